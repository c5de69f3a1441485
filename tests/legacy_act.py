"""The element layer as it was before the kind classes (wsym.group.kinds): a frozen oracle.

Kept verbatim but for the memo (computed afresh here, so that the spec stays
untouched), so that tests can check that the kind classes sample the same
elements from the same seeds and act bit for bit as before.

Group elements: sampling, inversion and exact action on state dicts.

An element is an ordered list of components ``(group index, value)``; acting
applies them in order, the inverse applies the inverted components in reverse
order, so ``act(inverse(g), act(g, sd)) == sd`` up to round-off for every spec.
"""

from __future__ import annotations

import math
import string
from dataclasses import dataclass

import torch

from wsym.errors import WsymInputError
from wsym.group.spec import Group, Leaf, Split, SymmetrySpec, leaves


@dataclass(frozen=True)
class GroupElement:
    """An element of the product group, as ordered components ``(group index, value)``."""

    components: tuple[tuple[int, object], ...]
    inverted: tuple[bool, ...] = ()

    def inverse(self) -> GroupElement:
        """The inverse element."""
        inv = self.inverted or (False,) * len(self.components)
        return GroupElement(tuple(reversed(self.components)), tuple(not f for f in reversed(inv)))

    def parts(self):
        """``(group index, value, inverted)`` in the order they act."""
        inv = self.inverted or (False,) * len(self.components)
        return [(i, v, f) for (i, v), f in zip(self.components, inv, strict=True)]


def _index_sizes(spec: SymmetrySpec, group: Group) -> list[int]:
    sizes = {}
    for _, dims in spec.layouts:
        for t in dims:
            for leaf in leaves(t):
                sizes[leaf.cls] = leaf.size
    return [sizes[c] for c in group.index]


def _random_orthogonal(shape, n, gen, special: bool = False) -> torch.Tensor:
    a = torch.randn(*shape, n, n, generator=gen, dtype=torch.float64)
    q, r = torch.linalg.qr(a)
    q = q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)
    if special:  # flip one column where the determinant is -1
        det = torch.linalg.det(q)
        q[..., :, 0] = q[..., :, 0] * det.sign().unsqueeze(-1)
    return q


def _log_uniform(shape, scale, gen) -> torch.Tensor:
    lo, hi = math.log(scale[0]), math.log(scale[1])
    return torch.exp(lo + (hi - lo) * torch.rand(tuple(shape), generator=gen, dtype=torch.float64))


def sample_group(
    spec: SymmetrySpec, i: int, gen: torch.Generator, scale=(1e-2, 1e2), moving: bool = False
):
    """A random value for group ``i`` (uniform permutations, log-uniform scales).

    With ``moving`` (for verification), permutations are random n-cycles, so that
    every unit moves, and sign vectors flip at least one unit.
    """
    g = spec.groups[i]
    n = g.size
    if g.kind == "permutation":
        perm = torch.randperm(n, generator=gen)
        if not moving:
            return perm
        cycle = torch.empty_like(perm)
        cycle[perm] = perm.roll(-1)
        return cycle
    if g.kind in ("scaling", "norm_scaling"):
        return _log_uniform((n,), scale, gen)
    if g.kind == "sign":
        signs = torch.randint(0, 2, (n,), generator=gen).to(torch.float64) * 2 - 1
        if moving and (signs > 0).all():
            signs[torch.randint(0, n, (1,), generator=gen)] = -1
        return signs
    idx = _index_sizes(spec, g)
    if g.kind == "orthogonal":
        return _random_orthogonal(idx, n, gen, g.special)
    if g.kind == "gl":
        u, v = _random_orthogonal(idx, n, gen), _random_orthogonal(idx, n, gen)
        return (u * _log_uniform((*idx, 1, n), scale, gen)) @ v.transpose(-1, -2)
    if g.kind == "translation":
        key, _, mode = g.target
        shape = () if mode == "uniform" else tuple(t.size for t in spec.layout[key])
        return torch.randn(shape, generator=gen, dtype=torch.float64) * _log_uniform((), scale, gen)
    raise ValueError(f"unknown group kind {g.kind}")


def sample(
    spec: SymmetrySpec,
    seed: int = 0,
    scale=(1e-2, 1e2),
    kinds=None,
    groups=None,
    moving: bool = False,
    flip: bool = False,
) -> GroupElement:
    """A random element of the product of ``spec``'s groups (or of ``kinds``/``groups`` only).

    ``moving`` and ``flip`` serve verification: every unit of a permutation
    moves, and ``flip`` negates the sign vectors, so that the elements drawn with
    one seed with and without it flip every unit once between them.
    """
    gen = torch.Generator().manual_seed(seed)
    chosen = range(len(spec.groups)) if groups is None else groups
    comps = []
    for i in chosen:
        if kinds is None or spec.groups[i].kind in kinds:
            value = sample_group(spec, i, gen, scale, moving)
            if flip and spec.groups[i].kind == "sign":
                value = -value
            comps.append((i, value))
    return GroupElement(tuple(comps))


