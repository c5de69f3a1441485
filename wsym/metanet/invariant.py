"""The continuous (and sign) part of the symmetry removed: canonical forms modulo permutations.

The meta-network sees weights after :func:`wsym.canonicalize` restricted to
every kind but ``permutation``: scaling and norm_scaling groups are balanced,
GL/orthogonal blocks brought to their balanced SVD/principal-axes form,
translations to their zero representative and signs to a fixed convention. All
of these are computed unit by unit (or head by head), so they commute with the
permutations, which the message passing then handles:
``invariant_form(act(g, sd)) = act(p(g), invariant_form(sd))`` with ``p(g)`` a
permutation.

Example:
    >>> import torch, wsym
    >>> from wsym.models.networks import MLP
    >>> mlp = MLP(3, [4], 2)
    >>> spec = wsym.detect(mlp, torch.randn(2, 3))
    >>> sd = {k: v.double() for k, v in mlp.state_dict().items()}
    >>> scaled = spec.act(spec.sample(seed=0, kinds=["scaling"]), sd)
    >>> a, b = invariant_form(sd, spec), invariant_form(scaled, spec)
    >>> all(torch.allclose(a[k], b[k]) for k in a)
    True
"""

from __future__ import annotations

import torch

from wsym.align.canonicalize import canonical_element
from wsym.group.kinds import kind_of
from wsym.group.spec import SymmetrySpec


def continuous_kinds(spec: SymmetrySpec) -> list[str]:
    """Kinds of ``spec`` other than permutation (those canonicalized before the graph)."""
    return sorted({g.kind for g in spec.groups if not kind_of(g).permutes})


def invariant_form(state_dict: dict, spec: SymmetrySpec) -> dict[str, torch.Tensor]:
    """Float64 canonical form of ``state_dict`` modulo every group but the permutations."""
    kinds = continuous_kinds(spec)
    if not kinds:
        return {
            k: v.detach().double() if v.is_floating_point() else v for k, v in state_dict.items()
        }
    canon, _ = canonical_element(state_dict, spec, kinds=kinds)
    return canon
