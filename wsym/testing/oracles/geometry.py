"""Slow, obvious references for the geometry (float64, one block, no batch dims).

* :func:`metric_matrix` -- the dense metric tensor ``g(x)`` on the flattened block
  ``x = (vec G, vec H)`` (row-major), by automatic differentiation of
  :func:`~wsym.sharpness.geometry.inner`.
* :func:`geodesic_acceleration` -- ``x'' = -Gamma(x', x')`` from the Euler-Lagrange
  equations of ``L = 1/2 x'^T g(x) x'``: ``g x'' = dL/dx - (Dg[x']) x'``, all by autograd.
* :func:`geodesic_path`, :func:`geodesic_ode` -- the geodesic at given times by
  ``scipy.integrate.solve_ivp``.
* :func:`sylvester_kron` -- ``A X + X B = C`` solved on its Kronecker form.

None of these use the closed-form Christoffel symbols or Sylvester solvers they check.
Keep ``eps = 0`` (the default) when comparing with :func:`~wsym.sharpness.geometry.christoffel`:
with ``eps > 0`` :func:`~wsym.sharpness.geometry.inner` recomputes the shift at every point,
whereas the closed forms freeze it at the base point.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from scipy.integrate import solve_ivp
from torch import Tensor

from wsym.sharpness.geometry.block import Metric, Pair, as_pair
from wsym.sharpness.geometry.metrics import inner


def _split(x: Tensor, block: Pair) -> Pair:
    k = block.G.numel()
    return Pair(x[:k].reshape(block.G.shape), x[k:].reshape(block.H.shape))


def _flat(p: Pair) -> Tensor:
    return torch.cat([p.G.reshape(-1), p.H.reshape(-1)])


def _energy(block: Pair, metric: Metric, eps: float):
    """``L(x, v) = 1/2 <v, v>_x`` on flat vectors."""

    def energy(x: Tensor, v: Tensor) -> Tensor:
        return 0.5 * inner(_split(x, block), _split(v, block), _split(v, block), metric, eps)

    return energy


def metric_matrix(
    block: Pair | tuple[Tensor, Tensor], metric: Metric = "invariant", eps: float = 0.0
) -> Tensor:
    """Dense metric tensor ``g`` with ``<eta, zeta> = vec(eta)^T g vec(zeta)``, ``(N, N)``.

    Example:
        >>> G, H = torch.eye(2, dtype=torch.float64), 2 * torch.eye(2, dtype=torch.float64)
        >>> metric_matrix((G, H), "mixed").diagonal().tolist()
        [4.0, 4.0, 4.0, 4.0, 1.0, 1.0, 1.0, 1.0]
    """
    block = as_pair(block)
    x = _flat(block)
    momentum = torch.func.grad(_energy(block, metric, eps), argnums=1)  # (x, v) -> g(x) v
    return torch.func.jacrev(momentum, argnums=1)(x, torch.zeros_like(x))


def geodesic_acceleration(
    block: Pair | tuple[Tensor, Tensor],
    xi: Pair | tuple[Tensor, Tensor],
    metric: Metric = "invariant",
    eps: float = 0.0,
) -> Pair:
    """Geodesic acceleration ``-Gamma(xi, xi)`` at ``block`` from the metric by autograd."""
    block, xi = as_pair(block), as_pair(xi)
    energy = _energy(block, metric, eps)
    x, v = _flat(block), _flat(xi)
    momentum = torch.func.grad(energy, argnums=1)  # (x, v) -> g(x) v
    g = torch.func.jacrev(momentum, argnums=1)(x, v)
    dL_dx = torch.func.grad(energy, argnums=0)(x, v)
    dg_v_v = torch.func.jacrev(momentum, argnums=0)(x, v) @ v  # (D_x g[v]) v
    return _split(torch.linalg.solve(g, dL_dx - dg_v_v), block)


def geodesic_path(
    block: Pair | tuple[Tensor, Tensor],
    xi: Pair | tuple[Tensor, Tensor],
    metric: Metric = "invariant",
    times: Sequence[float] = (1.0,),
    eps: float = 0.0,
    rtol: float = 1e-12,
    atol: float = 1e-13,
) -> list[Pair]:
    """The geodesic with ``gamma(0) = block``, ``gamma'(0) = xi`` at positive ``times``.

    Integrates ``x'' = geodesic_acceleration(x, x')`` with DOP853. Since
    ``gamma_{s xi}(1) = gamma_xi(s)``, one solve gives the exponential map of all
    the rescaled velocities ``s * xi`` for ``s`` in ``times``.
    """
    block, xi = as_pair(block), as_pair(xi)
    N = block.G.numel() + block.H.numel()

    def rhs(_t: float, y: np.ndarray) -> np.ndarray:
        y_t = torch.from_numpy(y)
        pos, vel = _split(y_t[:N], block), _split(y_t[N:], block)
        acc = _flat(geodesic_acceleration(pos, vel, metric, eps))
        return np.concatenate([y[N:], acc.detach().numpy()])

    y0 = torch.cat([_flat(block), _flat(xi)]).double().numpy()
    order = np.argsort(times)
    t_eval = np.asarray(times, dtype=float)[order]
    sol = solve_ivp(rhs, (0.0, t_eval[-1]), y0, "DOP853", t_eval=t_eval, rtol=rtol, atol=atol)
    if not sol.success:
        raise RuntimeError(f"geodesic ODE failed: {sol.message}")
    out = torch.from_numpy(sol.y[:N]).to(block.G.dtype)
    at = {int(k): out[:, i] for i, k in enumerate(order)}
    return [_split(at[i], block) for i in range(len(times))]


def geodesic_ode(
    block: Pair | tuple[Tensor, Tensor],
    xi: Pair | tuple[Tensor, Tensor],
    metric: Metric = "invariant",
    t: float = 1.0,
    eps: float = 0.0,
) -> Pair:
    """The geodesic ``gamma(t)`` with ``gamma(0) = block``, ``gamma'(0) = xi`` (see above).

    Example:
        >>> u, v = torch.tensor([[2.0]], dtype=torch.float64), torch.tensor([[3.0]]).double()
        >>> G, H = geodesic_ode((u, v), (0.5 * u, 0.5 * v), "invariant")
        >>> torch.allclose(G, u * torch.e ** 0.5)  # u e^{bt}, b = 0.5
        True
    """
    return geodesic_path(block, xi, metric, (t,), eps)[0]


def sylvester_kron(A: Tensor, B: Tensor, C: Tensor) -> Tensor:
    """Solve ``A X + X B = C`` for ``X`` ``(..., h, k)`` via the ``hk x hk`` Kronecker system.

    Example:
        >>> A, B = torch.eye(2) * 2, torch.eye(3)
        >>> sylvester_kron(A, B, torch.ones(2, 3))[0, 0]
        tensor(0.3333)
    """
    h, k = A.shape[-1], B.shape[-1]
    eye_h = torch.eye(h, dtype=A.dtype, device=A.device)
    eye_k = torch.eye(k, dtype=A.dtype, device=A.device)
    # row-major vec: vec(A X) = (A kron I) vec X, vec(X B) = (I kron B^T) vec X
    K = (
        A[..., :, None, :, None] * eye_k[:, None, :]
        + eye_h[:, None, :, None] * B.mT[..., None, :, None, :]
    )
    K = K.reshape(*K.shape[:-4], h * k, h * k)
    return torch.linalg.solve(K, C.reshape(*C.shape[:-2], h * k, 1)).reshape(C.shape)
