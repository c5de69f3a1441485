"""Alignment speed: ``wsym.align`` by weights against PyPI ``rebasin`` on trained pairs.

Run from the repository root (``rebasin`` must be installed)::

    .venv/bin/python benchmarks/align_speed.py [--only NAME ...] [--repeats 5]
        [--cache DIR] [--save PATH] [--compare PATH] [--profile NAME]
        [--breakdown] [--orders N]

The pairs are those of ``benchmarks/alignment.py`` (same models, data, seeds
and training), trained once and cached as ``torch.save`` state dicts (read
back with ``weights_only=True``) under ``--cache`` (default
``.cache/alignment``, shared with ``benchmarks/alignment.py``). Per pair it
prints the least wall and CPU seconds over the repeats (one torch thread) of
``wsym.align`` (weights, spec given) and of
rebasin's whole use on the two models (tracing and coordinate descent), their
ratios, the machine's load average, and the loss barrier (train split, 11
points) of both aligned models. On a shared machine CPU seconds are the
steadier clock; least-of-repeats discounts the other processes.

``--save PATH`` stores wsym's aligned state dicts; ``--compare PATH`` reports
the largest difference to a stored run (to check that a faster code path gives
the same alignment). ``--profile NAME`` prints a cProfile of one pair's align.

``--breakdown`` splits wsym's least CPU time: canonicalizing both checkpoints
(continuous and sign groups), scipy's ``linear_sum_assignment`` (calls and
seconds inside ``wsym.align``), and the rest; beside it, a fifth of rebasin's
time (what wsym must stay under to be 5x faster).

``--orders N`` measures how much the barrier depends on the order in which
coordinate descent visits the permutation classes: wsym with ``seed`` 0..N-1
and rebasin with ``torch.manual_seed`` 0..N-1 (it visits them in
``torch.randperm`` order), train barrier (BatchNorm statistics reset on the
train split at every point, as in the CNN row of docs/merging.md), least / median /
largest over the orders.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from alignment import bn_reset_curves, configs, has_batchnorm, rebasin_align  # noqa: E402
from alignment import trained_pair as shared_pair  # noqa: E402

import wsym  # noqa: E402
from wsym.align import assignment  # noqa: E402
from wsym.align.alignment import CANON_TOL, NO_PERMUTATION  # noqa: E402
from wsym.align.canonicalize import canonical_element  # noqa: E402


def trained_pair(cfg: dict, cache: Path):
    """``(model_a, model_b, data)``: the pair of ``benchmarks/alignment.py``, from its cache."""
    return shared_pair(cfg, cache)[:3]


def clocked(fn, repeats: int):
    """``(result, least wall seconds, least CPU seconds)`` over ``repeats`` calls."""
    walls, cpus, result = [], [], None
    for _ in range(repeats):
        w, c = time.perf_counter(), time.process_time()
        result = fn()
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    return result, min(walls), min(cpus)


def rebasin_clocked(model_a, model_b, x, repeats: int):
    """rebasin's aligned state dict, least wall and CPU seconds (its own region only)."""
    walls, cpus, sd = [], [], None
    for _ in range(repeats):
        c = time.process_time()
        sd, wall = rebasin_align(model_a, model_b, x, 1)
        cpus.append(time.process_time() - c)  # includes one deep copy of model B
        walls.append(wall)
    return sd, min(walls), min(cpus)


def barrier(model, sd_a, sd_b, data) -> float:
    batches = list(data.batches("train", 1000))
    return wsym.interpolate(model, sd_a, sd_b, batches, F.cross_entropy, 11).barrier


def reset_barrier(model, sd_a, sd_b, data) -> float:
    """Train barrier; with BatchNorm, statistics recomputed at every point of the path."""
    if not has_batchnorm(model):
        return barrier(model, sd_a, sd_b, data)
    batches = list(data.batches("train", 1000))
    return bn_reset_curves(model, sd_a, sd_b, batches, {"train": batches})["train"].barrier


class CountedAssignment:
    """Stands in for scipy's ``linear_sum_assignment`` (``wsym.align.assignment``): calls, s."""

    def __init__(self):
        self.solve, self.calls, self.seconds = assignment.linear_sum_assignment, 0, 0.0

    def __call__(self, *args, **kwargs):
        start = time.process_time()
        out = self.solve(*args, **kwargs)
        self.seconds += time.process_time() - start
        self.calls += 1
        return out


