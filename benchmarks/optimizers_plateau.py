"""Optimizers trained to their plateau: SGD, Adam, K-FAC, LLQR, SAM, LLQR+SAM, 4 tasks.

The tasks, methods, radii and learning rates of ``benchmarks/optimizers.py`` (its
robustness grid's best learning rate per method, fixed before any test accuracy was
seen), plus a fourth task where SAM is known to help:

* ``digits-mlp-noise``: ``MLP(64, [32, 32], 10)`` (ReLU) on the 8x8 digits with 25 %
  of the training labels replaced by a uniformly drawn *other* class (the same
  corruption for every seed and method; test labels clean), batch 64; learning rates
  of the grid's digits-MLP row (the row that also serves ``mnist1d-mlp``).

Instead of an equal gradient budget, every run stops by one rule, the same for all
methods (:class:`wsym.optim.Plateau`): the training loss of each step's batch (at the
unperturbed weights, for the two-pass methods) is smoothed by a bias-corrected moving
average (beta 0.98); every 25 optimizer steps the smoothed loss is checked, and a check
whose relative improvement over the last 4 checks (100 steps) is below 1 % is a
strike; 3 strikes in a row stop the run. A check whose smoothed loss is below 0.01
stops it too (the training set is fit: an interpolating run's loss keeps shrinking by
over 1 % per 100 steps for thousands of steps without changing a prediction), and so
does the cap ``--max-steps`` optimizer steps (a run at the cap is counted as such).
``--decay F`` multiplies the learning rate by ``F`` at the first plateau and
trains on to a second plateau under the same rule (same cap on the total).

Reported per task and method over ``--seeds`` seeds (model init and batch order):
test accuracy mean +- std, optimizer steps, gradient evaluations and CPU seconds
(``time.process_time``) to the stop (median, with the number of runs that hit the
cap), and final sharpness: ``wsym.sharpness(measure="adaptive")`` worst case, rho 0.05,
10 ascent steps, on the first 256 training examples (noisy labels on the noise task).
Then the paired differences per seed: LLQR+SAM - SAM, LLQR+SAM - LLQR and SAM - SGD,
their mean with a 95% Student-t interval over the seeds, and their sign counts.

Run (from the repository root):
    PYTHONPATH=. .venv/bin/python benchmarks/optimizers_plateau.py          # 5 seeds, 4 tasks
    PYTHONPATH=. .venv/bin/python benchmarks/optimizers_plateau.py --seeds 1 --max-steps 100 \\
        --out /tmp/smoke.jsonl                                        # smoke run
    PYTHONPATH=. .venv/bin/python benchmarks/optimizers_plateau.py --table  # table of the jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
from scipy.stats import t as t_dist
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).parent))
import optimizers as equal_budget  # noqa: E402  (next to this script)

import wsym  # noqa: E402
from wsym.errors import WsymInputError  # noqa: E402
from wsym.io.datasets import Dataset, load  # noqa: E402
from wsym.models.evaluate import evaluate  # noqa: E402
from wsym.models.networks import MLP  # noqa: E402
from wsym.optim import Plateau  # noqa: E402

NOISE_TASK, NOISE = "digits-mlp-noise", 0.25
TASKS = (*equal_budget.TASKS, NOISE_TASK)
METHODS = ("sgd", "adam", "kfac", "llqr", "sam", "llqr-sam")
RULE = {"every": 25, "window": 4, "tol": 0.01, "patience": 3, "beta": 0.98, "floor": 0.01}
STOPS = ("plateau", "fit", "cap")
PAIRS = (("llqr-sam", "sam"), ("llqr-sam", "llqr"), ("sam", "sgd"))
HERE = Path(__file__).parent
JSONL, TABLE = HERE / "optimizers_plateau_results.jsonl", HERE / "optimizers_plateau_results.md"


def noisy_digits(fraction: float = NOISE, seed: int = 0) -> Dataset:
    """The digits, flattened, with ``fraction`` of the training labels moved to another class."""
    data = load("digits")
    gen = torch.Generator().manual_seed(seed)
    y = data.y_train.clone()
    flip = torch.rand(len(y), generator=gen) < fraction
    shift = torch.randint(1, 10, (len(y),), generator=gen)
    y[flip] = (y[flip] + shift[flip]) % 10
    flat = data.x_train.reshape(len(y), 64), data.x_test.reshape(len(data.y_test), 64)
    return Dataset(flat[0], y, flat[1], data.y_test, NOISE_TASK)


def _task(task: str, seed: int):
    if task == NOISE_TASK:
        torch.manual_seed(seed)
        return MLP(64, [32, 32], 10), noisy_digits(), 64
    return equal_budget._task(task, seed)


def _lr(task: str, method: str) -> float:
    return equal_budget._lr("mnist1d-mlp" if task == NOISE_TASK else task, method)


def _loss_step(method: str, opt, model, x, y) -> float:
    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        return loss

    if method in equal_budget.ONE_PASS:
        loss = closure()
        opt.step()
    else:
        loss = opt.step(closure)
    return float(loss.detach())


def _sharpness(model, spec, probe) -> float:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return wsym.sharpness(model, probe, F.cross_entropy, spec=spec, measure="adaptive")
        except WsymInputError:  # a diverged run's weights are not finite
            return float("nan")


def run(task: str, method: str, seed: int, max_steps: int, decay: float | None) -> dict:
    """One run to its plateau (module docstring)."""
    model, data, size = _task(task, seed)
    spec = equal_budget._spec(task, model, data.x_train[:8])
    opt = equal_budget._optimizer(method, model, _lr(task, method), data.x_train[:8])
    batches = equal_budget._batches(data, size, seed)
    rule, phases, steps = Plateau(max_steps=max_steps, **RULE), [], 0
    model.train()
    start = time.process_time()
    while True:
        x, y = next(batches)
        steps += 1
        if rule.update(_loss_step(method, opt, model, x, y)):
            phases.append({"steps": steps, "reason": rule.reason, "loss": rule.smoothed})
            if decay is None or rule.reason != "plateau" or len(phases) == 2:
                break
            for group in opt.param_groups:
                group["lr"] *= decay
            rule = Plateau(max_steps=max_steps - steps, **RULE)
    seconds = time.process_time() - start
    _, acc = evaluate(model, data.batches("test", 1024))
    probe = [(data.x_train[:256], data.y_train[:256])]
    passes = 1 if method in equal_budget.ONE_PASS else 2
    return {
        "task": task,
        "method": method,
        "seed": seed,
        "lr": _lr(task, method),
        "decay": decay,
        "acc": acc,
        "steps": steps,
        "grads": passes * steps,
        "seconds": seconds,
        "reason": phases[-1]["reason"],
        "phases": phases,
        "max_steps": max_steps,
        "adaptive": _sharpness(model, spec, probe),
    }


def _interval(values: list[float]) -> tuple[float, float, float]:
    """The mean and its 95% Student-t interval over seeds (the mean alone for one seed)."""
    mean = statistics.mean(values)
    if len(values) < 2:
        return mean, mean, mean
    half = t_dist.ppf(0.975, len(values) - 1) * statistics.stdev(values) / len(values) ** 0.5
    return mean, mean - half, mean + half


def _spread(values: list[float], fmt: str = "{:.1f}") -> str:
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{fmt.format(statistics.mean(values))} ± {fmt.format(std)}"


def _task_table(task: str, rows: list[dict]) -> list[str]:
    seeds = len({r["seed"] for r in rows})
    cap = rows[0]["max_steps"]
    out = [
        f"\n### {task}: {seeds} seeds, to the plateau (cap {cap} steps)\n",
        "| method | lr | test acc (%) | steps (median, min-max) | grad evals (median) "
        "| CPU s (median) | stop: plateau / fit / cap | train loss (median) "
        "| adaptive sharpness |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for method in METHODS:
        mine = [r for r in rows if r["method"] == method]
        if not mine:
            continue
        steps = [r["steps"] for r in mine]
        stops = " / ".join(str(sum(r["reason"] == w for r in mine)) for w in STOPS)
        loss = statistics.median(r["phases"][-1]["loss"] for r in mine)
        out.append(
            f"| {method} | {mine[0]['lr']:g} | {_spread([100 * r['acc'] for r in mine])} "
            f"| {statistics.median(steps):g} ({min(steps)}-{max(steps)}) "
            f"| {statistics.median(r['grads'] for r in mine):g} "
            f"| {statistics.median(r['seconds'] for r in mine):.1f} | {stops} | {loss:.3g} "
            f"| {statistics.mean(r['adaptive'] for r in mine):.3g} |"
        )
    out += [
        "",
        "| paired difference (points) | per seed | mean [95% CI] | sign (+/-) |",
        "|---|---|---|---|",
    ]
    for a, b in PAIRS:
        acc = {(r["method"], r["seed"]): 100 * r["acc"] for r in rows}
        both = sorted(s for (m, s) in acc if m == a and (b, s) in acc)
        if not both:
            continue
        diff = [acc[a, s] - acc[b, s] for s in both]
        cells = ", ".join(f"{d:+.1f}" for d in diff)
        plus, minus = sum(d > 0 for d in diff), sum(d < 0 for d in diff)
        mean, low, high = _interval(diff)
        out.append(
            f"| {a} − {b} | {cells} | {mean:+.1f} [{low:+.1f}, {high:+.1f}] | {plus}/{minus} |"
        )
    return out


def table(path: Path = JSONL) -> str:
    """Markdown tables, one per task, from the runs in ``path``."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    lines = []
    for task in TASKS:
        mine = [r for r in rows if r["task"] == task]
        if mine:
            lines += _task_table(task, mine)
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--max-steps", type=int, default=2500)
    parser.add_argument("--decay", type=float, default=None, help="lr factor at the plateau")
    parser.add_argument("--out", type=Path, default=JSONL, help="runs, one JSON per line")
    parser.add_argument("--table", action="store_true", help="print the table of --out only")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if not args.table:
        tasks, methods = args.tasks.split(","), args.methods.split(",")
        for name in tasks + methods:
            if name not in TASKS + METHODS:
                raise SystemExit(f"unknown task or method {name!r}: choose from {TASKS + METHODS}")
        with args.out.open("w") as log:
            for task in tasks:  # seed-major: a cut run still has whole seeds for the pairs
                for seed in range(args.seeds):
                    for method in methods:
                        row = run(task, method, seed, args.max_steps, args.decay)
                        log.write(json.dumps(row) + "\n")
                        log.flush()
                        print(
                            f"{task} {method} seed {seed}: acc {row['acc']:.3f} "
                            f"steps {row['steps']} ({row['reason']}) {row['seconds']:.1f}s "
                            f"sharp {row['adaptive']:.3g}",
                            flush=True,
                        )
    print(table(args.out))


if __name__ == "__main__":
    main()