def transform(t: torch.Tensor, trees: list, fn) -> torch.Tensor:
    """Apply ``fn(block, leaves)`` to every leaf-level block of ``t`` (one tree per axis)."""
    for i, tree in enumerate(trees):
        if isinstance(tree, Split) and tree.mode == "prod":
            sizes = tuple(c.size for c in tree.children)
            new = t.reshape(t.shape[:i] + sizes + t.shape[i + 1 :])
            out = transform(new, trees[:i] + list(tree.children) + trees[i + 1 :], fn)
            return out.reshape(t.shape)
        if isinstance(tree, Split):
            parts = torch.split(t, [c.size for c in tree.children], dim=i)
            return torch.cat(
                [
                    transform(p, trees[:i] + [c] + trees[i + 1 :], fn)
                    for p, c in zip(parts, tree.children, strict=True)
                ],
                dim=i,
            )
    return fn(t, trees)


def derived(spec: SymmetrySpec, key, compute):
    """``compute()``, memoized on ``spec`` under ``key`` (the spec is immutable).

    The memo lives in the instance's ``__dict__``, outside the dataclass fields,
    so it changes neither equality, hashing nor serialization.
    """
    return compute()


def block_plan(spec: SymmetrySpec, key: str) -> tuple | list:
    """How to reach the leaf-level blocks of ``key`` (those :func:`transform` visits), memoized.

    ``(shape, leaves)`` when no axis is a concatenation (one view), else
    ``[(flat index tensor of the block, leaves)]`` in :func:`transform`'s order.
    """
    return derived(spec, ("blocks", key), lambda: _plan(spec.layout[key]))


def _plan(trees) -> tuple | list:
    """``(shape, leaves)`` without concatenated axes, else ``[(flat block indices, leaves)]``."""
    if not any(isinstance(t, Split) and t.mode == "cat" for tree in trees for t in _nodes(tree)):
        lv = [leaf for tree in trees for leaf in leaves(tree)]
        return tuple(leaf.size for leaf in lv), lv
    numbers = torch.arange(math.prod(t.size for t in trees)).reshape(tuple(t.size for t in trees))
    return [(idx.clone(), lv) for idx, lv in _grab_blocks(numbers, trees)]


def _nodes(tree) -> list:
    """A layout tree's nodes, the tree first."""
    return [tree] + (
        [n for c in tree.children for n in _nodes(c)] if isinstance(tree, Split) else []
    )


def _grab_blocks(t: torch.Tensor, trees) -> list:
    out = []
    transform(t, list(trees), lambda block, lv: out.append((block, list(lv))) or block)
    return out


def map_blocks(spec: SymmetrySpec, key: str, t: torch.Tensor, fn) -> torch.Tensor:
    """:func:`transform` of ``t = state_dict[key]`` along the spec's layout, from its plan."""
    plan = block_plan(spec, key)
    if isinstance(plan, tuple):
        shape, lv = plan
        return fn(t.reshape(shape), list(lv)).reshape(t.shape)
    flat, out = t.reshape(-1), None
    for idx, lv in plan:
        block = fn(flat[idx], lv)
        if out is None:
            out = torch.empty(flat.shape, dtype=block.dtype)
        out[idx.reshape(-1)] = block.reshape(-1)
    return out.reshape(t.shape)


def _along(vec: torch.Tensor, axis: int, ndim: int) -> torch.Tensor:
    shape = [1] * ndim
    shape[axis] = -1
    return vec.reshape(shape)


def _matrix_fn(group: Group, m: torch.Tensor):
    m_contra = torch.linalg.inv(m).transpose(-1, -2)

    def fn(t, lv):
        for ax, leaf in enumerate(lv):
            if leaf.cls != group.cls:
                continue
            mat = (m if leaf.parity == 0 else m_contra).to(t.dtype)
            idx_axes = [next(j for j, x in enumerate(lv) if x.cls == c) for c in group.index]
            letters = string.ascii_letters[: t.ndim]
            out_letter = string.ascii_letters[t.ndim]
            m_sub = "".join(letters[j] for j in idx_axes) + letters[ax] + out_letter
            res = letters[:ax] + out_letter + letters[ax + 1 :]
            t = torch.einsum(f"{letters},{m_sub}->{res}", t, mat)
        return t

    return fn


