"""Fine-tuned transformers: does invariant sharpness predict the gap? (da Silva et al. 2025).

The small-scale version of the paper's setting: every member of a fine-tune zoo
(``wsym zoo build --preset vit-finetune``) starts from one model pretrained by
wsym and is fine-tuned with its own learning rate, weight decay, steps, batch
size, warm-up, label smoothing and seed (``data/README.md``).

Protocol, fixed before any tau was computed:

* data: the first ``--batch`` (256) examples of the downstream training split, a
  subset of every member's training data (the presets train on the full split);
* measures: worst-case adaptive, geodesic-inv, geodesic-mix and Euclidean
  sharpness (``wsym.sharpness``, ``--steps`` 10 ascent steps) and the Hessian
  trace (Hutchinson, 20 probes, seed 0), cross-entropy;
* radius: per measure, :func:`wsym.sharpness.correlation.calibrate` on the
  zoo's *val* split of members: the radius on the grid ``0.05 * 2^k`` whose median
  sharpness over those members is closest (in log) to ``--target`` = 0.1 nats;
* statistics over every member: Kendall tau_b against the gap (train minus test
  accuracy) and against the test error, scipy's p-value, a 95% bootstrap interval
  (1000 resamples of members); the partial tau against the gap given the learning
  rate (Andriushchenko et al. 2023);
* scramble: every member moved by ``spec.sample(seed=member, scale=(1e-2, 1e2))``
  (float64; the largest change of any logit is printed), measured again with the
  same radii; tau before and after, side by side.

Paper (Figs. 4-5; adaptive / geodesic-inv / geodesic-mix): ViT -0.41 / -0.71 / -0.70,
BERT 0.06 / 0.28 / 0.38.

Run::

    .venv/bin/python experiments/finetune_sharpness.py --zoo data/zoos/vit-finetune
"""

from __future__ import annotations

import argparse
import json
import time
import warnings

import torch

import wsym
import wsym.zoo
from wsym.sharpness.correlation import (
    calibrate,
    kendall,
    measure_zoo,
    partial_kendall,
    training_subset,
    zoo_member,
)

PAPER = {
    "adaptive": {"vit": -0.41, "bert": 0.06},
    "geodesic-inv": {"vit": -0.71, "bert": 0.28},
    "geodesic-mix": {"vit": -0.70, "bert": 0.38},
}


def tables(rows, measures, boot) -> str:
    """The markdown tables: tau vs gap / test error / partial given lr; the scramble."""
    col = {k: [r[k] for r in rows] for k in rows[0]}
    lines = [
        "| measure | τ (gap) [95% CI] | p | τ (test error) | p | partial τ (gap given lr) "
        "| p | paper ViT | paper BERT |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for m in measures:
        gap, err = kendall(col[m], col["gap"], boot), kendall(col[m], col["test_error"], boot)
        part = partial_kendall(col[m], col["gap"], col["lr"], boot)
        ref = PAPER.get(m, {})
        vit, bert = (f"{ref[k]:+.2f}" if k in ref else "—" for k in ("vit", "bert"))
        lines.append(
            f"| {m} | {gap.tau:+.3f} [{gap.low:+.2f}, {gap.high:+.2f}] | {gap.p:.1e} "
            f"| {err.tau:+.3f} | {err.p:.1e} | {part.tau:+.3f} [{part.low:+.2f}, "
            f"{part.high:+.2f}] | {part.p:.1e} | {vit} | {bert} |"
        )
    if f"{measures[0]} scrambled" in col:
        lines += ["", "| measure | τ (gap) before | τ (gap) after scramble | change |"]
        lines.append("|---|---|---|---|")
        for m in measures:
            before = kendall(col[m], col["gap"], 1).tau
            after = kendall(col[f"{m} scrambled"], col["gap"], 1).tau
            lines.append(f"| {m} | {before:+.3f} | {after:+.3f} | {after - before:+.3f} |")
        lines.append(f"\nlargest logit change of a scrambled member: {max(col['drift']):.1e}")
    return "\n".join(lines)


def main(argv=None):
    """Calibrate, measure, correlate; print the tables and times; optionally write JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--zoo", default="data/zoos/vit-finetune")
    ap.add_argument("--members", type=int, default=0, help="the first N members (0: all)")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=10, help="ascent steps")
    ap.add_argument("--probes", type=int, default=20, help="Hessian-trace probes (0: skip)")
    ap.add_argument("--target", type=float, default=0.1, help="median sharpness of rho (nats)")
    ap.add_argument("--boot", type=int, default=1000, help="bootstrap resamples")
    ap.add_argument("--no-scramble", action="store_true")
    ap.add_argument("--json", help="write rows, radii and config to this path")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    wall, cpu = time.perf_counter(), time.process_time()
    zoo = wsym.zoo.load(args.zoo)
    ids = zoo.ids[: args.members] if args.members else zoo.ids
    batches = training_subset(zoo, args.batch)
    spec = wsym.detect(zoo_member(zoo, ids[0]).float(), batches[0][0][:8])
    accs = sorted(zoo.row(i)["test_acc"] for i in ids)
    print(
        f"zoo {args.zoo}: {len(ids)} members; test acc min/median/max "
        f"{accs[0]:.3f}/{accs[len(accs) // 2]:.3f}/{accs[-1]:.3f}; spec {spec.kinds()}"
    )
    calibration = [zoo_member(zoo, i) for i in zoo.split("val")]
    rhos = calibrate(calibration, batches, spec, target=args.target, steps=args.steps)
    print(f"radii (median over {len(calibration)} val members = {args.target} nats): {rhos}")
    start = time.process_time()
    rows = measure_zoo(zoo, ids, batches, spec, rhos, args.steps, args.probes, not args.no_scramble)
    measured = time.process_time() - start
    measures = [*rhos, *(["hessian-trace"] if args.probes else [])]
    print("\n" + tables(rows, measures, args.boot))
    print(
        f"\nmeasuring {len(ids)} members: {measured:.0f} s CPU; total "
        f"{time.process_time() - cpu:.0f} s CPU, {time.perf_counter() - wall:.0f} s wall"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": vars(args), "rhos": rhos, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
