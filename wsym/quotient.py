"""From a SymmetrySpec and a parameter dict to batched GL blocks, and back.

The quotient geometry of :mod:`wsym.geometry` works on GL blocks ``(G, H)``,
batched over heads. :func:`gather` reads them from a parameter dict, one
:class:`~wsym.geometry.Pair` per ``gl`` group (``G`` the stack of the group's
parity-0 rows, ``H`` of its parity-1 rows, exactly as
:func:`wsym.units.block_matrices`) and one per ``scaling`` group used as a
``GL(1)`` block (below); :func:`scatter` is its adjoint and inverse:
it writes a pair of tangents ``(xi_G, xi_H)`` back into parameter-shaped
tensors (zero outside the group's blocks). Both traverse the same leaf-level
blocks (:func:`wsym.act.transform`) in the same order, so
``scatter(gather(params))`` reproduces every covered entry exactly.

Scaling groups as ``GL(1)`` blocks: a ``scaling`` group whose exponents are all
``+1`` / ``-1`` (both present) is a block batched over its units: per unit,
``G`` is the column of the entries with exponent ``+1`` and ``H`` of those with
exponent ``-1`` (``(n_units, rows, 1)``), so ``s`` acts as ``G s, H / s``, the
``GL(1)`` action. It is used only if the group's entries are disjoint from the
chosen GL blocks and from every other continuous group's entries (``scaling``,
``norm_scaling``, ``gl``, ``orthogonal``; e.g. two ReLU layers sharing a weight
matrix), and if every entry it rescales is in its block; otherwise it stays
elementwise.

Coverage: entries outside every block are measured with the elementwise
adaptive metric ``||xi / |w| ||`` (:func:`wsym.geometry.adaptive_inner`), which
is exactly invariant to scaling, sign and norm-scaling groups (elementwise
rescalings) and to permutations, but not to orthogonal groups or translations.
``orthogonal`` groups are left elementwise too. A GL group whose entries overlap
an earlier group's, or that lacks one of the two parities, is left out
(elementwise).

Shapes:
    ``gather``: ``{name: (*shape)}`` -> list of ``(group index, Pair)`` with
    ``G (*index, n, h)``, ``H (*index, m, h)`` (GL(1): ``(n_units, n, 1)``).

Example:
    >>> import torch, wsym
    >>> from wsym.reference import MLP
    >>> model = MLP(4, [3], 2, "identity").double()
    >>> spec = wsym.detect(model, torch.randn(2, 4, dtype=torch.float64))
    >>> params = dict(model.named_parameters())
    >>> blocks = gather(spec, params)
    >>> [tuple(b.G.shape[-1:]) for _, b in blocks]
    [(3,)]
"""

from __future__ import annotations

import torch
from torch import Tensor

from wsym.act import transform
from wsym.geometry import Pair
from wsym.spec import Group, SymmetrySpec
from wsym.units import class_params

__all__ = ["Quotient", "block_groups", "gather", "gl_groups", "scatter"]


def _group_params(spec: SymmetrySpec, group: Group, names) -> list[str]:
    """Parameters (present in ``names``) with an axis of ``group``'s class, in spec order."""
    return [p for p in class_params(spec, group.cls) if p in names]


def _visit(spec: SymmetrySpec, group: Group, tensors: dict, fn) -> dict[str, Tensor]:
    """Call ``fn(moved_block, parity) -> moved_block`` on every block of ``group``.

    ``moved_block`` has the index axes first and the class axis last (as in
    :func:`wsym.units.block_matrices`); the returned tensors are put back in
    place. Returns the rebuilt tensors of the group's parameters.
    """
    layout = spec.layout
    out = {}
    for p in _group_params(spec, group, tensors):

        def one(block, lv):
            axes = [i for i, leaf in enumerate(lv) if leaf.cls == group.cls]
            if len(axes) != 1:
                return block
            idx = [next(i for i, leaf in enumerate(lv) if leaf.cls == c) for c in group.index]
            src, dst = [*idx, axes[0]], [*range(len(idx)), block.ndim - 1]
            moved = fn(block.movedim(src, dst), lv[axes[0]].parity)
            return moved.movedim(dst, src)

        out[p] = transform(tensors[p], list(layout[p]), one)
    return out