def _component_fn(group: Group, value, inverted: bool):
    kind = group.kind
    if kind == "permutation":
        perm = torch.argsort(value) if inverted else value

        def fn(t, lv):
            for ax, leaf in enumerate(lv):
                if leaf.cls == group.cls:
                    t = t[(slice(None),) * ax + (perm,)]  # faster than index_select off axis 0
            return t

        return fn
    if kind in ("scaling", "norm_scaling", "sign"):
        s = (1.0 / value if kind != "sign" else value) if inverted else value
        exps = dict(group.exponents)

        def fn(t, lv):
            for ax, leaf in enumerate(lv):
                e = exps.get(leaf.var, 0)
                if e and leaf.cls == group.cls:
                    t = t * _along(s.pow(e).to(t.dtype), ax, t.ndim)
            return t

        return fn
    if kind in ("gl", "orthogonal"):
        return _matrix_fn(group, torch.linalg.inv(value) if inverted else value)
    raise ValueError(kind)


def _translate(group: Group, value, inverted: bool, t: torch.Tensor, trees) -> torch.Tensor:
    """Add the constant on the blocks of the target whose leaves match its signature."""
    _, sig, mode = group.target
    sig = {tuple(x) for x in sig}
    c = (-value if inverted else value).to(t.dtype)
    if mode == "uniform":
        return t + c
    stacked = torch.stack([t, c.reshape(t.shape)])

    def fn(block, lv):
        inner = lv[1:]
        if any(leaf.size > 1 for leaf in inner) and all((x.cls, x.parity) in sig for x in inner):
            return torch.stack([block[0] + block[1], block[1]])
        return block

    return transform(stacked, [Leaf(-2, 2, 0, -1), *trees], fn)[0]


def translation_size(group: Group, trees) -> int:
    """Number of parameter entries a (full) translation group moves."""
    shape = tuple(t.size for t in trees)
    zeros = torch.zeros(shape, dtype=torch.float64)
    return int(
        _translate(
            group, torch.ones(shape, dtype=torch.float64), False, zeros, trees
        ).count_nonzero()
    )


def act(spec: SymmetrySpec, g: GroupElement, state_dict: dict) -> dict:
    """``g . state_dict``: a new state dict that computes the same function.

    Entries the spec does not describe are copied unchanged.
    """
    layout = spec.layout
    _check_state(spec, g, state_dict, layout)
    out = dict(state_dict)
    for i, value, inverted in g.parts():
        group = spec.groups[i]
        if group.kind == "translation":
            key = group.target[0]
            out[key] = _translate(group, value, inverted, out[key], layout[key])
            continue
        factors = _bn_factors(group, value, inverted, out, layout)
        fn = _component_fn(group, value, inverted)
        for key in group.params:
            out[key] = map_blocks(spec, key, out[key], fn)
        for key, f in factors.items():
            out[key] = map_blocks(spec, key, out[key], f)
    for alias, key in spec.aliases:
        out[alias] = out[key]
    return out


def _check_state(spec: SymmetrySpec, g: GroupElement, state_dict: dict, layout: dict) -> None:
    """One-line errors for state dicts that do not fit the spec."""
    for i, _ in g.components:
        for key in spec.groups[i].params:
            if key not in state_dict:
                raise WsymInputError(
                    f"the state dict has no entry {key!r} that the spec acts on; "
                    "pass a state dict of the architecture the spec was detected on"
                )
            expected = tuple(t.size for t in layout[key])
            if tuple(state_dict[key].shape) != expected:
                raise WsymInputError(
                    f"{key} has shape {tuple(state_dict[key].shape)}, the spec expects {expected}; "
                    "pass a state dict of the architecture the spec was detected on"
                )


def _bn_factors(group: Group, value, inverted: bool, sd: dict, layout) -> dict:
    """BatchNorm weight corrections of a norm_scaling component (from the current running_var)."""
    out = {}
    s = 1.0 / value if inverted else value
    for w_key, rv_key, eps, u in group.corrections:
        su = s.pow(u)
        holder = {}

        def grab(t, lv, holder=holder):
            for ax, leaf in enumerate(lv):
                if leaf.cls == group.cls:
                    holder["v"] = t.movedim(ax, 0).reshape(leaf.size, -1)[:, 0].to(torch.float64)
            return t

        transform(sd[rv_key], list(layout[rv_key]), grab)
        v = holder["v"]
        factor = torch.sqrt(su**2 * v + eps) / (su * torch.sqrt(v + eps))

        def fix(t, lv, factor=factor):
            for ax, leaf in enumerate(lv):
                if leaf.cls == group.cls:
                    t = t * _along(factor.to(t.dtype), ax, t.ndim)
            return t

        out[w_key] = fix
    return out
