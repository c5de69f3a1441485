r"""Float64 references for the learned LLQR on tiny networks: the exact optima it is tested against.

The mean LQR objective over the unit gradients :math:`\hat g_c` (:mod:`wsym.optim.lqr`),
written with the dense damped Gauss-Newton matrix :math:`C` (:func:`dense_curvature`) and
:math:`S = \operatorname{mean}_c \hat g_c \hat g_c^\top`, is a convex quadratic in
:math:`U`:

.. math::
    \ell(U) = -\operatorname{tr}(U S) + \tfrac12 \operatorname{tr}(U C U S).

Three optima, each a lower bound of the next:

* over all :math:`U`: :math:`U \hat g_c = C^{-1} \hat g_c`, value
  :math:`-\tfrac12 \operatorname{mean}_c \hat g_c^\top C^{-1} \hat g_c` (the dense step
  :math:`-C^{-1} g`);
* over symmetric block-diagonal :math:`U` (one block per layer, the blocks of
  :func:`structure_groups`), a linear least-squares problem in the blocks' entries:
  :func:`symmetric_block_optimum`;
* over positive-semidefinite block-diagonal :math:`U`, the closure of the richest
  structure (``"dense"``, :mod:`wsym.optim.structures`): :func:`block_optimum`, by
  accelerated projected gradient (FISTA, projection = eigenvalues clipped at 0 per
  block). The learned ``dense`` structure can reach this one and no lower.

A block-diagonal :math:`U` has no cross-layer blocks, so on networks of more than one
layer the third optimum's step is not :math:`-C^{-1} g` (``docs/llqr.md``, section 3).

Shapes: ``c`` is ``(P, P)``, ``grads`` a ``(P, m)`` matrix of flattened gradients
(:func:`flatten`, the linearization's ``names`` order), groups index tensors into ``P``.

Example:
    >>> import torch
    >>> c = torch.tensor([[2.0, 1.0], [1.0, 2.0]], dtype=torch.float64)
    >>> g = torch.eye(2, dtype=torch.float64)
    >>> groups = [torch.tensor([0]), torch.tensor([1])]  # two 1 x 1 blocks: a diagonal U
    >>> u, value = block_optimum(c, g, groups, iters=500)
    >>> [round(float(x), 4) for x in u.diagonal()], round(value, 4)
    ([0.5, 0.5], -0.25)
    >>> round(symmetric_block_optimum(c, g, groups)[1], 4)
    -0.25
"""

from __future__ import annotations

import torch
from torch import Tensor

from wsym.optim.lqr import Linearization
from wsym.optim.structures import Layout

Params = dict[str, Tensor]


def dense_curvature(lin: Linearization, lam: float) -> Tensor:
    r"""Reference: the dense :math:`C = J^\top H J + \lambda I` (float64, ``names`` order).

    One Jacobian-vector product per parameter entry: for tiny networks only.
    """
    shapes = {n: lin._vjp(lin.output.detach())[0][n].shape for n in lin.names}
    sizes = [int(torch.tensor(s).prod()) for s in shapes.values()]
    total = sum(sizes)
    cols = []
    for k in range(total):
        e = torch.zeros(total, dtype=torch.float64)
        e[k] = 1.0
        v = unflatten(e, shapes)
        hjv = lin.hessian(lin.jvp(v).double())
        cols.append(flatten({n: t.double() for n, t in lin.vjp(hjv).items()}, lin.names))
    return torch.stack(cols, 1) + lam * torch.eye(total, dtype=torch.float64)


def flatten(table: Params, names: list[str]) -> Tensor:
    """Concatenate ``table``'s tensors in ``names`` order (float64)."""
    return torch.cat([table[n].reshape(-1).double() for n in names])


def unflatten(vector: Tensor, shapes: dict[str, torch.Size]) -> Params:
    """Inverse of :func:`flatten` for the given ``{name: shape}``."""
    out, k = {}, 0
    for n, s in shapes.items():
        size = int(torch.tensor(s).prod()) if len(s) else 1
        out[n] = vector[k : k + size].reshape(s)
        k += size
    return out


