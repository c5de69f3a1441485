"""Diagonal linear networks: sharpness vs generalization (da Silva et al., Sec. 5.1).

Random Gaussian ``X`` (``n < d``), a 90%-sparse ground truth ``w*`` and targets
``X w*``. Diagonal networks ``y = x^T (u * v)`` are trained by full-batch gradient
descent on the MSE to training loss ``<= 1e-5`` from random initializations
``u0 = alpha * z_u``, ``v0 = alpha * z_v`` (``z`` standard Gaussian, a fresh draw
per network) with the scale ``alpha`` log-uniform: a small ``alpha``
biases gradient descent towards sparse (L1-like) solutions, a large one towards
L2-like ones, so the networks generalize differently while all interpolating.
The generalization gap is the test loss on fresh Gaussian inputs minus the
training loss. For every network the worst-case adaptive, geodesic-invariant and
geodesic-mixed sharpness (:func:`wsym.sharpness`, same ``rho`` for all) is
computed, and Kendall's tau of gap vs each measure is printed beside the paper's.

Run (a few minutes on CPU; ``--quick`` trains fewer networks)::

    .venv/bin/python experiments/diagonal_nets.py [--json PATH] [--quick]
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch
from scipy.stats import kendalltau

import wsym

PAPER = {"adaptive": -0.68, "geodesic-inv": -0.83, "geodesic-mix": -0.86}
MEASURES = tuple(PAPER)


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


def train(x, y, alphas, gen, lr: float, tol: float, max_steps: int):
    """Full-batch GD of all networks at once (one row each); a network stops at ``tol``."""
    m, d = len(alphas), x.shape[1]
    u = alphas.unsqueeze(1) * torch.randn(m, d, generator=gen, dtype=torch.float64)
    v = alphas.unsqueeze(1) * torch.randn(m, d, generator=gen, dtype=torch.float64)
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
    ap.add_argument("--quick", action="store_true", help="12 networks instead of 50")
    ap.add_argument("--nets", type=int, default=None)
    ap.add_argument("--rho", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    nets = args.nets or (12 if args.quick else 50)
    n, d, n_test, sparsity, tol = 40, 100, 2000, 0.9, 1e-5
    t0 = time.time()

    x, y, x_test, y_test = data(n, d, n_test, sparsity, args.seed)
    gen = torch.Generator().manual_seed(args.seed + 1)
    log_alpha = torch.empty(nets, dtype=torch.float64).uniform_(
        math.log(1e-2), math.log(1.0), generator=gen
    )
    alphas = log_alpha.exp()
    u, v, steps = train(x, y, alphas, gen, lr=0.01, tol=tol, max_steps=400_000)
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
            "steps": int(steps[i]),
            "train_loss": float(train_loss[i]),
            "test_loss": float(test_loss[i]),
            "gap": float(gap[i]),
            "l1": float(w[i].abs().sum()),
        }
        for measure in MEASURES:
            row[measure] = wsym.sharpness(
                model, [(x, y)], mse, spec=spec, measure=measure, rho=args.rho
            )
        rows.append(row)
    t_total = time.time() - t0

    taus = {}
    for measure in MEASURES:
        tau, p = kendalltau([r["gap"] for r in rows], [r[measure] for r in rows])
        taus[measure] = {"tau": float(tau), "p": float(p), "paper": PAPER[measure]}

    print(spec)
    print(
        f"\n{nets} diagonal nets, n={n}, d={d}, {int(sparsity * 100)}%-sparse w*, "
        f"alpha log-uniform in [1e-2, 1], rho={args.rho}"
    )
    print(
        f"train loss max {train_loss.max():.2e} (tol {tol:.0e}); steps "
        f"{int(steps.min())}..{int(steps.max())}; gap {gap.min():.3g}..{gap.max():.3g}"
    )
    print(f"time: training {t_train:.1f}s, total {t_total:.1f}s\n")
    print(f"{'measure':<14}{'tau(gap, S)':>12}{'p':>10}{'paper':>8}")
    for measure, t in taus.items():
        print(f"{measure:<14}{t['tau']:>12.3f}{t['p']:>10.1e}{t['paper']:>8.2f}")
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
            },
            "kendall": taus,
            "nets": rows,
        }
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
