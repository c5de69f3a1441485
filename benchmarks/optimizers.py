"""SGD, Adam and the SAM family, with and without teleportation, at equal gradient budgets.

Tasks (CPU, float32):

* ``mnist1d-mlp``: ``MLP(40, [64, 64], 10)`` (ReLU) on mnist1d (4000 train / 1000 test),
  batch 128;
* ``digits-cnn``: ``ResidualCNN(channels=8)`` (conv, BatchNorm, residual block) on the
  8x8 digits (1437 / 360), batch 64.

Budget: ``--budget`` gradient evaluations per run (default 600). One-pass methods
(SGD, Adam, K-FAC-SGD, LLQR) take ``budget`` steps; SAM-type methods (two gradients
per step) take ``budget / 2``. All SGD-based methods use momentum 0.9 and lr 0.05;
Adam lr 1e-3. Radii: SAM 0.05, ASAM 0.5 (eta 0.01), Fisher-SAM 0.05 (eta 1), LLQR+SAM
0.05 in the metric ``U^-1``. ``llqr-sam`` learns a K-FAC-structured U from the LQR
objective (``wsym.optim.learned``; refreshed every K=20 steps with beta 0.9); ``llqr``
is that learned preconditioner alone (SGD on ``U g``, one gradient per step), the
ablation the LLQR+SAM paper compares with. ``llqr-sam-fisher``
and ``kfac-sgd`` are the same two with U estimated as the damped inverse K-FAC Fisher
(equal to 1 at the mean curvature, damping 0.1 relative to it).

Teleportation (``+tp``): ``wsym.teleport(..., objective="grad-norm", steps=3, lr=0.05)``
on the current batch every 25 optimizer steps, moving the optimizer's state with the
weights (``optimizer=``, ``wsym.optim.transport``); its cost is in the wall time, not in
the gradient budget (it is a few double-backward passes).

Reported per task and method, over ``--seeds`` seeds (model init and batch order):
test accuracy mean +- std; wall time per optimizer step relative to SGD's (median
over seeds; teleportation amortized); and sharpness of the final models (mean over
seeds) on the first 256 training examples with ``wsym.sharpness``: ``adaptive``
(worst case, rho 0.05, 10 ascent steps), ``fisher`` (diagonal Fisher-Riemannian, 10
probes) and ``hessian-trace`` (10 probes). ``geodesic-mix`` is left out: on both
models it equals ``adaptive`` (the MLP's two ReLU layers share a weight matrix and the
CNN's channels carry norm_scaling groups, so no GL or GL(1) block is available).

Robustness grid (``--grid``; the same cells are tests/test_robustness.py): every
optimizer of ``wsym.optim`` on SGD (momentum 0.9) and on Adam trains three digits
models -- the 64-32-32-10 ReLU MLP, ``ResidualCNN(channels=4)`` (BatchNorm) and a
one-block ``TinyTransformer`` on the image rows -- for ``GRID_STEPS`` steps of batch
64 at each learning rate of a grid spanning 30x (SGD 0.03-1, Adam 1e-3-3e-2);
reported: the loss on the first 256 training images (training mode) after the run as
a fraction of its start, per learning rate. Radii: SAM and Fisher-SAM 0.05, ASAM 0.5,
GeoSAM 0.05, LLQR+SAM 0.05; LLQR and LLQR+SAM learn a K-FAC-structured U, refreshed
every 40 steps (10 inner steps).

Run:
    .venv/bin/python benchmarks/optimizers.py            # 5 seeds, a few minutes
    .venv/bin/python benchmarks/optimizers.py --quick    # smoke run, 1 seed, tiny budget
    .venv/bin/python benchmarks/optimizers.py --grid     # the robustness grid (~3 min)
    .venv/bin/python benchmarks/optimizers.py --pothole  # two-scale quadratic, U given / learned
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch
from torch import nn
from torch.nn import functional as F

import wsym
from wsym.data import load
from wsym.errors import WsymInputError
from wsym.optim import ASAM, LLQR, LLQRSAM, SAM, FisherSAM, GeoSAM
from wsym.optim.base import frozen_buffers
from wsym.reference import MLP, ResidualCNN, TinyTransformer
from wsym.train import evaluate

METHODS = (
    "sgd",
    "adam",
    "kfac-sgd",
    "llqr",
    "sam",
    "asam",
    "fisher-sam",
    "llqr-sam",
    "llqr-sam-fisher",
)
TWO_PASS = ("sam", "asam", "fisher-sam", "llqr-sam", "llqr-sam-fisher")
MEASURES = ("adaptive", "fisher", "hessian-trace")
LR, MOMENTUM, REFRESH, BETA = 0.05, 0.9, 20, 0.9
TELEPORT_EVERY = 25


def _task(name: str, seed: int):
    torch.manual_seed(seed)
    if name == "mnist1d-mlp":
        return MLP(40, [64, 64], 10), load("mnist1d"), 128
    return ResidualCNN(channels=8), load("digits"), 64


def _optimizer(method: str, model: nn.Module):
    sgd = {"base_optimizer": torch.optim.SGD, "lr": LR, "momentum": MOMENTUM}
    if method == "sgd":
        return torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    if method == "adam":
        return torch.optim.Adam(model.parameters(), lr=1e-3)
    if method == "kfac-sgd":
        return LLQR(model, preconditioner="fisher-kfac", refresh=REFRESH, beta=BETA, **sgd)
    if method == "sam":
        return SAM(model, rho=0.05, **sgd)
    if method == "asam":
        return ASAM(model, rho=0.5, eta=0.01, **sgd)
    if method == "fisher-sam":
        return FisherSAM(model, rho=0.05, eta=1.0, **sgd)
    if method == "llqr":
        return LLQR(model, preconditioner="kfac", refresh=REFRESH, beta=BETA, **sgd)
    pre = "fisher-kfac" if method == "llqr-sam-fisher" else "kfac"
    return LLQRSAM(model, rho=0.05, preconditioner=pre, refresh=REFRESH, beta=BETA, **sgd)


def _batches(data, size: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    while True:
        yield from data.batches(
            "train", size, seed=int(torch.randint(2**62, (1,), generator=gen)), shuffle=True
        )


def _step(method: str, opt, model, x, y) -> None:
    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        return loss

    if method in TWO_PASS:
        opt.step(closure)
    else:
        closure()
        opt.step()


_SPECS: dict = {}


def _spec(task: str, model: nn.Module, inputs):
    """Detect once per architecture (the spec does not depend on the weights)."""
    if task not in _SPECS:
        _SPECS[task] = wsym.detect(model, inputs)
    return _SPECS[task]


def run(task: str, method: str, teleport: bool, seed: int, budget: int) -> dict:
    model, data, size = _task(task, seed)
    spec = _spec(task, model, data.x_train[:8])
    opt = _optimizer(method, model)
    steps = budget // 2 if method in TWO_PASS else budget
    batches = _batches(data, size, seed)
    model.train()
    start = time.perf_counter()
    for t in range(steps):
        x, y = next(batches)
        if teleport and t % TELEPORT_EVERY == 0:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                wsym.teleport(
                    model, spec, [(x, y)], F.cross_entropy, steps=3, lr=0.05, optimizer=opt
                )
        _step(method, opt, model, x, y)
    per_step = (time.perf_counter() - start) / steps
    _, acc = evaluate(model, data.batches("test", 1024))
    probe = [(data.x_train[:256], data.y_train[:256])]
    sharp = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for m in MEASURES:
            opts = {"probes": 10} if m in ("fisher", "hessian-trace") else {}
            if m == "fisher":  # the paper's S_R (absolute damping), as recorded in the results
                opts["relative"] = False
            sharp[m] = wsym.sharpness(model, probe, F.cross_entropy, spec=spec, measure=m, **opts)
    return {"acc": acc, "time": per_step, **sharp}


GRID_OPTIMIZERS = ("sam", "asam", "fisher-sam", "geosam", "llqr", "llqr-sam")
GRID_BASES = {"sgd": (0.03, 0.1, 0.3, 1.0), "adam": (1e-3, 3e-3, 1e-2, 3e-2)}
GRID_TASKS = ("digits-mlp", "digits-bn-cnn", "digits-transformer")
GRID_STEPS, GRID_BATCH, GRID_REFRESH = 80, 64, 40


def grid_task(task: str, seed: int = 0):
    """``(model, inputs, labels)``: a digits model and the training set in its input shape."""
    data = load("digits")
    x, y = data.x_train, data.y_train
    torch.manual_seed(seed)
    if task == "digits-mlp":
        return MLP(64, [32, 32], 10), x.reshape(len(x), 64), y
    if task == "digits-bn-cnn":
        return ResidualCNN(channels=4), x, y
    return TinyTransformer(patch=8, seq=8, dim=16, heads=2, depth=1, hidden=32), x[:, 0], y


def grid_optimizer(name: str, base: str, model: nn.Module, lr: float, example):
    """One optimizer of the grid (module docstring); raises what its constructor raises."""
    kw = {"lr": lr}
    if base == "sgd":
        kw.update(base_optimizer=torch.optim.SGD, momentum=MOMENTUM)
    else:
        kw.update(base_optimizer=torch.optim.Adam)
    if name == "sam":
        return SAM(model, rho=0.05, **kw)
    if name == "asam":
        return ASAM(model, rho=0.5, **kw)
    if name == "fisher-sam":
        return FisherSAM(model, rho=0.05, **kw)
    if name == "geosam":
        return GeoSAM(model, rho=0.05, example_inputs=example, **kw)
    if name == "llqr":
        return LLQR(model, preconditioner="kfac", refresh=GRID_REFRESH, inner_steps=10, **kw)
    return LLQRSAM(
        model, rho=0.05, preconditioner="kfac", refresh=GRID_REFRESH, inner_steps=10, **kw
    )


def _train_loss(model: nn.Module, x, y) -> float:
    with torch.no_grad(), frozen_buffers(model):
        return float(F.cross_entropy(model(x), y))


def _grid_step(name: str, opt, model: nn.Module, x, y) -> None:
    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        return loss

    if name == "llqr":
        closure()
        opt.step()
    else:
        opt.step(closure)


def grid_cell(task: str, name: str, base: str, seed: int = 0) -> list[float]:
    """Final / initial training loss at each learning rate of ``base``'s grid."""
    ratios = []
    for lr in GRID_BASES[base]:
        model, x, y = grid_task(task, seed)
        model.train()
        probe = (x[:256], y[:256])
        opt = grid_optimizer(name, base, model, lr, x[:8])
        start = _train_loss(model, *probe)
        gen = torch.Generator().manual_seed(seed)
        for _ in range(GRID_STEPS):
            idx = torch.randint(0, len(y), (GRID_BATCH,), generator=gen)
            _grid_step(name, opt, model, x[idx], y[idx])
        end = _train_loss(model, *probe)
        ratios.append(end / start if end == end else float("inf"))
    return ratios


