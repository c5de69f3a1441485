"""Tiny transformers: sharpness vs generalization gap (da Silva et al. 2025, Sec. 5.2-5.3).

The analogue, at CPU scale, of the paper's ViT (72 CLIP ViT-B/32 fine-tuned on
ImageNet) and BERT (MNLI) experiments: a zoo of ``TinyTransformer`` members
(``wsym zoo build --preset seq-transformer``; dim 16, 2 heads, 1 block, mnist1d
as 10 patches of 4, trained with varied optimizer, learning rate, weight decay,
epochs, init scale, dropout, train fraction and label noise). The generalization
gap is the zoo's ``gap`` column (train accuracy on the member's own training
subset minus clean test accuracy).

For each member, on one fixed batch (the first ``--batch`` examples of the clean
training split, cross-entropy), the worst-case adaptive, geodesic-invariant and
geodesic-mixed sharpness (:func:`wsym.sharpness`, same ``rho`` and ``steps`` for
all; ``--average`` adds the average-case values) is computed, then Kendall's tau
(scipy, with its two-sided p-value) of gap vs each measure, printed as a markdown
table beside the paper's numbers. The spec is detected once (all members share
the architecture); the script prints the GL / GL(1) blocks the geodesic measures
use and the wall time of each measure.

Paper (Fig. 4, 5; left / middle / right panels = adaptive / geodesic with the
two metrics, read here as invariant / mixed as in the diagonal-network figure):
ViT -0.41 / -0.71 / -0.70, BERT 0.06 / 0.28 / 0.38.

The shipped zoo's members are often barely trained (2-25 epochs, up to 50% label
noise; test accuracy 0.04-0.79), so a second zoo with longer training and no label
noise comes from the ``seq-transformer-trained`` preset (30-60 epochs, train
fraction 0.05-1; about 10 minutes for 120 members on 2 loaded cores)::

    wsym zoo build --preset seq-transformer-trained --members 120 --out /tmp/zoo-trained --seed 0

Run (about 1 s per member for the three worst-case measures, 2 s with ``--average``)::

    .venv/bin/python experiments/transformer_sharpness.py [--members 200] [--zoo DIR] [--average]
"""

from __future__ import annotations

import argparse
import json
import time
import warnings

import torch
from scipy.stats import kendalltau

import wsym
import wsym.zoo
from wsym.sharpness.quotient import Quotient

PAPER = {
    "adaptive": {"vit": -0.41, "bert": 0.06},
    "geodesic-inv": {"vit": -0.71, "bert": 0.28},
    "geodesic-mix": {"vit": -0.70, "bert": 0.38},
}
MEASURES = tuple(PAPER)


def describe_blocks(spec, params) -> str:
    """The GL / GL(1) blocks of the quotient geometry, e.g. ``GL(8) x 2 heads``."""
    parts = []
    for i, block in Quotient(spec, params).blocks:
        group = spec.groups[i]
        count = block.G[..., 0, 0].numel()
        h = block.G.shape[-1]
        if group.kind == "gl":
            parts.append(f"GL({h}) x {count} (rows {block.G.shape[-2]}/{block.H.shape[-2]})")
        else:
            parts.append(f"GL(1) x {count} units (scaling group {i})")
    return "; ".join(parts) or "none"


def measure_zoo(zoo, ids, batch, rho, steps, average, spec):
    """Rows ``{id, gap, <measure>...}`` and the seconds spent per measure."""
    lf = torch.nn.functional.cross_entropy
    kinds = [(m, False) for m in MEASURES] + ([(m, True) for m in MEASURES] if average else [])
    seconds = {_name(m, a): 0.0 for m, a in kinds}
    rows = []
    for member in ids:
        model = zoo.model(member)
        model.load_state_dict(zoo.state_dict(member))
        row = {"id": member, "gap": zoo.row(member)["gap"]}
        for m, avg in kinds:
            start = time.perf_counter()
            row[_name(m, avg)] = wsym.sharpness(
                model, [batch], lf, spec=spec, measure=m, rho=rho, steps=steps, average=avg
            )
            seconds[_name(m, avg)] += time.perf_counter() - start
        rows.append(row)
    return rows, seconds


def _name(measure: str, average: bool) -> str:
    return f"{measure} (avg)" if average else measure


def table(rows, seconds, n) -> str:
    """Markdown table of Kendall tau (gap, sharpness) beside the paper's."""
    gaps = [r["gap"] for r in rows]
    lines = [
        "| measure | Kendall τ (gap, S), ours | p | paper ViT | paper BERT | time (s) |",
        "|---|---|---|---|---|---|",
    ]
    for name, secs in seconds.items():
        tau, p = kendalltau(gaps, [r[name] for r in rows])
        ref = PAPER[name.split(" ")[0]] if " (avg)" not in name else {"vit": None, "bert": None}
        vit = "—" if ref["vit"] is None else f"{ref['vit']:+.2f}"
        bert = "—" if ref["bert"] is None else f"{ref['bert']:+.2f}"
        lines.append(f"| {name} | {tau:+.3f} | {p:.1e} | {vit} | {bert} | {secs:.1f} |")
    return "\n".join(lines) + f"\n\n({n} members; time = total over members)"


def main(argv=None):
    """Measure, correlate, print the markdown table; optionally write JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--zoo", default="data/zoos/seq-transformer")
    ap.add_argument("--members", type=int, default=200, help="the first N members by id")
    ap.add_argument("--batch", type=int, default=256, help="fixed batch size")
    ap.add_argument("--rho", type=float, default=0.05)
    ap.add_argument("--steps", type=int, default=10, help="ascent steps / random directions")
    ap.add_argument("--average", action="store_true", help="also the average-case measures")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (0: torch default)")
    ap.add_argument("--json", help="write rows and taus to this path")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    start = time.perf_counter()
    zoo = wsym.zoo.load(args.zoo)
    ids = zoo.ids[: args.members]
    data = zoo.dataset()
    batch = (data.x_train[: args.batch], data.y_train[: args.batch])
    first = zoo.model(ids[0])
    first.load_state_dict(zoo.state_dict(ids[0]))
    spec = wsym.detect(first, batch[0][:8])
    params = {n: p.detach().double() for n, p in first.named_parameters()}
    gaps = [zoo.row(i)["gap"] for i in ids]
    print(f"zoo {args.zoo}: {len(zoo)} members, using {len(ids)}")
    print(f"gap range {min(gaps):+.3f} .. {max(gaps):+.3f}")
    print(f"geodesic blocks: {describe_blocks(spec, params)}")
    print(f"batch {args.batch} (clean training split), rho {args.rho}, steps {args.steps}\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rows, seconds = measure_zoo(zoo, ids, batch, args.rho, args.steps, args.average, spec)
    print(table(rows, seconds, len(ids)))
    print(f"\ntotal wall time {time.perf_counter() - start:.1f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": vars(args), "rows": rows, "seconds": seconds}, f, indent=1)


if __name__ == "__main__":
    main()
