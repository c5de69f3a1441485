r"""Fisher-Riemannian sharpness vs SGD noise scale on mnist1d MLPs (small-scale replication).

Ahmed, Sarmah, Dutta (2026), "Fisher-Geometric Sharpness and the Implicit Bias of SGD
toward Flat Minima", predict that the Fisher-Riemannian sharpness
:math:`S_R = \operatorname{Tr}(F^{-1} \nabla^2 L)` of the minimum SGD finds rises with
the batch size :math:`B` and falls with the learning rate :math:`\eta`
(:math:`S_R` roughly :math:`\propto B / \eta`), and that the gradient-noise covariance
is aligned with the Fisher. Here:

* a grid of batch sizes x learning rates; plain SGD (no momentum) on
  ``MLP(40, [64], 10)`` (ReLU) on mnist1d (4000 train), seeds ``0..--seeds-1`` per
  cell (initialization and batch order), trained **to convergence**: until the
  full training loss, checked after every epoch, is at most ``--loss`` (0.5; SGD
  with B = 16, lr 0.1 plateaus near 0.35, so a lower threshold is not reached), or
  ``--max-epochs`` epochs have passed (such runs are flagged and left out of the
  correlations). The claim is about the minima SGD converges to, so every run
  is compared at the same training loss, not after the same number of epochs;
* :math:`S_R` of the final model: ``wsym.sharpness(..., measure="fisher", probes=20,
  relative=False)`` (the paper's :math:`\sum_i H_{ii} / (F_{ii} + \delta)`, absolute damping)
  (diagonal estimator, sampled labels, damping 1e-3) on the first 512 training examples;
* test accuracy (1000 test examples);
* noise-Fisher alignment on the **last layer** (weight and bias, 650 parameters),
  exact on the first 512 training examples: per-sample gradients
  :math:`g_n = (p_n - e_{y_n}) \otimes [h_n; 1]` (``h_n`` the last hidden layer), the
  one-sample gradient-noise covariance :math:`C = \frac1N \sum_n (g_n - \bar g)(g_n - \bar g)^\top`
  (the minibatch noise is :math:`C / B`), and the Fisher with the expectation over the
  model's labels :math:`F = \frac1N \sum_n (\operatorname{diag} p_n - p_n p_n^\top) \otimes
  [h_n; 1][h_n; 1]^\top`; reported as the cosine similarity
  :math:`\langle C, F \rangle_F / (\|C\|_F \|F\|_F)` and the scale ratio
  :math:`\operatorname{Tr} C / \operatorname{Tr} F`.

Printed: one row per (B, eta) (mean over seeds; epochs to the threshold), then the
Kendall tau and Spearman rho of :math:`S_R` (and of test accuracy) against
:math:`B / \eta` over the runs that reached the threshold.

Run:
    .venv/bin/python experiments/fisher_noise.py             # 3x3 grid, 2 seeds, minutes
    .venv/bin/python experiments/fisher_noise.py --quick     # 2x2 grid, 1 seed, loss 1.0
"""

from __future__ import annotations

import argparse
import statistics
import warnings

import torch
from scipy.stats import kendalltau, spearmanr
from torch import nn
from torch.nn import functional as F

import wsym
from wsym.io.datasets import load
from wsym.models.networks import MLP


