r"""The two-scale quadratic of the LLQR+SAM paper: SAM vs LLQR+SAM in pothole directions.

:math:`L(\theta) = \tfrac12 \theta^\top (\bar H + H_\epsilon) \theta` with diagonal
matrices: a smooth average curvature :math:`\bar H = \bar\lambda \operatorname{diag}(c)`,
:math:`c_j \in [0.5, 1]`, and a sharp pothole :math:`H_\epsilon` of curvature 10-20 on
the last four coordinates. LLQR+SAM's preconditioner tracks the average geometry,
:math:`U = \bar H^{-1}`. Each method runs plain SGD at a fixed fraction ``C`` of the
stability limit of its own (preconditioned) dynamics, :math:`\eta = C / \lambda_{max}(U H)`,
as a tuned learning rate would be.

Why the envelopes scale as claimed: late in training the sharpest pothole coordinate
dominates the gradient and the iterates settle on a 2-cycle :math:`\pm a`. For SAM,
:math:`\theta' = (1 - \eta\lambda)\theta - \eta\lambda\rho\,\mathrm{sign}\,\theta` gives
:math:`a = \rho\, C / (2 - C)`: order :math:`\rho`, independent of :math:`\bar\lambda`.
For LLQR+SAM the perturbation :math:`\rho U g / \|g\|_U` is :math:`\rho \sqrt{u}` in that
coordinate (:math:`u = 1 / (\bar\lambda c_j)`), so :math:`a = \rho \sqrt{u}\, C / (2 - C)
\propto \rho \bar\lambda^{-1/2}`. Log-log slope: 0 for SAM, -1/2 for LLQR+SAM.
Tolerance 0.05 on the slopes: the 2-cycle is exact for one coordinate; the only
departures are the other coordinates' residual contributions to the normalization
:math:`\|g\|_U`, which contract geometrically (their preconditioned steps are below
the edge), and the finite window -- both far below 0.05 in log-slope over three
decades (measured: |slope - expected| < 2e-3). The normalization by :math:`\|Ug\|`
(the authors' practical variant) has Euclidean radius :math:`\rho` and so loses the
:math:`\bar\lambda^{-1/2}` amplification: slope 0 too.

Learned U: fitted by the LQR objective (:class:`~wsym.optim.learned.LQRPreconditioner`,
diagonal) on the average geometry alone, then held (the slow time scale). At the LQR
minimizer's own scale (``scale="newton"``) it is :math:`(\bar H + \lambda)^{-1}` and keeps
the slope -1/2; rescaled by the default rule (mean :math:`\hat g^\top U \hat g = 1`) it
no longer depends on :math:`\bar\lambda`, and neither does the envelope: slope 0.
"""

import math

import pytest
import torch
from torch import nn

from wsym.optim import LLQRSAM, SAM, FixedDiagonal, LQRPreconditioner

RHO, C, STEPS, WINDOW = 0.01, 1.0, 400, 50
LAMBDAS = (1e-3, 1e-2, 1e-1, 1.0)
POTHOLE = slice(4, 8)


class Quadratic(nn.Module):
    """``0.5 theta^T diag(h) theta``; forward takes no input."""

    def __init__(self, h: torch.Tensor, theta0: torch.Tensor):
        super().__init__()
        self.h = h
        self.theta = nn.Parameter(theta0.clone())

    def forward(self) -> torch.Tensor:
        return 0.5 * (self.h * self.theta**2).sum()


def _curvatures(lam_bar: float) -> tuple[torch.Tensor, torch.Tensor]:
    c = torch.linspace(0.5, 1.0, 8, dtype=torch.float64)
    h_bar = lam_bar * c
    h_eps = torch.zeros(8, dtype=torch.float64)
    h_eps[POTHOLE] = torch.linspace(10.0, 20.0, 4, dtype=torch.float64)
    return h_bar, h_bar + h_eps


