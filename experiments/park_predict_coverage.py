"""Does the shipped park meta-network read a checkpoint of every park architecture?

    python experiments/park_predict_coverage.py [--metanet models/metanet-mnist1d-park.safetensors]

For each architecture the ``mnist1d-park`` preset can draw (226: 64 MLPs,
126 CNNs, 36 transformers), a freshly initialised checkpoint is passed *bare*
(tensors only, as ``wsym predict --checkpoint`` reads it) to the meta-network.
Prints, per family, how many architectures it reads, how many candidate
architectures a bare checkpoint of each family matches (same tensors: the
activation, the residual connections, the head count), and the seconds per
prediction (the first meeting of an architecture detects its symmetries).
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import torch

from wsym.errors import WsymInputError
from wsym.io.resources import MODELS
from wsym.metanet import load
from wsym.zoo.architectures import build_architecture
from wsym.zoo.presets import load_preset
from wsym.zoo.space import architecture_space, architectures_with


def main() -> None:  # noqa: D103
    parser = argparse.ArgumentParser()
    parser.add_argument("--metanet", default=str(MODELS / "metanet-mnist1d-park.safetensors"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    predictor = load(args.metanet)
    preset = load_preset("mnist1d-park")
    read, total, candidates, seconds = (defaultdict(int) for _ in range(4))
    failures = []
    for k, config in enumerate(architecture_space(preset)):
        family = config["name"]
        torch.manual_seed(k)
        sd = build_architecture(config).state_dict()
        sig = {n: tuple(v.shape) for n, v in sd.items() if v.is_floating_point()}
        total[family] += 1
        candidates[family] += len(architectures_with(preset, sig))
        start = time.perf_counter()
        try:
            y = float(predictor.predict(sd))
        except WsymInputError as err:
            failures.append(f"{config}: {err}")
            continue
        seconds[family] += time.perf_counter() - start
        read[family] += bool(torch.isfinite(torch.tensor(y)))
    print("| family | architectures | read | candidates per checkpoint | s per prediction |")
    print("|---|---|---|---|---|")
    for f in total:
        print(
            f"| {f} | {total[f]} | {read[f]} | {candidates[f] / total[f]:.1f} | "
            f"{seconds[f] / max(read[f], 1):.2f} |"
        )
    for line in failures:
        print("not read:", line)


if __name__ == "__main__":
    main()