def grid_table() -> None:
    """Print the robustness grid as markdown tables, one per task."""
    for task in GRID_TASKS:
        print(f"\n### {task}: loss after {GRID_STEPS} steps / loss at start\n")
        for base, lrs in GRID_BASES.items():
            print(f"| {base} | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " | best |")
            print("|---|" + "---|" * (len(lrs) + 1))
            for name in GRID_OPTIMIZERS:
                try:
                    ratios = grid_cell(task, name, base)
                except WsymInputError as err:
                    print(f"| {name} | pending: {str(err)[:60]}... |", flush=True)
                    continue
                cells = " | ".join(f"{r:.2f}" if r < 10 else "diverged" for r in ratios)
                print(f"| {name} | {cells} | {min(ratios):.2f} |", flush=True)
            print()


def pothole_table() -> None:
    """The two-scale quadratic's envelopes, with U given and learned (tests/test_two_scale.py)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[1] / "tests" / "test_two_scale.py"
    spec = importlib.util.spec_from_file_location("two_scale", path)
    ts = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ts)
    lams = ts.LAMBDAS

    def learned(scale, normalize="metric"):
        return [ts._envelope("llqr", x, normalize, u=ts._learned_u(x, scale)) for x in lams]

    rows = {
        "SAM": [ts._envelope("sam", x) for x in lams],
        "LLQR+SAM, U = H_bar^-1": [ts._envelope("llqr", x) for x in lams],
        'LLQR+SAM, learned U, scale="newton"': learned("newton"),
        'LLQR+SAM, learned U, scale="gradient" (default)': learned("gradient"),
        "LLQR+SAM, learned U (newton), ||Ug|| normalization": learned("newton", "euclidean"),
    }
    print("| method | " + " | ".join(f"λ̄ = {x:g}" for x in lams) + " | log-log slope |")
    print("|---|" + "---|" * (len(lams) + 1))
    for name, ys in rows.items():
        cells = " | ".join(f"{y:.4g}" for y in ys)
        print(f"| {name} | {cells} | {ts._slope(lams, ys):+.4f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--budget", type=int, default=600)
    parser.add_argument("--tasks", default="mnist1d-mlp,digits-cnn")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--quick", action="store_true", help="1 seed, budget 40: a smoke run")
    parser.add_argument("--grid", action="store_true", help="the robustness grid only")
    parser.add_argument("--pothole", action="store_true", help="the two-scale quadratic only")
    args = parser.parse_args()
    if args.pothole:
        pothole_table()
        return
    if args.grid:
        torch.set_num_threads(1)
        grid_table()
        return
    if args.quick:
        args.seeds, args.budget = 1, 40
    torch.set_num_threads(1)
    for task in args.tasks.split(","):
        print(f"\n### {task}: {args.seeds} seeds, {args.budget} gradient evaluations per run\n")
        print("| method | test acc (%) | time/step vs SGD | " + " | ".join(MEASURES) + " |")
        print("|---|---|---|" + "---|" * len(MEASURES))
        base_time = None
        for method in args.methods.split(","):
            for tp in (False, True):
                rows = [run(task, method, tp, s, args.budget) for s in range(args.seeds)]
                acc = [100 * r["acc"] for r in rows]
                t = statistics.median(r["time"] for r in rows)
                base_time = t if base_time is None else base_time
                std = statistics.stdev(acc) if len(acc) > 1 else 0.0
                cells = [f"{statistics.mean(r[m] for r in rows):.3g}" for m in MEASURES]
                name = method + ("+tp" if tp else "")
                print(
                    f"| {name} | {statistics.mean(acc):.1f} ± {std:.1f} | {t / base_time:.2f} | "
                    + " | ".join(cells)
                    + " |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
