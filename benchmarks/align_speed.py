"""Alignment speed: ``wsym.align`` by weights against PyPI ``rebasin`` on trained pairs.

Run from the repository root (``rebasin`` must be installed)::

    .venv/bin/python benchmarks/align_speed.py [--only NAME ...] [--repeats 5]
        [--cache DIR] [--save PATH] [--compare PATH] [--profile NAME]

The pairs are those of ``benchmarks/alignment.py`` (same models, data, seeds
and training), trained once and cached as ``torch.save`` state dicts (read
back with ``weights_only=True``) under ``--cache`` (default
``.cache/align_speed``). Per pair it prints the least wall and CPU seconds over
the repeats (one torch thread) of ``wsym.align`` (weights, spec given) and of
rebasin's whole use on the two models (tracing and coordinate descent), their
ratios, the machine's load average, and the loss barrier (train split, 11
points) of both aligned models. On a shared machine CPU seconds are the
steadier clock; least-of-repeats discounts the other processes.

``--save PATH`` stores wsym's aligned state dicts; ``--compare PATH`` reports
the largest difference to a stored run (to check that a faster code path gives
the same alignment). ``--profile NAME`` prints a cProfile of one pair's align.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time
from pathlib import Path

import torch
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from alignment import SEEDS, configs, rebasin_align  # noqa: E402

import wsym  # noqa: E402
from wsym.data import load  # noqa: E402
from wsym.train import train  # noqa: E402


def trained_pair(cfg: dict, cache: Path):
    """``(model_a, model_b, data)``, trained as in ``benchmarks/alignment.py`` or from the cache."""
    data = load(cfg["data"])
    models = []
    for seed in SEEDS:
        torch.manual_seed(seed)
        model = cfg["make"]()
        path = cache / f"{cfg['name']}-{seed}.pt"
        if path.exists():
            model.load_state_dict(torch.load(path, weights_only=True))
        else:
            train(model, data, seed=seed, **cfg["train"])
            cache.mkdir(parents=True, exist_ok=True)
            torch.save(model.state_dict(), path)
        models.append(model.eval())
    return models[0], models[1], data


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", default=None)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cache", default=".cache/align_speed")
    parser.add_argument("--save", default=None)
    parser.add_argument("--compare", default=None)
    parser.add_argument("--profile", default=None)
    parser.add_argument("--no-rebasin", action="store_true")
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
        if name in previous:
            diff = max(float((sd[k] - previous[name][k]).abs().max()) for k in sd)
            print(f"  largest difference to {args.compare}: {diff:.2e}")
    print(f"load average {os.getloadavg()}")
    if args.save:
        torch.save(saved, args.save)


if __name__ == "__main__":
    main()
