"""Diagonal linear networks: sharpness vs generalization (da Silva et al., Sec. 5.1).

Random Gaussian ``X`` (``n < d``), a 90%-sparse ground truth ``w*`` and targets
``X w*``. Diagonal networks ``y = x^T (u * v)`` are trained by full-batch gradient
descent on the MSE to training loss ``<= 1e-5`` from random initializations
``u0 = alpha * z_u``, ``v0 = alpha * z_v`` (``z`` standard Gaussian, a fresh draw
per network; ``--init zero``: the zero-predictor ``u = 2 alpha, v = 0``) with the
scale ``alpha`` log-uniform, and optionally the step size log-uniform per
network (``--lr MIN MAX``): a small ``alpha``
biases gradient descent towards sparse (L1-like) solutions, a large one towards
L2-like ones, so the networks generalize differently while all interpolating.
The generalization gap is the test loss on fresh Gaussian inputs minus the
training loss. For every network the worst-case adaptive, geodesic-invariant and
geodesic-mixed sharpness (:func:`wsym.sharpness`, same ``rho`` for all) is
computed, and Kendall's tau of gap vs each measure is printed beside the paper's.

Exact geodesics (``--exact``): on a diagonal network every coordinate ``(u_i, v_i)``
is a ``1 x 1`` GL(1) block whose horizontal tangents are ``b_i (u_i, v_i)``, and
the geodesics are known in closed form (invariant ``(u, v) e^{b}``, mixed
``(u, v) sqrt(1 + 2b)``, the latter ending at ``w_i = 0`` for ``b <= -1/2``).
The flag adds both measures with these exact geodesics in place of the
second-order step of :func:`wsym.sharpness.geometry.geodesic_step`. It shows that the
mixed measure's second-order step is not a small correction here: the mixed
ball ``2 sum b_i^2 w_i^2 <= rho^2`` allows ``b_i ~ rho / |w_i|``, huge on the
near-zero coordinates of a sparse solution, where the truncated step
``w (1 + b - b^2/2)^2`` grows like ``b^4 w`` (values up to 1e28 at rho 0.05)
while the exact one, ``w (1 + 2b)``, stays within ``sqrt(2) rho``. The printed
maxima show it. The exact mixed ball is the Euclidean ball ``||dw|| <= sqrt(2) rho``
in predictor space (less ``b >= -1/2``), and the loss is quadratic in ``w``: at an
interpolating solution every network's exact geodesic-mix sharpness is at most
``2 rho^2 lambda_max(X^T X / n)``, nearly the same for all of them.

Run (about a minute for 200 networks; ``--quick`` trains 12)::

    .venv/bin/python experiments/diagonal_nets.py --exact --init zero --lr 0.003 0.03
    .venv/bin/python experiments/diagonal_nets.py [--json PATH] [--quick] [--exact] [--average]
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch
from scipy.stats import kendalltau

import wsym
from wsym.sharpness import average_case, worst_case
from wsym.sharpness.geometry import Pair
from wsym.sharpness.perturbation import Geodesic

PAPER = {"adaptive": -0.68, "geodesic-inv": -0.83, "geodesic-mix": -0.86}
MEASURES = tuple(PAPER)
EXACT = {"geodesic-inv (exact)": "invariant", "geodesic-mix (exact)": "mixed"}


class ExactDiagonal(Geodesic):
    """Geodesic sharpness with the closed-form geodesics of ``1 x 1`` GL(1) blocks."""

    def move(self, block, xi, s=0):
        """``(u, v) (f(b) - 1)`` with ``f = exp`` (invariant) or ``sqrt(1 + 2b)`` (mixed)."""
        if block.G.shape[-2:] != (1, 1) or block.H.shape[-2:] != (1, 1):
            raise ValueError("exact geodesics need 1 x 1 blocks (a diagonal network)")
        b = 0.5 * (xi.G / block.G + xi.H / block.H)  # horizontal: xi = b (u, v)
        if self.metrics[s] == "invariant":
            f = torch.exp(b)
        else:
            f = (1 + 2 * b).clamp_min(1e-30).sqrt()
        return Pair(block.G * (f - 1), block.H * (f - 1))


def exact_sharpness(model, x, y, spec, metric, rho, average, steps=10):
    """Worst-case (or average-case) sharpness with :class:`ExactDiagonal` geodesics."""
    params = {n: p.detach().double() for n, p in model.named_parameters()}
    geom = ExactDiagonal(params, spec, metric)

    def f(p):
        return mse(x @ (p["u"] * p["v"]), y)

    if average:
        return average_case(geom, [f], [1.0], rho, steps, seed=0)
    return worst_case(geom, f, rho, steps)


class Diagonal(torch.nn.Module):
    """``y = x @ (u * v)``."""

    def __init__(self, u: torch.Tensor, v: torch.Tensor):
        super().__init__()
        self.u = torch.nn.Parameter(u.clone())
        self.v = torch.nn.Parameter(v.clone())

    def forward(self, x):
        """Predictions ``(batch,)``."""
        return x @ (self.u * self.v)


def mse(out, y):
    """Mean squared error."""
    return ((out - y) ** 2).mean()


def data(n: int, d: int, n_test: int, sparsity: float, seed: int):
    """Gaussian train/test inputs, sparse ground truth, noiseless targets."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=gen, dtype=torch.float64)
    x_test = torch.randn(n_test, d, generator=gen, dtype=torch.float64)
    w_star = torch.zeros(d, dtype=torch.float64)
    k = max(1, round((1 - sparsity) * d))
    support = torch.randperm(d, generator=gen)[:k]
    w_star[support] = torch.randn(k, generator=gen, dtype=torch.float64)
    return x, x @ w_star, x_test, x_test @ w_star


