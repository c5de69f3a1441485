"""From an analysed graph to candidate groups: classes, kinds, exponents, indices."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace

from wsym.detect.context import Context, Dep
from wsym.detect.explain import notes
from wsym.detect.nullspace import nullspace, row_basis
from wsym.detect.tracing.export import Traced
from wsym.group.kinds import GL, Scaling, Sign, kind_of
from wsym.group.spec import Group, Leaf, Split, SymmetrySpec


@dataclass
class ClassInfo:
    """What the analysis learned about one leaf atom class."""

    size: int
    blocked: str | None = None
    breaks: set = field(default_factory=set)
    conflict: bool = False
    params: set = field(default_factory=set)


class Structure:
    """Leaf expansion of every occurrence, with inherited blocks and marks."""

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.atoms = ctx.atoms
        self.merged = ctx.merged  # class root -> Relabel (wsym.detect.relabel)
        self.info: dict[int, ClassInfo] = {}
        self._canon: dict[int, tuple] = {}
        self._leaves: dict[int, list] = {}
        self._pinned: dict | None = None
        self._events: list | None = None

    def events(self) -> list[tuple[set, set]]:
        """``(contracted classes, present classes)`` of every contraction or reduction event.

        Found once: every GL or orthogonal class reads them all (:func:`_index_classes`).
        """
        if self._events is None:
            self._events = [
                (
                    {r for a in atoms for _, r, _ in self.leaves(a)},
                    {r for a in present for _, r, _ in self.leaves(a)},
                )
                for atoms, present in self.ctx.events
            ]
        return self._events

    def canon(self, a: int) -> tuple:
        """Occurrence key of atom ``a``: (base atom, path of sub-axis indices)."""
        if a not in self._canon:
            owner = self.ctx.owner.get(a)
            if owner is None:
                self._canon[a] = (a, ())
            else:
                base, path = self.canon(owner[0])
                self._canon[a] = (base, (*path, owner[1]))
        return self._canon[a]

    def pinned(self, cls: int) -> list[dict]:
        """``{occurrence key: 1}`` for every leaf of class ``cls`` under a pinned atom.

        The leaves of all pinned atoms are expanded once (a DenseNet has
        thousands of classes and pinned atoms).
        """
        if self._pinned is None:
            self._pinned = {}
            for a in self.ctx.atoms.pinned:
                for k, r, _ in self.leaves(a):
                    self._pinned.setdefault(r, []).append(k)
        return [{k: 1} for k in self._pinned.get(cls, [])]

    def leaves(self, a: int) -> list[tuple[tuple, int, int]]:
        """``(occurrence key, leaf class, parity)`` for every leaf under atom ``a`` (read only).

        Walked once per atom: the atoms no longer change, and the walk's marks on the
        classes' info are the same every time.
        """
        if a not in self._leaves:
            out: list = []
            self._walk(a, self.canon(a), 0, None, frozenset(), False, out)
            self._leaves[a] = out
        return self._leaves[a]

    def _walk(self, a, key, parity, blocked, breaks, conflict, out) -> None:
        r, p = self.atoms.find(a)
        parity ^= p
        blocked = blocked or self.atoms.blocked.get(r)
        breaks = breaks | self.atoms.breaks.get(r, set())
        conflict = conflict or r in self.atoms.conflict
        split = self.atoms.split.get(r)
        if split is None and r in self.merged:  # a shuffle's output: its input's classes
            r, parity = self.target(r, parity)
            blocked = blocked or self.atoms.blocked.get(r)
            breaks = breaks | self.atoms.breaks.get(r, set())
            conflict = conflict or r in self.atoms.conflict
            split = self.atoms.split.get(r)
        if split is None:
            info = self.info.setdefault(r, ClassInfo(size=self.atoms.size[r]))
            info.blocked = info.blocked or blocked
            info.breaks |= breaks
            info.conflict = info.conflict or conflict
            out.append((key, r, parity))
            return
        for i, c in enumerate(split[1]):
            self._walk(c, (key[0], (*key[1], i)), parity, blocked, breaks, conflict, out)

    def target(self, r: int, parity: int = 0) -> tuple[int, int]:
        """The class root an unsplit class root ``r`` is merged into, and the parity there."""
        m = self.merged.get(r)
        return (r, parity) if m is None else (m.target, parity ^ m.parity)

    def relabeled(self, a: int) -> bool:
        """Whether occurrence ``a`` sees its class through a relabeling (a shuffle's output)."""
        return self.atoms.root(a) in self.merged

    def tree(self, a: int, var_ids: dict) -> Leaf | Split:
        """Layout tree of atom ``a`` (for parameters)."""
        return self._tree(a, self.canon(a), 0, var_ids)

    def _tree(self, a, key, parity, var_ids):
        r, p = self.atoms.find(a)
        parity ^= p
        split = self.atoms.split.get(r)
        units = self.merged[r].units if split is None and r in self.merged else ()
        if units:  # a shuffle's output: its input's classes, relabeled
            r, parity = self.target(r, parity)
            split = self.atoms.split.get(r)
        if split is None:
            var = var_ids.setdefault(key, len(var_ids))
            return Leaf(cls=r, size=self.atoms.size[r], parity=parity, var=var, relabel=units)
        return Split(
            split[0],
            tuple(
                self._tree(c, (key[0], (*key[1], i)), parity, var_ids)
                for i, c in enumerate(split[1])
            ),
            relabel=units,
        )


def _factors(layout) -> list[int]:
    out = []
    for dim in layout:
        for f in dim:
            out.extend(a for p in f.parts for a in p) if isinstance(f, Dep) else out.append(f)
    return out


MAX_BLOCKS = 512


def _alternatives(st: Structure, a: int) -> list[list[int]]:
    """Leaf classes along each branch of the cat splits under atom ``a``."""
    r = st.atoms.root(a)
    if r in st.merged:  # a shuffle's output: its input's classes
        r = st.merged[r].target
    split = st.atoms.split.get(r)
    if split is None:
        return [[r]]
    subs = [_alternatives(st, c) for c in split[1]]
    if split[0] == "cat":
        return [alt for sub in subs for alt in sub]
    out = [[]]
    for sub in subs:
        out = [x + y for x in out for y in sub][:MAX_BLOCKS]
    return out


def _factor_alternatives(st: Structure, f) -> list[list[int]]:
    if not isinstance(f, Dep):
        return _alternatives(st, f)
    out = []
    for part in f.parts:  # one part per index of the key axis: alternatives, like cat branches
        alts = [[]]
        for a in part:
            alts = [x + y for x in alts for y in _alternatives(st, a)][:MAX_BLOCKS]
        out.extend(alts)
    return out


def _blocks(st: Structure, layout) -> list[list[int]]:
    """Leaf classes of each block of a tensor (one cat branch chosen per axis)."""
    out = [[]]
    factors = [f for dim in layout for f in dim]
    for f in factors:
        out = [x + y for x in out for y in _factor_alternatives(st, f)]
        if len(out) > MAX_BLOCKS:  # too many: one bag, which only removes index candidates
            return [[c for g in factors for alt in _factor_alternatives(st, g) for c in alt]]
    return out


def solve(ctx: Context, traced: Traced, state_keys: dict[str, str]) -> SymmetrySpec:
    """Candidate groups (not yet verified) of the analysed graph.

    Args:
        ctx: the analysis context.
        traced: the traced graph.
        state_keys: placeholder name -> state-dict key for parameters and buffers.
    """
    st = Structure(ctx)
    tensors = []  # leaf classes of each block (cat branch) of each tensor
    for lay in ctx.layouts.values():
        for sub in lay if isinstance(lay, tuple) else [lay]:
            for a in _factors(sub):
                st.leaves(a)  # registers class info
            tensors.extend(_blocks(st, sub))
    var_ids: dict = {}
    layouts = _Layouts()
    param_vars = _ParamVars()  # occurrence key -> leaf class, for state-dict entries
    nodes = {n.name: n for n in traced.graph.nodes}
    for ph, key in state_keys.items():
        lay = ctx.layouts[ph]
        shape = tuple(nodes[ph].meta["val"].shape)
        dims = tuple(
            Split("prod", tuple(st.tree(a, var_ids) for a in dim)) if n else Split("cat", ())
            for dim, n in zip(lay, shape, strict=True)
        )
        layouts.append((key, dims))
        for dim in lay:
            for a in dim:
                for k, r, _ in st.leaves(a):
                    param_vars[k] = r
                    st.info[r].params.add(key)
    rows = _relation_rows(ctx, st)
    groups = []
    for cls, info in sorted(st.info.items()):
        if not info.params or info.size <= 1:
            continue
        groups.extend(
            _class_groups(
                ctx, st, cls, info, tensors, rows, param_vars, var_ids, layouts, state_keys
            )
        )
    # a diagonal scale or sign along a head axis is a scalar inside that head's GL block
    gl_index = {c for g in groups if type(kind_of(g)) is GL for c in g.index}
    groups = [g for g in groups if not (type(kind_of(g)) in (Scaling, Sign) and g.cls in gl_index)]
    groups.extend(_translations(ctx, st, traced, state_keys, layouts))
    why = notes(ctx, st, groups, layouts)
    sites = _activation_sites(ctx, st, traced)
    groups, layouts, ids = _renumber(groups, layouts)
    buffers = tuple(state_keys[ph] for ph in traced.buffers if ph in state_keys)
    sites = tuple(
        sorted((ids[c], name, d) for c, found in sites.items() if c in ids for name, d in found)
    )
    return SymmetrySpec(
        groups=tuple(groups),
        layouts=tuple(layouts),
        buffers=buffers,
        sites=sites,
        warnings=tuple(ctx.warnings),
        notes=why,
    )


def _activation_sites(ctx: Context, st: Structure, traced: Traced) -> dict:
    """Per leaf class, every activation with the most samples whose axis is exactly that class.

    A residual stream has one such site per block (each sum into the stream);
    activation matching sums their correlations. Only values computed from the
    model's inputs are activations (a weight's transpose is not).
    """
    best: dict = {}
    fed = set(traced.inputs)
    for node in traced.graph.nodes:
        if any(s.name in fed for s in node.all_input_nodes):
            fed.add(node.name)
        lay = ctx.layouts.get(node.name)
        val = node.meta.get("val")
        if node.op != "call_function" or not isinstance(lay, list) or not hasattr(val, "shape"):
            continue
        if node.name not in fed:
            continue
        if not val.dtype.is_floating_point:
            continue
        for d, dim in enumerate(lay):
            if len(dim) != 1 or isinstance(dim[0], Dep) or st.relabeled(dim[0]):
                continue  # a shuffled axis holds its class's units out of order
            found = st.leaves(dim[0])
            if len(found) == 1 and st.atoms.size[found[0][1]] == val.shape[d]:
                cls, numel = found[0][1], val.numel()
                if cls not in best or numel > best[cls][0]:
                    best[cls] = (numel, [])
                if numel == best[cls][0]:
                    best[cls][1].append((node.name, d))
    return {c: sites for c, (_, sites) in best.items()}


def _renumber(groups: list[Group], layouts: list) -> tuple[list[Group], list, dict]:
    """Number classes 0, 1, ... in state-dict order; order groups by their first parameter."""
    ids: dict[int, int] = {}
    for _, dims in layouts:
        for t in dims:
            for leaf in _leaves(t):
                ids.setdefault(leaf.cls, len(ids))

    def tree(t):
        if isinstance(t, Leaf):
            return replace(t, cls=ids[t.cls])
        return replace(t, children=tuple(tree(c) for c in t.children))

    new_layouts = [(p, tuple(tree(t) for t in dims)) for p, dims in layouts]
    order = {p: i for i, (p, _) in enumerate(layouts)}
    new_groups = []
    for g in groups:
        g = replace(g, params=tuple(sorted(g.params, key=order.__getitem__)))
        if kind_of(g).additive:
            key, sig, mode = g.target
            sig = tuple(sorted((ids[c], p) for c, p in sig if c in ids))
            new_groups.append(replace(g, target=(key, sig, mode)))
        else:
            new_groups.append(replace(g, cls=ids[g.cls], index=tuple(ids[c] for c in g.index)))
    kinds = ("gl", "orthogonal", "permutation", "scaling", "norm_scaling", "sign", "translation")
    new_groups.sort(key=lambda g: (order[g.params[0]], g.cls, kinds.index(g.kind)))
    return new_groups, new_layouts, ids


def _relation_rows(ctx: Context, st: Structure) -> dict:
    """Expanded exponent rows per (system, leaf class)."""
    rows: dict = {}
    for system, _, atoms, coefs in ctx.relations:
        expansions = [st.leaves(a) for a in atoms]
        if len({len(e) for e in expansions}) != 1:
            for e in expansions:
                for _, r, _ in e:
                    st.info[r].conflict = True
            continue
        for leaves in zip(*expansions, strict=True):
            row: dict = {}
            for (k, _, _), c in zip(leaves, coefs, strict=True):
                row[k] = row.get(k, 0) + c
            rows.setdefault((system, leaves[0][1]), []).append(row)
    return rows


def _class_groups(
    ctx, st, cls, info, tensors, rows, param_vars, var_ids, layouts, state_keys
) -> list[Group]:
    params = tuple(sorted(info.params))
    if info.blocked:  # no permutation or mixing; diagonal groups that leave pinned axes alone
        pinned = st.pinned(cls)
        args = (ctx, cls, info, rows, param_vars, var_ids, layouts, state_keys)
        return _diagonal_groups(*args, pinned)
    if "gl" not in info.breaks and not info.conflict:
        index = _index_classes(ctx, st, cls, tensors)
        count = 1
        for c in index:
            count *= st.info[c].size
        return [Group("gl", info.size, count, params, cls=cls, index=index)]
    if "orth" not in info.breaks:
        index = _index_classes(ctx, st, cls, tensors)
        count = 1
        for c in index:
            count *= st.info[c].size
        special = "reflection" in info.breaks
        return [
            Group("orthogonal", info.size, count, params, cls=cls, index=index, special=special)
        ]
    groups = [Group("permutation", info.size, 1, params, cls=cls)]
    return groups + _diagonal_groups(
        ctx, cls, info, rows, param_vars, var_ids, layouts, state_keys, []
    )


def _diagonal_groups(
    ctx, cls, info, rows, param_vars, var_ids, layouts, state_keys, extra
) -> list[Group]:
    """Scaling and sign groups of a class: the nullspaces of its exponent relations."""
    groups = []
    for system, modulus in (("scale", None), ("sign", 2)):
        class_rows = rows.get((system, cls), []) + extra
        own = param_vars.by_class.get(cls, set())
        variables = sorted({k for row in class_rows for k in row} | own, key=str)
        basis = nullspace(variables, class_rows, modulus)
        projected = [{k: x for k, x in v.items() if k in own} for v in basis]
        for vec in row_basis([v for v in projected if v], modulus):
            group = _diagonal_group(ctx, system, cls, info, vec, var_ids, layouts, state_keys)
            if group is not None:
                groups.append(group)
    return groups


class _ParamVars(dict):
    """Occurrence key -> leaf class, with the inverse index (built once, on first use)."""

    @functools.cached_property
    def by_class(self) -> dict:
        out: dict = {}
        for k, r in self.items():
            out.setdefault(r, set()).add(k)
        return out


class _Layouts(list):
    """``[(state key, layout trees)]`` with derived maps built once, on first use."""

    @functools.cached_property
    def var_param(self) -> dict:
        return {leaf.var: p for p, dims in self for t in dims for leaf in _leaves(t)}

    @functools.cached_property
    def leaf_classes(self) -> dict:
        return {p: [leaf.cls for t in dims for leaf in _leaves(t)] for p, dims in self}


def _one_block(layouts: _Layouts, key: str, cls: int) -> bool:
    """Whether ``key`` (a running variance) is one leaf, of class ``cls``.

    Not so after a cat split (two halves of the class) or a product split (a
    grouped convolution's ``(groups, channels)``): the correction would be wrong.
    """
    return layouts.leaf_classes[key] == [cls]


def _diagonal_group(ctx, system, cls, info, vec, var_ids, layouts, state_keys) -> Group | None:
    """The group of one exponent vector, or None where its action cannot be written.

    A BatchNorm weight correction is applied along the whole class: a running
    variance that is not one leaf of the class (two cat halves that move
    differently, a product split) cannot be corrected, and the group is left out
    (conservative).
    """
    exps = dict(sorted((var_ids[k], int(x)) for k, x in vec.items()))
    var_param = layouts.var_param
    params = tuple(sorted({var_param[v] for v in exps}))
    if system == "sign":
        return Group("sign", info.size, 1, params, cls=cls, exponents=tuple(exps.items()))
    per_param: dict = {}  # the exponents summed per parameter
    for v, x in exps.items():
        per_param[var_param[v]] = per_param.get(var_param[v], 0) + x
    corrections = []
    for w, rv, _, eps in ctx.bn_corrections:
        u2 = per_param.get(state_keys[rv], 0)
        if u2:
            if not _one_block(layouts, state_keys[rv], cls):
                return None
            corrections.append((state_keys[w], state_keys[rv], float(eps), u2 // 2))
    kind = "norm_scaling" if corrections else "scaling"
    params = tuple(sorted(set(params) | {c[0] for c in corrections}))
    return Group(
        kind,
        info.size,
        1,
        params,
        cls=cls,
        exponents=tuple(exps.items()),
        corrections=tuple(corrections),
    )


def _leaves(t):
    if isinstance(t, Leaf):
        return [t]
    return [leaf for c in t.children for leaf in _leaves(c)]


def _index_classes(ctx, st, cls, tensors) -> tuple[int, ...]:
    """Index classes of a GL/orthogonal class ``cls``: a transform may vary along them.

    They are present exactly once beside ``cls`` in every block that holds it,
    and never contracted or reduced without it (heads for per-head GL).
    """
    common = None
    for classes in tensors:
        if cls not in classes:
            continue
        once = {c for c in classes if classes.count(c) == 1 and c != cls}
        common = once if common is None else common & once
    common = common or set()
    for contracted, present in st.events() if common else ():
        if cls not in contracted and cls in present:
            common -= contracted
    return tuple(sorted(c for c in common if st.info[c].size > 1))


def _translations(ctx, st, traced, state_keys, layouts) -> list[Group]:
    from wsym.detect.translation import translation_groups

    return translation_groups(ctx, st, traced, state_keys, layouts)
