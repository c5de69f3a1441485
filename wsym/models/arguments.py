"""What the public entry points need of a module, its batches and a loss: one line each.

Every entry point that takes a model, ``(inputs, targets)`` batches or a loss
function checks them here, at the boundary, so that a wrong type surfaces as one
:class:`~wsym.errors.WsymInputError` line naming the cause and the fix instead of
an ``AttributeError`` or an unpacking error deep inside.

Example:
    >>> check_module({"w": 1}, "wsym.sharpness")
    Traceback (most recent call last):
    ...
    wsym.errors.WsymInputError: wsym.sharpness needs a torch.nn.Module, got dict ...
"""

from __future__ import annotations

import torch

from wsym.errors import WsymInputError, check_finite


def check_module(model, who: str, *, finite: bool = True) -> None:
    """A ``torch.nn.Module`` (not a number, a function or a state dict), with finite weights."""
    if not isinstance(model, torch.nn.Module):
        hint = " (a state dict?)" if isinstance(model, dict) else ""
        raise WsymInputError(
            f"{who} needs a torch.nn.Module, got {type(model).__name__}{hint}; pass the model "
            "itself (wrap a function in an nn.Module whose parameters it uses)"
        )
    if finite:
        check_finite(model.state_dict())


def check_state_dict(state_dict, who: str, name: str = "a state dict") -> None:
    """A dict of tensors (``model.state_dict()``), not a module or another object."""
    if isinstance(state_dict, torch.nn.Module) or not isinstance(state_dict, dict):
        raise WsymInputError(
            f"{who} needs {name} (a dict of tensors), got {type(state_dict).__name__}; "
            "pass model.state_dict()"
        )


def check_batches(batches, who: str) -> list:
    """A non-empty list of ``(inputs, targets)`` pairs, returned as a list."""
    if torch.is_tensor(batches) or isinstance(batches, dict | str) or batches is None:
        got = type(batches).__name__
    else:
        try:
            batches = list(batches)
        except TypeError:
            got = type(batches).__name__
        else:
            if not batches:
                raise WsymInputError(f"{who}: batches is empty; pass a list of (inputs, targets)")
            bad = next((b for b in batches if not _is_pair(b)), None)
            if bad is None:
                return batches
            got = f"a list holding a {type(bad).__name__}"
    raise WsymInputError(
        f"{who} needs batches as a list of (inputs, targets) pairs, got {got}; pass e.g. [(x, y)]"
    )


def _is_pair(batch) -> bool:
    return isinstance(batch, tuple | list) and len(batch) == 2 and not torch.is_tensor(batch)


def check_loss(loss_fn, who: str) -> None:
    """A callable ``loss_fn(outputs, targets) -> scalar``."""
    if not callable(loss_fn):
        raise WsymInputError(
            f"{who} needs loss_fn as a callable loss_fn(outputs, targets), got "
            f"{type(loss_fn).__name__}; pass e.g. torch.nn.functional.cross_entropy"
        )


def check_runs(
    model: torch.nn.Module, args: tuple, kwargs: dict, what: str = "the example inputs"
) -> None:
    """Raise a one-line error if the model cannot run on ``what`` at all.

    Runs one forward pass without gradients: pass a copy where the forward updates
    buffers (the caller's module is not to change).
    """
    try:
        with torch.no_grad():
            model(*args, **kwargs)
    except Exception as err:  # noqa: BLE001 - reported to the user as one line
        raise model_failure(err, what) from err


def model_failure(err: BaseException, what: str = "the example inputs") -> WsymInputError:
    """The one line saying that the model's forward failed on ``what``, and the fix."""
    msg = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return WsymInputError(
        f"the model fails on {what} ({type(err).__name__}: {msg}); "
        "pass inputs of the shape and dtype its forward expects"
    )


__all__ = [
    "check_batches",
    "check_loss",
    "check_module",
    "check_runs",
    "check_state_dict",
    "model_failure",
]
