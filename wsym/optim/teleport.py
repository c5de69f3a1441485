r"""Symmetry teleportation: move along a symmetry orbit, at no cost to the loss, to a better point.

Zhao et al. (2022): the continuous symmetry groups of a network (``scaling``,
``norm_scaling``, ``gl``) act on the weights without changing the function, so the
loss is constant on each orbit but its gradient is not. :func:`teleport` searches the
orbit through the current weights, parametrized by group elements in exponential
coordinates (log-scales :math:`a`, :math:`s = e^{a}`; GL elements
:math:`A = \exp(X)`, ``torch.linalg.matrix_exp``), for

* ``objective="grad-norm"``: the largest squared gradient norm
  :math:`\|\nabla L(g \cdot \theta)\|^2` (faster descent afterwards), or
* ``objective="sharpness"``: the smallest Hessian trace
  :math:`\operatorname{Tr} \nabla^2 L(g \cdot \theta)` (Hutchinson, ``probes`` fixed
  Rademacher vectors; it is not invariant, so the orbit holds flatter-looking points).

Each of ``steps`` normalized gradient steps moves the coordinates by ``lr`` (in the
Euclidean norm of all coordinates together); the best point seen is kept. Everything
runs on a float64 copy in eval mode (BatchNorm uses its running statistics, as in
:mod:`wsym.sharpness`), with the objective the sample-mean loss over ``batches``.
Before writing back, the loss at the new point is compared with the loss at the old
one: if the relative change exceeds ``tol`` (a symmetry that does not hold exactly,
e.g. a norm_scaling group in train mode with a large ``eps``), a
:class:`~wsym.errors.SymmetryWarning` is issued and the model is left unchanged.

The model is moved **in place** (its parameter and buffer tensors are overwritten,
so optimizers holding them keep working) and returned. With ``optimizer=``, its state
(momentum, Adam moments) moves with the weights
(:func:`wsym.optim.transport.transport_state`: the pending step is the same move in
function space); without, it stays in the old coordinates. Inside training, call it
every ``N`` steps::

    for step, (x, y) in enumerate(loader):
        if step % N == 0:
            wsym.teleport(model, spec, [(x, y)], loss_fn, steps=10, lr=0.05, optimizer=opt)
        opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()

Example:
    >>> import torch, wsym
    >>> from wsym.models.networks import MLP
    >>> _ = torch.manual_seed(0)
    >>> model, x = MLP(4, [8], 3), torch.randn(32, 4)
    >>> batches = [(x, torch.randint(0, 3, (32,)))]
    >>> spec = wsym.detect(model, x)
    >>> loss = torch.nn.functional.cross_entropy
    >>> before = float(loss(model(x), batches[0][1]).detach())
    >>> model = teleport(model, spec, batches, loss, steps=5, lr=0.1)
    >>> abs(float(loss(model(x), batches[0][1]).detach()) - before) < 1e-5
    True
"""

from __future__ import annotations

import copy
import math
import types
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from wsym.errors import SymmetryWarning, WsymInputError
from wsym.group.elements import GroupElement, act
from wsym.group.kinds import kind_of
from wsym.group.spec import SymmetrySpec
from wsym.models.arguments import check_batches, check_loss, check_module
from wsym.models.calling import eval_mode
from wsym.sharpness.curvature.hutchinson import probe_chunks
from wsym.sharpness.curvature.objective import as_double, batch_weights, call

OBJECTIVES = ("grad-norm", "sharpness")
CONTINUOUS = ("scaling", "norm_scaling", "gl")
"""Default kinds: those whose moves change the gradient (``orthogonal`` and
``translation``, also continuous, may be passed in ``kinds``)."""


def orbit_groups(spec: SymmetrySpec, kinds: Sequence[str] = CONTINUOUS) -> list[int]:
    """Indices of the groups teleportation moves along: continuous kinds in ``kinds``."""
    return [i for i, g in enumerate(spec.groups) if g.kind in kinds and kind_of(g).continuous]