def init(alphas, d: int, gen, kind: str):
    """Initial ``(u, v)``, one row per network.

    ``gaussian``: ``alpha * z_u``, ``alpha * z_v`` (a random, nonzero initial predictor
    ``u * v``). ``zero``: ``u = 2 alpha``, ``v = 0``, the ``u * v`` form of the
    classic ``w = p^2 - q^2``, ``p0 = q0 = alpha`` initialization (Woodworth et al.
    2020; ``u = p + q``, ``v = p - q``): the predictor starts at 0 and ``alpha``
    alone moves the implicit bias from L1 (small) to L2 (large).
    """
    m = len(alphas)
    if kind == "zero":
        u = 2 * alphas.unsqueeze(1).expand(m, d).clone()
        return u, torch.zeros_like(u)
    u = alphas.unsqueeze(1) * torch.randn(m, d, generator=gen, dtype=torch.float64)
    v = alphas.unsqueeze(1) * torch.randn(m, d, generator=gen, dtype=torch.float64)
    return u, v


def train(x, y, alphas, gen, lr, tol: float, max_steps: int, kind: str = "gaussian"):
    """Full-batch GD of all networks at once (one row each); a network stops at ``tol``.

    ``lr``: one step size for all networks, or one per network (a tensor ``(m,)``).
    """
    m = len(alphas)
    lr = torch.as_tensor(lr, dtype=torch.float64).reshape(-1, 1)
    u, v = init(alphas, x.shape[1], gen, kind)
    active = torch.ones(m, dtype=torch.bool)
    steps = torch.zeros(m, dtype=torch.long)
    for _ in range(max_steps):
        r = (u * v) @ x.T - y  # (m, n)
        loss = (r**2).mean(1)
        active &= loss > tol
        if not active.any():
            break
        g = 2 * r @ x / x.shape[0]  # dL/dw, (m, d)
        a = active.unsqueeze(1).to(u.dtype)
        u, v = u - lr * a * g * v, v - lr * a * g * u
        steps += active.long()
    return u, v, steps


