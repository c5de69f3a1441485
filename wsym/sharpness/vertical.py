r"""The vertical space of the whole continuous symmetry group, and the horizontal projection.

At a point :math:`\theta` every continuous group of the spec moves the parameters along
its orbit; the span of those directions is the *vertical space*
:math:`V_\theta = \{J a\}`, with :math:`J` the infinitesimal action (the Lie-algebra
generators at :math:`\theta`) and :math:`a` one coefficient per generator. A tangent
vector :math:`\xi` is *horizontal* under a metric :math:`M` when
:math:`J^\top M \xi = 0`; its horizontal part is

.. math::
    \xi_h = \xi - J a, \qquad (J^\top M J)\, a = J^\top M \xi ,

solved matrix-free by preconditioned conjugate gradients (the Gram matrix
:math:`J^\top M J` is never formed, nor any :math:`P \times P` matrix). The groups and
their generators (``docs/geometry.md``):

* a GL, orthogonal or GL(1) block ``(G, H)`` of :class:`wsym.quotient.Quotient`:
  :math:`J\Omega = (G\Omega, -H\Omega^\top)` (:math:`x \mapsto x M` on the rows of
  ``G``, :math:`x \mapsto x M^{-\top}` on those of ``H``, :math:`M = e^{t\Omega}`;
  :math:`\Omega` skew-symmetric for orthogonal groups), one coefficient matrix per block;
* every other ``scaling`` group, and ``norm_scaling`` groups without running
  statistics (LayerNorm / RMSNorm inputs): :math:`J a = \theta \odot (E a)`, with
  :math:`E` the sparse matrix of exponents (entry, unit); ``norm_scaling`` of a
  BatchNorm moves its running statistics too, so with the statistics fixed (eval mode)
  it is no symmetry of the parameters and has no vertical direction;
* ``uniform`` translations (a logit bias shifted by a constant): a fixed direction;
  ``full`` translations (a key bias, which softmax ignores entirely): their target
  entries are vertical altogether, so their horizontal part is zero. At the balanced
  point of :mod:`wsym.sharpness.gauge` those entries are zero, so no other generator
  touches them and zeroing them is the exact, decoupled projection.

The preconditioner inverts each block's own Gram matrix exactly (invariant metric:
a Lyapunov equation solved in the eigenbasis of :math:`QP`; mixed: :math:`\tfrac12
P^{-1} R Q^{-1}`) and the scaling groups' diagonal. It is equivariant, so the
conjugate-gradient iterates, and the projection, transform exactly with the group.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

from wsym.geometry import Gram
from wsym.group.kinds.translation import translate
from wsym.group.layout import map_blocks
from wsym.group.spec import SymmetrySpec

TOL = 1e-11
"""Relative residual (in the preconditioned norm) at which the Gram solve stops."""
MAX_ITER = 200

Coefficients = list[Tensor]


def _vertical_torus(spec: SymmetrySpec, params: dict[str, Tensor], skip: set[int]) -> list[int]:
    """Scaling / norm_scaling groups that move parameters only, minus the block groups."""
    buffers = set(spec.buffers)
    out = []
    for i, g in enumerate(spec.groups):
        if i in skip or g.kind not in ("scaling", "norm_scaling"):
            continue
        if g.kind == "norm_scaling" and (g.corrections or buffers & set(g.params)):
            continue  # BatchNorm: the running statistics move too
        if any(p in params for p in g.params):
            out.append(i)
    return out


def exponent_matrix(
    spec: SymmetrySpec, groups: list[int], names: list[str], params: dict[str, Tensor]
) -> Tensor:
    """Sparse ``E`` ``(entries, units)``: the exponent of each unit on each parameter entry.

    Rows follow the flat concatenation of ``names``; columns the units of ``groups``
    in turn. ``theta * (E @ a)`` is the generator of the scalings ``s = exp(a)``.
    """
    offsets, start = {}, 0
    for n in names:
        offsets[n] = start
        start += params[n].numel()
    rows, cols, vals = [], [], []
    col = 0
    for i in groups:
        g = spec.groups[i]
        exps = dict(g.exponents)
        for p in g.params:
            if p not in offsets:
                continue
            ids = torch.arange(params[p].numel(), dtype=torch.float64).reshape(params[p].shape)

            def grab(block, lv, p=p, g=g, exps=exps, col=col):
                for ax, leaf in enumerate(lv):
                    e = exps.get(leaf.var, 0)
                    if leaf.cls != g.cls or not e:
                        continue
                    shape = [1] * block.ndim
                    shape[ax] = -1
                    units = torch.arange(leaf.size).reshape(shape).expand(block.shape)
                    rows.append(block.reshape(-1).long() + offsets[p])
                    cols.append(units.reshape(-1) + col)
                    vals.append(torch.full((block.numel(),), float(e), dtype=torch.float64))
                return block

            map_blocks(spec, p, ids, grab)
        col += g.size
    if not rows:
        empty = torch.zeros(2, 0, dtype=torch.long)
        return torch.sparse_coo_tensor(empty, [], (start, col), check_invariants=False)
    index = torch.stack([torch.cat(rows), torch.cat(cols)])
    return torch.sparse_coo_tensor(
        index, torch.cat(vals), (start, col), check_invariants=False
    ).coalesce()


def translation_directions(
    spec: SymmetrySpec, names: list[str], params: dict[str, Tensor]
) -> tuple[Tensor, Tensor]:
    """``(full, uniform)``: 0/1 mask of full-translation entries, directions ``(entries, k)``."""
    offsets, start = {}, 0
    for n in names:
        offsets[n] = start
        start += params[n].numel()
    full = torch.zeros(start, dtype=torch.float64)
    uniform = []
    for g in spec.groups:
        if g.kind != "translation" or g.target[0] not in offsets:
            continue
        key, _, mode = g.target
        t = params[key].detach().double()
        ones = torch.ones((), dtype=torch.float64) if mode == "uniform" else torch.ones_like(t)
        moved = translate(g, ones, torch.zeros_like(t), list(spec.layout[key]))
        sl = slice(offsets[key], offsets[key] + t.numel())
        if mode == "uniform":
            d = torch.zeros(start, dtype=torch.float64)
            d[sl] = moved.reshape(-1)
            uniform.append(d)
        else:
            full[sl] = torch.maximum(full[sl], (moved != 0).double().reshape(-1))
    return full, (torch.stack(uniform, 1) if uniform else full.new_zeros(start, 0))


class Horizontal:
    """Horizontal projection of a :class:`~wsym.perturbation.Geodesic`'s tangent vectors.

    Works on the tangent layout flattened into one vector: every generator is a sparse
    matrix into it (scalings, translations) or a product with a block (GL, orthogonal,
    GL(1)), so one conjugate-gradient iteration is a few sparse products, the
    elementwise metric and one small matrix product per stack of blocks.

    Args:
        geom: the geometry (its tangent layout, metric and blocks); its base point
            should be the balanced point of :func:`wsym.sharpness.gauge.balanced`.
        spec: the symmetry spec.

    Attributes:
        groups: the scaling groups measured through their exponents (not blocks).
        iterations: conjugate-gradient iterations of the last projection.
    """

    def __init__(self, geom, spec: SymmetrySpec):
        self.geom = geom
        q, params, names = geom.quotient, geom.params, geom.names
        self.shapes = [t.shape for t in geom.coordinates()]
        self.sizes = [s.numel() for s in self.shapes]
        n = sum(self.sizes)
        like = next(iter(params.values()), torch.zeros(0, dtype=torch.float64))
        theta = torch.cat([params[k].reshape(-1) for k in names]) if names else like.new_zeros(0)
        # each parameter entry's position in the flat tangent layout (a partition)
        numbers = torch.arange(1, theta.numel() + 1, dtype=torch.float64)
        placed = self._flat(geom.to_tangent(numbers))
        pos = torch.zeros(theta.numel(), dtype=torch.long)
        hit = placed.nonzero().squeeze(1)
        pos[placed[hit].round().long() - 1] = hit
        blocks = {i for i, _ in q.blocks}
        self.groups = _vertical_torus(spec, params, blocks)
        E = exponent_matrix(spec, self.groups, names, params)
        rows, cols = E.indices()
        self.T = _csr(pos[rows], cols, E.values() * theta[rows].double(), (n, E.shape[1]))
        self.TT = _csr(cols, pos[rows], E.values() * theta[rows].double(), (E.shape[1], n))
        full, D = translation_directions(spec, names, params)
        self.keep = None
        where = full.nonzero().squeeze(1)
        if bool((theta[where] == 0).all()):  # canonical (zero) key biases: decoupled, zeroed
            if where.numel():
                self.keep = torch.ones(n, dtype=torch.float64)
                self.keep[pos[where]] = 0.0
        else:  # elsewhere GL moves them too: one direction per entry, solved with the rest
            unit = torch.zeros(theta.numel(), where.numel(), dtype=torch.float64)
            unit[where, torch.arange(where.numel())] = 1.0
            D = torch.cat([D, unit], 1)
        self.D = torch.zeros(n, D.shape[1], dtype=torch.float64)
        self.D[pos] = D
        self.stacks = q.stacks
        self.skew = q.orthogonal
        k = len(geom.slots)
        self._slots = sum(self.sizes[:k])
        offsets = torch.tensor([0, *self.sizes]).cumsum(0).tolist()
        self._views = [
            (
                slice(offsets[k + 2 * s], offsets[k + 2 * s + 1]),
                slice(offsets[k + 2 * s + 1], offsets[k + 2 * s + 2]),
            )
            for s in range(len(self.stacks))
        ]
        self.iterations = 0
        self.active = bool(E.shape[1] or D.shape[1] or self.stacks)
        self._unit_group = torch.repeat_interleave(
            torch.arange(len(self.groups)),
            torch.tensor([spec.groups[i].size for i in self.groups], dtype=torch.long),
        )
        self._cg = self._coupled(pos[rows], self._unit_group[cols], n)
        self._precompute()

    def _coupled(self, t_rows: Tensor, t_groups: Tensor, n: int) -> tuple:
        """Which coefficients need conjugate gradients: ``(units, translations, stacks)`` masks.

        The Gram matrix is block-diagonal over the connected components of "shares a
        tangent entry" (or a block row, through the block metric); a component of one
        stack, one translation, or one scaling group whose units touch disjoint plain
        entries is solved exactly by its preconditioner, the others by CG.
        """
        n_e, n_d, n_s = len(self.groups), self.D.shape[1], len(self.stacks)
        parent = list(range(n_e + n_d + n_s))

        def find(i):
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        stack_of = torch.full((n,), -1, dtype=torch.long)
        for s_, (g, h) in enumerate(self._views):
            stack_of[g], stack_of[h] = s_, s_
        d_rows, d_cols = self.D.nonzero(as_tuple=True)
        node_pos = torch.cat([t_rows, d_rows])
        nodes = torch.cat([t_groups, n_e + d_cols])
        in_stack = stack_of[node_pos] >= 0
        pairs = torch.stack([nodes[in_stack], n_e + n_d + stack_of[node_pos[in_stack]]], 1)
        order = torch.argsort(node_pos[~in_stack], stable=True)
        plain_pos, plain_nodes = node_pos[~in_stack][order], nodes[~in_stack][order]
        same = plain_pos[1:] == plain_pos[:-1]
        pairs = torch.cat([pairs, torch.stack([plain_nodes[:-1][same], plain_nodes[1:][same]], 1)])
        for a, b in pairs.unique(dim=0).tolist():
            ra, rb = find(a), find(b)
            if ra != rb:
                parent[ra] = rb
        roots = [find(i) for i in range(len(parent))]
        size = {r: roots.count(r) for r in set(roots)}
        inner = set(plain_nodes[:-1][same & (plain_nodes[:-1] == plain_nodes[1:])].tolist())
        cg = [size[roots[i]] > 1 or i in inner for i in range(len(parent))]
        groups = torch.tensor(cg[:n_e], dtype=torch.bool)
        units = groups[self._unit_group] if n_e else torch.zeros(0, dtype=torch.bool)
        return units, torch.tensor(cg[n_e : n_e + n_d], dtype=torch.bool), cg[n_e + n_d :]

    def _flat(self, xs: list[Tensor]) -> Tensor:
        return torch.cat([x.reshape(-1) for x in xs]) if xs else torch.zeros(0, dtype=torch.float64)

    def _unflat(self, v: Tensor) -> list[Tensor]:
        return [x.view(s) for x, s in zip(v.split(self.sizes), self.shapes, strict=True)]

    def _stack_views(self, v: Tensor, s: int) -> tuple[Tensor, Tensor]:
        g, h = self._views[s]
        G, H = self.stacks[s]
        return v[g].view(G.shape), v[h].view(H.shape)

    # -- the linear maps (flat tangent layout) ------------------------------------------
    def lower(self, v: Tensor, stacks: list | None = None) -> Tensor:
        """``M v``: the metric on a flat tangent vector.

        Entries of the stacks not flagged in ``stacks`` are left undefined.
        """
        out = torch.empty_like(v)
        out[: self._slots] = v[: self._slots] * self.geom._inv
        for s, (G, H) in enumerate(self.stacks):
            if stacks is not None and not stacks[s]:
                continue
            xG, xH = self._stack_views(v, s)
            oG, oH = self._stack_views(out, s)
            P, Q = Gram.of(G, self.geom.eps), Gram.of(H, self.geom.eps)
            if self.geom.metrics[s] == "invariant":
                oG.copy_(P.solve(xG, left=False))
                oH.copy_(Q.solve(xH, left=False))
            else:
                oG.copy_(xG @ Q.matrix)
                oH.copy_(xH @ P.matrix)
        return out

    def apply(self, c: Coefficients, stacks: list | None = None) -> Tensor:
        """``J c`` as a flat tangent vector (only the stacks flagged in ``stacks``)."""
        a, t, omegas = c[0], c[1], c[2:]
        v = self.T @ a if a.numel() else torch.zeros(sum(self.sizes), dtype=torch.float64)
        if t.numel():
            v = v + self.D @ t
        for s, (G, H) in enumerate(self.stacks):
            if stacks is not None and not stacks[s]:
                continue
            vG, vH = self._stack_views(v, s)
            vG.add_(G @ omegas[s])
            vH.sub_(H @ omegas[s].mT)
        return v

    def adjoint(self, y: Tensor, stacks: list | None = None) -> Coefficients:
        """``J^T y`` (Euclidean adjoint of :meth:`apply`; zero on unflagged stacks)."""
        out = [self.TT @ y if self.TT.shape[0] else y.new_zeros(0), self.D.T @ y]
        for s, (G, H) in enumerate(self.stacks):
            if stacks is not None and not stacks[s]:
                out.append(G.new_zeros((*G.shape[:-2], G.shape[-1], G.shape[-1])))
                continue
            yG, yH = self._stack_views(y, s)
            om = G.mT @ yG - (H.mT @ yH).mT
            out.append(_skew(om) if self.skew[s] else om)
        return out

    def gram(self, c: Coefficients, stacks: list | None = None) -> Coefficients:
        """``J^T M J c`` (only the stacks flagged in ``stacks``, default all)."""
        return self.adjoint(self.lower(self.apply(c, stacks), stacks), stacks)

    # -- the preconditioner ---------------------------------------------------------
    def _precompute(self) -> None:
        """Diagonal of the scaling part, eigenbases of the blocks' own Gram operators."""
        if self.TT.shape[0]:
            # sum_e E_eu^2 theta_e (M theta)_e: inside a block the row sums of
            # theta (M theta) are the rows' leverages, so with E constant along a block
            # row this is the exact diagonal of J^T M J
            theta_t = self._flat(self.geom.coordinates()).double()
            sq = torch.sparse_csr_tensor(
                self.TT.crow_indices(), self.TT.col_indices(), self.TT.values() ** 2, self.TT.shape
            )
            weight = self.lower(theta_t) / torch.where(
                theta_t != 0, theta_t, torch.ones_like(theta_t)
            )
            d = sq @ weight
            self._diag = torch.where(d > 0, 1.0 / d, torch.ones_like(d))
        if self.D.shape[1]:
            MD = torch.stack([self.lower(self.D[:, j]) for j in range(self.D.shape[1])], 1)
            self._tdiag = (self.D * MD).sum(0)
        self._blocks = []
        for s, (G, H) in enumerate(self.stacks):
            P, Q = Gram.of(G, self.geom.eps), Gram.of(H, self.geom.eps)
            sides = (G.shape[-2] > 0, H.shape[-2] > 0)
            if self.geom.metrics[s] == "mixed" and all(sides):
                self._blocks.append(("mixed", P.matrix, Q.matrix))
            elif all(sides):  # invariant: P W P^-1 + Q^-1 W Q = R, i.e. C W + W C = Q R P
                Qh = _sym_sqrt(Q.matrix)
                lam, U = torch.linalg.eigh(Qh @ P.matrix @ Qh)
                S = Qh @ U
                Sinv = U.mT @ torch.linalg.inv(Qh)
                den = lam[..., :, None] + lam[..., None, :]
                self._blocks.append(("lyapunov", Q.matrix, P.matrix, S, Sinv, den))
            elif sides[0]:  # one side (orthogonal): P W P^-1 = R
                self._blocks.append(("left", P.matrix, torch.linalg.inv(P.matrix)))
            else:
                self._blocks.append(("right", Q.matrix, torch.linalg.inv(Q.matrix)))

    def precondition(self, r: Coefficients) -> Coefficients:
        """Approximate ``(J^T M J)^{-1} r``: exact per block, diagonal for scalings."""
        out = [r[0] * self._diag if r[0].numel() else r[0]]
        out.append(r[1] / self._tdiag if r[1].numel() else r[1])
        for s, (plan, R) in enumerate(zip(self._blocks, r[2:], strict=True)):
            kind = plan[0]
            if kind == "mixed":
                _, P, Q = plan
                W = 0.5 * torch.linalg.solve(P, torch.linalg.solve(Q, R.mT).mT)
            elif kind == "lyapunov":
                _, Q, P, S, Sinv, den = plan
                W = S @ ((Sinv @ (Q @ R @ P) @ S) / den) @ Sinv
            elif kind == "left":
                _, P, Pinv = plan
                W = Pinv @ R @ P
            else:
                _, Q, Qinv = plan
                W = Q @ R @ Qinv
            out.append(_skew(W) if self.skew[s] else W)
        return out

    # -- the projection -------------------------------------------------------------
    def project(self, xi: list[Tensor]) -> list[Tensor]:
        """The horizontal part of ``xi`` (tangent layout)."""
        v = self._flat(xi)
        if self.keep is not None:
            v = v * self.keep
        if self.active:
            v = v - self.apply(self.solve(self.adjoint(self.lower(v))))
        return self._unflat(v)

    def solve(self, b: Coefficients) -> Coefficients:
        """``(J^T M J)^{-1} b``: exact on decoupled components, CG on the coupled ones."""
        units, trans, stacks = self._cg
        exact = self._restrict(self.precondition(b), ~units, ~trans, [not c for c in stacks])
        self.iterations = 0
        if not (bool(units.any()) or bool(trans.any()) or any(stacks)):
            return exact
        keep = (units, trans, stacks)
        x = [torch.zeros_like(t) for t in b]
        r = self._restrict(list(b), *keep)
        z = self._restrict(self.precondition(r), *keep)
        rz = _dot(r, z)
        stop = TOL * TOL * rz
        p = z
        while rz > stop and rz > 0 and self.iterations < MAX_ITER:
            Kp = self._restrict(self.gram(p, stacks), *keep)
            alpha = rz / _dot(p, Kp)
            x = [u + alpha * v for u, v in zip(x, p, strict=True)]
            r = [u - alpha * v for u, v in zip(r, Kp, strict=True)]
            z = self._restrict(self.precondition(r), *keep)
            rz_new = _dot(r, z)
            p = [u + (rz_new / rz) * v for u, v in zip(z, p, strict=True)]
            rz = rz_new
            self.iterations += 1
        return [u + v for u, v in zip(x, exact, strict=True)]

    @staticmethod
    def _restrict(c: Coefficients, units: Tensor, trans: Tensor, stacks: list) -> Coefficients:
        """``c`` with the coefficients outside the masks set to zero."""
        out = [c[0] * units if c[0].numel() else c[0], c[1] * trans if c[1].numel() else c[1]]
        return out + [
            w if keep else torch.zeros_like(w) for w, keep in zip(c[2:], stacks, strict=True)
        ]


def _csr(rows: Tensor, cols: Tensor, vals: Tensor, shape) -> Tensor:
    index = torch.stack([rows, cols]) if rows.numel() else torch.zeros(2, 0, dtype=torch.long)
    coo = torch.sparse_coo_tensor(index, vals, shape, check_invariants=False).coalesce()
    with warnings.catch_warnings():  # "sparse CSR support is in beta"
        warnings.simplefilter("ignore", UserWarning)
        return coo.to_sparse_csr()


def _dot(a: Coefficients, b: Coefficients) -> Tensor:
    return sum((x * y).sum() for x, y in zip(a, b, strict=True))


def _skew(W: Tensor) -> Tensor:
    return 0.5 * (W - W.mT)


def _sym_sqrt(A: Tensor) -> Tensor:
    lam, U = torch.linalg.eigh(A)
    return (U * lam.clamp_min(0).sqrt()[..., None, :]) @ U.mT
