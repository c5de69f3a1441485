"""SGD, Adam, K-FAC, LLQR and the SAM family, ± teleportation, at equal gradient budgets.

Tasks (CPU, float32, one thread):

* ``mnist1d-mlp``: ``MLP(40, [64, 64], 10)`` (ReLU) on mnist1d (4000 train / 1000 test),
  batch 128;
* ``digits-cnn``: ``ResidualCNN(channels=8)`` (conv, BatchNorm, residual block) on the
  8x8 digits (1437 / 360), batch 64;
* ``digits-transformer``: ``TinyTransformer(patch=8, seq=8, dim=16, heads=2, depth=1,
  hidden=32)`` on the digits' rows as a sequence of 8 tokens, batch 64.

Budget: ``--budget`` gradient evaluations per run (default 300). One-pass methods
(SGD, Adam, K-FAC, LLQR) take ``budget`` steps; two-pass methods (SAM, ASAM,
Fisher-SAM, GeoSAM, LLQR+SAM) take ``budget / 2``. Every method but Adam runs on SGD
with momentum 0.9. Radii: SAM, Fisher-SAM (eta 1), GeoSAM 0.05, ASAM 0.5 (eta 0.01),
LLQR+SAM 0.05 in the metric ``U^-1``. ``llqr`` / ``llqr-sam`` learn a K-FAC-structured
U from the LQR objective (``wsym.optim.learned``: refresh every 40 steps, 10 inner
steps, beta 0.95); ``kfac`` / ``llqr-sam-fisher`` estimate U as the damped inverse K-FAC
Fisher instead (refresh every 40 steps). The refresh's Jacobian-vector products and
K-FAC's sampled-label passes are not counted in the budget; their cost is in the time
column.

Learning rates (``LRS``), fixed before any test accuracy was looked at: each method's
best value on the robustness grid (``--grid``, the lowest training loss after 80 steps,
lrs 0.03 / 0.1 / 0.3 / 1 on SGD, 1e-3 / 3e-3 / 1e-2 / 3e-2 for Adam), the digits MLP's
grid row serving the mnist1d MLP.

Ablations of the learned U (``--methods llqr@newton,...``, at the method's learning rate):
``@newton`` keeps the LQR minimizer's own scale (``LQRPreconditioner(scale="newton")``),
``@damping1`` sets the relative damping to 1 (default 0.1).

Teleportation (``+tp``): ``wsym.teleport(..., objective="grad-norm", steps=3, lr=0.05)``
on the current batch every 25 optimizer steps, moving the optimizer's state with the
weights (``optimizer=``, ``wsym.optim.transport``); its cost is in the time, not in the
gradient budget.

Reported per task and method, over ``--seeds`` seeds (model init and batch order):
test accuracy mean +- std; CPU time (``time.process_time``) per optimizer step relative
to SGD's in the same run (median over seeds; teleportation amortized); sharpness of the
final models (mean over seeds) on the first 256 training examples with
``wsym.sharpness`` (worst case, rho 0.05, 10 ascent steps): ``adaptive`` and
``geodesic-inv`` (the quotient by the whole continuous group, invariant metric).

Robustness grid (``--grid``; the same cells are tests/test_robustness.py): every
optimizer of ``wsym.optim`` on SGD (momentum 0.9) and on Adam trains three digits
models -- the 64-32-32-10 ReLU MLP, ``ResidualCNN(channels=4)`` (BatchNorm) and a
one-block ``TinyTransformer`` on the image rows -- for ``GRID_STEPS`` steps of batch
64 at each learning rate of a grid spanning 30x (SGD 0.03-1, Adam 1e-3-3e-2);
reported: the loss on the first 256 training images (training mode) after the run as
a fraction of its start, per learning rate. Radii: SAM and Fisher-SAM 0.05, ASAM 0.5,
GeoSAM 0.05, LLQR+SAM 0.05; LLQR and LLQR+SAM learn a K-FAC-structured U, refreshed
every 40 steps (10 inner steps). ``plain`` (the base optimizer alone), ``kfac`` and
``llqr-sam-fisher`` rows give the learning rates of the benchmark's baselines.

Run (from the repository root; ``PYTHONPATH=.`` imports this checkout's wsym):
    PYTHONPATH=. .venv/bin/python benchmarks/optimizers.py            # 5 seeds, 3 tasks
    PYTHONPATH=. .venv/bin/python benchmarks/optimizers.py --quick    # smoke run
    PYTHONPATH=. .venv/bin/python benchmarks/optimizers.py --grid     # robustness grid
    PYTHONPATH=. .venv/bin/python benchmarks/optimizers.py --pothole  # two-scale quadratic
    PYTHONPATH=. .venv/bin/python benchmarks/optimizers.py --reference  # learned U, exact optima
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
from wsym.errors import WsymInputError
from wsym.io.datasets import Dataset, load
from wsym.models.evaluate import evaluate
from wsym.models.networks import MLP, ResidualCNN, TinyTransformer
from wsym.optim import ASAM, LLQR, LLQRSAM, SAM, FisherSAM, GeoSAM, LQRPreconditioner
from wsym.optim.base import frozen_buffers

METHODS = (
    "sgd",
    "adam",
    "kfac",
    "llqr",
    "sam",
    "asam",
    "fisher-sam",
    "geosam",
    "llqr-sam",
    "llqr-sam-fisher",
)
ONE_PASS = ("sgd", "adam", "kfac", "llqr")  # and their ablations, "llqr@newton", ...
TASKS = ("mnist1d-mlp", "digits-cnn", "digits-transformer")
MEASURES = ("adaptive", "geodesic-inv")
MOMENTUM, REFRESH, INNER = 0.9, 40, 10
TELEPORT_EVERY = 25
# the best learning rate of each method's robustness-grid row (module docstring):
# method -> (digits MLP row for mnist1d-mlp, digits-bn-cnn row, digits-transformer row)
_GRID_LRS = {
    "sgd": (0.1, 0.3, 0.1),
    "adam": (0.03, 0.03, 0.01),
    "kfac": (0.03, 0.1, 0.03),
    "llqr": (0.03, 0.3, 0.03),
    "sam": (0.1, 0.3, 0.1),
    "asam": (0.1, 0.3, 0.1),
    "fisher-sam": (0.1, 0.3, 0.1),
    "geosam": (0.1, 0.3, 0.1),
    "llqr-sam": (0.03, 1.0, 0.1),
    "llqr-sam-fisher": (0.03, 0.1, 0.03),
}
LRS = {task: {m: lrs[k] for m, lrs in _GRID_LRS.items()} for k, task in enumerate(TASKS)}


def _lr(task: str, method: str) -> float:
    """A method's learning rate; an ablation (``llqr@newton``) takes its method's."""
    return LRS[task][method.partition("@")[0]]


def _task(name: str, seed: int) -> tuple[nn.Module, Dataset, int]:
    torch.manual_seed(seed)
    if name == "mnist1d-mlp":
        return MLP(40, [64, 64], 10), load("mnist1d"), 128
    data = load("digits")
    if name == "digits-cnn":
        return ResidualCNN(channels=8), data, 64
    rows = Dataset(data.x_train[:, 0], data.y_train, data.x_test[:, 0], data.y_test, "digits")
    return TinyTransformer(patch=8, seq=8, dim=16, heads=2, depth=1, hidden=32), rows, 64


def _learned(variant: str) -> dict:
    """The learned U's options: the default, or an ablation (``@newton``, ``@damping1``)."""
    if variant == "newton":  # the LQR minimizer's own scale, not gradient-normalized
        return {
            "refresh": REFRESH,
            "preconditioner": LQRPreconditioner("kfac", steps=INNER, scale="newton"),
        }
    damping = {"": 0.1, "damping1": 1.0}[variant]
    return {"refresh": REFRESH, "inner_steps": INNER, "damping": damping, "preconditioner": "kfac"}


