"""Which biases weight matching leaves out of its pairing scores (the default alignment).

A unit's *bias* here is a one-entry-per-unit parameter that a scaling group
moves with the unit's incoming weights (the same exponent as a tensor with
more entries per unit): the bias of a ``Linear`` or convolution
followed by a ReLU-like nonlinearity. Weight matching's pairing score of two
units is the inner product of all their entries, the bias one entry among the
fan-in; :func:`unmatched_biases` names the biases left out of that score
(they still move with their units, and the continuous fits and the
weight-matching objective keep them).

Left out: the biases of units that do not read a normalization's output.
Kept: those of units that do (their weights' input axis sits in a scaling group
whose other side holds only one-entry-per-unit tensors: a LayerNorm's or
BatchNorm's gain and shift). The rule is measured, not derived
(``docs/alignment.md``): on the MLP pairs of ``benchmarks/alignment.py`` the
train-loss barrier drops as the biases' weight in the score goes from 4 to 1 to
0 (512 wide, 8 starts each: 0.334, 0.298, 0.272); on the small ViT, whose MLP
units read a LayerNorm, leaving them out raised it.
"""

from __future__ import annotations

import torch

from wsym.group.kinds import kind_of
from wsym.group.layout import leaves
from wsym.group.memo import derived
from wsym.group.spec import SymmetrySpec


def _vars(spec: SymmetrySpec) -> dict[int, tuple[str, int, int]]:
    """``var -> (parameter, class of the leaf, leaves of the parameter)`` (buffers left out)."""
    skip = set(spec.buffers)
    out = {}
    for key, dims in spec.layouts:
        if key in skip:
            continue
        lv = [leaf for tree in dims for leaf in leaves(tree)]
        for leaf in lv:
            out[leaf.var] = (key, leaf.cls, len(lv))
    return out


def _reads_a_norm(spec: SymmetrySpec, var: int, where: dict) -> bool:
    """Whether ``var`` sits in a scaling group whose opposite-exponent entries are all 1-D."""
    for g in spec.groups:
        if not _scales(g):
            continue
        exps = dict(g.exponents)
        if var not in exps:
            continue
        other = [v for v, e in g.exponents if e * exps[var] < 0 and v in where]
        if other and all(where[v][2] == 1 for v in other):
            return True
    return False


def unmatched_biases(spec: SymmetrySpec) -> frozenset[str]:
    """The biases weight matching leaves out of its scores (see the module docstring).

    Example:
        >>> import torch, wsym
        >>> mlp = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
        >>> sorted(unmatched_biases(wsym.detect(mlp, torch.randn(2, 3))))
        ['0.bias']
    """
    return derived(spec, "unmatched_biases", lambda: frozenset(_unmatched(spec)))


def _unmatched(spec: SymmetrySpec) -> set[str]:
    where = _vars(spec)
    out: set[str] = set()
    for g in spec.groups:
        if not _scales(g):
            continue
        for sign in (1, -1):  # the side of the incoming weights (exponent signs are a convention)
            side = [v for v, e in g.exponents if e * sign > 0 and v in where]
            weights = [v for v in side if where[v][2] > 1]
            biases = {where[v][0] for v in side if where[v][2] == 1}
            inputs = [
                leaf.var
                for v in weights
                for tree in spec.layout[where[v][0]]
                for leaf in leaves(tree)
                if leaf.cls != g.cls
            ]
            if weights and biases and not any(_reads_a_norm(spec, v, where) for v in inputs):
                out |= biases
    return out


def without(sd: dict, keys) -> dict:
    """``sd`` with the tensors ``keys`` set to zero (left out of every pairing score)."""
    if not keys:
        return sd
    return {k: torch.zeros_like(v) if k in keys else v for k, v in sd.items()}


def _scales(g) -> bool:
    """A scaling or norm-scaling group (positive factors per unit)."""
    kind = kind_of(g)
    return kind.diagonal and kind.continuous
