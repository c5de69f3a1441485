r"""Exact solve of the coupled Gram system by the Schur complement on the scaling units.

Where scaling units overlap GL blocks (a LayerNorm gain and the query, key and value
heads it feeds), the Gram system of :class:`wsym.sharpness.vertical.Horizontal` is

.. math::
    \begin{pmatrix} A & B \\ B^\top & C \end{pmatrix}
    \begin{pmatrix} a \\ \Omega \end{pmatrix} =
    \begin{pmatrix} b \\ R \end{pmatrix},

with :math:`a` one coefficient per unit, :math:`\Omega` one matrix per block and
:math:`C` block-diagonal, inverted exactly per block. A unit scales whole rows of the
blocks it touches (``J_u = (D_u G, D'_u H)``, ``D_u`` diagonal), so under the mixed
metric the Schur complement :math:`S = A - B C^{-1} B^\top` has a closed form in
Hadamard products of the blocks' row Gram matrices (``docs/geometry.md``):

.. math::
    B C^{-1} B^\top = \tfrac12 \sum_{\text{blocks}} E^\top
    \begin{pmatrix} L_G \circ K_G & -X \circ X \\ -(X \circ X)^\top & K_H \circ L_H
    \end{pmatrix} E,

:math:`L_G = G P^{-1} G^\top`, :math:`K_G = G Q G^\top`, :math:`X = G H^\top`,
:math:`K_H = H P H^\top`, :math:`L_H = H Q^{-1} H^\top`, :math:`E` the units' row
exponents. :math:`S` is block-diagonal over the connected components of "touch the same
block or entry", so it is assembled and Cholesky-factored once per base point, one
small dense matrix per component; as the preconditioner of conjugate gradients it
makes one iteration enough (more where forming it lost digits to cancellation).
Under the invariant metric :math:`C^{-1}` is a Lyapunov
solve, and the same complement is one product of ``(rows, h^2)`` factors per block
(:func:`_invariant_term`), formed where it costs less than a few dozen
conjugate-gradient iterations (:data:`MAX_ROWS`).

:func:`schur` returns None (the caller keeps conjugate gradients) where this does not
apply: an invariant-metric block of more than :data:`MAX_ROWS` rows, an orthogonal or
one-sided block, a translation among the coupled
generators, or a unit whose exponent varies along a block row.
"""

from __future__ import annotations

import torch
from torch import Tensor

from wsym.sharpness.geometry import Gram

SHIFT = 1e-13
"""Regularization of each Schur block, relative to its mean diagonal: finite when singular."""


class Schur:
    """Cholesky factors of the Schur complement, one batch per component size.

    Also the two coupling products of the elimination in closed form (a unit scales
    whole block rows, ``D`` on the rows of ``G``, ``D'`` on those of ``H``; ``M_G``,
    ``M_H`` the metric's right factors on ``G`` and ``H``, ``Q`` and ``P`` for the mixed
    metric, ``P^-1`` and ``Q^-1`` for the invariant one):

    * :meth:`units_of`, the units' part of ``J^T M J Omega``: per row ``r`` of ``G``,
      ``d_r <g_r, (G Omega M_G)_r>``, and of ``H``, ``-d'_r <h_r, (H Omega^T M_H)_r>``;
    * :meth:`blocks_of`, ``B^T a``: ``(G^T D G) M_G - M_H (H^T D' H)``.

    One product with each factor per block instead of the two of applying ``J``, ``M``
    and ``J^T`` in turn (and no gather over the units' entries).

    Attributes:
        groups: per component size ``k``, the units ``(C, k)`` and factors ``(C, k, k)``.
        rows: per coupled stack, its rows' units and exponents ``(K, blocks, n + m)``
            and the metric factors ``(M_G, M_H)``.
    """

    def __init__(self, groups: list[tuple[Tensor, Tensor]], rows: dict | None = None):
        self.groups, self.rows = groups, rows or {}

    def solve(self, r: Tensor) -> Tensor:
        """``S^{-1} r`` for a vector ``r`` over all units (zero outside the components)."""
        out = torch.zeros_like(r)
        for units, factor in self.groups:  # factors in float64 whatever the working dtype
            x = torch.cholesky_solve(r[units].unsqueeze(-1).to(factor.dtype), factor)
            out[units] = x.squeeze(-1).to(r.dtype)
        return out

    def units_of(self, stacks, omegas, n_units: int, dtype=torch.float64) -> Tensor:
        """The units' part of ``J^T M J Omega`` for block coefficients ``omegas`` (per stack)."""
        out = torch.zeros(n_units + 1, dtype=dtype)
        for s, (ru, re, (MG, MH)) in self.rows.items():
            G, H = stacks[s]
            W = omegas[s]
            yG, yH = G @ (W @ MG), -(H @ (W.mT @ MH))
            add_row_sums(out, ru, re, G, H, yG, yH)
        return out[:n_units]

    def blocks_of(self, stacks, a: Tensor) -> dict[int, Tensor]:
        """``B^T a``: the block part of ``J^T M J a`` for unit coefficients ``a``, per stack."""
        ext = torch.cat([a, a.new_zeros(1)])
        out = {}
        for s, (ru, re, (MG, MH)) in self.rows.items():
            G, H = stacks[s]
            dG, dH = row_scalings(ru, re, ext, G)
            out[s] = (G.mT @ (dG * G)) @ MG - MH @ (H.mT @ (dH * H))
        return out