def main(argv=None):
    """Train, measure, correlate; print the table and optionally write JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the results to this path")
    ap.add_argument("--quick", action="store_true", help="12 networks instead of 200")
    ap.add_argument("--nets", type=int, default=None)
    ap.add_argument("--rho", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--alpha", type=float, nargs=2, default=(1e-2, 1.0), metavar=("MIN", "MAX"))
    ap.add_argument(
        "--lr",
        type=float,
        nargs=2,
        default=(0.01, 0.01),
        metavar=("MIN", "MAX"),
        help="GD step size, log-uniform per network (equal bounds: one step size for all)",
    )
    ap.add_argument("--init", choices=("gaussian", "zero"), default="gaussian")
    ap.add_argument("--average", action="store_true", help="average-case (20 directions)")
    ap.add_argument("--exact", action="store_true", help="also exact-geodesic measures")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)  # tiny ops: threads only add synchronization
    nets = args.nets or (12 if args.quick else 200)
    n, d, n_test, sparsity, tol = 40, 100, 2000, 0.9, 1e-5
    t0 = time.time()

    x, y, x_test, y_test = data(n, d, n_test, sparsity, args.seed)
    gen = torch.Generator().manual_seed(args.seed + 1)
    log_alpha = torch.empty(nets, dtype=torch.float64).uniform_(
        math.log(args.alpha[0]), math.log(args.alpha[1]), generator=gen
    )
    alphas = log_alpha.exp()
    lrs = (
        torch.empty(nets, dtype=torch.float64)
        .uniform_(math.log(args.lr[0]), math.log(args.lr[1]), generator=gen)
        .exp()
    )
    u, v, steps = train(x, y, alphas, gen, lr=lrs, tol=tol, max_steps=400_000, kind=args.init)
    w = u * v
    train_loss = ((w @ x.T - y) ** 2).mean(1)
    test_loss = ((w @ x_test.T - y_test) ** 2).mean(1)
    gap = test_loss - train_loss
    t_train = time.time() - t0

    spec = wsym.detect(Diagonal(u[0], v[0]), x)
    rows = []
    for i in range(nets):
        model = Diagonal(u[i], v[i])
        row = {
            "alpha": float(alphas[i]),
            "lr": float(lrs[i]),
            "steps": int(steps[i]),
            "train_loss": float(train_loss[i]),
            "test_loss": float(test_loss[i]),
            "gap": float(gap[i]),
            "l1": float(w[i].abs().sum()),
        }
        n_dirs = 20 if args.average else 10
        for measure in MEASURES:
            row[measure] = wsym.sharpness(
                model,
                [(x, y)],
                mse,
                spec=spec,
                measure=measure,
                rho=args.rho,
                average=args.average,
                steps=n_dirs,
            )
        for name, metric in EXACT.items() if args.exact else ():
            row[name] = exact_sharpness(model, x, y, spec, metric, args.rho, args.average, n_dirs)
        rows.append(row)
    t_total = time.time() - t0

    taus = {}
    for measure in [*MEASURES, *(EXACT if args.exact else ())]:
        tau, p = kendalltau([r["gap"] for r in rows], [r[measure] for r in rows])
        paper = PAPER.get(measure.split(" ")[0])
        top = max(r[measure] for r in rows)
        taus[measure] = {"tau": float(tau), "p": float(p), "paper": paper, "max": top}

    print(spec)
    print(
        f"\n{nets} diagonal nets, n={n}, d={d}, {int(sparsity * 100)}%-sparse w*, "
        f"alpha log-uniform in [{args.alpha[0]:g}, {args.alpha[1]:g}], "
        f"lr log-uniform in [{args.lr[0]:g}, {args.lr[1]:g}], rho={args.rho}, "
        + ("average-case" if args.average else "worst-case")
        + f", {args.init} init"
    )
    print(
        f"train loss max {train_loss.max():.2e} (tol {tol:.0e}); steps "
        f"{int(steps.min())}..{int(steps.max())}; gap {gap.min():.3g}..{gap.max():.3g}"
    )
    print(f"time: training {t_train:.1f}s, total {t_total:.1f}s")
    sources = {"alpha": alphas.tolist(), "lr": lrs.tolist()}
    print(
        "tau(gap, source): "
        + ", ".join(f"{k} {kendalltau(gap.tolist(), v).statistic:+.3f}" for k, v in sources.items())
        + "\n"
    )
    print(f"{'measure':<22}{'tau(gap, S)':>12}{'p':>10}{'paper':>8}{'max S':>10}")
    for measure, t in taus.items():
        paper = f"{t['paper']:.2f}" if t["paper"] is not None else "-"
        print(f"{measure:<22}{t['tau']:>12.3f}{t['p']:>10.1e}{paper:>8}{t['max']:>10.2g}")
    if args.json:
        out = {
            "config": {
                "n": n,
                "d": d,
                "n_test": n_test,
                "sparsity": sparsity,
                "tol": tol,
                "nets": nets,
                "rho": args.rho,
                "seed": args.seed,
                "alpha": list(args.alpha),
                "lr": list(args.lr),
                "average": args.average,
                "init": args.init,
            },
            "kendall": taus,
            "nets": rows,
        }
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
