"""The start of weight matching: each class first matched on the entries already settled.

Coordinate descent over permutation classes (:func:`wsym.align.matching.weight_matching`)
starts from the identity: the first class it solves scores its units partly
through tensors whose other axes belong to classes not yet matched, read in
their arbitrary stored order. What it converges to then depends on the
visiting order (the two orders of a two-layer MLP reach different optima).

:func:`settled_start` instead matches every class once, greedily: a tensor
is *settled* for a class when all its other axes belong to classes that never
permute (the network's inputs and outputs, or a held class) or that are
already matched; each step solves the class with the most settled entries per
unit, on those entries only (the others set to zero in both checkpoints), so
that no pairing score reads an unmatched axis. On an MLP this matches the
layers from the input on, each against its matched input (and, for the last
hidden layer, its fixed output). Coordinate descent then continues from this
start. Data-free and deterministic (ties: the spec's group order). The default
uses it only on a chain of layers (:func:`is_chain`): on the pre-LN transformer
pairs, whose residual stream couples to every block, it raised the small ViT's
barrier above the naive one.

Measured on the MLP pairs of ``benchmarks/alignment.py`` (``docs/merging.md``).
"""

from __future__ import annotations

import math

from wsym.align.biases import without
from wsym.align.matching import ClassPlan, class_units, match_class
from wsym.group.elements import GroupElement, act
from wsym.group.memo import derived
from wsym.group.spec import SymmetrySpec, leaves


def class_tensors(spec: SymmetrySpec) -> dict[int, list[tuple[str, frozenset[int], int]]]:
    """``class -> [(param, its other classes, entries)]`` over the parameters (buffers left out)."""

    def build():
        skip, out = set(spec.buffers), {}
        for key, dims in spec.layouts:
            if key in skip:
                continue
            classes = {leaf.cls for tree in dims for leaf in leaves(tree)}
            numel = math.prod(t.size for t in dims)
            for c in classes:
                out.setdefault(c, []).append((key, frozenset(classes - {c}), numel))
        return out

    return derived(spec, "class_tensors", build)


def settled_weight(spec: SymmetrySpec, cls: int, open_classes: set[int]) -> tuple:
    """``(entries per unit, tensors left out)`` of class ``cls`` given the open classes.

    A tensor holding ``cls`` is settled when none of its other classes is open.
    """
    size = next(g.size for g in spec.groups if g.cls == cls)
    settled, left_out = 0, set()
    for key, others, numel in class_tensors(spec).get(cls, ()):
        if others & open_classes:
            left_out.add(key)
        else:
            settled += numel
    return settled / size, left_out


def is_chain(spec: SymmetrySpec, todo: list[ClassPlan]) -> bool:
    """Whether every class sits in at most two tensors of more than one entry per unit.

    That is a chain of layers: the one writing the class and the one reading it
    (biases, norm gains and shifts aside). The settled start is layer-wise matching;
    where a class is read and written by many layers (a residual stream, an attention
    head's query, key, value and output) there is no layer order, and the start
    stays the identity (measured: ``docs/merging.md``).
    """
    table = class_tensors(spec)
    for p in todo:
        group = spec.groups[p.group]
        layers = [key for key, _, numel in table.get(group.cls, ()) if numel > group.size]
        if len(layers) > 2:
            return False
    return True


def settled_start(
    spec: SymmetrySpec, ref: dict, other: dict, todo: list[ClassPlan], unmatched=frozenset()
) -> tuple[list, dict]:
    """``(components, moved other)``: every class in ``todo`` matched once on settled entries.

    Args:
        spec: the :class:`~wsym.group.spec.SymmetrySpec`.
        ref: the reference state dict (float64).
        other: the state dict to move (float64).
        todo: the classes' plans (:func:`wsym.align.matching.plans`); those with
            ``fixed`` count as settled from the start and are not solved.
        unmatched: tensors left out of every score (:mod:`wsym.align.biases`).

    Example:
        >>> import torch, wsym
        >>> from wsym.align.matching import plans
        >>> mlp = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.ReLU(), torch.nn.Linear(5, 2))
        >>> spec = wsym.detect(mlp, torch.randn(2, 3))
        >>> sd = {k: v.double() for k, v in mlp.state_dict().items()}
        >>> moved = spec.act(spec.sample(seed=0, kinds=["permutation"]), sd)
        >>> comps, back = settled_start(spec, sd, moved, plans(spec))
        >>> all(torch.equal(back[k], sd[k]) for k in sd)
        True
    """
    pending = {p.group: p for p in todo if not p.fixed}
    open_classes = {spec.groups[i].cls for i in pending}
    comps: list = []
    current = other
    while pending:
        weights = {i: settled_weight(spec, spec.groups[i].cls, open_classes) for i in pending}
        i = max(pending, key=lambda j: weights[j][0])  # first in spec order on ties
        hidden = weights[i][1] | set(unmatched)
        plan = pending.pop(i)
        ref_units = class_units(spec, without(ref, hidden), plan)
        step = match_class(spec, plan, ref_units, without(current, hidden))
        if step:
            comps.extend(step)
            current = act(spec, GroupElement(tuple(step)), current)
        open_classes.discard(spec.groups[i].cls)
    return comps, current