def row_scalings(ru: Tensor, re: Tensor, ext: Tensor, G: Tensor) -> tuple[Tensor, Tensor]:
    """Each block row's scaling ``d = sum_k re_k a[ru_k]`` for unit coefficients ``ext``.

    ``ru``, ``re`` ``(K, blocks, n + m)``: the rows' units and exponents (``ext`` has a
    trailing 0 for "no unit"). Returns ``(d_G (..., n, 1), d_H (..., m, 1))``, shaped to
    broadcast over the rows of a stack whose ``G`` is ``G``.
    """
    d = (re * ext[ru]).sum(0).reshape(*G.shape[:-2], -1, 1)
    return d[..., : G.shape[-2], :], d[..., G.shape[-2] :, :]


def add_row_sums(out: Tensor, ru: Tensor, re, G, H, yG: Tensor, yH: Tensor) -> None:
    """``out[u] += sum_r re_r <row_r of (G, H), row_r of (yG, yH)>`` over the rows of unit u.

    The adjoint of :func:`row_scalings` times the block: ``out`` has ``n_units + 1``
    entries (the last collects rows of no unit).
    """
    r = torch.cat([(G * yG).sum(-1), (H * yH).sum(-1)], -1).reshape(ru.shape[1:])
    out.index_add_(0, ru.reshape(-1), (re * r).reshape(-1))


