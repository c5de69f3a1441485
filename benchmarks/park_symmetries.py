"""The detected symmetries of the shipped park zoo's trained members leave their outputs unchanged.

For the first member of every distinct architecture in ``data/zoos/mnist1d-park``,
detect its spec (``wsym.detect`` on 16 test signals), act on its trained weights
(float64) with one random element of the whole group per seed (scales
1e-2..1e2, 3 seeds) and print, per family, the architectures checked, the group
kinds found and the largest relative change of the outputs on 256 test signals.

Run::

    PYTHONPATH=. .venv/bin/python benchmarks/park_symmetries.py [--zoo data/zoos/mnist1d-park]
"""

from __future__ import annotations

import argparse
import json
from collections import Counter

from torch.func import functional_call

import wsym
import wsym.zoo
from wsym.testing import invariance_error


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--zoo", default="data/zoos/mnist1d-park", help="park zoo directory")
    args = parser.parse_args()
    zoo = wsym.zoo.load(args.zoo)
    x = zoo.dataset().x_test[:256].double()
    first: dict[str, int] = {}
    for row in zoo.table:
        first.setdefault(json.dumps(row["architecture"], sort_keys=True), row["id"])
    worst: dict[str, float] = {}
    kinds: dict[str, Counter] = {}
    count: Counter = Counter()
    for member in first.values():
        family = zoo.row(member)["family"]
        model = zoo.model(member).eval()
        spec = wsym.detect(model, zoo.example_inputs(16))
        model = model.double()
        sd = {k: v.double() for k, v in zoo.state_dict(member).items()}
        err = invariance_error(lambda s, m=model: functional_call(m, s, (x,)), spec, sd)
        worst[family] = max(worst.get(family, 0.0), err)
        kinds.setdefault(family, Counter()).update(spec.kinds())
        count[family] += 1
    print("| family | architectures | group kinds (summed over them) | largest relative change |")
    print("|---|---|---|---|")
    for family in sorted(count):
        found = ", ".join(f"{k} {n}" for k, n in sorted(kinds[family].items()))
        print(f"| {family} | {count[family]} | {found} | {worst[family]:.1e} |")


if __name__ == "__main__":
    main()