def element(spec: SymmetrySpec, groups: list[int], coords: list[Tensor]) -> GroupElement:
    """The group element with exponential coordinates ``coords`` (differentiable).

    Shapes: each kind's ``coefficient_shape``, e.g. ``(n,)`` log-scales for scaling
    groups, ``(*index, h, h)`` for GL groups; the value is the kind's ``exp``.
    """
    parts = []
    for i, c in zip(groups, coords, strict=True):
        group = spec.groups[i]
        parts.append((i, kind_of(group).exp(group, c)))
    return GroupElement(tuple(parts))


def _zero_coords(spec: SymmetrySpec, groups: list[int]) -> list[Tensor]:
    """The identity's exponential coordinates, one zero coefficient per group."""
    shapes = [kind_of(spec.groups[i]).coefficient_shape(spec, spec.groups[i]) for i in groups]
    return [torch.zeros(shape, dtype=torch.float64) for shape in shapes]


def _probes(state: dict, names: list[str], probes: int, seed: int) -> list[list[Tensor]]:
    """The probes of :func:`wsym.sharpness.curvature.hessian_trace` (same seed, same probes)."""
    chunks = probe_chunks({n: state[n].detach() for n in names}, probes, seed, 64)
    return [[c[n][j] for n in names] for c in chunks for j in range(c[names[0]].shape[0])]


def _loss(model64: nn.Module, state: dict, batches: list, loss_fn: Callable) -> Tensor:
    weights = batch_weights(batches)
    return sum(
        w * loss_fn(call(model64, state, x), y) for w, (x, y) in zip(weights, batches, strict=True)
    )


def _objective(model64, state, names, batches, loss_fn, objective, probes) -> Tensor:
    """Value to maximize: squared gradient norm, or minus the Hutchinson Hessian trace.

    The trace is the estimate of :func:`wsym.sharpness.curvature.hessian_trace` with the same
    probes, taken by double backward so that it is differentiable with respect to the
    group coordinates (the curvature estimators return detached values and read the
    buffers, which norm_scaling groups move, from the model).
    """
    loss = _loss(model64, state, batches, loss_fn)
    params = [state[n] for n in names]
    grads = torch.autograd.grad(loss, params, create_graph=True)
    if objective == "grad-norm":
        return sum((g * g).sum() for g in grads)
    trace = 0.0
    for vs in probes:
        gv = sum((g * v).sum() for g, v in zip(grads, vs, strict=True))
        hv = torch.autograd.grad(gv, params, create_graph=True)
        trace = trace + sum((h * v).sum() for h, v in zip(hv, vs, strict=True))
    return -trace / len(probes)


def _eval_batchnorm(self: nn.modules.batchnorm._BatchNorm, x: Tensor) -> Tensor:
    """Eval-mode BatchNorm written out, differentiable in the running statistics."""
    shape = (1, -1) + (1,) * (x.ndim - 2)
    out = (x - self.running_mean.view(shape)) / torch.sqrt(self.running_var.view(shape) + self.eps)
    if self.weight is not None:
        out = out * self.weight.view(shape)
    if self.bias is not None:
        out = out + self.bias.view(shape)
    return out


def _differentiable_copy(model: nn.Module) -> nn.Module:
    """A float64 copy whose BatchNorm layers (with running statistics) use the eval formula.

    ``torch.batch_norm`` has no derivative with respect to the running statistics,
    which norm_scaling groups move.
    """
    copied = copy.deepcopy(model).double()
    for module in copied.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and module.track_running_stats:
            module.forward = types.MethodType(_eval_batchnorm, module)
    return copied


def _check(objective, steps, lr, tol) -> None:
    if objective not in OBJECTIVES:
        raise WsymInputError(f"unknown objective {objective!r}; use one of {', '.join(OBJECTIVES)}")
    if not isinstance(steps, int) or steps < 1:
        raise WsymInputError(f"steps must be an integer >= 1, got {steps!r}; pass e.g. steps=10")
    for name, value in (("lr", lr), ("tol", tol)):
        if not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
            raise WsymInputError(f"{name} must be a positive number, got {value!r}")


