"""Sharpness before and after a random element of the *whole* symmetry group, on stock models.

For each stock model of the test registry (``tests/cases.py``: a 3-layer ReLU MLP, a
conv-BN-ReLU CNN, torchvision resnet18, timm ViT (depth 2) and ConvNeXt-atto, Hugging
Face GPT-2, Llama and BERT from small configs, an e3nn network; random weights,
float64, eval mode, a mean-squared loss against random targets), one element
``spec.sample(seed, scale=(1e-2, 1e2))`` of every detected kind at once moves the
weights (the same function), and each measure is computed before and after with the
same seed (rho 0.05, 5 ascent steps or 5 antithetic pairs). Printed: the relative
change ``|after - before| / |before|`` per measure, and the average-case value with
its standard error.

Run:
    .venv/bin/python benchmarks/sharpness_invariance.py [--only vit_tiny gpt2] [--seed 3]
"""

import argparse
import copy
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from cases import STOCK, stock_case  # noqa: E402

from wsym.sharpness import sharpness  # noqa: E402

MEASURES = (
    ("geodesic-inv", False),
    ("geodesic-mix", False),
    ("geodesic-mix", True),
    ("adaptive", False),
    ("euclidean", False),
)


def moved(model, spec, seed):
    other = copy.deepcopy(model)
    g = spec.sample(seed=seed, scale=(1e-2, 1e2))
    other.load_state_dict(spec.act(g, model.state_dict()))
    return other


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=list(STOCK))
    parser.add_argument("--seed", type=int, default=3)
    args = parser.parse_args()
    cols = ["geo-inv", "geo-mix", "geo-mix avg", "adaptive", "euclidean"]
    print(f"{'model':<14} {'kinds':<44} " + " ".join(f"{c:>11}" for c in cols) + "  avg value")
    for name in args.only:
        start = time.perf_counter()
        model, batches, loss, spec = stock_case(name)
        other = moved(model, spec, args.seed)
        changes, avg = [], None
        for measure, average in MEASURES:
            kw = {"spec": spec, "measure": measure, "average": average, "steps": 5, "rho": 0.05}
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                a = sharpness(model, batches, loss, with_error=True, **kw)
                b = sharpness(other, batches, loss, with_error=True, **kw)
            changes.append(abs(b.value - a.value) / abs(a.value))
            if average:
                avg = a
        kinds = ", ".join(f"{n} {k}" for k, n in sorted(spec.kinds().items()))
        row = " ".join(f"{c:>11.1e}" for c in changes)
        took = time.perf_counter() - start
        print(f"{name:<14} {kinds:<44} {row}  {avg}  ({took:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