def _scaling_exps(group: Group) -> dict[int, int]:
    return {var: e for var, e in group.exponents if e}


def is_gl1(group: Group) -> bool:
    """A ``scaling`` group whose exponents are all +1/-1, both present."""
    exps = set(_scaling_exps(group).values())
    return group.kind == "scaling" and exps == {1, -1}


def _visit_scaling(spec: SymmetrySpec, group: Group, tensors: dict, fn) -> dict[str, Tensor]:
    """Call ``fn(moved_block, exponent)`` (unit axis first) on every +-1 block of ``group``."""
    layout, exps = spec.layout, _scaling_exps(group)
    out = {}
    for p in _group_params(spec, group, tensors):

        def one(block, lv):
            axes = [i for i, leaf in enumerate(lv) if leaf.cls == group.cls]
            if len(axes) != 1 or exps.get(lv[axes[0]].var, 0) not in (1, -1):
                return block
            moved = fn(block.movedim(axes[0], 0), exps[lv[axes[0]].var])
            return moved.movedim(0, axes[0])

        out[p] = transform(tensors[p], list(layout[p]), one)
    return out


def _touched(spec: SymmetrySpec, group: Group, params: dict) -> dict[str, Tensor]:
    """``{name: bool}``: entries a continuous group changes (every block holding its class)."""
    layout = spec.layout
    exps = _scaling_exps(group) if group.kind in ("scaling", "norm_scaling") else None
    out = {}
    for p in _group_params(spec, group, params):

        def one(block, lv):
            hit = any(
                leaf.cls == group.cls and (exps is None or exps.get(leaf.var, 0)) for leaf in lv
            )
            return torch.ones_like(block) if hit else block

        out[p] = transform(torch.zeros_like(params[p], dtype=torch.bool), list(layout[p]), one)
    return out


def gather_group(spec: SymmetrySpec, group: Group, tensors: dict) -> dict[int, Tensor]:
    """``{parity: (*index, rows, h)}`` of ``group`` (as ``units.block_matrices``).

    GL(1) scaling groups: parity 0 holds the exponent +1 entries, parity 1 the
    exponent -1 entries, as ``(n_units, rows, 1)``.
    """
    parts: dict[int, list] = {0: [], 1: []}
    if group.kind == "scaling":

        def grab_unit(moved, e):
            parts[0 if e == 1 else 1].append(moved.reshape(moved.shape[0], -1))
            return moved

        _visit_scaling(spec, group, tensors, grab_unit)
        return {k: torch.cat(v, dim=1).unsqueeze(-1) for k, v in parts.items() if v}

    def grab(moved, parity):
        lead = moved.shape[: len(group.index)]
        parts[parity].append(moved.reshape(*lead, -1, group.size))
        return moved

    _visit(spec, group, tensors, grab)
    return {k: torch.cat(v, dim=-2) for k, v in parts.items() if v}


def scatter_group(
    spec: SymmetrySpec, group: Group, pair: Pair, like: dict[str, Tensor]
) -> dict[str, Tensor]:
    """Parameter-shaped tensors holding ``pair``'s rows (zero elsewhere); inverse of gathering."""
    offset = {0: 0, 1: 0}
    src = {0: pair.G, 1: pair.H}
    zeros = {p: torch.zeros_like(like[p], dtype=pair.G.dtype) for p in like}
    if group.kind == "scaling":

        def put_unit(moved, e):
            parity = 0 if e == 1 else 1
            rows = moved[0].numel()
            start = offset[parity]
            offset[parity] = start + rows
            return src[parity][:, start : start + rows, 0].reshape(moved.shape)

        return _visit_scaling(spec, group, zeros, put_unit)

    def put(moved, parity):
        lead = moved.shape[: len(group.index)]
        rows = moved.reshape(*lead, -1, group.size).shape[-2]
        start = offset[parity]
        offset[parity] = start + rows
        return src[parity][..., start : start + rows, :].reshape(moved.shape)

    return _visit(spec, group, zeros, put)


