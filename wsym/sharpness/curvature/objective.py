r"""The empirical risk over a list of batches, its gradient and Hessian-vector products.

Every curvature quantity in :mod:`wsym.sharpness.curvature` is taken of the same objective,

.. math::
    \mathcal{L}(\theta) = \sum_k w_k\, \ell\big(f(x_k; \theta), y_k\big),
    \qquad w_k = \frac{n_k}{\sum_j n_j},

where ``(x_k, y_k)`` are the batches, ``n_k`` their sizes (length of the first axis
of the inputs) and ``\ell = loss_fn`` is a mean over its batch. So
:math:`\mathcal{L}` is the mean loss over all samples; with equal batch sizes it is
the plain average of the batch losses.

The model is evaluated with :func:`torch.func.functional_call` on a parameter dict
``{name: tensor}`` in **eval mode**: BatchNorm uses its running statistics (they are
constants, not functions of the batch) and dropout is off, so the objective is a
deterministic function of :math:`\theta` and per-sample computations are valid.
Buffers are taken from the model unchanged; the model's training flag is restored
afterwards.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, jvp, vjp, vmap

from wsym.models.calling import eval_mode

Params = dict[str, Tensor]
Batch = tuple[Any, Any]
LossFn = Callable[[Tensor, Any], Tensor]
HvpMode = Literal["forward", "reverse"]


def model_params(model: nn.Module) -> Params:
    """Detached copies of the parameters that require grad, keyed by name."""
    return {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}


def as_args(inputs: Any) -> tuple:
    """Positional arguments of the model: a tuple stays, anything else is wrapped."""
    return inputs if isinstance(inputs, tuple) else (inputs,)


def batch_size(inputs: Any) -> int:
    """Number of samples in ``inputs``: the first axis of its first tensor.

    ``inputs`` is a tensor, a tuple of positional inputs or a dict of keyword inputs.
    """
    first = next(iter(inputs.values())) if isinstance(inputs, dict) else as_args(inputs)[0]
    return int(first.shape[0])


def call(model: nn.Module, params: Params, inputs: Any) -> Any:
    """``model`` at ``params`` on ``inputs``: a tensor, a tuple, or a dict of keyword inputs."""
    if isinstance(inputs, dict):
        return functional_call(model, params, (), inputs)
    return functional_call(model, params, as_args(inputs))


def as_dtype(x: Any, dtype: torch.dtype) -> Any:
    """``x`` with its floating tensors at ``dtype`` (tensors, tuples, lists, dicts of them)."""
    if isinstance(x, Tensor):
        return x.to(dtype) if x.is_floating_point() else x
    if isinstance(x, tuple | list):
        return type(x)(as_dtype(v, dtype) for v in x)
    if isinstance(x, dict):
        return {k: as_dtype(v, dtype) for k, v in x.items()}
    return x


def as_double(x: Any) -> Any:
    """``x`` with its floating tensors in float64 (tensors, tuples, lists, dicts of them)."""
    return as_dtype(x, torch.float64)


def batch_weights(batches: Sequence[Batch]) -> list[float]:
    r"""Weights :math:`w_k = n_k / \sum_j n_j` that make the objective a sample mean."""
    sizes = [batch_size(x) for x, _ in batches]
    total = sum(sizes)
    if total == 0:
        raise ValueError("batches are empty; pass at least one non-empty (inputs, targets)")
    return [n / total for n in sizes]


def batch_loss(model: nn.Module, loss_fn: LossFn, inputs: Any, targets: Any) -> Callable:
    """The map ``params -> loss_fn(f(inputs; params), targets)`` of one batch."""

    def loss(params: Params) -> Tensor:
        return loss_fn(call(model, params, inputs), targets)

    return loss


def gradient(
    model: nn.Module, params: Params | None, batches: Sequence[Batch], loss_fn: LossFn
) -> Params:
    r"""Gradient :math:`\nabla \mathcal{L}(\theta)` of the sample-mean loss.

    Args:
        model: the network; evaluated in eval mode (see the module docstring).
        params: ``{name: tensor}`` at which to differentiate; ``None`` takes the model's.
        batches: list of ``(inputs, targets)``.
        loss_fn: ``loss_fn(outputs, targets)``, a mean over the batch.

    Returns:
        ``{name: tensor}`` with the shapes of ``params``.

    Example:
        >>> model = nn.Linear(3, 1)
        >>> g = gradient(model, None, [(torch.randn(4, 3), torch.randn(4, 1))], nn.MSELoss())
        >>> sorted((k, tuple(v.shape)) for k, v in g.items())
        [('bias', (1,)), ('weight', (1, 3))]
    """
    params = model_params(model) if params is None else params
    total = {n: torch.zeros_like(p) for n, p in params.items()}
    with eval_mode(model):
        for w, (x, y) in zip(batch_weights(batches), batches, strict=True):
            g = grad(batch_loss(model, loss_fn, x, y))(params)
            for n in total:
                total[n] += w * g[n]
    return total


def hvp(
    model: nn.Module,
    params: Params | None,
    batches: Sequence[Batch],
    loss_fn: LossFn,
    v: Params,
    mode: HvpMode = "reverse",
) -> Params:
    r"""Hessian-vector product :math:`\nabla^2 \mathcal{L}(\theta)\, v`.

    ``mode="forward"`` (forward-over-reverse): for each batch the JVP
    of the gradient, ``torch.func.jvp(torch.func.grad(loss), (params,), (v,))``,
    weighted by :math:`w_k`; one forward and one backward pass, each carrying a
    tangent. ``mode="reverse"`` (reverse-over-reverse): the VJP of the gradient,
    ``torch.func.vjp(torch.func.grad(loss), params)[1](v)`` -- the same matrix
    (the Hessian is symmetric), the default: faster on CPU (benchmarks/curvature_speed.py:
    2.4-2.6x a gradient against 3.0-3.6x), notably for models with LayerNorm, whose
    forward-mode derivative of the backward runs through a decomposition.

    Args:
        model: the network; evaluated in eval mode.
        params: ``{name: tensor}``; ``None`` takes the model's.
        batches: list of ``(inputs, targets)``.
        loss_fn: ``loss_fn(outputs, targets)``, a mean over the batch.
        v: direction ``{name: tensor}`` with the shapes of ``params``.
        mode: ``"forward"`` (jvp of grad) or ``"reverse"`` (vjp of grad).

    Returns:
        ``{name: tensor}``, :math:`H v` with the shapes of ``params``.

    Example:
        >>> model = nn.Linear(2, 1, bias=False)
        >>> x = torch.eye(2)
        >>> loss = lambda out, y: 0.5 * ((out - y) ** 2).sum(0).squeeze()  # H = x^T x = I
        >>> hvp(model, None, [(x, torch.zeros(2, 1))], loss, {"weight": torch.ones(1, 2)})
        {'weight': tensor([[1., 1.]])}
    """
    params = model_params(model) if params is None else params
    vs = {n: t.unsqueeze(0) for n, t in v.items()}
    return {n: t[0] for n, t in hvp_many(model, params, batches, loss_fn, vs, mode=mode).items()}


def hvp_many(
    model: nn.Module,
    params: Params,
    batches: Sequence[Batch],
    loss_fn: LossFn,
    vs: Params,
    chunk_size: int | None = None,
    mode: HvpMode = "reverse",
) -> Params:
    """Hessian-vector products with a stack of directions, vectorized with ``vmap``.

    With ``mode="reverse"`` the gradient graph is built once per batch and only the
    second backward pass is vectorized over the directions.

    Args:
        model: the network; evaluated in eval mode.
        params: ``{name: tensor}``.
        batches: list of ``(inputs, targets)``.
        loss_fn: ``loss_fn(outputs, targets)``, a mean over the batch.
        vs: ``{name: tensor of shape (m, *param.shape)}``, ``m`` directions.
        chunk_size: directions per ``vmap`` call (memory bound); ``None`` = all.
        mode: ``"forward"`` (jvp of grad) or ``"reverse"`` (vjp of grad), see :func:`hvp`.

    Returns:
        ``{name: tensor of shape (m, *param.shape)}``, the products :math:`H v_j`.
    """
    if mode not in ("forward", "reverse"):
        raise ValueError(f"mode must be 'forward' or 'reverse', got {mode!r}")
    m = next(iter(vs.values())).shape[0]
    total = {n: torch.zeros_like(t) for n, t in vs.items()}
    with eval_mode(model):
        for w, (x, y) in zip(batch_weights(batches), batches, strict=True):
            one = _hvp_function(grad(batch_loss(model, loss_fn, x, y)), params, mode)
            if m == 1:  # no vmap overhead for a single direction
                hv = {n: t.unsqueeze(0) for n, t in one({n: t[0] for n, t in vs.items()}).items()}
            else:
                hv = vmap(one, chunk_size=chunk_size)(vs)
            for n in total:
                total[n] += w * hv[n]
    return total


def _hvp_function(g: Callable, params: Params, mode: HvpMode) -> Callable[[Params], Params]:
    """``v -> H v`` for the gradient map ``g``: jvp of ``g`` or the pullback of ``g``."""
    if mode == "forward":
        return lambda t: jvp(g, (params,), (t,))[1]
    _, pullback = vjp(g, params)
    return lambda t: pullback(t)[0]


def flatten(tensors: Params, names: Sequence[str]) -> Tensor:
    """Concatenate ``tensors[name].flatten()`` in the order of ``names``."""
    return torch.cat([tensors[n].reshape(-1) for n in names])


def unflatten(vector: Tensor, like: Params) -> Params:
    """Split a flat vector into ``{name: tensor}`` with the shapes (and order) of ``like``."""
    out, i = {}, 0
    for n, p in like.items():
        out[n] = vector[i : i + p.numel()].view_as(p)
        i += p.numel()
    return out