class Smooth(nn.Module):
    """The average geometry alone as a network: outputs ``sqrt(h_bar) * theta``, squared error."""

    def __init__(self, h_bar: torch.Tensor):
        super().__init__()
        self.scale = h_bar.sqrt()
        self.theta = nn.Parameter(torch.ones_like(h_bar))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.scale * self.theta).expand(len(x), -1)


def _learned_u(lam_bar: float, scale: str) -> torch.Tensor:
    """U learned from the LQR objective on the average geometry (the slow time scale)."""
    h_bar, _ = _curvatures(lam_bar)
    model = Smooth(h_bar)
    x = torch.zeros(1, 1, dtype=torch.float64)
    out = model(x)
    dz = torch.autograd.grad(0.5 * (out**2).sum(), out)[0]
    pre = LQRPreconditioner("diagonal", damping=1e-3, steps=300, lr=0.1, loss="mse", scale=scale)
    pre.estimate(model, {"theta": model.theta.detach()}, x, output_grad=dz)
    return pre.apply({"theta": torch.ones(8, dtype=torch.float64)})["theta"]


def _envelope(method: str, lam_bar: float, normalize: str = "metric", u=None) -> float:
    h_bar, h = _curvatures(lam_bar)
    theta0 = torch.randn(8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    model = Quadratic(h, theta0)
    if method == "sam":
        opt = SAM(model, rho=RHO, lr=C / float(h.max()))
    else:
        u = 1.0 / h_bar if u is None else u
        opt = LLQRSAM(
            model,
            rho=RHO,
            lr=C / float((u * h).max()),
            preconditioner=FixedDiagonal({"theta": u}),
            normalize=normalize,
        )

    def closure():
        opt.zero_grad()
        loss = model()
        loss.backward()
        return loss

    late = []
    for t in range(STEPS):
        opt.step(closure)
        if t >= STEPS - WINDOW:
            late.append(model.theta.detach()[POTHOLE].abs().max())
    return float(torch.stack(late).max())


def _slope(xs, ys) -> float:
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True)) / sum(
        (a - mx) ** 2 for a in lx
    )


@pytest.fixture(scope="module")
def envelopes():
    return {m: [_envelope(m, lam) for lam in LAMBDAS] for m in ("sam", "llqr")}


def test_sam_envelope_is_order_rho(envelopes):
    sam = envelopes["sam"]
    assert abs(_slope(LAMBDAS, sam)) < 0.05
    for a in sam:  # 2-cycle amplitude rho * C / (2 - C)
        assert 0.5 * RHO * C / (2 - C) < a < 2 * RHO


def test_llqr_envelope_scales_as_inverse_sqrt_lambda(envelopes):
    llqr = envelopes["llqr"]
    assert abs(_slope(LAMBDAS, llqr) + 0.5) < 0.05
    for lam, a, s in zip(LAMBDAS, llqr, envelopes["sam"], strict=True):
        assert a > s if lam < 0.5 else True  # flat surroundings amplify the escape


def test_euclidean_normalization_loses_the_amplification():
    ys = [_envelope("llqr", lam, normalize="euclidean") for lam in LAMBDAS]
    assert abs(_slope(LAMBDAS, ys)) < 0.05


def test_learned_u_keeps_the_amplification_at_its_own_scale():
    """U learned by the LQR objective on the average geometry: (H_bar + lambda)^-1, Newton scale."""
    ys = []
    for lam in LAMBDAS:
        u = _learned_u(lam, "newton")
        h_bar, _ = _curvatures(lam)
        torch.testing.assert_close(u * h_bar, torch.full_like(u, 1 / 1.001), rtol=2e-3, atol=0)
        ys.append(_envelope("llqr", lam, u=u))
    assert abs(_slope(LAMBDAS, ys) + 0.5) < 0.05


def test_gradient_scaled_learned_u_normalizes_the_amplification_away():
    """The default scale rule (mean g^T U g = 1 over unit gradients) removes lambda_bar from U."""
    ys = [_envelope("llqr", lam, u=_learned_u(lam, "gradient")) for lam in LAMBDAS]
    assert abs(_slope(LAMBDAS, ys)) < 0.05
