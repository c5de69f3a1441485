"""One group per expert: splitting a class shared by the experts of a stacked tensor.

A mixture of experts that stacks its experts in one tensor (Mixtral's
``gate_up_proj (E, 2F, D)`` and ``down_proj (E, D, F)``, read by ``grouped_mm``
or a batched matmul) gives its hidden units one class: the rules couple the
``F`` axis of every expert alike, and the expert axis ``E`` is fixed (which
expert reads a token is routing data). What holds is more: expert ``e``'s hidden
units can be permuted, rescaled and flipped on their own, one ``S_F x (R+)^F x
Z2^F`` per expert, since expert ``e``'s output reads only slice ``e`` of each tensor.

:func:`split_experts` proposes that refinement where the layout allows it:
every tensor holding the class is at least 3-D and led by an axis of size ``E``
that nothing permutes or mixes (the expert axis), and no buffer holds the class.
(a scaling of whole experts may act on it: it is then dropped, as the per-expert
scaling holds it). Those expert axes are merged into one class ``X`` and the group becomes one
copy per value of ``X`` (``index=(X,)``, ``count=E``). The proposal is a
candidate like any other: :func:`verified_split` keeps it only if it verifies
and falls back to the shared group (one element for every expert) otherwise.
"""

from __future__ import annotations

import dataclasses

import torch

from wsym.group.kinds import kind_of
from wsym.group.layout import block_plan, class_params, plan_leaves
from wsym.group.spec import Group, Leaf, SymmetrySpec, leaves


def split_experts(spec: SymmetrySpec, routers=None) -> tuple[SymmetrySpec, dict[int, Group]]:
    """``(spec with per-expert groups, {group position: the shared group it replaces})``.

    ``routers``: router weight -> the expert weights it routes to (:func:`router_weights`);
    with one router of ``E`` rows for the experts, the expert permutation ``S_E``
    (the experts' slices and the router's rows together) is proposed too.
    """
    routers = routers or {}
    mixed = {g.cls for g in spec.groups if not kind_of(g).diagonal}
    mixed |= {c for g in spec.groups for c in g.index}
    merge: dict[int, int] = {}  # expert-axis class -> the merged class
    fresh = 1 + max((leaf.cls for _, dims in spec.layouts for t in dims for leaf in leaves(t)))
    groups, shared, experts = list(spec.groups), {}, {}
    for i, g in enumerate(spec.groups):
        if not (kind_of(g).permutes or _per_unit(g)) or g.index:
            continue
        axes = _expert_axes(spec, g.cls, mixed)
        if axes is None:
            continue
        size, classes = axes
        target = next((merge[c] for c in classes if c in merge), None)
        if target is None:
            target, fresh = fresh, fresh + 1
        merge.update(dict.fromkeys(classes, target))
        experts[target] = size
        groups[i] = dataclasses.replace(g, count=size * g.count, index=(target,))
        shared[i] = g
    if not shared:
        return spec, {}
    acted = {g.cls for g in spec.groups} | {c for g in spec.groups for c in g.index}
    for target, size in experts.items():
        rows = [_single(spec.layout[r][0]) for r in _routers_of(spec, routers, merge, target)]
        rows = [leaf for leaf in rows if leaf is not None and leaf.size == size]
        if len(rows) == 1 and rows[0].cls not in acted:
            merge[rows[0].cls] = target
            groups.append(Group("permutation", size, 1, (), cls=target))
    layouts = tuple((p, tuple(_relabel(t, merge) for t in dims)) for p, dims in spec.layouts)
    relabelled = dataclasses.replace(spec, layouts=layouts)
    groups = [_moved_class(g, merge) for g in groups]  # a scaling of whole experts
    groups = [  # the expert permutation: the parameters its class labels
        g if g.params else dataclasses.replace(g, params=tuple(class_params(relabelled, g.cls)))
        for g in groups
    ]
    out = dataclasses.replace(
        relabelled, groups=tuple(groups), notes=_notes(spec, layouts, experts)
    )
    keep = [i for i, g in enumerate(out.groups) if not _contained(out, g)]
    shared = {keep.index(i): g for i, g in shared.items()}
    return dataclasses.replace(out, groups=tuple(out.groups[i] for i in keep)), shared