def gl_groups(spec: SymmetrySpec, params: dict[str, Tensor]) -> list[int]:
    """Indices of the GL groups used as blocks: both parities present, no overlaps."""
    taken: dict[str, Tensor] = {}
    chosen = []
    for i, group in enumerate(spec.groups):
        if group.kind != "gl" or not _group_params(spec, group, params):
            continue
        parts = gather_group(spec, group, params)
        if set(parts) != {0, 1}:
            continue
        ones = Pair(torch.ones_like(parts[0]), torch.ones_like(parts[1]))
        mask = {p: t != 0 for p, t in scatter_group(spec, group, ones, params).items()}
        if any((taken[p] & m).any() for p, m in mask.items() if p in taken):
            continue
        for p, m in mask.items():
            taken[p] = taken[p] | m if p in taken else m
        chosen.append(i)
    return chosen


def _mask(spec: SymmetrySpec, group: Group, params: dict) -> dict[str, Tensor]:
    parts = gather_group(spec, group, params)
    ones = Pair(torch.ones_like(parts[0]), torch.ones_like(parts[1]))
    return {p: t != 0 for p, t in scatter_group(spec, group, ones, params).items()}


def _overlaps(a: dict[str, Tensor], b: dict[str, Tensor]) -> bool:
    return any((a[p] & m).any() for p, m in b.items() if p in a)


def block_groups(spec: SymmetrySpec, params: dict[str, Tensor]) -> list[int]:
    """GL groups of :func:`gl_groups`, then the scaling groups usable as GL(1) blocks."""
    chosen = gl_groups(spec, params)
    taken: dict[str, Tensor] = {}
    for i in chosen:
        for p, m in _mask(spec, spec.groups[i], params).items():
            taken[p] = taken[p] | m if p in taken else m
    continuous = ("scaling", "norm_scaling", "gl", "orthogonal")
    touched = {
        i: _touched(spec, g, params)
        for i, g in enumerate(spec.groups)
        if g.kind in continuous and g.cls >= 0
    }
    for i, group in enumerate(spec.groups):
        if not is_gl1(group) or not _group_params(spec, group, params):
            continue
        if set(gather_group(spec, group, params)) != {0, 1}:
            continue
        mask = _mask(spec, group, params)
        own = touched[i]
        if any(not torch.equal(own[p], mask.get(p, torch.zeros_like(own[p]))) for p in own):
            continue  # an entry it rescales lies outside its block
        if _overlaps(taken, mask) or any(_overlaps(t, mask) for j, t in touched.items() if j != i):
            continue
        chosen.append(i)
    return chosen


def gather(spec: SymmetrySpec, params: dict[str, Tensor]) -> list[tuple[int, Pair]]:
    """``[(group index, Pair(G, H))]`` for the blocks of :func:`block_groups`."""
    out = []
    for i in block_groups(spec, params):
        parts = gather_group(spec, spec.groups[i], params)
        out.append((i, Pair(parts[0], parts[1])))
    return out


def scatter(
    spec: SymmetrySpec, tangents: list[tuple[int, Pair]], like: dict[str, Tensor]
) -> dict[str, Tensor]:
    """Sum over groups of their pairs, written into tensors shaped like ``like``."""
    out = {p: torch.zeros_like(t) for p, t in like.items()}
    for i, pair in tangents:
        for p, t in scatter_group(spec, spec.groups[i], pair, like).items():
            out[p] = out[p] + t
    return out


