"""Add the training members' weight statistics to a shipped meta-network file.

    python experiments/metanet_novelty.py --metanet models/metanet-mnist1d-mlp.safetensors \
        --zoo data/zoos/mnist1d-mlp
    python experiments/metanet_novelty.py --metanet models/metanet-mnist1d-park.safetensors \
        --zoo data/zoos/mnist1d-park

Files written before :mod:`wsym.metanet.novelty` carry no
:class:`~wsym.metanet.novelty.TrainingDistribution`, so ``wsym predict`` reports
their out-of-distribution flag as unknown. This recomputes it from the zoo split
the file was trained on (``train``; diverged park members left out, as
:func:`~wsym.metanet.park_fit.fit_zoo` does) and rewrites the file's metadata;
the network's tensors are unchanged. Prints the flagged share of every split.
"""

from __future__ import annotations

import argparse
import json

import torch
from safetensors.torch import load_file, safe_open, save_file

from wsym.io.atomic import atomic_path
from wsym.metanet import load
from wsym.metanet.files import META_KEY
from wsym.metanet.graph import batch_graphs
from wsym.metanet.layers import stat_input
from wsym.metanet.novelty import TrainingDistribution
from wsym.metanet.park import ParkPredictor
from wsym.zoo import load as load_zoo


def statistics(p, zoo) -> dict:
    """``{split: (n, F) statistics}`` of the zoo's members as ``p`` reads them."""
    if isinstance(p, ParkPredictor):
        from wsym.metanet.park_fit import is_finite, zoo_ids, zoo_members

        zoo.__dict__["_park_specs"] = dict(p.space._specs)  # the specs the file stores
        ids = zoo_ids(zoo)
        out = {}
        for s, v in ids.items():
            members = [m for m in zoo_members(zoo, v) if is_finite(m[1])]
            out[s] = batch_graphs(p.graphs(members)).stat_x
        return out
    from wsym.metanet.evaluate import zoo_splits

    ids = zoo_splits(zoo)
    return {s: stat_input(batch_graphs(p.graphs(zoo.state_dicts(v)))) for s, v in ids.items()}


def main() -> None:  # noqa: D103
    parser = argparse.ArgumentParser()
    parser.add_argument("--metanet", required=True)
    parser.add_argument("--zoo", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    x = statistics(load(args.metanet), load_zoo(args.zoo))
    dist = TrainingDistribution.fit(x["train"])
    for s, v in x.items():
        share = float((dist.distance(v) > dist.threshold).double().mean())
        print(f"{s}: {len(v)} members, {share:.1%} flagged (threshold {dist.threshold:.2f})")
    with safe_open(args.metanet, "pt") as f:
        meta = json.loads(f.metadata()[META_KEY])
    meta["novelty"] = dist.to_json()
    tensors = load_file(args.metanet)
    with atomic_path(args.metanet) as tmp:
        save_file(tensors, str(tmp), metadata={META_KEY: json.dumps(meta)})
    print(f"wrote {args.metanet}")


if __name__ == "__main__":
    main()
