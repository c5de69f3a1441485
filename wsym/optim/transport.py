r"""Move an optimizer's state along a symmetry move of the weights (teleportation).

A group element acts on the parameters by a linear map :math:`\theta' = a\,\theta`
(permutations, scalings, norm-scalings at fixed BatchNorm statistics, GL blocks;
translations are affine with the same linear part). A *displacement*
:math:`\delta` of the parameters moves with the differential of the action, the
pushforward :math:`\delta' = a\,\delta` (contravariantly): the displaced point maps
exactly, :math:`a(\theta + \delta) = \theta' + \delta'`, so :math:`f(\theta' + \delta') =
f(\theta + \delta)` for the network function :math:`f`.

:func:`transport_state` applies that to the state of the optimizer, parameter by
parameter, so that the step the state has pending is the same move in function
space after the teleport as before:

* SGD's ``momentum_buffer`` :math:`b` and Adam's first moment ``exp_avg`` :math:`m`
  (the directions of the pending step :math:`-\eta\mu b`, :math:`-\eta \hat m / (\sqrt{\hat v}
  + \epsilon)`): pushed forward, :math:`b' = a b`, :math:`m' = a m`. Exact for every
  element.
* Adam's elementwise second moment ``exp_avg_sq`` (and ``max_exp_avg_sq``; Adagrad's
  ``sum``, RMSprop's ``square_avg``): permuted by the element's permutation part only,
  its scales left out. For *monomial* elements (permutations, signs, scalings,
  norm-scalings: one nonzero per row of :math:`a`) this is exact: with :math:`a = P D`,
  :math:`(P D m) / (\sqrt{P v} + \epsilon) = P D\,(m / (\sqrt v + \epsilon))`, the pushforward
  of Adam's pending step, :math:`\epsilon` included. For GL (and orthogonal) blocks it
  is an approximation: no elementwise :math:`v'` makes Adam's normalization commute with
  a rotation, and the second moment is left in place on those entries (the first
  moment is still exact).

What is not preserved, and cannot be: the gradients taken after the teleport are those
of the new point, :math:`\nabla L(\theta') = a^{-\top} \nabla L(\theta)`, and gradient
descent is not equivariant under non-orthogonal moves; that difference is what
teleportation is for. For orthogonal elements (permutations, signs, orthogonal GL
elements) :math:`a^{-\top} = a` and the whole next step of SGD with momentum moves
the function exactly as it would have without the teleport.

Other state entries (the step counter, entries of other optimizers) are left as they are.

Example:
    >>> import torch, wsym
    >>> from wsym.models.networks import MLP
    >>> _ = torch.manual_seed(0)
    >>> model, x = MLP(3, [4], 2).double(), torch.randn(8, 3, dtype=torch.float64)
    >>> opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    >>> model(x).square().mean().backward(); opt.step()
    >>> spec = wsym.detect(model, x)
    >>> g = spec.sample(seed=1, scale=(0.5, 2.0), kinds=("scaling",))
    >>> w = model[0].weight.detach().clone()
    >>> b = opt.state[model[0].weight]["momentum_buffer"].clone()
    >>> transport_state(opt, model, spec, g)
    >>> new = spec.act(g, {**model.state_dict(), "0.weight": w + b})["0.weight"]
    >>> moved = spec.act(g, model.state_dict())["0.weight"]
    >>> torch.allclose(opt.state[model[0].weight]["momentum_buffer"], new - moved)
    True
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from wsym.errors import WsymInputError
from wsym.group.elements import GroupElement, act
from wsym.group.kinds import kind_of
from wsym.group.spec import SymmetrySpec

FIRST_MOMENTS = ("momentum_buffer", "exp_avg")
SECOND_MOMENTS = ("exp_avg_sq", "max_exp_avg_sq", "sum", "square_avg")


def pushforward(
    spec: SymmetrySpec, element: GroupElement, state_dict: dict, vectors: dict[str, Tensor]
) -> dict[str, Tensor]:
    r"""The displacements ``vectors`` (``{name: tensor}``) moved by ``element``: :math:`a\delta`.

    ``state_dict`` is the state *before* the move (norm-scalings read its BatchNorm
    statistics). Computed as :math:`a(\delta) - a(0)` with the other entries fixed (exact
    for linear and affine actions).
    """
    names = list(vectors)
    with_vectors = dict(state_dict)
    with_zeros = dict(state_dict)
    for n in names:
        with_vectors[n] = vectors[n].to(torch.float64)
        with_zeros[n] = torch.zeros_like(with_vectors[n])
    moved, origin = act(spec, element, with_vectors), act(spec, element, with_zeros)
    return {n: (moved[n] - origin[n]).to(vectors[n].dtype) for n in names}


def permutation_part(spec: SymmetrySpec, element: GroupElement) -> GroupElement:
    """The element's permutation components only (scales, signs and GL blocks dropped)."""
    flags = element.inverted or (False,) * len(element.components)
    keep = [
        (c, f)
        for c, f in zip(element.components, flags, strict=True)
        if kind_of(spec.groups[c[0]]).permutes
    ]
    return GroupElement(tuple(c for c, _ in keep), tuple(f for _, f in keep))


def transport_state(
    optimizer: torch.optim.Optimizer,
    model: nn.Module,
    spec: SymmetrySpec,
    element: GroupElement,
    state_dict: dict | None = None,
) -> None:
    """Move ``optimizer``'s per-parameter state along ``element`` (module docstring), in place.

    Args:
        optimizer: a torch optimizer over ``model``'s parameters, or a wsym optimizer
            wrapping one (its ``base_optimizer`` holds the state).
        model: the network whose weights ``element`` moves.
        spec: the symmetries ``element`` belongs to.
        element: the group element of the move.
        state_dict: ``model``'s state before the move; ``None`` reads the model (call it
            before moving the weights then).
    """
    inner = getattr(optimizer, "base_optimizer", optimizer)
    before = {k: v.detach().double() for k, v in (state_dict or model.state_dict()).items()}
    names = {p: n for n, p in model.named_parameters()}
    held = [p for g in inner.param_groups for p in g["params"]]
    if any(p not in names for p in held):
        raise WsymInputError(
            "transport_state: the optimizer holds parameters that are not the model's; "
            "pass the optimizer built on this model's parameters"
        )
    entries: dict[str, dict[str, Tensor]] = {}
    for p, st in inner.state.items():
        for key, value in st.items():
            if p in names and isinstance(value, Tensor) and value.shape == p.shape:
                entries.setdefault(key, {})[names[p]] = value
    permutation = permutation_part(spec, element)
    for key, table in entries.items():
        if key in FIRST_MOMENTS:
            moved = pushforward(spec, element, before, table)
        elif key in SECOND_MOMENTS:
            moved = pushforward(spec, permutation, before, table)
        else:
            continue
        with torch.no_grad():
            for n, value in table.items():
                value.copy_(moved[n])