class Quotient:
    """GL and GL(1) blocks of a parameter dict and the mask of the entries they cover.

    Blocks with the same leading dims and ``h`` are also held as one *stack*
    (:attr:`stacks`: a :class:`~wsym.geometry.Pair` with one more leading dim, rows
    zero-padded to the longest factor of the stack), so that the geometry runs once
    per stack rather than once per block: every function of :mod:`wsym.geometry`
    treats leading dims as independent blocks, and zero rows (of the block and of
    every tangent built from gradients, metrics and Christoffel terms) stay zero and
    change no Gram matrix. Only a draw that mixes rows must be masked (:attr:`rows`).

    Attributes:
        spec: the symmetry spec.
        params: ``{name: tensor}`` the blocks were read from.
        blocks: ``[(group index, Pair(G, H))]``.
        members: per stack, the positions in :attr:`blocks` of its blocks.
        stacks: per stack, ``Pair(G (k, *index, r, h), H (k, *index, r, h))``.
        rows: per stack, ``Pair`` of 0/1 row masks ``(k, *index, r, 1)`` (None: no padding).
        covered: ``{name: bool tensor}``, True on entries inside some GL or GL(1) block.

    Example:
        >>> import torch, wsym
        >>> from wsym.reference import TinyTransformer
        >>> model = TinyTransformer(depth=2).double()
        >>> spec = wsym.detect(model, torch.randn(2, 10, 4, dtype=torch.float64))
        >>> q = Quotient(spec, {n: p.detach() for n, p in model.named_parameters()})
        >>> len(q.blocks), [tuple(s.G.shape) for s in q.stacks]
        (5, [(4, 4, 33, 8), (1, 32, 10, 1)])
    """

    def __init__(self, spec: SymmetrySpec, params: dict[str, Tensor]):
        self.spec, self.params = spec, params
        self.blocks = gather(spec, params)
        by_shape: dict[tuple, list[int]] = {}
        for j, (_, b) in enumerate(self.blocks):
            by_shape.setdefault((b.G.shape[:-2], b.G.shape[-1]), []).append(j)
        self.members = list(by_shape.values())
        self._rows = [
            max(M.shape[-2] for j in js for M in self.blocks[j][1]) for js in self.members
        ]
        self.stacks = [self._stack([self.blocks[j][1] for j in js], r) for js, r in self._stacked()]
        self.rows = [
            None
            if all(M.shape[-2] == r for j in js for M in self.blocks[j][1])
            else self._stack(
                [Pair(*(torch.ones_like(M[..., :1]) for M in self.blocks[j][1])) for j in js], r
            )
            for js, r in self._stacked()
        ]
        # number every stacked entry (1, 2, ... in flattened G, H order, padding included)
        # and scatter the numbers of the blocks' own entries once: afterwards gathering
        # and scattering are one indexing per parameter
        codes: list = [None] * len(self.blocks)
        offset = 1
        for (js, _), stack in zip(self._stacked(), self.stacks, strict=True):
            parts = []
            for M in stack:
                parts.append(torch.arange(offset, offset + M.numel(), dtype=torch.float64))
                offset += M.numel()
            G, H = parts[0].reshape(stack.G.shape), parts[1].reshape(stack.H.shape)
            for k, j in enumerate(js):
                i, b = self.blocks[j]
                codes[j] = (i, Pair(G[k][..., : b.G.shape[-2], :], H[k][..., : b.H.shape[-2], :]))
        like = {p: torch.zeros(t.shape, dtype=torch.float64) for p, t in params.items()}
        placed = scatter(spec, codes, like)
        self.covered = {p: (t != 0).to(params[p].device) for p, t in placed.items()}
        self._total = offset - 1
        # per parameter touched: positions in it and in the stacked values, so that
        # gathering and scattering are one index_select and one index_copy_ each
        self._index: dict[str, tuple[Tensor, Tensor]] = {}
        for p, t in placed.items():
            dst = t.reshape(-1).nonzero().squeeze(1)
            if len(dst):
                src = t.reshape(-1)[dst].long() - 1
                self._index[p] = (dst.to(params[p].device), src.to(params[p].device))

    def _stacked(self):
        return zip(self.members, self._rows, strict=True)

    @staticmethod
    def _stack(pairs: list, rows: int) -> Pair:
        """Pairs stacked on a new first dim, their rows zero-padded to ``rows``."""
        return Pair(
            *(
                torch.stack(
                    [torch.nn.functional.pad(p[k], (0, 0, 0, rows - p[k].shape[-2])) for p in pairs]
                )
                for k in (0, 1)
            )
        )

    def gather_stacks(self, tensors: dict[str, Tensor]) -> list[Pair]:
        """One stacked pair per stack read from parameter-shaped ``tensors``.

        The adjoint of :meth:`scatter_stacks`: ``gather_stacks(params)`` returns the
        stacks themselves; for a gradient with respect to the parameters it returns
        the gradient with respect to the stacked blocks (zero on padding rows).
        """
        like = next(iter(tensors.values()))
        values = torch.zeros(self._total, dtype=like.dtype, device=like.device)
        for p, (dst, src) in self._index.items():
            values.index_copy_(0, src, tensors[p].reshape(-1).index_select(0, dst))
        out, offset = [], 0
        for s in self.stacks:
            parts = []
            for M in s:
                parts.append(values[offset : offset + M.numel()].reshape(M.shape))
                offset += M.numel()
            out.append(Pair(*parts))
        return out

    def gather(self, tensors: dict[str, Tensor]) -> list[Pair]:
        """One pair per block (in :attr:`blocks` order), as :meth:`gather_stacks`."""
        out: list = [None] * len(self.blocks)
        for js, s in zip(self.members, self.gather_stacks(tensors), strict=True):
            for k, j in enumerate(js):
                b = self.blocks[j][1]
                out[j] = Pair(s.G[k][..., : b.G.shape[-2], :], s.H[k][..., : b.H.shape[-2], :])
        return out

    def scatter_stacks(self, tangents: list[Pair]) -> dict[str, Tensor]:
        """Write one stacked pair per stack into parameter-shaped tensors (padding dropped).

        Differentiable in ``tangents``.
        """
        if len(tangents) != len(self.stacks):
            raise ValueError(f"expected {len(self.stacks)} stacked pairs, got {len(tangents)}")
        flat = [M.reshape(-1) for t in tangents for M in t]
        values = torch.cat(flat) if flat else None
        out = {}
        for p, t in self.params.items():
            if p in self._index:
                dst, src = self._index[p]
                zero = torch.zeros(t.numel(), dtype=values.dtype, device=values.device)
                out[p] = zero.index_copy_(0, dst, values.index_select(0, src)).reshape(t.shape)
            else:
                out[p] = torch.zeros_like(t)
        return out

    def add_stacks(self, tensors: dict[str, Tensor], tangents: list[Pair]) -> None:
        """Add one stacked pair per stack into parameter-shaped ``tensors``, in place.

        ``tensors`` must hold every parameter a block covers and be writable; the same
        as adding :meth:`scatter_stacks`, without the zero tensors.
        """
        flat = [M.reshape(-1) for t in tangents for M in t]
        if not flat:
            return
        values = torch.cat(flat)
        for p, (dst, src) in self._index.items():
            tensors[p].view(-1).index_add_(0, dst, values.index_select(0, src))

    def scatter(self, tangents: list[Pair]) -> dict[str, Tensor]:
        """Write one pair per block (in :attr:`blocks` order), as :meth:`scatter_stacks`."""
        if len(tangents) != len(self.blocks):
            raise ValueError(f"expected {len(self.blocks)} pairs, got {len(tangents)}")
        stacked = [self._stack([tangents[j] for j in js], r) for js, r in self._stacked()]
        return self.scatter_stacks(stacked)
