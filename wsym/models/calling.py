"""How wsym calls a module: example inputs as ``(args, kwargs)``, eval mode for the call.

Example:
    >>> import torch
    >>> split_inputs(torch.ones(2))[0][0].shape
    torch.Size([2])
"""

from __future__ import annotations

import contextlib
import inspect

import torch

from wsym.errors import WsymInputError


def split_inputs(example_inputs) -> tuple[tuple, dict]:
    """``Tensor | tuple | dict`` -> ``(args, kwargs)``."""
    if isinstance(example_inputs, dict):
        return (), dict(example_inputs)
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,), {}
    if isinstance(example_inputs, list | tuple):
        return tuple(example_inputs), {}
    raise WsymInputError(
        f"example inputs of type {type(example_inputs).__name__}; pass a Tensor, a tuple of "
        "positional inputs or a dict of keyword inputs"
    )


def model_inputs(model: torch.nn.Module, example_inputs) -> tuple[tuple, dict]:
    """``(args, kwargs)`` for analysing ``model``.

    Models whose forward takes ``use_cache`` (Hugging Face decoders) are analysed
    with ``use_cache=False`` unless the caller sets it: the key/value cache is a
    by-product for incremental decoding, not part of the function; a symmetry
    that moves keys and values moves a cache built with the same weights alike.
    """
    args, kwargs = split_inputs(example_inputs)
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        params = {}
    if "use_cache" in params and "use_cache" not in kwargs:
        kwargs = {**kwargs, "use_cache": False}
    return args, kwargs


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module):
    """Temporarily put ``model`` in eval mode (restoring each submodule's flag).

    A model already in eval mode is left alone (no walk over its modules per call:
    the verification's probe runs through here on every forward pass).
    """
    flags = {m: m.training for m in model.modules()}
    if not any(flags.values()):
        yield model
        return
    model.eval()
    try:
        yield model
    finally:
        for m, flag in flags.items():
            m.train(flag)


def joined_pairs(batches: list) -> list:
    """``batches`` as one ``(inputs, targets)`` where both are tensors of one trailing shape."""
    if len(batches) < 2 or not all(
        torch.is_tensor(x) and torch.is_tensor(y) and x.dim() > 0 for x, y in batches
    ):
        return batches
    if any(len({tuple(b[j].shape[1:]) for b in batches}) != 1 for j in (0, 1)):
        return batches
    return [(torch.cat([x for x, _ in batches]), torch.cat([y for _, y in batches]))]


def lacks_float64(err: RuntimeError) -> bool:
    """Whether ``err`` says a kernel has no float64 version (Hugging Face's ``grouped_mm``).

    Example:
        >>> lacks_float64(RuntimeError("Expected mat_a to be Float32 or BFloat16, got Double"))
        True
    """
    return "Double" in str(err) or "float64" in str(err)