def _optimizer(method: str, model: nn.Module, lr: float, example):
    method, _, variant = method.partition("@")
    if method == "sgd":
        return torch.optim.SGD(model.parameters(), lr=lr, momentum=MOMENTUM)
    if method == "adam":
        return torch.optim.Adam(model.parameters(), lr=lr)
    sgd = {"base_optimizer": torch.optim.SGD, "lr": lr, "momentum": MOMENTUM}
    learned = _learned(variant)
    if method == "kfac":
        return LLQR(model, preconditioner="fisher-kfac", refresh=REFRESH, **sgd)
    if method == "llqr":
        return LLQR(model, **learned, **sgd)
    if method == "sam":
        return SAM(model, rho=0.05, **sgd)
    if method == "asam":
        return ASAM(model, rho=0.5, eta=0.01, **sgd)
    if method == "fisher-sam":
        return FisherSAM(model, rho=0.05, eta=1.0, **sgd)
    if method == "geosam":
        return GeoSAM(model, rho=0.05, example_inputs=example, **sgd)
    if method == "llqr-sam-fisher":
        return LLQRSAM(model, rho=0.05, preconditioner="fisher-kfac", refresh=REFRESH, **sgd)
    return LLQRSAM(model, rho=0.05, **learned, **sgd)


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

    if method.partition("@")[0] in ONE_PASS:
        closure()
        opt.step()
    else:
        opt.step(closure)


