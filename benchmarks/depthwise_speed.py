"""Benchmark: the probe's float64 forward pass with depthwise convolutions shifted or native.

Run from the repository root::

    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python benchmarks/depthwise_speed.py \
        [--models efficientnet_b5,convmixer_768_32,maxvit_t,maxvit_nano_rw_256]

Each model is built as the architecture sweep builds it (random weights). For each,
one :class:`~wsym.group.verify.Probe` times its float64 pass at its generic weights
with float64 depthwise convolutions as shifted multiply-adds
(:mod:`wsym.group.depthwise`, what detection runs) and with PyTorch's kernel,
alternating (median of 5 after a warm-up, CPU seconds of this process), next to one
float32 pass of the same probe; it also prints the largest relative difference of
the two float64 outputs (round-off).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).parent))

from architectures_models import FAMILIES  # noqa: E402

from wsym.group.floor import relative  # noqa: E402
from wsym.group.verify import Probe  # noqa: E402

MODELS = {
    "efficientnet_b5": "torchvision",
    "convmixer_768_32": "timm",
    "maxvit_t": "torchvision",
    "maxvit_nano_rw_256": "timm",
    "mobilenet_v3_large": "torchvision",
    "convnext_tiny": "torchvision",
}


def seconds(fn, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return statistics.median(times)


def bench(name: str) -> dict:
    torch.manual_seed(0)
    model, inputs = FAMILIES[MODELS[name]]()[name]()
    model.eval()
    probe = Probe(model, inputs)
    low = probe.in_dtype(torch.float32)
    state = probe.generic

    def run(shifted: bool):
        probe._depthwise = shifted
        return probe(state)

    y_shifted, y_native = run(True), run(False)  # warm-up, and the round-off between them
    low(state)
    times = {"shifted": [], "native": [], "float32": []}
    for _ in range(5):  # alternating, so that load changes hit both alike
        times["shifted"].append(seconds(lambda: run(True), 1))
        times["native"].append(seconds(lambda: run(False), 1))
        times["float32"].append(seconds(lambda: low(state), 1))
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"model": name, **med, "difference": relative(y_shifted, y_native)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(list(MODELS)[:4]))
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(
        "| model | float64 pass: native | shifted | native / shifted | float32 pass "
        "| shifted / float32 | difference |"
    )
    print("|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        r = bench(name.strip())
        print(
            f"| {r['model']} | {r['native']:.3f} s | {r['shifted']:.3f} s "
            f"| {r['native'] / r['shifted']:.1f} | {r['float32']:.3f} s "
            f"| {r['shifted'] / r['float32']:.1f} | {r['difference']:.0e} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