def schur(h, lay) -> Schur | None:
    """The Schur complement of ``h``'s coupled system on the reduced layout ``lay``, or None."""
    units, trans, stacks = h._cg
    if bool(trans.any()):
        return None
    coupled = [s for s, c in enumerate(stacks) if c]
    for s in coupled:
        G, H = h.stacks[s]
        if h.skew[s] or not (G.shape[-2] and H.shape[-2]):
            return None
        if h.geom.metrics[s] == "invariant" and G.shape[-2] + H.shape[-2] > MAX_ROWS:
            return None
    n = h.n_units
    plain = lay.sup < lay.slots
    idx, val = lay.idx[:, plain], lay.val[:, plain]
    inv = lay.slot_inv[lay.sup[plain]]
    rowsets = {}
    for s in coupled:
        rowsets[s] = row_exponents(h, lay, s)
        if rowsets[s] is None:
            return None
    edges = [idx[[0, a]] for a in range(1, idx.shape[0])]
    for ru, _ in rowsets.values():
        first = ru.min(0).values.min(-1, keepdim=True).values.expand_as(ru[0])
        edges += [torch.stack([r.reshape(-1), first.reshape(-1)]) for r in ru]
    plan = _Plan.of(n, torch.cat(edges, 1) if edges else torch.zeros(2, 0, dtype=torch.long), units)
    if plan is None:
        return None
    for a in range(idx.shape[0]):  # elementwise entries: A = J^T diag(inv) J over plain slots
        for b in range(idx.shape[0]):
            plan.add(idx[a], idx[b], val[a] * val[b] * inv)
    for s in coupled:
        G, H = h.stacks[s]
        ru, re = rowsets[s]
        G, H = G.reshape(-1, *G.shape[-2:]), H.reshape(-1, *H.shape[-2:])
        rows, width = ru.shape[-1], G.shape[-1]
        chunk = max(1, CHUNK // max(rows * rows, rows * width * width))
        for lo in range(0, G.shape[0], chunk):
            part = slice(lo, lo + chunk)
            if h.geom.metrics[s] == "mixed":
                M = _mixed_term(G[part], H[part], h.geom.eps)
            else:
                S, Sinv, den = h._blocks[s][3:6]
                flat = [t.reshape(-1, *t.shape[-2:])[part] for t in (S, Sinv, den)]
                M = _invariant_term(G[part], H[part], h.geom.eps, *flat)
            for a in range(ru.shape[0]):
                for b in range(ru.shape[0]):
                    ua, ub = ru[a, lo : lo + chunk], ru[b, lo : lo + chunk]
                    w = re[a, lo : lo + chunk, :, None] * re[b, lo : lo + chunk, None, :] * M
                    plan.add(ua[:, :, None].expand_as(w), ub[:, None, :].expand_as(w), w)
    factor = plan.factor()
    if factor is not None:
        factor.rows = {s: (*rowsets[s], _metric_factors(h, s)) for s in coupled}
    return factor


def _metric_factors(h, s: int) -> tuple[Tensor, Tensor]:
    """The metric's right factors on ``G`` and ``H`` of stack ``s`` (``M xi = xi M_G``)."""
    G, H = h.stacks[s]
    P, Q = Gram.of(G, h.geom.eps), Gram.of(H, h.geom.eps)
    if h.geom.metrics[s] == "mixed":
        return Q.matrix, P.matrix
    eye = torch.eye(G.shape[-1], dtype=G.dtype).expand_as(P.matrix)
    return P.solve(eye), Q.solve(eye)


CHUNK = 1 << 22
"""Entries of the blocks' row Gram matrices formed at once (bounds the memory)."""
MAX_ROWS = 600
"""Invariant metric: the Schur complement costs about ``(n + m) / 6`` CG iterations per
block (``2 (n + m)^2 h^2`` flops against ``12 (n + m) h^2``), formed only below this."""


def _mixed_term(G: Tensor, H: Tensor, eps: float) -> Tensor:
    """``diag(K_G, K_H) - B C^{-1} B^T`` in row coordinates, per block ``(b, n + m, n + m)``.

    The first term is the units' own Gram matrix on the block rows (the mixed metric
    weighs row ``r`` of ``G`` by ``(G Q G^T)_{rr}``), the second the part the block's
    generators take away.
    """
    P, Q = Gram.of(G, eps).matrix, Gram.of(H, eps).matrix
    K_G, K_H = G @ Q @ G.mT, H @ P @ H.mT
    L_G, L_H = G @ torch.linalg.solve(P, G.mT), H @ torch.linalg.solve(Q, H.mT)
    X2 = (G @ H.mT) ** 2
    M = -0.5 * torch.cat([torch.cat([L_G * K_G, -X2], -1), torch.cat([-X2.mT, K_H * L_H], -1)], -2)
    own = torch.cat([K_G.diagonal(dim1=-2, dim2=-1), K_H.diagonal(dim1=-2, dim2=-1)], -1)
    M.diagonal(dim1=-2, dim2=-1).add_(own)
    return M


def _invariant_term(
    G: Tensor, H: Tensor, eps: float, S: Tensor, Sinv: Tensor, den: Tensor
) -> Tensor:
    """The invariant metric's ``diag(L_G, L_H) - B C^{-1} B^T`` per block, rows of G then H.

    A unit on row ``r`` of ``G`` has ``B^T e_r = g_r (P^{-1} g_r)^T`` and on row ``c`` of
    ``H`` ``-Q^{-1} h_c h_c^T``; ``C^{-1}`` is the Lyapunov solve of
    :meth:`Horizontal.precondition` (``K = QP = S diag(lam) S^{-1}``), so
    ``<B^T e_r', C^{-1} B^T e_r> = sum_jk u_r'j v_r'k alpha_rj beta_rk / den_jk``: one
    matrix product of ``(rows, h^2)`` factors per block.
    """
    P, Q = Gram.of(G, eps).matrix, Gram.of(H, eps).matrix
    PG, QH = torch.linalg.solve(P, G.mT), torch.linalg.solve(Q, H.mT)  # P^-1 g_r, Q^-1 h_c
    St, Si = S.mT, Sinv
    alpha = torch.cat([(Si @ Q @ G.mT).mT, -(Si @ H.mT).mT], -2)  # (b, rows, h)
    beta = torch.cat([(St @ G.mT).mT, (St @ P @ H.mT).mT], -2)
    u = torch.cat([(St @ G.mT).mT, -(St @ QH).mT], -2)
    v = torch.cat([(Si @ PG).mT, (Si @ H.mT).mT], -2)
    b, rows, w = alpha.shape
    Y = (alpha[..., :, None] * beta[..., None, :] / den[:, None]).reshape(b, rows, w * w)
    U = (u[..., :, None] * v[..., None, :]).reshape(b, rows, w * w)
    M = -(U @ Y.mT)
    own = torch.cat([(G * PG.mT).sum(-1), (H * QH.mT).sum(-1)], -1)  # diag of G P^-1 G^T, ...
    M.diagonal(dim1=-2, dim2=-1).add_(own)
    return M


def row_exponents(h, lay, s: int) -> tuple[Tensor, Tensor] | None:
    """Per block row of stack ``s``: its units and exponents ``(K, blocks, n + m)``, or None.

    ``h.n_units`` marks no unit. None when an exponent varies along a row (the closed
    form needs whole-row scalings).
    """
    K = lay.idx.shape[0]
    parts_u, parts_e = [], []
    for view, factor in zip(lay.views[s], h.stacks[s], strict=True):
        u = torch.full((K, factor.numel()), h.n_units, dtype=torch.long)
        e = torch.zeros((K, factor.numel()), dtype=factor.dtype)
        inside = (lay.sup >= view.start) & (lay.sup < view.stop)
        local = lay.sup[inside] - view.start
        order = torch.argsort(lay.idx[:, inside], 0)  # the same order of units on every entry
        u[:, local] = torch.gather(lay.idx[:, inside], 0, order)
        e[:, local] = torch.gather(lay.exps[:, inside], 0, order)
        u, e = u.view(K, *factor.shape), e.view(K, *factor.shape)
        if not (bool((u == u[..., :1]).all()) and bool((e == e[..., :1]).all())):
            return None
        parts_u.append(u[..., 0])
        parts_e.append(e[..., 0])
    u, e = torch.cat(parts_u, -1), torch.cat(parts_e, -1)
    return u.reshape(K, -1, u.shape[-1]), e.reshape(K, -1, e.shape[-1])


class _Plan:
    """Dense storage of the Schur complement, one ``k x k`` matrix per component."""

    def __init__(self, n: int, groups: list[tuple[Tensor, int, int]]):
        self.n, self.groups = n, groups
        self.base = torch.zeros(n + 1, dtype=torch.long)
        self.local = torch.zeros(n + 1, dtype=torch.long)
        self.size = torch.zeros(n + 1, dtype=torch.long)
        offset = 0
        for block, start, k in groups:
            self.local[block] = torch.arange(k).expand_as(block)
            self.base[block] = start + torch.arange(block.shape[0])[:, None] * k * k
            self.size[block] = k
            offset = start + block.shape[0] * k * k
        self.flat = torch.zeros(offset + 1, dtype=torch.float64)  # last entry: discarded
        self.base[n] = offset

    @classmethod
    def of(cls, n: int, edges: Tensor, coupled: Tensor) -> _Plan | None:
        """Components of the units linked by ``edges`` ``(2, e)`` (``n`` marks no unit)."""
        ok = (edges < n).all(0)
        a, b = edges[0, ok], edges[1, ok]
        a, b = torch.cat([a, b]), torch.cat([b, a])
        label = torch.arange(n)
        while True:  # propagate the smallest label along the edges, then jump pointers
            new = label.clone().scatter_reduce_(0, a, label[b], reduce="amin")
            new = new[new]
            if bool((new == label).all()):
                break
            label = new
        if bool((~coupled[a]).any()):
            return None  # an entry ties a coupled unit to a decoupled one: keep CG
        by_label: dict[int, list[int]] = {}
        for u in coupled.nonzero().squeeze(1).tolist():
            by_label.setdefault(int(label[u]), []).append(u)
        by_size: dict[int, list[list[int]]] = {}
        for us in by_label.values():
            by_size.setdefault(len(us), []).append(us)
        groups, start = [], 0
        for k, comps in by_size.items():
            groups.append((torch.tensor(comps, dtype=torch.long), start, k))
            start += len(comps) * k * k
        return cls(n, groups)

    def add(self, rows: Tensor, cols: Tensor, vals: Tensor) -> None:
        """Accumulate entries ``S[rows, cols] += vals`` (entries naming no unit dropped)."""
        rows, cols, vals = rows.reshape(-1), cols.reshape(-1), vals.reshape(-1)
        drop = (rows == self.n) | (cols == self.n)
        at = self.base[rows] + self.local[rows] * self.size[rows] + self.local[cols]
        self.flat.index_add_(
            0, torch.where(drop, self.flat.numel() - 1, at), vals.to(self.flat.dtype)
        )

    def factor(self) -> Schur | None:
        """Cholesky factors per component (regularized by :data:`SHIFT`); None if not PD."""
        out = []
        for block, start, k in self.groups:
            S = self.flat[start : start + block.shape[0] * k * k].view(-1, k, k)
            S = 0.5 * (S + S.mT)
            mean = S.diagonal(dim1=-2, dim2=-1).mean(-1).clamp_min(torch.finfo(S.dtype).tiny)
            S = S + SHIFT * mean[:, None, None] * torch.eye(k, dtype=S.dtype)
            factor, info = torch.linalg.cholesky_ex(S)
            if bool(info.any()):
                return None
            out.append((block, factor))
        return Schur(out)