def _routers_of(spec: SymmetrySpec, routers: dict, merge: dict, target: int) -> list[str]:
    """The router of the experts on class ``target``.

    The one whose ``grouped_mm`` reads them, else (no router is tied to its
    experts in the graph) the only router there is.
    """
    held = {p for c, t in merge.items() if t == target for p in class_params(spec, c)}
    tied = [r for r, experts in routers.items() if experts & held and r in spec.layout]
    if tied or any(routers.values()):
        return tied
    return [r for r in routers if r in spec.layout]


def _notes(spec: SymmetrySpec, layouts, experts: dict) -> tuple:
    """The notes, with each expert axis saying what its groups are (routing is not read)."""
    axes = {
        (p, d)
        for p, dims in layouts
        for d, t in enumerate(dims)
        if (leaf := _single(t)) is not None and leaf.cls in experts
    }
    text = (
        "expert axis: one group per expert on the other axes; permuting the experts "
        "(with the router's rows) is proposed and kept only if it verifies"
    )
    kept = tuple(n for n in spec.notes if (n[0], n[1]) not in axes or "permutation" not in n[2])
    return kept + tuple((p, d, text) for p, d in sorted(axes))


def _moved_class(g: Group, merge: dict[int, int]) -> Group:
    return dataclasses.replace(
        g, cls=merge.get(g.cls, g.cls), index=tuple(merge.get(c, c) for c in g.index)
    )


def router_weights(traced) -> dict[str, frozenset]:
    """Router weights ``W`` whose ``linear(x, W)`` a ``topk`` ranks, each with its experts.

    Read from the traced graph: from each ``topk`` back through softmax, sigmoid
    and casts to a ``linear`` whose weight is a parameter (a recorded pass has
    ``mm`` of its transpose). Its experts are the
    weights of the ``grouped_mm`` calls whose offsets come from that ``topk``
    (walking back through integer ops and casts only); empty where none does.
    """
    from wsym.detect.analyze import rule_name

    routers = {}
    for node in traced.graph.nodes:
        if node.op == "call_function" and rule_name(node) == "aten::topk":
            src = _back(node.args[0], THROUGH, rule_name)
            w = _weight_of(src, rule_name)
            if w is not None:
                key = traced.parameters.get(getattr(w, "name", None))
                if key is not None:
                    routers[node.name] = (key, set())
    for node in traced.graph.nodes:
        if node.op == "call_function" and rule_name(node) in GROUPED and len(node.args) > 2:
            w = _back(node.args[1], VIEWS, rule_name)
            top = _routing_source(node.args[2], rule_name)
            if top in routers and getattr(w, "name", None) in traced.parameters:
                routers[top][1].add(traced.parameters[w.name])
    return {key: frozenset(experts) for key, experts in routers.values()}


THROUGH = ("aten::softmax", "aten::_softmax", "aten::sigmoid", "aten::_to_copy", "aten::clone")
VIEWS = (
    "aten::transpose",
    "aten::t",
    "aten::permute",
    "aten::view",
    "aten::reshape",
    "aten::alias",
)
CASTS = ("aten::_to_copy", "aten::to", "_operator::getitem", "aten::histc")  # ids as floats
GROUPED = ("aten::_grouped_mm", "transformers::grouped_mm_fallback")


def _weight_of(node, rule_name):
    """The weight ``W`` of ``linear(x, W)``, recorded as ``linear`` or as ``mm(x, t(W))``."""
    if not _is_call(node):
        return None
    if rule_name(node) == "aten::linear":
        return node.args[1]
    w = node.args[1] if rule_name(node) == "aten::mm" else None
    return w.args[0] if _is_call(w) and rule_name(w) == "aten::t" else None


def _is_call(node) -> bool:
    return getattr(node, "op", None) == "call_function"


def _back(node, through, rule_name):
    while _is_call(node) and rule_name(node) in through:
        node = node.args[0]
    return node


def _routing_source(offsets, rule_name) -> str | None:
    """The one ``topk`` the offsets are computed from (integer ops and casts between)."""
    seen, stack, found = set(), [offsets], set()
    while stack:
        node = stack.pop()
        if not _is_call(node) or node.name in seen:
            continue
        seen.add(node.name)
        if rule_name(node) == "aten::topk":
            found.add(node.name)
            continue
        val = node.meta.get("val")
        vals = val if isinstance(val, list | tuple) else [val]
        integer = all(not getattr(v, "is_floating_point", lambda: True)() for v in vals)
        if integer or rule_name(node) in CASTS:
            stack.extend(node.all_input_nodes)
    return found.pop() if len(found) == 1 else None


