"""From a SymmetrySpec and a parameter dict to batched GL blocks, and back.

The quotient geometry of :mod:`wsym.sharpness.geometry` works on GL blocks ``(G, H)``,
batched over heads. :func:`gather` reads them from a parameter dict, one
:class:`~wsym.sharpness.geometry.Pair` per ``gl`` group (``G`` the stack of the group's
parity-0 rows, ``H`` of its parity-1 rows, exactly as
:func:`wsym.group.units.block_matrices`) and one per ``scaling`` group used as a
``GL(1)`` block (below); :func:`scatter` is its adjoint and inverse:
it writes a pair of tangents ``(xi_G, xi_H)`` back into parameter-shaped
tensors (zero outside the group's blocks). Both traverse the same leaf-level
blocks (:func:`wsym.group.layout.transform`) in the same order, so
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
adaptive metric ``||xi / |w| ||`` (:func:`wsym.sharpness.geometry.adaptive_inner`), which
is exactly invariant to scaling, sign and norm-scaling groups (elementwise
rescalings) and to permutations, but not to orthogonal groups or translations.
``orthogonal`` groups are left elementwise too. A GL group whose entries overlap
an earlier group's, that lacks one of the two parities, or with a factor of fewer
rows than its size (a singular Gram matrix: the metrics would be degenerate; with a
``SymmetryWarning``), is left out (elementwise).

Shapes:
    ``gather``: ``{name: (*shape)}`` -> list of ``(group index, Pair)`` with
    ``G (*index, n, h)``, ``H (*index, m, h)`` (GL(1): ``(n_units, n, 1)``).

Example:
    >>> import torch, wsym
    >>> from wsym.models.networks import MLP
    >>> model = MLP(4, [3], 4, "identity").double()
    >>> spec = wsym.detect(model, torch.randn(2, 4, dtype=torch.float64))
    >>> params = dict(model.named_parameters())
    >>> blocks = gather(spec, params)
    >>> [tuple(b.G.shape[-1:]) for _, b in blocks]
    [(3,)]
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch
from torch import Tensor

from wsym.group.kinds import kind_of
from wsym.group.memo import derived
from wsym.group.spec import SymmetrySpec
from wsym.sharpness.blocks import block_groups, gather, gl_groups, scatter
from wsym.sharpness.geometry import Pair

__all__ = ["Quotient", "block_groups", "gather", "gl_groups", "scatter"]


class Quotient:
    """GL and GL(1) blocks of a parameter dict and the mask of the entries they cover.

    Blocks with the same leading dims and ``h`` are also held as one *stack*
    (:attr:`stacks`: a :class:`~wsym.sharpness.geometry.Pair` with one more leading dim, the rows
    of each factor zero-padded to the longest ``G``, respectively ``H``, of the stack:
    a GL(1) block of a LayerNorm gain has 2 rows on one side and thousands on the
    other, and padding both to one length would double the tangent), so that the geometry runs once
    per stack rather than once per block: every function of :mod:`wsym.sharpness.geometry`
    treats leading dims as independent blocks, and zero rows (of the block and of
    every tangent built from gradients, metrics and Christoffel terms) stay zero and
    change no Gram matrix. Only a draw that mixes rows must be masked (:attr:`rows`).

    Attributes:
        spec: the symmetry spec.
        params: ``{name: tensor}`` the blocks were read from.
        blocks: ``[(group index, Pair(G, H))]``.
        members: per stack, the positions in :attr:`blocks` of its blocks.
        orthogonal: per stack, whether its blocks are orthogonal groups (kept apart from
            GL blocks: their vertical directions are the skew-symmetric ones).
        stacks: per stack, ``Pair(G (k, *index, r_G, h), H (k, *index, r_H, h))``.
        rows: per stack, ``Pair`` of 0/1 row masks ``(k, *index, r, 1)`` (None: no padding).
        covered: ``{name: bool tensor}``, True on entries inside some GL or GL(1) block.
        touched: the names of the parameters some block covers (in part), in the flat
            order of :meth:`scatter_flat` and :meth:`split_touched`.

    Example:
        >>> import torch, wsym
        >>> from wsym.models.networks import TinyTransformer
        >>> model = TinyTransformer(depth=2).double()
        >>> spec = wsym.detect(model, torch.randn(2, 10, 4, dtype=torch.float64))
        >>> q = Quotient(spec, {n: p.detach() for n, p in model.named_parameters()})
        >>> len(q.blocks), [(tuple(s.G.shape), s.H.shape[-2]) for s in q.stacks]
        (5, [((4, 4, 33, 8), 33), ((1, 32, 2, 1), 10)])
    """

    def __init__(self, spec: SymmetrySpec, params: dict[str, Tensor]):
        self.spec, self.params = spec, params
        lay = _layout(spec, params)
        self.members, self.orthogonal, self.touched = lay.members, lay.orthogonal, lay.touched
        self._block_shapes, self._total = lay.block_shapes, lay._total
        self._shapes, self._sizes, self._stack_shapes = lay._shapes, lay._sizes, lay.stack_shapes
        like = next(iter(params.values())) if params else torch.zeros(0)
        device, dtype = like.device, like.dtype
        self._gather_index = lay._gather_index.to(device)
        self._scatter_index = lay._scatter_index.to(device)
        self.covered = {p: t.to(device) for p, t in lay.covered.items()}
        self.rows = [
            None if r is None else Pair(*(m.to(device, dtype) for m in r)) for r in lay.rows
        ]
        # one gather reads every stack (padding rows zero); the blocks are views of them
        self.stacks = self.gather_stacks(params) if self.members else []
        self.blocks: list = [None] * len(lay.groups)
        for i, stacked in enumerate(self.stacks):
            for j, pair in self._unstack(i, stacked):
                self.blocks[j] = (lay.groups[j], pair)

    @staticmethod
    def _rows(stack: Pair) -> tuple[int, int]:
        return stack.G.shape[-2], stack.H.shape[-2]

    @staticmethod
    def _stack(pairs: list, rows: tuple[int, int] | None = None) -> Pair:
        """Pairs stacked on a new first dim, each factor's rows zero-padded to ``rows``.

        ``rows``: ``(rows of G, rows of H)``; default the longest of each.
        """
        if rows is None:
            rows = tuple(max(p[k].shape[-2] for p in pairs) for k in (0, 1))
        return Pair(
            *(
                torch.stack(
                    [
                        torch.nn.functional.pad(p[k], (0, 0, 0, rows[k] - p[k].shape[-2]))
                        for p in pairs
                    ]
                )
                for k in (0, 1)
            )
        )

    def _unstack(self, i: int, stacked: Pair) -> list[tuple[int, Pair]]:
        """``(position in blocks, pair)`` of each member of stack ``i``, padding cut off."""
        out = []
        for k, j in enumerate(self.members[i]):
            n, m = self._block_shapes[j]
            out.append((j, Pair(stacked.G[k][..., :n, :], stacked.H[k][..., :m, :])))
        return out

    def gather_stacks(self, tensors: dict[str, Tensor]) -> list[Pair]:
        """One stacked pair per stack read from parameter-shaped ``tensors``.

        The adjoint of :meth:`scatter_stacks`: ``gather_stacks(params)`` returns the
        stacks themselves; for a gradient with respect to the parameters it returns
        the gradient with respect to the stacked blocks (zero on padding rows).
        """
        if not self.members:
            return []
        like = tensors[self.touched[0]]
        zero = torch.zeros(1, dtype=like.dtype, device=like.device)
        flat = torch.cat([*(tensors[p].reshape(-1) for p in self.touched), zero])
        return self._split_stacks(flat.index_select(0, self._gather_index))

    def _split_stacks(self, values: Tensor) -> list[Pair]:
        shapes = self._stack_shapes
        out, parts = [], values.split([math.prod(g) for pair in shapes for g in pair])
        for i, (g, h) in enumerate(shapes):
            out.append(Pair(parts[2 * i].view(g), parts[2 * i + 1].view(h)))
        return out

    def gather(self, tensors: dict[str, Tensor]) -> list[Pair]:
        """One pair per block (in :attr:`blocks` order), as :meth:`gather_stacks`."""
        out: list = [None] * len(self.blocks)
        for i, stacked in enumerate(self.gather_stacks(tensors)):
            for j, pair in self._unstack(i, stacked):
                out[j] = pair
        return out

    def scatter_stacks(self, tangents: list[Pair]) -> dict[str, Tensor]:
        """Write one stacked pair per stack into parameter-shaped tensors (padding dropped).

        Zero outside the blocks; differentiable in ``tangents``.
        """
        if len(tangents) != len(self.stacks):
            raise ValueError(f"expected {len(self.stacks)} stacked pairs, got {len(tangents)}")
        dtype = tangents[0].G.dtype if tangents else None
        out = {p: torch.zeros_like(t, dtype=dtype) for p, t in self.params.items()}
        if tangents:
            out.update(self.split_touched(self.scatter_flat(tangents)))
        return out

    def scatter_flat(self, tangents: list[Pair]) -> Tensor:
        """Stacked pairs written into the touched parameters, concatenated flat.

        The layout of :meth:`split_touched`; zero on entries no block covers.
        """
        like = tangents[0].G
        zero = torch.zeros(1, dtype=like.dtype, device=like.device)
        return self.scatter_values(torch.cat([*(M.reshape(-1) for t in tangents for M in t), zero]))

    def stack_buffer(self, like: Tensor) -> tuple[Tensor, list[Pair]]:
        """A flat buffer of every stacked entry and one trailing zero, with its stacks' views.

        Write the stacks into the views, then :meth:`scatter_values` scatters them without
        first concatenating them (what :meth:`scatter_flat` does).
        """
        values = torch.empty(self._total + 1, dtype=like.dtype, device=like.device)
        values[-1] = 0.0
        return values, self._split_stacks(values[:-1])

    def scatter_values(self, values: Tensor) -> Tensor:
        """:meth:`scatter_flat` of stacks already laid out flat (:meth:`stack_buffer`)."""
        return values.index_select(0, self._scatter_index)

    def split_touched(self, flat: Tensor) -> dict[str, Tensor]:
        """``{name: view}`` of a flat vector over the touched parameters (:attr:`touched`)."""
        parts = flat.split(self._sizes)
        return {p: x.view(s) for p, x, s in zip(self.touched, parts, self._shapes, strict=True)}

    def scatter(self, tangents: list[Pair]) -> dict[str, Tensor]:
        """Write one pair per block (in :attr:`blocks` order), as :meth:`scatter_stacks`."""
        if len(tangents) != len(self.blocks):
            raise ValueError(f"expected {len(self.blocks)} pairs, got {len(tangents)}")
        stacked = [
            self._stack([tangents[j] for j in js], self._rows(s))
            for js, s in zip(self.members, self.stacks, strict=True)
        ]
        return self.scatter_stacks(stacked)


def _layout(spec: SymmetrySpec, params: dict[str, Tensor]) -> SimpleNamespace:
    """What a :class:`Quotient` holds that depends on names and shapes only (memoized).

    The blocks' stacking, padding masks, coverage and the gather / scatter indices,
    computed once per spec and parameter shapes: the balancing and the geometry of one
    :func:`wsym.sharpness.sharpness` call read the same layout.
    """
    key = ("quotient", tuple((p, tuple(t.shape)) for p, t in params.items()))
    return derived(spec, key, lambda: _build_layout(spec, params))


def _build_layout(spec: SymmetrySpec, params: dict[str, Tensor]) -> SimpleNamespace:
    shaped = {p: torch.zeros(t.shape, dtype=torch.float64) for p, t in params.items()}
    blocks = gather(spec, shaped)  # zeros: only the shapes are read
    by_shape: dict[tuple, list[int]] = {}
    for j, (i, b) in enumerate(blocks):
        orthogonal = kind_of(spec.groups[i]).self_dual
        by_shape.setdefault((b.G.shape[:-2], b.G.shape[-1], orthogonal), []).append(j)
    members = list(by_shape.values())
    stacks = [Quotient._stack([blocks[j][1] for j in js]) for js in members]
    rows = [
        None
        if all(M.shape[-2] == S.shape[-2] for j in js for M, S in zip(blocks[j][1], s, strict=True))
        else Quotient._stack(
            [Pair(*(torch.ones_like(M[..., :1]) for M in blocks[j][1])) for j in js],
            Quotient._rows(s),
        )
        for js, s in zip(members, stacks, strict=True)
    ]
    # number every stacked entry (1, 2, ... in flattened G, H order, padding included)
    # and scatter the numbers of the blocks' own entries once: afterwards gathering
    # and scattering are one indexing each
    codes: list = [None] * len(blocks)
    offset = 1
    for js, stack in zip(members, stacks, strict=True):
        parts = []
        for M in stack:
            parts.append(torch.arange(offset, offset + M.numel(), dtype=torch.float64))
            offset += M.numel()
        G, H = parts[0].reshape(stack.G.shape), parts[1].reshape(stack.H.shape)
        for k, j in enumerate(js):
            b = blocks[j][1]
            codes[j] = (
                blocks[j][0],
                Pair(G[k][..., : b.G.shape[-2], :], H[k][..., : b.H.shape[-2], :]),
            )
    placed = scatter(spec, codes, shaped)
    total = offset - 1
    # the parameters a block touches, concatenated flat ("touched" order): for each
    # stacked entry the position of its value there (padding: one zero slot after the
    # end), and for each touched entry the position of its stacked value (entries no
    # block covers: a zero slot after the stacks), so that gathering and scattering
    # are one index_select each
    touched = [p for p, t in placed.items() if bool((t != 0).any())]
    codes_flat = torch.cat(
        [torch.zeros(0, dtype=torch.float64)] + [placed[p].reshape(-1) for p in touched]
    )
    where = codes_flat.nonzero().squeeze(1)
    gather_index = torch.full((total,), len(codes_flat), dtype=torch.long)
    gather_index[codes_flat[where].long() - 1] = where
    scatter_index = torch.full((len(codes_flat),), total, dtype=torch.long)
    scatter_index[where] = codes_flat[where].long() - 1
    return SimpleNamespace(
        groups=[i for i, _ in blocks],
        block_shapes=[(b.G.shape[-2], b.H.shape[-2]) for _, b in blocks],
        members=members,
        orthogonal=[key[2] for key in by_shape],
        stack_shapes=[(tuple(s.G.shape), tuple(s.H.shape)) for s in stacks],
        rows=rows,
        covered={p: t != 0 for p, t in placed.items()},
        touched=touched,
        _total=total,
        _shapes=[params[p].shape for p in touched],
        _sizes=[params[p].numel() for p in touched],
        _gather_index=gather_index,
        _scatter_index=scatter_index,
    )
