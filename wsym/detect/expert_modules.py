"""The expert permutation of experts kept as separate modules (an ``nn.ModuleList``).

``torch.stack([expert(x) for expert in experts], dim)`` puts expert ``e``'s output
at index ``e`` of the stacked axis, and the gates read from the router's row ``e``
weigh it. Renumbering the experts together with the router's rows computes the
same function; no tensor axis carries the expert index, so the group names the
modules (:mod:`wsym.group.kinds.modules`).

:func:`propose` reads it from the traced graph: a ``stack`` of ``E`` values whose
exclusive computations (the nodes only one of them depends on) run the same
operations on parameters of the same shapes, one router of ``E`` rows
(:func:`~wsym.detect.experts.router_weights`) whose output reaches a consumer of
the stack, and that router's rows one class no other group acts on. It is a
candidate like any other: verification keeps it only if it holds.
"""

from __future__ import annotations

import dataclasses

from wsym.detect.experts import router_weights
from wsym.group.layout import class_params
from wsym.group.spec import Group, Leaf, SymmetrySpec, leaves


def propose(spec: SymmetrySpec, traced) -> SymmetrySpec:
    """``spec`` with a ``module_permutation`` candidate per ModuleList mixture of experts."""
    acted = {g.cls for g in spec.groups} | {c for g in spec.groups for c in g.index}
    groups = list(spec.groups)
    for router, modules in expert_modules(traced):
        row = _single(spec.layout.get(router, ()))
        keys = [k for m in modules for k in m]
        if row is None or row.size != len(modules) or row.cls in acted:
            continue
        if not all(k in spec.layout for k in keys):
            continue  # an expert's tensor carries no layout (dead code): nothing to move
        params = tuple(class_params(spec, row.cls)) + tuple(keys)
        groups.append(Group("module_permutation", row.size, 1, params, cls=row.cls, target=modules))
        acted.add(row.cls)
    return dataclasses.replace(spec, groups=tuple(groups))


def _single(dims) -> Leaf | None:
    """The one leaf of a tensor's leading axis, or None."""
    lv = leaves(dims[0]) if dims else []
    return lv[0] if len(lv) == 1 else None


def expert_modules(traced) -> list[tuple[str, tuple[tuple[str, ...], ...]]]:
    """``[(router key, per expert its state-dict keys)]`` for each stack of expert outputs."""
    from wsym.detect.analyze import rule_name

    keys = {**traced.parameters, **traced.buffers}
    routers = _router_nodes(traced, set(router_weights(traced)), rule_name)
    if not routers:  # no top-k routing: nothing to read (most models)
        return []
    out = []
    for node in traced.graph.nodes:
        if node.op != "call_function" or rule_name(node) != "aten::stack":
            continue
        inputs = list(node.args[0])
        modules = _modules(inputs, keys, rule_name)
        if modules is None:
            continue
        reach = set().union(*(_ancestors(u) for u in node.users))
        tied = [r for r, lin in routers.items() if lin in reach and _rows(lin) == len(inputs)]
        if len(tied) == 1:
            out.append((tied[0], modules))
    return out


def _router_nodes(traced, routers: set, rule_name) -> dict:
    """Router key -> the ``linear`` node computing its logits."""
    out = {}
    for node in traced.graph.nodes:
        if node.op == "call_function" and rule_name(node) == "aten::linear":
            key = traced.parameters.get(getattr(node.args[1], "name", None))
            if key in routers:
                out[key] = node
    return out


def _rows(linear) -> int:
    return int(linear.args[1].meta["val"].shape[0])


def _ancestors(node) -> set:
    seen, stack = set(), [node]
    while stack:
        n = stack.pop()
        if n not in seen:
            seen.add(n)
            stack.extend(n.all_input_nodes)
    return seen


def _modules(inputs, keys: dict, rule_name) -> tuple | None:
    """Per input, its exclusive state keys in graph order, where all inputs compute alike."""
    if len(inputs) < 2 or not all(hasattr(n, "all_input_nodes") for n in inputs):
        return None
    anc = [_ancestors(n) for n in inputs]
    mine = [a - set().union(*(b for j, b in enumerate(anc) if j != i)) for i, a in enumerate(anc)]
    order = {n: i for i, n in enumerate(inputs[0].graph.nodes)}
    ops, modules = [], []
    for own in mine:
        nodes = sorted(own, key=order.__getitem__)
        held = [n for n in nodes if n.op == "placeholder" and n.name in keys]
        ops.append(
            [rule_name(n) for n in nodes if n.op == "call_function"]
            + [tuple(n.meta["val"].shape) for n in held]
        )
        modules.append(tuple(keys[n.name] for n in held))
    if not modules[0] or any(o != ops[0] for o in ops):
        return None
    return tuple(modules)
