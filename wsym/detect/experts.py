"""One group per expert: splitting a class shared by the experts of a stacked tensor.

A mixture of experts that stacks its experts in one tensor (Mixtral's
``gate_up_proj (E, 2F, D)`` and ``down_proj (E, D, F)``, read by ``grouped_mm``
or a batched matmul) gives its hidden units one class: the rules couple the
``F`` axis of every expert alike, and the expert axis ``E`` is fixed (which
expert reads a token is routing data). What holds is more: expert ``e``'s hidden
units can be permuted, rescaled and flipped on their own, one ``S_F x (R+)^F x
Z2^F`` per expert, since expert ``e``'s output reads only slice ``e`` of each tensor.

:func:`split_experts` proposes that refinement where the layout allows it:
every parameter block holding the class also holds exactly one axis of size
``E`` that no group acts on (the expert axis), and no buffer holds the class.
Those expert axes are merged into one class ``X`` and the group becomes one
copy per value of ``X`` (``index=(X,)``, ``count=E``). The proposal is a
candidate like any other: :func:`verified_split` keeps it only if it verifies
and falls back to the shared group (one element for every expert) otherwise.
"""

from __future__ import annotations

import dataclasses

from wsym.group.layout import block_plan, class_params, plan_leaves
from wsym.group.spec import Group, Leaf, Split, SymmetrySpec, leaves

SPLITTABLE = ("permutation", "scaling", "sign")


def split_experts(spec: SymmetrySpec) -> tuple[SymmetrySpec, dict[int, Group]]:
    """``(spec with per-expert groups, {group position: the shared group it replaces})``."""
    acted = {g.cls for g in spec.groups} | {c for g in spec.groups for c in g.index}
    merge: dict[int, int] = {}  # expert-axis class -> the merged class
    fresh = 1 + max((leaf.cls for _, dims in spec.layouts for t in dims for leaf in leaves(t)))
    groups, shared = list(spec.groups), {}
    for i, g in enumerate(spec.groups):
        if g.kind not in SPLITTABLE or g.index:
            continue
        axes = _expert_axes(spec, g.cls, acted)
        if axes is None:
            continue
        size, classes = axes
        target = next((merge[c] for c in classes if c in merge), None)
        if target is None:
            target, fresh = fresh, fresh + 1
        merge.update(dict.fromkeys(classes, target))
        groups[i] = dataclasses.replace(g, count=size * g.count, index=(target,))
        shared[i] = g
    if not shared:
        return spec, {}
    layouts = tuple((p, tuple(_relabel(t, merge) for t in dims)) for p, dims in spec.layouts)
    return dataclasses.replace(spec, groups=tuple(groups), layouts=layouts), shared


def _expert_axes(spec: SymmetrySpec, cls: int, acted: set) -> tuple[int, set] | None:
    """``(E, classes of the expert axes)`` if every block of ``cls`` holds one, else None."""
    if set(class_params(spec, cls, with_buffers=True)) != set(class_params(spec, cls)):
        return None  # a buffer (running statistics) holds the class: left shared
    sizes, classes, stacked = set(), set(), False
    for p in class_params(spec, cls):
        dims = [_single(t) for t in spec.layout[p]]
        plain = [
            t.cls for t in dims if t is not None and t.cls != cls and t.cls not in acted and t.size > 1
        ]
        if len(plain) != 1 or dims[0] is None or dims[0].cls != plain[0]:
            return None  # the expert axis leads: (E, ...) as stacked experts are stored
        stacked = stacked or len(dims) >= 3
        for lv in plan_leaves(block_plan(spec, p)):
            if any(leaf.cls == cls for leaf in lv) and sum(x.cls == plain[0] for x in lv) != 1:
                return None
        sizes.add(dims[0].size)
        classes.add(plain[0])
    return (sizes.pop(), classes) if len(sizes) == 1 and stacked else None


def _single(tree) -> Leaf | None:
    """The leaf of an axis that is one leaf (possibly wrapped in a one-child product)."""
    lv = leaves(tree)
    return lv[0] if len(lv) == 1 else None


def _relabel(tree, merge: dict[int, int]):
    if isinstance(tree, Leaf):
        return dataclasses.replace(tree, cls=merge.get(tree.cls, tree.cls))
    return Split(tree.mode, tuple(_relabel(c, merge) for c in tree.children))


def verified_split(spec: SymmetrySpec, verify) -> SymmetrySpec:
    """``verify(candidates)`` with per-expert groups, falling back to shared ones that fail.

    ``verify`` is :func:`wsym.detect.verify_candidates` bound to the model and inputs.
    """
    split, shared = split_experts(spec)
    if not shared:
        return verify(spec)
    checked = verify(split)
    kept = {(g.kind, g.cls, g.index) for g in checked.groups}
    failed = [
        i for i, g in enumerate(split.groups) if i in shared and (g.kind, g.cls, g.index) not in kept
    ]
    if not failed:
        return checked
    groups = [shared[i] if i in failed else g for i, g in enumerate(split.groups)]
    return verify(dataclasses.replace(split, groups=tuple(groups)))
