r"""The balanced point of an orbit's diagonal part: where the quotient metric is evaluated.

The block metrics of Hide & Seek are invariant to GL on a block's own axis, the
elementwise adaptive metric to every elementwise rescaling; neither is invariant to
a *diagonal* group acting on the *other* axis of a block (a LayerNorm gain rescales the
columns of ``W_Q`` while GL acts on its rows). wsym evaluates the geometry at the point
:math:`\hat\theta = s^\star(\theta) \cdot \theta` of the orbit of those diagonal groups,
where :math:`u = \log s` minimizes the convex, GL-invariant balancing objective

.. math::
    F(u) = \sum_{e \notin \text{blocks}} w_e^2\, e^{2 (E u)_e}
         + \sum_{\text{blocks}} \big\| D_G(u)\, G H^\top D_H(u) \big\|_F^2 ,

:math:`E` the exponents of the units on the entries, :math:`D_G, D_H` the diagonal
factors they put on the rows of a block's two factors (a one-sided orthogonal block
contributes :math:`\|D_G G\|_F^2`). Only the diagonal groups that touch another
group's block (and those sharing entries with them) take part; where none does, the
block metrics are invariant as they are and :math:`\hat\theta = \theta` (up to
translations). :math:`F` sees blocks only through their products, so its minimizer does
not depend on GL or orthogonal elements, and :math:`F_{k\theta}(u) = F_\theta(u + \log k)`
for a diagonal element :math:`k`: :math:`\hat\theta` is the same point for a whole
diagonal orbit and moves with the other groups (derivation: ``docs/geometry.md``).
Translations are put at their canonical representative (a zero key bias, a zero-mean
logit bias). Newton's method with a backtracking line search solves for :math:`u`.

A diagonal element computes the same function, so the loss around :math:`\theta` in the
directions :math:`s^{\star -1} \xi` is the loss around :math:`\hat\theta` in the
directions :math:`\xi`: the measures evaluate :math:`\hat\theta` directly.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

from wsym.align.canonicalize import canonical_element
from wsym.errors import SymmetryWarning
from wsym.group.elements import GroupElement, act
from wsym.group.kinds import kind_of
from wsym.group.memo import derived
from wsym.group.spec import SymmetrySpec
from wsym.sharpness.block_diagonal import BlockDiagonal
from wsym.sharpness.exponents import exponent_entries, exponent_matrix
from wsym.sharpness.quotient import Quotient
from wsym.sharpness.structure import components

NEWTON_TOL = 1e-13
MAX_NEWTON = 100


def balanced(
    spec: SymmetrySpec, state: dict[str, Tensor], names=None, dtype: torch.dtype = torch.float64
) -> dict[str, Tensor]:
    """``s*(theta) . theta`` (at ``dtype``), translations canonical; buffers move with it.

    Memory: one copy of ``state`` at ``dtype`` (none where it is at it already); the
    objective is evaluated in float64 a chunk of blocks at a time.

    Args:
        spec: the symmetry spec.
        state: a state dict (parameters and buffers).
        names: the parameters that are perturbed (default: the spec's non-buffer entries).
        dtype: the precision of the returned state (the Newton solve is float64).

    Example:
        >>> import torch, wsym
        >>> from wsym.models.networks import TinyTransformer
        >>> model = TinyTransformer(depth=1).double()
        >>> spec = wsym.detect(model, torch.randn(2, 10, 4, dtype=torch.float64))
        >>> sd = model.state_dict()
        >>> moved = spec.act(spec.sample(seed=1), sd)
        >>> a, b = balanced(spec, sd), balanced(spec, moved)
        >>> key = "blocks.0.norm1.weight"
        >>> bool(torch.allclose(a[key].abs().sort()[0], b[key].abs().sort()[0]))
        True
    """
    state, k = balancing_element(spec, state, names, dtype)
    return act(spec, k, state) if k.components else state


def balancing_element(
    spec: SymmetrySpec, state: dict[str, Tensor], names=None, dtype: torch.dtype = torch.float64
) -> tuple[dict[str, Tensor], GroupElement]:
    """``(state with canonical translations (at dtype), k)``: :func:`balanced` is ``k . state``.

    ``k`` is the diagonal element ``s*`` of the module docstring (empty where no
    diagonal group needs balancing, or where the balancing diverges, with a warning),
    its values at ``dtype``.
    """
    state = {k: v.detach().to(dtype) if v.is_floating_point() else v for k, v in state.items()}
    if any(kind_of(g).additive for g in spec.groups):  # first: F reads the key bias
        state, _ = canonical_element(state, spec, kinds={"translation"}, dtype=dtype)
    if names is None:
        buffers = set(spec.buffers)
        names = [k for k, _ in spec.layouts if k in state and k not in buffers]
    params = {n: state[n] for n in names}
    groups = gauged_groups(spec, params)
    u = _newton(_Objective(spec, params, groups)) if groups else None
    if u is None:
        return state, GroupElement(())
    element, start = [], 0
    for i in groups:
        n = spec.groups[i].size
        element.append((i, torch.exp(u[start : start + n]).to(dtype)))
        start += n
    return state, GroupElement(tuple(element))


def _diagonal(group) -> bool:
    kind = kind_of(group)
    return kind.diagonal and kind.continuous


def gauged_groups(spec: SymmetrySpec, params: dict[str, Tensor]) -> list[int]:
    """Diagonal groups that rescale rows of another group's block, and those sharing entries.

    Depends on names and shapes only (memoized on the spec).
    """
    key = ("gauged", tuple((p, tuple(t.shape)) for p, t in params.items()))
    return list(derived(spec, key, lambda: _gauged(spec, params)))


def _gauged(spec: SymmetrySpec, params: dict[str, Tensor]) -> tuple[int, ...]:
    q = Quotient(spec, params)
    if not q.blocks:
        return ()
    own = {i for i, _ in q.blocks}
    diagonal = [i for i, g in enumerate(spec.groups) if _diagonal(g) and i not in own]
    names = list(params)
    rows, cols, _ = exponent_entries(spec, diagonal, names, params)
    start = torch.tensor([0] + [spec.groups[i].size for i in diagonal]).cumsum(0)
    group = torch.searchsorted(start, cols, right=True) - 1  # position in ``diagonal``
    covered = torch.cat([q.covered[n].reshape(-1) for n in names])
    seeds = set(group[covered[rows]].unique().tolist())
    # close under sharing entries: the components of "groups meeting on one entry"
    order = torch.argsort(rows, stable=True)
    r, g = rows[order], group[order]
    same = r[1:] == r[:-1]
    roots = components(len(diagonal), torch.stack([g[:-1][same], g[1:][same]], 1))
    reached = {roots[j] for j in seeds}
    return tuple(diagonal[j] for j in range(len(diagonal)) if roots[j] in reached)


class _Objective:
    """The balancing objective ``F(u)`` of the module docstring, its gradient and Hessian."""

    def __init__(self, spec: SymmetrySpec, params: dict[str, Tensor], groups: list[int]):
        names = list(params)
        self.q = Quotient(spec, params)
        E = exponent_matrix(spec, groups, names, params)
        self.n = E.shape[1]
        theta = torch.cat([params[n].reshape(-1) for n in names])
        # parameter-flat position -> position in the Quotient's stacked blocks (or none)
        offsets, start = {}, 0
        for n in names:
            offsets[n] = start
            start += params[n].numel()
        stack_pos = torch.full((start,), -1, dtype=torch.long)
        t_start = 0
        for n in self.q.touched:
            k = params[n].numel()
            s = self.q._scatter_index[t_start : t_start + k]
            stack_pos[offsets[n] : offsets[n] + k] = torch.where(s < self.q._total, s, -1)
            t_start += k
        rows, cols = E.indices()
        vals = E.values()
        inside = stack_pos[rows] >= 0
        # entries outside the blocks: c_e exp(2 (E u)_e), entries with equal rows of E merged
        out_rows = rows[~inside]
        uniq, inv = out_rows.unique(return_inverse=True)
        self.c, self.E_out = _merged(
            theta[uniq].double() ** 2, inv, cols[~inside], vals[~inside], self.n
        )
        # block rows: one per row of a stacked factor (E is constant along the block's axis)
        self.parts = []  # per stacked factor: (offset, numel, rows, h)
        offset, row0 = 0, 0
        for G, H in self.q.stacks:
            for M in (G, H):
                self.parts.append((offset, M.numel(), row0, M.shape[-1]))
                offset += M.numel()
                row0 += M.numel() // M.shape[-1]
        self.rows_total = row0
        pos = stack_pos[rows[inside]]
        starts = torch.tensor([p[0] for p in self.parts])
        part = torch.searchsorted(starts, pos, right=True) - 1
        h = torch.tensor([p[3] for p in self.parts])[part]
        row = torch.tensor([p[2] for p in self.parts])[part] + (pos - starts[part]) // h
        key = row * self.n + cols[inside]
        ukey, first = _unique_first(key)
        self.E_rows = _sparse(ukey // self.n, ukey % self.n, vals[inside][first], (row0, self.n))
        hit = self.E_rows.indices()[0]
        self.stacks = [  # the stacks whose rows some gauged unit rescales (others are constant)
            s
            for s in range(len(self.q.stacks))
            if any(
                bool(((hit >= r0) & (hit < r0 + k // h)).any())
                for _, k, r0, h in self.parts[2 * s : 2 * s + 2]
            )
        ]
        self.pairs = {
            s: _PairTerm.of(self.E_rows, self.q.stacks[s], self.parts[2 * s : 2 * s + 2])
            for s in self.stacks
            if not self.q.orthogonal[s] and all(M.shape[-2] for M in self.q.stacks[s])
        }
        self._cross = _CrossPattern(list(self.pairs.values()), self.n)

    def value_grad_hess(self, u: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``F(u)``, its gradient ``(n,)`` and Hessian ``(n, n)`` (sparse COO, coalesced).

        Float64 throughout (the blocks are promoted a chunk at a time), whatever the
        parameters' dtype.
        """
        z = torch.exp(2 * (self.E_out @ u)) * self.c
        F = z.sum()
        grad = 2 * (self.E_out.T @ z)
        hess = 4 * _gram(self.E_out, z)
        alpha = torch.exp(self.E_rows @ u)  # diagonal factor of every block row
        g_rows = torch.zeros(self.rows_total, dtype=torch.float64)
        cross = []
        for s in self.stacks:
            if s in self.pairs:
                F = F + self.pairs[s].add(alpha, g_rows, cross)
                continue
            # orthogonal (one-sided): ||D G||^2 + ||D H||^2
            for M, (_, _, r0, _) in zip(
                self.q.stacks[s], self.parts[2 * s : 2 * s + 2], strict=True
            ):
                scale = alpha[r0 : r0 + M[..., 0].numel()] ** 2
                sq = (M.double() ** 2).sum(-1).reshape(-1) * scale
                F = F + sq.sum()
                g_rows[r0 : r0 + sq.numel()] += 2 * sq
        grad = grad + self.E_rows.T @ g_rows
        hess = hess + _gram(self.E_rows, 2 * g_rows)  # d/du of a row's term doubles it
        if cross:
            C = self._cross.matrix(cross)
            hess = hess + C + C.t()
        return F, grad, hess.coalesce()


class _PairTerm:
    """One stack's ``sum_b ||D_G G_b H_b^T D_H||_F^2``, its row gradient and unit cross terms.

    The Hessian's cross term between the units on the rows of ``G_b`` and those on the
    rows of ``H_b`` is ``E_G^T (4 P2_b) E_H`` with ``P2 = (D_G G H^T D_H)^2`` entrywise.
    Blocks whose rows carry the same units (the heads of one attention layer) are summed
    before that product, and the product is dense on the few units a block's rows carry:
    no per-entry index of the ``rows x rows`` pair matrices is ever formed (for ViT-B/16
    that index alone was 4 GB).
    """

    CHUNK = 1 << 22  # entries of P2 formed at once

    def __init__(self, G, H, rows, groups):
        self.G, self.H, self.rows, self.groups = G, H, rows, groups

    @classmethod
    def of(cls, E_rows: Tensor, stack, parts) -> _PairTerm:
        G, H = (M.reshape(-1, *M.shape[-2:]) for M in stack)
        (_, _, rg, _), (_, _, rh, _) = parts
        B, ng, nh = G.shape[0], G.shape[-2], H.shape[-2]
        r, c = E_rows.indices()
        v = E_rows.values()
        sides = []
        for r0, n in ((rg, ng), (rh, nh)):
            hit = (r >= r0) & (r < r0 + B * n)
            local = r[hit] - r0
            sides.append((local // n, local % n, c[hit], v[hit], n))
        signature: dict = {}
        for b in range(B):
            key = []
            for blk, row, unit, val, _ in sides:
                at = blk == b
                key.append(
                    (
                        row[at].numpy().tobytes(),
                        unit[at].numpy().tobytes(),
                        val[at].numpy().tobytes(),
                    )
                )
            signature.setdefault(tuple(key), []).append(b)
        groups = []
        for members in signature.values():
            factors = []
            for blk, row, unit, val, n in sides:
                at = blk == members[0]
                units, local = unit[at].unique(return_inverse=True)
                Emat = torch.zeros(n, len(units), dtype=torch.float64)
                Emat[row[at], local] = val[at]
                factors.append((units, Emat))
            if all(len(f[0]) for f in factors):
                groups.append((torch.tensor(members), *factors))
        rows = (
            torch.arange(rg, rg + B * ng).view(B, ng),
            torch.arange(rh, rh + B * nh).view(B, nh),
        )
        return cls(G, H, rows, groups)

    def add(self, alpha: Tensor, g_rows: Tensor, cross: list) -> Tensor:
        """Add the row gradients to ``g_rows``, the cross blocks to ``cross``; return F."""
        F = alpha.new_zeros(())
        ng, nh = self.G.shape[-2], self.H.shape[-2]
        step = max(1, self.CHUNK // max(1, ng * nh))
        seen = torch.zeros(self.G.shape[0], dtype=torch.bool)
        for members, (_, Eg), (_, Eh) in self.groups:
            D = alpha.new_zeros(ng, nh)
            for lo in range(0, len(members), step):
                F = F + self._chunk(members[lo : lo + step], alpha, g_rows, D)
            seen[members] = True
            cross.append(Eg.T @ (4 * D) @ Eh)
        rest = (~seen).nonzero().squeeze(1)  # blocks without units on one side: no cross term
        for lo in range(0, len(rest), step):
            F = F + self._chunk(rest[lo : lo + step], alpha, g_rows, None)
        return F

    def _chunk(self, idx: Tensor, alpha, g_rows, D) -> Tensor:
        rg, rh = self.rows[0][idx], self.rows[1][idx]
        Gs = self.G[idx].double() * alpha[rg].unsqueeze(-1)
        Hs = self.H[idx].double() * alpha[rh].unsqueeze(-1)
        P2 = (Gs @ Hs.mT) ** 2  # (blocks, ng, nh): ||D_G G H^T D_H||^2 entrywise
        g_rows.index_add_(0, rg.reshape(-1), 2 * P2.sum(-1).reshape(-1))
        g_rows.index_add_(0, rh.reshape(-1), 2 * P2.sum(-2).reshape(-1))
        if D is not None:
            D += P2.sum(0)
        return P2.sum()


class _CrossPattern:
    """The sparse ``(n, n)`` matrix of the pair terms' dense unit blocks (pattern sorted once)."""

    def __init__(self, terms: list[_PairTerm], n: int):
        rows, cols = [], []
        for term in terms:
            for _, (ug, _), (uh, _) in term.groups:
                rows.append(ug[:, None].expand(len(ug), len(uh)).reshape(-1))
                cols.append(uh[None, :].expand(len(ug), len(uh)).reshape(-1))
        self.n = n
        if rows:
            key, self.inverse = torch.unique(
                torch.cat(rows) * n + torch.cat(cols), return_inverse=True
            )
            self.index = torch.stack([key // n, key % n])

    def matrix(self, blocks: list[Tensor]) -> Tensor:
        """The blocks (in the terms' group order) summed into one coalesced sparse matrix."""
        flat = torch.cat([b.reshape(-1) for b in blocks])
        vals = flat.new_zeros(self.index.shape[1]).index_add_(0, self.inverse, flat)
        return torch.sparse_coo_tensor(
            self.index, vals, (self.n, self.n), is_coalesced=True, check_invariants=False
        )


def _merged(c: Tensor, rows: Tensor, cols: Tensor, vals: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """``(c, E)`` with the rows of ``E`` that carry one unit at one exponent merged.

    ``sum_e c_e exp(2 (E u)_e)`` is unchanged when rows with the same single entry are
    summed into one (their ``c`` added): a LayerNorm gain's unit rescales a whole column
    of the next linear layer, thousands of entries, which become one row.
    """
    single = torch.bincount(rows, minlength=len(c))[rows] == 1
    exps, code = vals[single].unique(return_inverse=True)
    key, where = (cols[single] * len(exps) + code).unique(return_inverse=True)
    merged = c.new_zeros(len(key)).index_add_(0, where, c[rows[single]])
    multi = rows[~single]
    kept, renumber = multi.unique(return_inverse=True)
    out_rows = torch.cat([torch.arange(len(key)), len(key) + renumber])
    out_cols = torch.cat([key // len(exps), cols[~single]]) if len(exps) else cols[~single]
    out_vals = torch.cat([exps[key % len(exps)], vals[~single]]) if len(exps) else vals[~single]
    c = torch.cat([merged, c[kept]])
    return c, _sparse(out_rows, out_cols, out_vals, (len(c), n))


def _gram(E: Tensor, w: Tensor) -> Tensor:
    """``E^T diag(w) E`` (sparse ``(n, n)``) of a sparse COO ``E``."""
    rows, cols = E.indices()
    scaled = _sparse(rows, cols, E.values() * w[rows], E.shape)
    with warnings.catch_warnings():  # "sparse CSR support is in beta"
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse.mm(E.t(), scaled)


def _newton(obj: _Objective) -> Tensor | None:
    """Minimize the convex objective from ``u = 0``; None (with a warning) if it diverges."""
    u = torch.zeros(obj.n, dtype=torch.float64)
    F, g, Hm = obj.value_grad_hess(u)
    solver = None
    for _ in range(MAX_NEWTON):
        if solver is None or not solver.covers(Hm):  # the pattern is u's; checked, not assumed
            solver = BlockDiagonal(Hm)
        step = -solver.solve(Hm, g, 1e-14 * float(_trace(Hm)) / obj.n)
        t = 1.0
        while t > 1e-8:
            F_new, g_new, H_new = obj.value_grad_hess(u + t * step)
            if F_new <= F:
                break
            t /= 2
        u = u + t * step
        done = float((t * step).abs().max()) < NEWTON_TOL or F_new == F
        F, g, Hm = F_new, g_new, H_new
        if done:
            break
    if not bool(torch.isfinite(u).all()) or float(u.abs().max()) > 700:
        warnings.warn(
            "the balancing of the diagonal groups did not converge (a dead unit?); "
            "the geodesic measures use the point as it is",
            SymmetryWarning,
            stacklevel=3,
        )
        return None
    return u


def _trace(H: Tensor) -> Tensor:
    """Trace of a coalesced sparse COO matrix."""
    rows, cols = H.indices()
    return H.values()[rows == cols].sum()


def _sparse(rows: Tensor, cols: Tensor, vals: Tensor, shape) -> Tensor:
    index = torch.stack([rows, cols]) if rows.numel() else torch.zeros(2, 0, dtype=torch.long)
    return torch.sparse_coo_tensor(index, vals, shape, check_invariants=False).coalesce()


def _unique_first(key: Tensor) -> tuple[Tensor, Tensor]:
    """Sorted unique values of ``key`` and the index of one occurrence of each."""
    uniq, inv = key.unique(return_inverse=True)
    first = torch.full((len(uniq),), -1, dtype=torch.long)
    first[inv] = torch.arange(len(key))
    return uniq, first