_SPECS: dict = {}


def _spec(task: str, model: nn.Module, inputs):
    """Detect once per architecture (the spec does not depend on the weights)."""
    if task not in _SPECS:
        _SPECS[task] = wsym.detect(model, inputs)
    return _SPECS[task]


def _sharpness(model, spec, probe) -> dict:
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for m in MEASURES:
            try:
                out[m] = wsym.sharpness(model, probe, F.cross_entropy, spec=spec, measure=m)
            except WsymInputError:  # a diverged run's weights are not finite
                out[m] = float("nan")
    return out


def run(task: str, method: str, teleport: bool, seed: int, budget: int) -> dict:
    """One training run: test accuracy, CPU time per step and final sharpness."""
    model, data, size = _task(task, seed)
    spec = _spec(task, model, data.x_train[:8])
    opt = _optimizer(method, model, _lr(task, method), data.x_train[:8])
    steps = budget if method.partition("@")[0] in ONE_PASS else budget // 2
    batches = _batches(data, size, seed)
    model.train()
    start = time.process_time()
    for t in range(steps):
        x, y = next(batches)
        if teleport and t % TELEPORT_EVERY == 0:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                wsym.teleport(
                    model, spec, [(x, y)], F.cross_entropy, steps=3, lr=0.05, optimizer=opt
                )
        _step(method, opt, model, x, y)
    per_step = (time.process_time() - start) / steps
    _, acc = evaluate(model, data.batches("test", 1024))
    probe = [(data.x_train[:256], data.y_train[:256])]
    return {"acc": acc, "time": per_step, **_sharpness(model, spec, probe)}


def _row(name: str, rows: list[dict], base_time: float) -> str:
    acc = [100 * r["acc"] for r in rows]
    std = statistics.stdev(acc) if len(acc) > 1 else 0.0
    t = statistics.median(r["time"] for r in rows)
    cells = [f"{statistics.mean(r[m] for r in rows):.3g}" for m in MEASURES]
    return (
        f"| {name} | {statistics.mean(acc):.1f} ± {std:.1f} | {t / base_time:.2f} | "
        + " | ".join(cells)
        + " |"
    )


def benchmark_table(tasks, methods, seeds: int, budget: int, teleport=(False, True)) -> None:
    """Print one markdown table per task (module docstring); SGD first, the time base."""
    for task in tasks:
        print(f"\n### {task}: {seeds} seeds, {budget} gradient evaluations per run\n")
        print("| method | lr | test acc (%) | time/step vs SGD | " + " | ".join(MEASURES) + " |")
        print("|---|---|---|---|" + "---|" * len(MEASURES))
        base = statistics.median(run(task, "sgd", False, s, budget)["time"] for s in range(seeds))
        for method in methods:
            for tp in teleport:
                rows = [run(task, method, tp, s, budget) for s in range(seeds)]
                name = f"{method}{'+tp' if tp else ''} | {_lr(task, method):g}"
                print(_row(name, rows, base), flush=True)