def _contained(spec: SymmetrySpec, h: Group) -> bool:
    """Whether ``h`` (a scaling or sign of whole experts) is a per-expert group's constant value.

    Checked exactly on random tensors shaped as the spec's: ``h`` at ``v`` acts as
    the per-expert group at ``v`` repeated over each expert's units.
    """
    if h.index or not _per_unit(h):
        return False
    gen = torch.Generator().manual_seed(0)
    for g in spec.groups:
        if g.kind != h.kind or g.index != (h.cls,) or not set(h.params) <= set(g.params):
            continue
        k = kind_of(g)
        state = {
            p: torch.randn(_shape(spec, p), generator=gen, dtype=torch.float64) for p in g.params
        }
        v = k.sample(spec, h, gen, (0.5, 2))
        mine = k.act(spec, h, v, state)
        theirs = k.act(spec, g, v.unsqueeze(-1).expand(-1, g.size), state)
        if all(torch.equal(mine[p], theirs[p]) for p in h.params) and all(
            torch.equal(theirs[p], state[p]) for p in set(g.params) - set(h.params)
        ):
            return True
    return False


def _shape(spec: SymmetrySpec, key: str) -> tuple[int, ...]:
    return tuple(t.size for t in spec.layout[key])


def _expert_axes(spec: SymmetrySpec, cls: int, mixed: set) -> tuple[int, set] | None:
    """``(E, classes of the expert axes)`` if every tensor of ``cls`` is stacked, else None.

    Stacked: at least 3-D, led by one axis of another class that nothing permutes
    or mixes (``mixed``), held once by every block that holds ``cls``.
    """
    if set(class_params(spec, cls, with_buffers=True)) != set(class_params(spec, cls)):
        return None  # a buffer (running statistics) holds the class: left shared
    sizes, classes = set(), set()
    for p in class_params(spec, cls):
        lead = _single(spec.layout[p][0])
        if len(spec.layout[p]) < 3 or lead is None or lead.cls in mixed | {cls} or lead.size < 2:
            return None
        for lv in plan_leaves(block_plan(spec, p)):
            if any(leaf.cls == cls for leaf in lv) and sum(x.cls == lead.cls for x in lv) != 1:
                return None
        sizes.add(lead.size)
        classes.add(lead.cls)
    return (sizes.pop(), classes) if len(sizes) == 1 else None


def _single(tree) -> Leaf | None:
    """The leaf of an axis that is one leaf (possibly wrapped in a one-child product)."""
    lv = leaves(tree)
    return lv[0] if len(lv) == 1 else None


def _relabel(tree, merge: dict[int, int]):
    if isinstance(tree, Leaf):
        return dataclasses.replace(tree, cls=merge.get(tree.cls, tree.cls))
    return dataclasses.replace(tree, children=tuple(_relabel(c, merge) for c in tree.children))


def verified_split(spec: SymmetrySpec, verify, routers=None) -> SymmetrySpec:
    """``verify(candidates)`` with per-expert groups, falling back to shared ones that fail.

    ``verify`` is :func:`wsym.detect.verify_candidates` bound to the model and inputs;
    ``routers`` as in :func:`split_experts` (an expert permutation that fails is dropped).
    """
    split, shared = split_experts(spec, routers)
    if not shared:
        return verify(spec)
    checked = verify(split)
    kept = {(g.kind, g.cls, g.index) for g in checked.groups}
    failed = [
        i
        for i, g in enumerate(split.groups)
        if i in shared and (g.kind, g.cls, g.index) not in kept
    ]
    if not failed:
        return checked
    groups = [shared[i] if i in failed else g for i, g in enumerate(split.groups)]
    return verify(dataclasses.replace(split, groups=tuple(groups)))


def _per_unit(g: Group) -> bool:
    """A scaling or sign group (one factor per unit; not a BatchNorm input's norm scaling)."""
    kind = kind_of(g)
    return kind.diagonal and not kind.one_sided
