"""Benchmark: cost of ``wsym.detect`` in forward passes of the model itself.

Run from the repository root::

    .venv/bin/python benchmarks/detect_speed.py [--models resnet50,bert-base] [--json PATH]
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/detect_speed.py \
        --models densenet201,efficientnet_v2_s,regnet_x_8gf --clock cpu

``densenet169``, ``densenet161``, ``efficientnet_b5``, ``maxvit_t``, ``convmixer_768_32``
and ``maxvit_nano_rw_256`` are built as the architecture sweep builds them
(``benchmarks/architectures_models.py``: 2x3x64x64 inputs, 1x3x224x224 for maxvit_t,
timm's own size for maxvit_nano); densenet201 is built the same way.

For each model (random weights, nothing downloaded) it times one float32 and one
float64 forward pass (median of 10 after one warm-up), then the phases of
``wsym.detect`` (trace: recording one forward pass, or torch.export where that
fails; analysis + solving; verification = float64 probe setup + group-testing
screen), and the whole ``wsym.detect`` call end to end.
Detection times are medians of 3 runs. One-time ``torch.export`` start-up is
excluded by tracing a tiny model first.
Ratios are seconds / (float32 forward seconds); the goal is detection +
verification <= 20 forward passes. ``--clock cpu`` times this process's CPU
seconds instead of wall seconds (on a machine shared with other jobs).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
import warnings
from collections import Counter
from pathlib import Path

import torch

import wsym
from wsym.detect import detection_trace, find_candidates
from wsym.detect.tracing.export import trace
from wsym.group.verify import Probe, screen

GOAL = 20
REPEATS = 3


def resnet50():
    import torchvision

    return torchvision.models.resnet50(weights=None), torch.randn(1, 3, 224, 224)


def bert_base():
    from transformers import BertConfig, BertModel

    config = BertConfig(
        vocab_size=30522,
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        intermediate_size=3072,
    )
    return BertModel(config), {"input_ids": torch.randint(0, config.vocab_size, (1, 128))}


def _small_torchvision(name):  # the architecture sweep's setting: 2x3x64x64
    def build():
        import torchvision

        return getattr(torchvision.models, name)(weights=None), torch.randn(2, 3, 64, 64)

    return build


def _sweep(family: str, name: str):  # built exactly as the architecture sweep builds it
    def build():
        sys.path.insert(0, str(Path(__file__).parent))
        from architectures_models import FAMILIES

        return FAMILIES[family]()[name]()

    return build


# the sweep's models over its time budget before issue 16's cost round
SWEEP_SLOW = {
    "torchvision": ("densenet169", "densenet161", "efficientnet_b5", "maxvit_t"),
    "timm": ("convmixer_768_32", "maxvit_nano_rw_256"),
}
MODELS = {
    "resnet50": resnet50,
    "bert-base": bert_base,
    **{n: _small_torchvision(n) for n in ("densenet201", "efficientnet_v2_s", "regnet_x_8gf")},
    **{n: _sweep(f, n) for f, names in SWEEP_SLOW.items() for n in names},
}
perf_counter = time.perf_counter  # or time.process_time (--clock cpu)


class CountingProbe(Probe):
    """A :class:`~wsym.group.verify.Probe` that counts its forward passes per dtype."""

    calls: Counter = Counter()

    def __call__(self, state, mode=None):
        type(self).calls[str(self.dtype).replace("torch.", "")] += 1  # copies count too
        return super().__call__(state, mode)


def call(model, inputs):
    if isinstance(inputs, dict):
        return model(**inputs)
    return model(*inputs) if isinstance(inputs, tuple) else model(inputs)


def forward_seconds(model, inputs, repeats: int = 10) -> float:
    """Median wall time of one no-grad eval forward, after one warm-up."""
    model.eval()
    with torch.no_grad():
        call(model, inputs)
        times = []
        for _ in range(repeats):
            t = perf_counter()
            call(model, inputs)
            times.append(perf_counter() - t)
    return statistics.median(times)


def to_double(inputs):
    if isinstance(inputs, dict):
        return {k: to_double(v) for k, v in inputs.items()}
    return inputs.double() if inputs.is_floating_point() else inputs


def detect_phases(model, inputs, seed: int = 0) -> tuple[dict[str, float], dict]:
    """``wsym.detect``'s three phases, timed; returns (seconds, probe forwards per dtype)."""
    t = {}
    start = perf_counter()
    traced = detection_trace(model, inputs)
    t["trace"] = perf_counter() - start
    start = perf_counter()
    spec = find_candidates(traced, model)
    t["analyze + solve"] = perf_counter() - start
    start = perf_counter()
    CountingProbe.calls = Counter()
    probe = CountingProbe(model, inputs, seed=seed)
    t["verify: probe setup"] = perf_counter() - start
    start = perf_counter()
    if spec.groups:
        screen(spec, probe, seed=seed)
    t["verify: screen"] = perf_counter() - start
    t["verify (total)"] = t["verify: probe setup"] + t["verify: screen"]
    return t, dict(CountingProbe.calls)


def bench(name: str) -> dict:
    torch.manual_seed(0)
    model, inputs = MODELS[name]()
    model.eval()
    fwd32 = forward_seconds(model, inputs)
    fwd64 = forward_seconds(copy.deepcopy(model).double(), to_double(inputs))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        runs = [detect_phases(model, inputs) for _ in range(REPEATS)]
        phases = {k: statistics.median(r[0][k] for r in runs) for k in runs[0][0]}
        probe_calls = runs[0][1]
        totals = []
        for _ in range(REPEATS):
            start = perf_counter()
            spec = wsym.detect(model, inputs)
            totals.append(perf_counter() - start)
        total = statistics.median(totals)
    rows = {
        "forward float32": fwd32,
        "forward float64": fwd64,
        **phases,
        "wsym.detect total": total,
    }
    return {
        "model": name,
        "seconds": rows,
        "ratio": {k: v / fwd32 for k, v in rows.items()},
        "probe_forwards": probe_calls,
        "groups": dict(sorted(Counter(g.kind for g in spec.groups).items())),
        "forward_passes": total / fwd32,
    }


def report(r: dict) -> None:
    print(f"\n== {r['model']} ==")
    print(f"{'phase':<22}{'seconds':>10}{'ratio':>10}")
    for k, s in r["seconds"].items():
        print(f"{k:<22}{s:>10.3f}{r['ratio'][k]:>10.1f}")
    passes = ", ".join(f"{k} {n}" for k, n in sorted(r["probe_forwards"].items()))
    print(f"probe forward passes in verification: {passes}")
    groups = ", ".join(f"{k}: {n}" for k, n in r["groups"].items()) or "none"
    print(f"groups found: {sum(r['groups'].values())} ({groups})")
    print(f"detection + verification = {r['forward_passes']:.1f} forward passes (goal: <= {GOAL})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models", default=",".join(MODELS), help="comma-separated: " + ", ".join(MODELS)
    )
    parser.add_argument("--json", metavar="PATH", help="also write the numbers as JSON")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    args = parser.parse_args()
    global perf_counter
    perf_counter = time.process_time if args.clock == "cpu" else time.perf_counter
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in names if m not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; choose from {list(MODELS)}")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    trace(torch.nn.Linear(2, 2), torch.randn(1, 2))  # one-time torch.export start-up, not timed
    results = []
    for name in names:
        results.append(bench(name))
        report(results[-1])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