GRID_OPTIMIZERS = ("sam", "asam", "fisher-sam", "geosam", "llqr", "llqr-sam")
GRID_BASELINES = ("plain", "kfac", "llqr-sam-fisher")  # printed by --grid, not in the test
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
    if name == "plain":
        kw.pop("base_optimizer")
        cls = torch.optim.SGD if base == "sgd" else torch.optim.Adam
        return cls(model.parameters(), **kw)
    if name == "kfac":
        return LLQR(model, preconditioner="fisher-kfac", refresh=GRID_REFRESH, **kw)
    if name == "llqr-sam-fisher":
        return LLQRSAM(model, rho=0.05, preconditioner="fisher-kfac", refresh=GRID_REFRESH, **kw)
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

    if name in ("llqr", "plain", "kfac"):
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


def grid_table(rows=GRID_OPTIMIZERS + GRID_BASELINES) -> None:
    """Print the robustness grid as markdown tables, one per task."""
    for task in GRID_TASKS:
        print(f"\n### {task}: loss after {GRID_STEPS} steps / loss at start\n")
        for base, lrs in GRID_BASES.items():
            print(f"| {base} | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " | best |")
            print("|---|" + "---|" * (len(lrs) + 1))
            for name in rows:
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
    ts = _load_test("test_two_scale")
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


def _load_test(name: str):
    """A module of tests/ (its helpers are the experiments' references)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[1] / "tests" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def reference_table() -> None:
    """The learned structures against the exact optima on tests/test_llqr.py's problem."""
    tl = _load_test("test_llqr")
    print("| network | | " + " | ".join(tl.RICHER) + " | block optimum | dense optimum |")
    print("|---|---|" + "---|" * (len(tl.RICHER) + 2))
    notes = []
    for hidden in ([], [4]):
        torch.manual_seed(0)
        model = MLP(5, hidden, 3).double()
        lin, grads, lam, full, _, _ = tl._problem(model)
        _, optimum, exact = tl._reference(model, lin, grads, lam, full)
        best_step, best, bound = tl._block_reference(model, lin, grads, lam, full)
        fits = {s: tl._learned(s, model, lin, grads, lam) for s in tl.RICHER}
        cross = float(best_step @ exact / (best_step.norm() * exact.norm()))
        name = f"MLP(5, {hidden}, 3)"
        rows = {
            "cosine to -C^-1 g": [tl._cosine(u, full, exact) for u, _ in fits.values()]
            + [cross, 1.0],
            "cosine to block optimum": [tl._cosine_to(u, full, best_step) for u, _ in fits.values()]
            + [1.0, cross],
            "objective": [v for _, v in fits.values()] + [best, optimum],
        }
        for label, cells in rows.items():
            print(f"| {name} | {label} | " + " | ".join(f"{c:.4f}" for c in cells) + " |")
        longer = tl._learned("dense", model, lin, grads, lam, steps=1000)[1]
        notes.append(
            f"{name}: dense, 1000 inner steps: objective {longer:.5f}, 200: "
            f"{fits['dense'][1]:.5f}; dense cosine to block optimum "
            f"{tl._cosine_to(fits['dense'][0], full, best_step):.5f}; block optimum "
            f"{best:.5f}, symmetric block-diagonal optimum (a bound) {bound:.5f}"
        )
    print("\n" + "\n".join(notes))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--budget", type=int, default=300)
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--quick", action="store_true", help="1 seed, budget 40: a smoke run")
    parser.add_argument("--no-teleport", action="store_true", help="skip the +tp rows")
    parser.add_argument("--grid", action="store_true", help="the robustness grid only")
    parser.add_argument("--pothole", action="store_true", help="the two-scale quadratic only")
    parser.add_argument("--reference", action="store_true", help="learned U vs exact optima")
    parser.add_argument(
        "--grid-rows", default=",".join(GRID_OPTIMIZERS + GRID_BASELINES), help="with --grid"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.reference:
        reference_table()
    elif args.pothole:
        pothole_table()
    elif args.grid:
        grid_table(tuple(args.grid_rows.split(",")))
    else:
        if args.quick:
            args.seeds, args.budget = 1, 40
        teleport = (False,) if args.no_teleport else (False, True)
        tasks, methods = args.tasks.split(","), args.methods.split(",")
        benchmark_table(tasks, methods, args.seeds, args.budget, teleport)


if __name__ == "__main__":
    main()