def structure_groups(layout: Layout) -> list[Tensor]:
    """Index sets (into :func:`flatten` of ``layout.names``) of the blocks of a block-diagonal U.

    One per matrix block (its weight and bias entries), one per entry of every other
    parameter (preconditioned elementwise).
    """
    offsets, k = {}, 0
    for name, shape in zip(layout.names, layout.shapes, strict=True):
        size = int(torch.tensor(shape).prod()) if len(shape) else 1
        offsets[name] = torch.arange(k, k + size)
        k += size
    groups = [
        torch.cat([offsets[n] for n in (b.weight, b.bias) if n is not None]) for b in layout.blocks
    ]
    groups += [i.reshape(1) for n in layout.rest for i in offsets[n]]
    return groups


def objective_value(u: Tensor, c: Tensor, grads: Tensor) -> float:
    r"""Mean LQR objective over the columns of ``grads``: :math:`\ell(U)` above."""
    v = u @ grads
    return float((-(grads * v).sum(0) + 0.5 * (v * (c @ v)).sum(0)).mean())


def symmetric_block_optimum(c: Tensor, grads: Tensor, groups: list[Tensor]) -> tuple[Tensor, float]:
    """The best symmetric block-diagonal U (least squares on the blocks' entries) and its value.

    A lower bound of :func:`block_optimum` (no definiteness constraint). One basis matrix
    per entry of a block's upper triangle: for tiny networks only.
    """
    n, m = grads.shape
    basis = []
    for ids in groups:
        rows, cols = torch.triu_indices(len(ids), len(ids))
        for a, b in zip(ids[rows].tolist(), ids[cols].tolist(), strict=True):
            e = torch.zeros(n, n, dtype=torch.float64)
            e[a, b] = e[b, a] = 1.0
            basis.append(e)
    e = torch.stack(basis)
    moved = e @ grads  # (K, P, m): E_k g_c
    quad = moved.flatten(1) @ (c @ moved).flatten(1).T / m  # tr(E_k^T C E_l S)
    lin = moved.flatten(1) @ grads.reshape(-1) / m  # tr(E_k S)
    coef = torch.linalg.lstsq(quad, lin[:, None], rcond=None).solution[:, 0]
    u = torch.einsum("k,kab->ab", coef, e)
    return u, objective_value(u, c, grads)


def _project(u: Tensor, groups: list[Tensor]) -> Tensor:
    """Nearest block-diagonal positive-semidefinite matrix (Frobenius)."""
    out = torch.zeros_like(u)
    for ids in groups:
        block = u[ids][:, ids]
        w, q = torch.linalg.eigh(0.5 * (block + block.T))
        out[ids[:, None], ids[None, :]] = (q * w.clamp_min(0)) @ q.T
    return out


def block_optimum(
    c: Tensor, grads: Tensor, groups: list[Tensor], iters: int = 2000
) -> tuple[Tensor, float]:
    r"""The best block-diagonal positive-semidefinite U (FISTA, ``iters`` steps) and its value.

    Gradient :math:`\nabla \ell = -S + \frac12 (C U S + S U C)`, step :math:`1/L` with
    :math:`L = \lambda_{max}(C) \lambda_{max}(S)`, from the identity scaled to
    :math:`1/\lambda_{max}(C)`.
    """
    s = grads @ grads.T / grads.shape[1]
    top = float(torch.linalg.eigvalsh(c)[-1])
    step = 1.0 / (top * float(torch.linalg.eigvalsh(s)[-1]))
    x = torch.eye(len(c), dtype=torch.float64) / top  # block-diagonal and positive already
    y, t = x.clone(), 1.0
    for _ in range(iters):
        grad = -s + 0.5 * (c @ y @ s + s @ y @ c)
        new = _project(y - step * grad, groups)
        t_new = (1 + (1 + 4 * t * t) ** 0.5) / 2
        y = new + (t - 1) / t_new * (new - x)
        x, t = new, t_new
    return x, objective_value(x, c, grads)