def teleport(
    model: nn.Module,
    spec: SymmetrySpec | None,
    batches: Sequence[tuple[Any, Any]],
    loss_fn: Callable[[Any, Any], Tensor],
    objective: str = "grad-norm",
    steps: int = 10,
    lr: float = 0.1,
    kinds: Sequence[str] = CONTINUOUS,
    tol: float = 1e-6,
    probes: int = 4,
    seed: int = 0,
    optimizer: torch.optim.Optimizer | None = None,
) -> nn.Module:
    """Move ``model`` in place along its symmetry orbit (module docstring); returns it.

    Args:
        model: the network; its parameters and buffers are overwritten in place.
        spec: its symmetries; ``None`` detects them on the first batch's inputs.
        batches: list of ``(inputs, targets)``, as in :func:`wsym.sharpness`.
        loss_fn: ``loss_fn(outputs, targets)`` -> scalar, a mean over the batch.
        objective: ``"grad-norm"`` (maximize) or ``"sharpness"`` (minimize Hessian trace).
        steps: normalized gradient steps on the group coordinates.
        lr: length of each step in exponential coordinates (log-scales, GL generators).
        kinds: group kinds to move along (among scaling, norm_scaling, gl).
        tol: largest relative change of the loss accepted (else warn, do not move).
        probes: Rademacher probes of the Hessian trace (``objective="sharpness"``).
        seed: seed of the probes.
        optimizer: an optimizer over ``model``'s parameters whose state moves too.

    Returns:
        ``model``, moved.

    Raises:
        WsymInputError: bad arguments, or a spec without the continuous groups needed.
    """
    check_module(model, "wsym.teleport")
    batches = check_batches(batches, "wsym.teleport")
    check_loss(loss_fn, "wsym.teleport")
    _check(objective, steps, lr, tol)
    from wsym.detect import spec_or_detect

    spec = spec_or_detect(spec, model, batches[0][0], "wsym.teleport")
    groups = orbit_groups(spec, kinds)
    if not groups:
        raise WsymInputError(
            "teleport needs continuous symmetries (scaling, norm_scaling or gl) and the spec "
            f"has none of kinds {', '.join(kinds)}; teleportation cannot move this model"
        )
    model64 = _differentiable_copy(model)
    state = {k: as_double(v.detach()) for k, v in model64.state_dict().items()}
    names = [n for n, p in model64.named_parameters() if p.requires_grad]
    for n in names:  # leaves, so that entries no group moves still get a gradient
        state[n].requires_grad_(True)
    batches64 = [(as_double(x), as_double(y)) for x, y in batches]
    vs = _probes(state, names, probes, seed) if objective == "sharpness" else []
    coords = _zero_coords(spec, groups)
    best, best_value = [c.clone() for c in coords], -math.inf
    with eval_mode(model64):
        for k in range(steps + 1):
            coords = [c.detach().requires_grad_(True) for c in coords]
            moved = act(spec, element(spec, groups, coords), state)
            value = _objective(model64, moved, names, batches64, loss_fn, objective, vs)
            if float(value.detach()) > best_value:
                best, best_value = [c.detach().clone() for c in coords], float(value.detach())
            if k == steps:
                break
            grads = torch.autograd.grad(value, coords)
            size = math.sqrt(sum(float((g * g).sum()) for g in grads))
            if not size > 0 or not math.isfinite(size):
                break
            coords = [c.detach() + lr / size * g for c, g in zip(coords, grads, strict=True)]
        with torch.no_grad():
            moved = act(spec, element(spec, groups, best), state)
            old = float(_loss(model64, state, batches64, loss_fn))
            moved = {k: v.detach() for k, v in moved.items()}
            new = float(_loss(model64, moved, batches64, loss_fn))
    if not abs(new - old) <= tol * max(abs(old), 1e-300):
        warnings.warn(
            f"teleport: the loss changed from {old:.10g} to {new:.10g} (relative tolerance {tol}); "
            "the model was not moved",
            SymmetryWarning,
            stacklevel=2,
        )
        return model
    if optimizer is not None:  # before the weights move: it reads the old state
        from wsym.optim.transport import transport_state

        transport_state(optimizer, model, spec, element(spec, groups, best), state)
    with torch.no_grad():
        for key, tensor in model.state_dict(keep_vars=True).items():
            if key in moved and tensor.is_floating_point():
                tensor.copy_(moved[key].to(tensor.dtype))
    return model
