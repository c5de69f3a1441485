"""Benchmark: the property-based architecture fuzzer at length, with counts.

Draws ``--examples`` random architectures (``wsym.testing.architectures``: linear,
conv, norm, attention, gating, residual and concat blocks, random widths and
activations, train or eval mode) and runs on each the properties of
``tests/test_fuzz_architectures.py``: every reported group holds in float64 on
example, fresh and x20 / x1000 inputs; ``detect`` leaves the module unchanged;
every public entry point succeeds (canonicalize and align computing the same
function) or raises one ``WsymInputError`` line. Prints the counts::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/fuzz_architectures.py --examples 200

A failure prints its recipe (a minimal model after hypothesis' shrinking).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

import torch
from hypothesis import HealthCheck, given, seed, settings

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from test_fuzz_architectures import check_model  # noqa: E402

from wsym.testing.architectures import architectures  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=200, help="models to draw")
    parser.add_argument("--depth", type=int, default=2, help="nesting of residual/concat")
    parser.add_argument("--seed", type=int, default=0, help="hypothesis seed")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    counts, families, failures = Counter(), Counter(), []
    start = time.time()

    @settings(
        max_examples=args.examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @seed(args.seed)
    @given(drawn=architectures(depth=args.depth))
    def run(drawn):
        model, x, recipe = drawn
        counts["models"] += 1
        families[recipe[0]] += 1
        try:
            for k, v in check_model(model, x).items():
                counts[k] += v
        except Exception as err:  # noqa: BLE001 - counted, then re-raised for shrinking
            counts["failures"] += 1
            failures.append((recipe, f"{type(err).__name__}: {str(err)[:300]}"))
            raise

    try:
        run()
    except Exception as err:  # noqa: BLE001
        print(f"smallest failing model: {type(err).__name__}: {str(err)[:500]}")
    drawn = ", ".join(f"{k} {v}" for k, v in sorted(families.items()))
    print(
        f"models drawn {counts['models']} ({drawn}); "
        f"groups checked {counts['groups']}; refused by detect {counts['refused']}; "
        f"entry-point calls ok {counts['entries']}, refused in one line {counts['entry_errors']}; "
        f"failures {counts['failures']}; {time.time() - start:.0f} s"
    )
    for recipe, message in failures[-3:]:
        print(f"failing recipe: {recipe!r}: {message}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
