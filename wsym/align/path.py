"""Continuous groups fitted to the interpolation path (``wsym.align(..., refine="path")``).

The weight- and activation-matching objectives are proxies for the barrier. Once
the permutations are fixed, the continuous groups can be fitted to the path
itself: with ``theta(t) = (1 - t) ref + t (g . other)``, minimize

    L(g) = E_t [ loss(theta(t)) ],    t ~ U(0, 1),

over the continuous part of the group (scales, GL and orthogonal blocks, a
pre-LN residual stream's rotation), by Adam on each factor's Lie-algebra
coordinates ``a`` with ``g = exp(a)``: ``exp`` of the log-scales, ``matrix_exp``
of a GL block's coefficients, of the skew part for an orthogonal block, and for a
rotation that must fix ``1`` (a LayerNorm stream) of ``P skew(a) P``
(``P = I - 1 1^T / n``), whose exponential fixes ``1``. Every iterate is a group
element, so ``g . other`` computes exactly ``other``'s function whatever the fit
ends at. This is Git Re-Basin's straight-through idea (learn the alignment by the
loss at the midpoint) on the continuous groups, where no straight-through
estimator is needed: they are differentiable. Permutations, signs and
translations are held (a translation of a key bias or a logit bias moves no
point of the path).

BatchNorm layers run on each point's batch statistics (training mode, on copies
of their buffers): the statistics reset along the path, the running statistics
out of the fit. The fit is kept only where it lowers the mean loss over the fixed grid
``t = 0.1, ..., 0.9`` on the same batches (so it never makes that objective
worse). Derivation and measurements in ``docs/alignment.md`` and
``docs/merging.md``.
"""

from __future__ import annotations

import torch
from torch.func import functional_call

from wsym.align.batchnorm import batchnorm_batch_statistics
from wsym.errors import WsymInputError
from wsym.group.elements import GroupElement, act
from wsym.group.kinds import kind_of
from wsym.group.spec import SymmetrySpec
from wsym.models.calling import eval_mode, joined_pairs, model_inputs

STEPS = 100
LR = 1e-2
# The fixed grid the result is checked on (the interior points of an 11-point path).
GRID = tuple(i / 10 for i in range(1, 10))
NO_TARGETS = "refine='path' needs batches of (inputs, targets) to take the loss on"


def fitted_groups(spec: SymmetrySpec) -> list[int]:
    """The groups the path fit moves: continuous, not translations.

    Example:
        >>> import torch, wsym
        >>> mlp = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
        >>> spec = wsym.detect(mlp, torch.randn(2, 3))
        >>> [spec.groups[i].kind for i in fitted_groups(spec)]
        ['scaling']
    """
    return [
        i for i, g in enumerate(spec.groups) if kind_of(g).continuous and not kind_of(g).additive
    ]


def path_fit(
    spec: SymmetrySpec,
    model: torch.nn.Module,
    ref: dict,
    other: dict,
    batches,
    loss_fn,
    *,
    centered: frozenset[int] = frozenset(),
    steps: int = STEPS,
    lr: float = LR,
    seed: int = 0,
) -> list[tuple[int, torch.Tensor]]:
    """The continuous element ``g`` minimizing ``E_t loss((1 - t) ref + t g . other)``.

    Args:
        spec: the spec whose continuous groups move (:func:`fitted_groups`).
        model: the module ``ref`` and ``other`` are state dicts of.
        ref: the reference state dict (float64).
        other: the state dict to move (float64, already aligned: the fit starts at ``g = 1``).
        batches: ``(inputs, targets)`` pairs; joined into one batch where they can be.
        loss_fn: ``loss_fn(outputs, targets) -> scalar``.
        centered: orthogonal groups whose rotation must fix ``1`` (LayerNorm streams).
        steps: Adam steps, one ``t ~ U(0, 1)`` each.
        lr: Adam's learning rate on the Lie-algebra coordinates.
        seed: the draw of the ``t``.

    Returns:
        ``[(group, value)]``, empty where the fit does not lower the mean loss over
        :data:`GRID`.

    Raises:
        WsymInputError: a batch has no targets.
    """
    batches = joined_pairs(list(batches))
    if not batches or any(targets is None for _, targets in batches):
        raise WsymInputError(NO_TARGETS)
    groups = fitted_groups(spec)
    coords = [
        torch.zeros(
            kind_of(spec.groups[i]).coefficient_shape(spec, spec.groups[i]),
            dtype=torch.float64,
            requires_grad=True,
        )
        for i in groups
    ]
    if not coords:
        return []
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)

    def element():
        return GroupElement(
            tuple((i, _exp(spec, i, a, i in centered)) for i, a in zip(groups, coords, strict=True))
        )

    buffers = {name for name, _ in model.named_buffers()}

    def path_loss(g, ts):
        moved = act(spec, g, other)
        total = 0.0
        for t in ts:
            state = {
                k: ((1 - t) * v + t * moved[k]).to(dtype) if v.is_floating_point() else v
                for k, v in ref.items()
                if k not in buffers
            }
            # BatchNorm runs on each point's batch statistics (its running ones left out).
            state |= {
                k: ref[k].detach().clone().to(dtype)
                if ref[k].is_floating_point()
                else ref[k].clone()
                for k in buffers
                if k in ref
            }
            for inputs, targets in batches:
                args, kwargs = model_inputs(model, inputs)
                args = tuple(
                    a.to(dtype) if torch.is_tensor(a) and a.is_floating_point() else a for a in args
                )
                outputs = functional_call(model, state, args, kwargs)
                total = total + loss_fn(outputs, targets) / (len(ts) * len(batches))
        return total

    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(coords, lr=lr)
    with eval_mode(model), batchnorm_batch_statistics(model):
        start = float(path_loss(GroupElement(()), GRID))
        for _ in range(steps):
            loss = path_loss(element(), torch.rand(1, generator=gen, dtype=torch.float64).tolist())
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            g = element()
            end = float(path_loss(g, GRID))
    if not end < start:
        return []
    return [(i, v.detach()) for i, v in g.components]


def _exp(spec: SymmetrySpec, i: int, a: torch.Tensor, centered: bool) -> torch.Tensor:
    """``exp(a)`` in group ``i``; for a ``centered`` rotation, ``exp(P skew(a) P)``."""
    group = spec.groups[i]
    if centered:
        n = a.shape[-1]
        p = torch.eye(n, dtype=a.dtype) - torch.full((n, n), 1.0 / n, dtype=a.dtype)
        return torch.linalg.matrix_exp(p @ (0.5 * (a - a.transpose(-1, -2))) @ p)
    return kind_of(group).exp(group, a)
