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

* a GL, orthogonal or GL(1) block ``(G, H)`` of :class:`wsym.sharpness.quotient.Quotient`:
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

import torch
from torch import Tensor

from wsym.group.spec import SymmetrySpec
from wsym.sharpness import tangent
from wsym.sharpness.exponents import translation_directions
from wsym.sharpness.geometry import Gram
from wsym.sharpness.geometry.block import addmm, mm
from wsym.sharpness.schur import add_row_sums, row_exponents, row_scalings, schur
from wsym.sharpness.structure import TangentLayout, structure
from wsym.sharpness.tangent import FlatTangent

TOL = 1e-11
"""Relative residual (in the preconditioned norm) at which the Gram solve stops (float64)."""
TOLS = {torch.float64: TOL, torch.float32: 1e-5}
""":data:`TOL` per working dtype (float32: about 100 machine epsilons)."""
MAX_ITER = 200

Coefficients = list[Tensor]


class Horizontal:
    """Horizontal projection of a :class:`~wsym.sharpness.perturbation.Geodesic`'s tangent vectors.

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
        exact: precondition with the Schur complement where it applies (default True;
            False keeps the per-group preconditioner, as a reference).
        trusted: the Schur solve met the CG tolerance on :meth:`probe_schur`'s
            right-hand side, so it is used without conjugate gradients.
    """

    def __init__(self, geom, spec: SymmetrySpec):
        self.geom = geom
        q, params, names = geom.quotient, geom.params, geom.names
        st = structure(geom, spec)
        self.shapes, self.sizes, self._views, self._slots = st.shapes, st.sizes, st.views, st.slots
        self.groups, self.n_units = st.groups, st.n_units
        self._idx, self._support = st.idx, st.support
        n = sum(self.sizes)
        like = next(iter(params.values()), torch.zeros(0, dtype=torch.float64))
        theta = torch.cat([params[k].reshape(-1) for k in names]) if names else like.new_zeros(0)
        self.dtype = theta.dtype if theta.dtype in TOLS else torch.float64
        self.tol = TOLS[self.dtype]
        theta = theta.to(self.dtype)
        self._exps = st.exps.to(self.dtype)
        self._val = self._exps * theta[st.param_of]  # (K, support): exponent * theta per unit slot
        full, D = translation_directions(spec, names, params)
        self.keep = None
        where = full.nonzero().squeeze(1)
        if bool((theta[where] == 0).all()):  # canonical (zero) key biases: decoupled, zeroed
            if where.numel():
                self.keep = torch.ones(n, dtype=self.dtype)
                self.keep[st.pos[where]] = 0.0
        else:  # elsewhere GL moves them too: one direction per entry, solved with the rest
            unit = torch.zeros(theta.numel(), where.numel(), dtype=self.dtype)
            unit[where, torch.arange(where.numel())] = 1.0
            D = torch.cat([D, unit], 1)
        self.D = torch.zeros(n, D.shape[1], dtype=self.dtype)
        self.D[st.pos] = D.to(self.dtype)
        self.stacks = q.stacks
        self.skew = q.orthogonal
        self.iterations = 0
        self.active = bool(self.n_units or D.shape[1] or self.stacks)
        # translations are few: always with conjugate gradients
        self._cg = (st.cg_units, torch.ones(D.shape[1], dtype=torch.bool), st.cg_stacks)
        self._layout = self._full()
        self._rowwise = self._row_units(self._layout)
        self._reduced_layout = None
        self._schur = None
        self.trusted = False  # the Schur solve passed :meth:`probe_schur` at this base point
        self.exact = True  # the Schur complement where it applies, else conjugate gradients
        self._keep_commutes = self._keeps_rows()
        self._drop = None if self.keep is None else (self.keep == 0).nonzero().squeeze(1)
        self._precompute()

    def _flat(self, xs: list[Tensor]) -> Tensor:
        return torch.cat([x.reshape(-1) for x in xs]) if xs else torch.zeros(0, dtype=self.dtype)

    def _unflat(self, v: Tensor) -> list[Tensor]:
        return [x.view(s) for x, s in zip(v.split(self.sizes), self.shapes, strict=True)]

    def _views_of(self, v: Tensor, lay: TangentLayout, s: int) -> tuple[Tensor, Tensor]:
        g, h = lay.views[s]
        G, H = self.stacks[s]
        return v[g].view(G.shape), v[h].view(H.shape)

    def _full(self) -> TangentLayout:
        return TangentLayout(
            sum(self.sizes), self._slots, self.geom._inv, self._views,
            self._support, self._idx, self._val, self.D, self._exps, *_rows_of(self.D),
        )  # fmt: skip

    def _reduced(self) -> TangentLayout:
        """The tangent entries the coupled generators touch (where CG iterates)."""
        units, _, stacks = self._cg
        ext = torch.cat([units, torch.tensor([False])])
        cols = ext[self._idx].any(0) if self._idx.numel() else torch.zeros(0, dtype=torch.bool)
        parts = [self._support[cols], self.D.any(1).nonzero().squeeze(1)]
        for s, (g, h) in enumerate(self._views):
            if stacks[s]:
                parts += [torch.arange(g.start, g.stop), torch.arange(h.start, h.stop)]
        R = torch.cat(parts).unique()
        slots = int((R < self._slots).sum())
        views = [
            (
                slice(int(torch.searchsorted(R, g.start)), int(torch.searchsorted(R, g.stop))),
                slice(int(torch.searchsorted(R, h.start)), int(torch.searchsorted(R, h.stop))),
            )
            if stacks[s]
            else None
            for s, (g, h) in enumerate(self._views)
        ]
        sup = torch.searchsorted(R, self._support[cols])
        return TangentLayout(
            len(R), slots, self.geom._inv[R[:slots]], views,
            sup, self._idx[:, cols], self._val[:, cols], self.D[R], self._exps[:, cols],
            *_rows_of(self.D[R]),
        )  # fmt: skip

    def _row_units(self, lay: TangentLayout):
        """The units' gather split into whole block rows (read per row) and the rest, or None.

        A unit that scales whole rows of a block (a LayerNorm gain feeding attention heads)
        acts there as ``d * G`` per row: no gather over its entries. None where some unit's
        exponent varies along a block row (the gather stays).
        """
        if not self.n_units:
            return None
        rows, inside = {}, torch.zeros_like(lay.sup, dtype=torch.bool)
        for s, views in enumerate(lay.views):
            if views is None:
                continue
            hit = torch.zeros_like(inside)
            for v in views:
                hit |= (lay.sup >= v.start) & (lay.sup < v.stop)
            if not bool(hit.any()):
                continue
            rows[s] = row_exponents(self, lay, s)
            if rows[s] is None:
                return None
            inside |= hit
        rest = ~inside
        return rows, lay.sup[rest], lay.idx[:, rest], lay.val[:, rest]

    # -- the linear maps (flat tangent layout, or the reduced one) -------------------------
    def lower(self, v: Tensor, lay: TangentLayout | None = None) -> Tensor:
        """``M v``: the metric on a flat tangent vector (in layout ``lay``, default all)."""
        lay = lay or self._layout
        out = torch.empty_like(v)
        out[: lay.slots] = v[: lay.slots] * lay.slot_inv
        for s, (G, H) in enumerate(self.stacks):
            if lay.views[s] is None:
                continue
            xG, xH = self._views_of(v, lay, s)
            oG, oH = self._views_of(out, lay, s)
            P, Q = Gram.of(G, self.geom.eps), Gram.of(H, self.geom.eps)
            if self.geom.metrics[s] == "invariant":
                oG.copy_(P.solve(xG, left=False))
                oH.copy_(Q.solve(xH, left=False))
            else:
                oG.copy_(mm(xG, Q.matrix))
                oH.copy_(mm(xH, P.matrix))
        return out

    def apply(
        self,
        c: Coefficients,
        lay: TangentLayout | None = None,
        out: Tensor | None = None,
        alpha: float = 1.0,
    ) -> Tensor:
        """``J c`` as a flat tangent vector (in layout ``lay``, default all); None: zero part.

        ``out``: add ``alpha J c`` to this flat vector in place (and return it) instead.
        """
        lay = lay or self._layout
        a, t, omegas = c[0], c[1], c[2:]
        v = torch.zeros(lay.n, dtype=self.dtype) if out is None else out
        if a is not None and a.numel():
            ext = torch.cat([a, a.new_zeros(1)])
            rows, sup, idx, val = self._gather_of(lay)
            v.index_add_(0, sup, (val * ext[idx]).sum(0), alpha=alpha)
            for s, (ru, re) in rows.items():
                (vG, vH), (G, H) = self._views_of(v, lay, s), self.stacks[s]
                dG, dH = row_scalings(ru, re, ext, G)
                vG.addcmul_(dG, G, value=alpha)
                vH.addcmul_(dH, H, value=alpha)
        if t is not None and t.numel():
            v.index_add_(0, lay.d_rows, lay.d_vals @ t, alpha=alpha)
        for s, (G, H) in enumerate(self.stacks):
            if lay.views[s] is None or omegas[s] is None:
                continue
            vG, vH = self._views_of(v, lay, s)
            addmm(vG, G, omegas[s], alpha, out=vG)
            addmm(vH, H, omegas[s].mT, -alpha, out=vH)
        return v

    def adjoint(self, y: Tensor, lay: TangentLayout | None = None) -> Coefficients:
        """``J^T y`` (Euclidean adjoint of :meth:`apply`; zero on stacks outside ``lay``)."""
        lay = lay or self._layout
        rows, sup, idx, val = self._gather_of(lay)
        units = y.new_zeros(self.n_units + 1)
        units.index_add_(0, idx.reshape(-1), (val * y[sup]).reshape(-1))
        for s, (ru, re) in rows.items():
            add_row_sums(units, ru, re, *self.stacks[s], *self._views_of(y, lay, s))
        out = [units[: self.n_units], lay.d_vals.T @ y[lay.d_rows]]
        for s, (G, H) in enumerate(self.stacks):
            if lay.views[s] is None:
                out.append(G.new_zeros((*G.shape[:-2], G.shape[-1], G.shape[-1])))
                continue
            yG, yH = self._views_of(y, lay, s)
            om = mm(G.mT, yG) - mm(H.mT, yH).mT
            out.append(_skew(om) if self.skew[s] else om)
        return out

    def _gather_of(self, lay: TangentLayout) -> tuple:
        """``(rows, sup, idx, val)``: block rows read per row (full layout), the rest gathered."""
        if lay is self._layout and self._rowwise is not None:
            return self._rowwise
        return {}, lay.sup, lay.idx, lay.val

    def _unit_sums(self, values: Tensor, idx: Tensor) -> Tensor:
        """Sum ``values`` ``(K, support)`` into their units ``idx`` (adjoint of the gather)."""
        out = values.new_zeros(self.n_units + 1)
        out.index_add_(0, idx.reshape(-1), values.reshape(-1))
        return out[: self.n_units]

    def gram(self, c: Coefficients, lay: TangentLayout | None = None) -> Coefficients:
        """``J^T M J c`` (in layout ``lay``, default all)."""
        return self.adjoint(self.lower(self.apply(c, lay), lay), lay)

    def _precompute(self) -> None:
        """Diagonal of the scaling part, eigenbases of the blocks' own Gram operators."""
        if self.n_units:
            # sum_e E_eu^2 theta_e (M theta)_e: inside a block the row sums of
            # theta (M theta) are the rows' leverages, so with E constant along a block
            # row this is the exact diagonal of J^T M J
            theta_t = self._flat(self.geom.coordinates()).to(self.dtype)
            safe = torch.where(theta_t != 0, theta_t, torch.ones_like(theta_t))
            weight = (self.lower(theta_t) / safe)[self._support]
            d = self._unit_sums(self._val**2 * weight, self._idx)
            self._diag = torch.where(d > 0, 1.0 / d, torch.ones_like(d))
        if self.D.shape[1]:
            MD = torch.stack([self.lower(self.D[:, j]) for j in range(self.D.shape[1])], 1)
            self._tdiag = (self.D * MD).sum(0)
        self._blocks = []
        for s, (G, H) in enumerate(self.stacks):
            P, Q = Gram.of(G, self.geom.eps), Gram.of(H, self.geom.eps)
            sides = (G.shape[-2] > 0, H.shape[-2] > 0)
            if self.geom.metrics[s] == "mixed" and all(sides):
                inverses = (P.inverse, Q.inverse)  # None where not numerically PD
                self._blocks.append(("mixed", P.matrix, Q.matrix, *inverses))
            elif all(sides):  # invariant: P W P^-1 + Q^-1 W Q = R, i.e. C W + W C = Q R P
                Qh = _sym_sqrt(Q.matrix)
                lam, U = torch.linalg.eigh(Qh @ P.matrix @ Qh)
                S = Qh @ U
                Sinv = U.mT @ torch.linalg.inv(Qh)
                den = lam[..., :, None] + lam[..., None, :]
                # W = S ((S^-1 Q) R (P S) / den) S^-1: the outer factors multiplied once
                plan = ("lyapunov", Q.matrix, P.matrix, S, Sinv, den, Sinv @ Q.matrix, P.matrix @ S)
                self._blocks.append(plan)
            elif sides[0]:  # one side (orthogonal): P W P^-1 = R
                self._blocks.append(("left", P.matrix, torch.linalg.inv(P.matrix)))
            else:
                self._blocks.append(("right", Q.matrix, torch.linalg.inv(Q.matrix)))

    def precondition(self, r: Coefficients, stacks: list[bool] | None = None) -> Coefficients:
        """Approximate ``(J^T M J)^{-1} r``: exact per block, diagonal for scalings.

        ``stacks``: solve only the stacks marked True (the others' coefficients zero).
        """
        out = [r[0] * self._diag if r[0].numel() else r[0]]
        out.append(r[1] / self._tdiag if r[1].numel() else r[1])
        for s, (plan, R) in enumerate(zip(self._blocks, r[2:], strict=True)):
            if stacks is not None and not stacks[s]:
                out.append(torch.zeros_like(R))
                continue
            kind = plan[0]
            if kind == "mixed":
                _, P, Q, Pinv, Qinv = plan
                if Pinv is None or Qinv is None:
                    W = 0.5 * torch.linalg.solve(P, torch.linalg.solve(Q, R.mT).mT)
                else:
                    W = 0.5 * mm(mm(Pinv, R), Qinv)
            elif kind == "lyapunov":
                S, Sinv, den, SQ, PS = plan[3:]
                W = mm(mm(S, mm(mm(SQ, R), PS) / den), Sinv)
            elif kind == "left":
                _, P, Pinv = plan
                W = mm(mm(Pinv, R), P)
            else:
                _, Q, Qinv = plan
                W = mm(mm(Q, R), Qinv)
            out.append(_skew(W) if self.skew[s] else W)
        return out

    # -- the projection -------------------------------------------------------------
    def project(self, xi: list[Tensor], covector: Tensor | None = None) -> list[Tensor]:
        """The horizontal part of ``xi`` (tangent layout).

        ``covector``: ``M xi``, flat, where the caller has it (a Riemannian gradient's is
        the Euclidean gradient), which saves applying the metric.
        """
        return self.project_flat(tangent.flat_copy(xi), covector, own_covector=False)

    def project_flat(
        self, v: Tensor, covector: Tensor | None = None, own_covector: bool = True
    ) -> FlatTangent:
        """:meth:`project` of a flat tangent ``v``, overwritten with its horizontal part.

        ``own_covector``: ``covector`` may be overwritten too (the caller built it).
        Returns the tangent-layout views of ``v``.
        """
        if self._drop is not None:
            v.index_fill_(0, self._drop, 0.0)
        if self.active:
            if covector is None or not self._keep_commutes:
                y = self.lower(v)
            elif self._drop is None:
                y = covector
            else:  # the zeroed entries are whole block rows, so M commutes with zeroing
                fill = covector.index_fill_ if own_covector else covector.index_fill
                y = fill(0, self._drop, 0.0)
            self.apply(self.solve(self.adjoint(y)), out=v, alpha=-1.0)
        return FlatTangent.of(v, self.shapes)

    def _keeps_rows(self) -> bool:
        """Whether :attr:`keep` zeroes whole rows of the blocks (then it commutes with M)."""
        if self.keep is None:
            return True
        for s, views in enumerate(self._views):
            for view, factor in zip(views, self.stacks[s], strict=True):
                k = self.keep[view].view(factor.shape)
                if not bool((k == k[..., :1]).all()):
                    return False
        return True

    def solve(self, b: Coefficients) -> Coefficients:
        """``(J^T M J)^{-1} b``: exact on decoupled components, CG on the coupled ones.

        Where the Schur complement of :mod:`wsym.sharpness.schur` applies and passed
        :meth:`probe_schur` at this base point, it is the solve; where it applies but
        failed the probe, it preconditions CG (a few iterations); elsewhere the exact
        per-group solves precondition CG.
        """
        units, trans, stacks = self._cg
        free = [not c for c in stacks]
        exact = self._restrict(self.precondition(b, free), ~units, ~trans, free)
        self.iterations = 0
        if not (bool(units.any()) or bool(trans.any()) or any(stacks)):
            return exact
        keep = (units, trans, stacks)
        if self._reduced_layout is None:
            self._reduced_layout = self._reduced()
            self._schur = schur(self, self._reduced_layout) if self.exact else None
            self.trusted = self._schur is not None and self.probe_schur()
        reduced = self._reduced_layout
        if self.trusted:  # exact to the tolerance here (probed): no confirming iteration
            return [u + v for u, v in zip(self._solve_schur(b, keep), exact, strict=True)]
        if self._schur is not None:  # an exact solve, refined by CG where round-off bites
            precondition = lambda r: self._solve_schur(r, keep)  # noqa: E731
        else:
            precondition = lambda r: self._restrict(self.precondition(r), *keep)  # noqa: E731
        x = [torch.zeros_like(t) for t in b]
        r = self._restrict(list(b), *keep)
        z = precondition(r)
        rz = _dot(r, z)
        tol = self.tol
        stop, scale = tol * tol * rz, _dot(r, r).sqrt()
        p = z
        while (
            self.iterations < MAX_ITER
            and rz > 0
            and (rz > stop or (self._schur is not None and _dot(r, r).sqrt() > tol * scale))
        ):
            Kp = self._restrict(self.gram(p, reduced), *keep)
            alpha = rz / _dot(p, Kp)
            x = [u + alpha * v for u, v in zip(x, p, strict=True)]
            r = [u - alpha * v for u, v in zip(r, Kp, strict=True)]
            z = precondition(r)
            rz_new = _dot(r, z)
            p = [u + (rz_new / rz) * v for u, v in zip(z, p, strict=True)]
            rz = rz_new
            self.iterations += 1
        return [u + v for u, v in zip(x, exact, strict=True)]

    def probe_schur(self, seed: int = 0) -> bool:
        """Whether the Schur solve alone meets the CG tolerance at this base point.

        A fixed-seed Gaussian right-hand side ``b = K c`` on the coupled coefficients
        (``K`` the Gram operator) is solved once; the solve is trusted when its residual
        is below :data:`TOL` relative, in the preconditioned norm and in the plain one
        (the stopping rule of the conjugate gradients it then replaces). Forming the
        complement cancels digits on nearly singular blocks, and the probe fails there.
        """
        keep = self._cg
        gen = torch.Generator().manual_seed(seed)
        coeffs = [
            torch.randn(t.shape, generator=gen, dtype=torch.float64).to(self.dtype)
            for t in self._zero()
        ]
        b = self._restrict(self.gram(self._restrict(coeffs, *keep), self._reduced_layout), *keep)
        x = self._solve_schur(b, keep)
        Kx = self._restrict(self.gram(x, self._reduced_layout), *keep)
        r = [u - v for u, v in zip(b, Kx, strict=True)]
        tol = self.tol
        plain = _dot(r, r) <= tol * tol * _dot(b, b)
        pre = _dot(r, self._solve_schur(r, keep)) <= tol * tol * _dot(b, x)
        return bool(plain and pre)

    def _zero(self) -> Coefficients:
        """Zero coefficients: one per unit, per translation direction, a matrix per stack."""
        units = torch.zeros(self.n_units, dtype=self.dtype)
        trans = torch.zeros(self.D.shape[1], dtype=self.dtype)
        blocks = [G.new_zeros((*G.shape[:-2], G.shape[-1], G.shape[-1])) for G, _ in self.stacks]
        return [units, trans, *blocks]

    def _solve_schur(self, b: Coefficients, keep) -> Coefficients:
        """The coupled system solved exactly through :mod:`wsym.sharpness.schur`.

        Exact up to round-off: used alone where :meth:`probe_schur` found it meets the
        tolerance at this base point, else as the preconditioner of conjugate gradients
        (on nearly singular blocks, where forming the complement cancels digits, the
        iterations recover the accuracy).

        With ``C`` the blocks' own Gram operator (inverted exactly by
        :meth:`precondition`) and ``B`` the units' coupling to them:
        ``a = S^-1 (b - B C^-1 R)``, ``Omega = C^-1 (R - B^T a)``; ``B C^-1 R`` and
        ``B^T a`` in closed form (:meth:`wsym.sharpness.schur.Schur.units_of`,
        :meth:`~wsym.sharpness.schur.Schur.blocks_of`).
        """
        units, trans, stacks = keep
        off, sc = torch.zeros_like(units), self._schur
        blocks = self._restrict(list(b), off, trans, stacks)
        w = self._restrict(self.precondition(blocks, stacks), off, trans, stacks)
        a = sc.solve((b[0] - sc.units_of(self.stacks, w[2:], self.n_units, self.dtype)) * units)
        back = sc.blocks_of(self.stacks, a)
        rest = blocks[:2] + [R - back[s] if s in back else R for s, R in enumerate(blocks[2:])]
        omega = self._restrict(self.precondition(rest, stacks), off, trans, stacks)
        return [a, *omega[1:]]

    @staticmethod
    def _restrict(c: Coefficients, units: Tensor, trans: Tensor, stacks: list) -> Coefficients:
        """``c`` with the coefficients outside the masks set to zero."""
        out = [c[0] * units if c[0].numel() else c[0], c[1] * trans if c[1].numel() else c[1]]
        return out + [
            w if keep else torch.zeros_like(w) for w, keep in zip(c[2:], stacks, strict=True)
        ]


def _rows_of(D: Tensor) -> tuple[Tensor, Tensor]:
    """The nonzero rows of the translation directions ``D``: their indices and values."""
    rows = D.any(1).nonzero().squeeze(1)
    return rows, D[rows]


def _dot(a: Coefficients, b: Coefficients) -> Tensor:
    return sum((x * y).sum() for x, y in zip(a, b, strict=True))


def _skew(W: Tensor) -> Tensor:
    return 0.5 * (W - W.mT)


def _sym_sqrt(A: Tensor) -> Tensor:
    lam, U = torch.linalg.eigh(A)
    return (U * lam.clamp_min(0).sqrt()[..., None, :]) @ U.mT