def breakdown(align, sd_a, sd_b, spec, repeats: int) -> tuple[float, float, int]:
    """Least CPU seconds of canonicalizing both checkpoints; scipy seconds and calls in align."""

    def canonicalize_both():
        return [
            canonical_element(sd, spec, kinds=NO_PERMUTATION, tol=CANON_TOL) for sd in (sd_a, sd_b)
        ]

    canon = clocked(canonicalize_both, repeats)[2]
    counted = CountedAssignment()
    assignment.linear_sum_assignment = counted
    try:
        lap = []
        for _ in range(repeats):
            counted.calls, counted.seconds = 0, 0.0
            align()
            lap.append((counted.seconds, counted.calls))
    finally:
        assignment.linear_sum_assignment = counted.solve
    seconds, calls = min(lap)
    return canon, seconds, calls


def order_spread(model_a, model_b, sd_a, sd_b, spec, x, data, orders: int) -> str:
    """Barrier least / median / largest over visiting orders, wsym and rebasin."""
    ours, theirs = [], []
    for seed in range(orders):
        ours.append(reset_barrier(model_a, sd_a, wsym.align(sd_a, sd_b, spec, seed=seed), data))
        sd, _ = rebasin_align(model_a, model_b, x, 1, seed=seed)
        theirs.append(reset_barrier(model_a, sd_a, sd, data))

    def spread(values):
        return f"{min(values):.3f} / {statistics.median(values):.3f} / {max(values):.3f}"

    head = f"  barrier over {orders} orders, least / median / largest:"
    return f"{head} wsym {spread(ours)}, rebasin {spread(theirs)}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", default=None)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cache", default=".cache/alignment")
    parser.add_argument("--save", default=None)
    parser.add_argument("--compare", default=None)
    parser.add_argument("--profile", default=None)
    parser.add_argument("--no-rebasin", action="store_true")
    parser.add_argument("--breakdown", action="store_true")
    parser.add_argument("--orders", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    cache = Path(args.cache)
    saved, previous = {}, torch.load(args.compare, weights_only=True) if args.compare else {}
    print(f"torch {torch.__version__}, 1 thread, load average {os.getloadavg()}")
    print("pair          wsym s (cpu)     rebasin s (cpu)   ratio wall / cpu", end="")
    print("   barrier wsym / rebasin")
    for cfg in configs(False):
        name = cfg["name"]
        if args.only and name not in args.only:
            continue
        model_a, model_b, data = trained_pair(cfg, cache)
        sd_a, sd_b = (
            {k: v.detach().clone() for k, v in m.state_dict().items()} for m in (model_a, model_b)
        )
        x = data.x_train[:64]
        spec = wsym.detect(model_a, x)

        def align(sd_a=sd_a, sd_b=sd_b, spec=spec):
            return wsym.align(sd_a, sd_b, spec, "weights")

        if args.profile == name:
            prof = cProfile.Profile()
            prof.enable()
            align()
            prof.disable()
            pstats.Stats(prof).sort_stats("cumulative").print_stats(35)
        sd, w_wall, w_cpu = clocked(align, args.repeats)
        saved[name] = sd
        line = f"{name:<12}  {w_wall:.3f} ({w_cpu:.3f})"
        if args.no_rebasin:
            print(line + f"   barrier {barrier(model_a, sd_a, sd, data):.4f}")
        else:
            rb, r_wall, r_cpu = rebasin_clocked(model_a, model_b, x, args.repeats)
            ratios = f"{r_wall / w_wall:5.1f} / {r_cpu / w_cpu:5.1f}"
            line += f"    {r_wall:.3f} ({r_cpu:.3f})    {ratios}"
            b_w, b_r = barrier(model_a, sd_a, sd, data), barrier(model_a, sd_a, rb, data)
            print(line + f"      {b_w:.4f} / {b_r:.4f}")
        if args.breakdown:
            canon, lap, calls = breakdown(align, sd_a, sd_b, spec, args.repeats)
            rest = w_cpu - canon - lap
            budget = "" if args.no_rebasin else f"; rebasin / 5: {r_cpu / 5:.3f}"
            print(
                f"  cpu s: canonicalize both {canon:.3f}, scipy {lap:.3f} ({calls} calls), "
                f"rest {rest:.3f}{budget}"
            )
        if args.orders:
            print(order_spread(model_a, model_b, sd_a, sd_b, spec, x, data, args.orders))
        if name in previous:
            diff = max(float((sd[k] - previous[name][k]).abs().max()) for k in sd)
            print(f"  largest difference to {args.compare}: {diff:.2e}")
    print(f"load average {os.getloadavg()}")
    if args.save:
        torch.save(saved, args.save)


if __name__ == "__main__":
    main()