def last_layer_alignment(model: MLP, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """Cosine similarity of the noise covariance and the Fisher on the last layer; Tr ratio."""
    model = model.double().eval()
    with torch.no_grad():
        h = nn.Sequential(*list(model)[:-1])(x.double())
        p = model[-1](h).softmax(-1)
    hb = torch.cat([h, torch.ones_like(h[:, :1])], 1)  # (N, d+1)
    e = p - F.one_hot(y, p.shape[1]).double()  # (N, C)
    g = (e[:, :, None] * hb[:, None, :]).reshape(len(y), -1)  # (N, C (d+1))
    centred = g - g.mean(0)
    noise = centred.T @ centred / len(y)
    lam = torch.diag_embed(p) - p[:, :, None] * p[:, None, :]  # (N, C, C)
    fisher = torch.einsum("nab,ni,nj->aibj", lam, hb, hb).reshape(noise.shape) / len(y)
    cos = float((noise * fisher).sum() / (noise.norm() * fisher.norm()))
    return cos, float(noise.trace() / fisher.trace())


def train_to_loss(model, data, lr, batch, seed, threshold, max_epochs) -> tuple[int, bool]:
    """Plain SGD until the full training loss is ``<= threshold``: (epochs, reached)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    x, y = data.x_train, data.y_train
    for epoch in range(1, max_epochs + 1):
        order = torch.randperm(len(y), generator=gen)
        for start in range(0, len(y) - batch + 1, batch):
            idx = order[start : start + batch]
            opt.zero_grad()
            F.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
        with torch.no_grad():
            if float(F.cross_entropy(model(x), y)) <= threshold:
                return epoch, True
    return max_epochs, False


def run(batch: int, lr: float, seed: int, threshold: float, max_epochs: int, data) -> dict:
    """Train one MLP to the loss threshold; test accuracy, S_R, noise-Fisher alignment."""
    torch.manual_seed(seed)
    model = MLP(40, [64], 10)
    epochs, reached = train_to_loss(model, data, lr, batch, seed, threshold, max_epochs)
    with torch.no_grad():
        acc = float((model(data.x_test).argmax(-1) == data.y_test).float().mean())
    x, y = data.x_train[:512], data.y_train[:512]
    probe = [(x[:256], y[:256]), (x[256:], y[256:])]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s_r = wsym.sharpness(
            model, probe, F.cross_entropy, measure="fisher", probes=20, seed=seed, relative=False
        )
    cos, ratio = last_layer_alignment(model, x, y)
    return {"acc": acc, "s_r": s_r, "cos": cos, "ratio": ratio, "epochs": epochs, "ok": reached}


def main() -> None:
    """Run the grid and print the table and rank correlations."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="16,64,256")
    parser.add_argument("--lrs", default="0.02,0.05,0.1")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--loss", type=float, default=0.5, help="training-loss threshold")
    parser.add_argument("--max-epochs", type=int, default=4000)
    parser.add_argument("--quick", action="store_true", help="2x2 grid, 1 seed, loss 1.0")
    args = parser.parse_args()
    if args.quick:
        args.batches, args.lrs, args.seeds, args.loss = "32,128", "0.05,0.1", 1, 1.0
    torch.set_num_threads(1)
    data = load("mnist1d")
    print(f"mnist1d MLP(40, [64], 10), SGD without momentum, to training loss <= {args.loss} ")
    print(f"(at most {args.max_epochs} epochs), {args.seeds} seed(s) per cell; S_R on 512 ")
    print("training examples\n")
    print("| B | lr | B/lr | epochs | test acc (%) | S_R | cos(noise cov, Fisher) | Tr C / Tr F |")
    print("|---|---|---|---|---|---|---|---|")
    runs = []
    for b in [int(v) for v in args.batches.split(",")]:
        for lr in [float(v) for v in args.lrs.split(",")]:
            rows = [run(b, lr, s, args.loss, args.max_epochs, data) for s in range(args.seeds)]
            runs += [(b / lr, r) for r in rows if r["ok"]]
            mean = {k: statistics.mean(r[k] for r in rows) for k in rows[0]}
            flag = "" if all(r["ok"] for r in rows) else " (not reached)"
            print(
                f"| {b} | {lr:g} | {b / lr:.0f} | {mean['epochs']:.0f}{flag} | "
                f"{100 * mean['acc']:.1f} | {mean['s_r']:.4g} | {mean['cos']:.3f} | "
                f"{mean['ratio']:.3f} |",
                flush=True,
            )
    ratio = [k for k, _ in runs]
    for key, label in (("s_r", "S_R"), ("acc", "test accuracy")):
        vals = [r[key] for _, r in runs]
        tau, rho = kendalltau(ratio, vals).statistic, spearmanr(ratio, vals).statistic
        print(
            f"\n{label} vs B/lr over {len(runs)} runs: Kendall tau {tau:+.3f}, Spearman {rho:+.3f}"
        )


if __name__ == "__main__":
    main()
