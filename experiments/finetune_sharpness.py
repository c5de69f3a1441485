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
  rate (Andriushchenko et al. 2023) and given the training loss (the members that
  fitted more are both sharper and further apart: the confounder);
* out of distribution (the paper's BERT result is measured on HANS): every member's
  accuracy on a test set of the same task shifted further along the downstream
  task's own shift from upstream (:data:`SHIFT`: mnist1d signals with 1.5x the noise
  and shear, token sequences with twice the token noise; fresh examples, seed 2,
  seen by no member), and the OOD gap, training accuracy minus that accuracy; tau
  and partial tau given the training loss against it;
* a training-loss band: the same taus over the members whose training loss lies in
  the zoo's middle half (quartiles 1 to 3), where the training loss varies least;
* scramble: every member moved by ``spec.sample(seed=member, scale=(1e-2, 1e2))``
  (float64; the largest change of any logit is printed), measured again with the
  same radii; tau before and after, side by side; then, per invariant measure,
  how many members' values moved by more than 1e-6 relative and the members that
  moved most, with the conditioning of their GL blocks (``sigma_min / sigma_max``
  of the worst block of the member, before the scramble) and whether the move
  changed the member's rank.

Paper (Figs. 4-5; adaptive / geodesic-inv / geodesic-mix): ViT -0.41 / -0.71 / -0.70,
BERT 0.06 / 0.28 / 0.38.

Run::

    .venv/bin/python experiments/finetune_sharpness.py --zoo data/zoos/vit-finetune
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
import warnings

import torch

import wsym
import wsym.zoo
from wsym.sharpness.blocks import gather
from wsym.sharpness.correlation import (
    RADIUS_MEASURES,
    calibrate,
    kendall,
    measure_zoo,
    partial_kendall,
    training_subset,
    zoo_member,
)
from wsym.zoo.tasks import load_task

PAPER = {
    "adaptive": {"vit": -0.41, "bert": 0.06},
    "geodesic-inv": {"vit": -0.71, "bert": 0.28},
    "geodesic-mix": {"vit": -0.70, "bert": 0.38},
}


#: How the out-of-distribution test set moves each downstream dataset: generator
#: scales multiplied (mnist1d) or token noise doubled (the hidden-topic language).
SHIFT = {
    "mnist1d-patches": {"generator": 1.5},
    "markov-tokens": {"noise": 2.0},
}


def shifted_test(dataset: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """The out-of-distribution test split of a zoo's downstream ``dataset`` (:data:`SHIFT`)."""
    config = {**dataset, "seed": 2}
    factors = SHIFT.get(config["name"])
    if factors is None:
        raise SystemExit(f"no out-of-distribution shift for dataset {config['name']!r}")
    for key, factor in factors.items():
        if isinstance(config[key], dict):
            config[key] = {k: v * factor for k, v in config[key].items()}
        else:
            config[key] = config[key] * factor
    data = load_task(config)
    return data.x_test, data.y_test


def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Top-1 accuracy of ``model`` (float64) on ``(x, y)``."""
    x = x.double() if x.is_floating_point() else x
    with torch.no_grad():
        return float((model(x).argmax(-1) == y).double().mean())


def _cell(t) -> str:
    return f"{t.tau:+.3f} [{t.low:+.2f}, {t.high:+.2f}]"


def shift_and_band(rows, measures, boot) -> str:
    """τ against the OOD gap, and both gaps' τ over the middle half of training losses."""
    losses = sorted(r["train_loss"] for r in rows)
    low, high = losses[len(losses) // 4], losses[(3 * len(losses)) // 4]
    band = [r for r in rows if low <= r["train_loss"] <= high]
    col = {k: [r[k] for r in rows] for k in rows[0]}
    mid = {k: [r[k] for r in band] for k in band[0]}
    lines = [
        f"OOD accuracy median {statistics.median(col['ood_acc']):.3f} (test accuracy "
        f"{1 - statistics.median(col['test_error']):.3f}); band: {len(band)} members with "
        f"train loss in [{low:.3g}, {high:.3g}]",
        "",
        "| measure | τ (OOD gap) [95% CI] | partial τ (OOD gap given train loss) "
        "| band: τ (gap) | band: τ (OOD gap) | band: partial τ (gap given train loss) |",
        "|---|---|---|---|---|---|",
    ]
    for m in measures:
        ood = kendall(col[m], col["ood_gap"], boot)
        fit = partial_kendall(col[m], col["ood_gap"], col["train_loss"], boot)
        gap, bood = kendall(mid[m], mid["gap"], boot), kendall(mid[m], mid["ood_gap"], boot)
        bfit = partial_kendall(mid[m], mid["gap"], mid["train_loss"], boot)
        lines.append(
            f"| {m} | {_cell(ood)} | {_cell(fit)} | {_cell(gap)} | {_cell(bood)} | {_cell(bfit)} |"
        )
    return "\n".join(lines)


def tables(rows, measures, boot) -> str:
    """The markdown tables: tau vs gap / test error / partial given lr and train loss."""
    col = {k: [r[k] for r in rows] for k in rows[0]}
    lines = [
        "| measure | τ (gap) [95% CI] | p | τ (test error) | p | partial τ (gap given lr) "
        "| p | partial τ (gap given train loss) | p | paper ViT | paper BERT |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for m in measures:
        gap, err = kendall(col[m], col["gap"], boot), kendall(col[m], col["test_error"], boot)
        part = partial_kendall(col[m], col["gap"], col["lr"], boot)
        fit = partial_kendall(col[m], col["gap"], col["train_loss"], boot)
        ref = PAPER.get(m, {})
        vit, bert = (f"{ref[k]:+.2f}" if k in ref else "—" for k in ("vit", "bert"))
        lines.append(
            f"| {m} | {gap.tau:+.3f} [{gap.low:+.2f}, {gap.high:+.2f}] | {gap.p:.1e} "
            f"| {err.tau:+.3f} | {err.p:.1e} | {part.tau:+.3f} [{part.low:+.2f}, "
            f"{part.high:+.2f}] | {part.p:.1e} | {fit.tau:+.3f} [{fit.low:+.2f}, "
            f"{fit.high:+.2f}] | {fit.p:.1e} | {vit} | {bert} |"
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


#: Measures that are functions of the function: a scramble must not move them.
INVARIANT = ("geodesic-inv", "geodesic-mix")


def conditioning(spec, model) -> tuple[float, str]:
    """The smallest ``sigma_min / sigma_max`` over the GL blocks of ``model``, and where.

    Each block ``(G, H)`` of :func:`wsym.sharpness.blocks.gather` (batched over
    heads) contributes both factors; the location names the group (its notation
    and first parameter), the copy (head) and the factor.
    """
    params = {k: v.detach() for k, v in model.named_parameters()}
    worst, where = math.inf, ""
    for group, pair in gather(spec, params):
        for side, mat in zip("GH", pair, strict=True):
            sv = torch.linalg.svdvals(mat.reshape(-1, *mat.shape[-2:]))
            ratio = sv[..., -1] / sv[..., 0].clamp_min(1e-300)
            head = int(ratio.argmin())
            if float(ratio[head]) < worst:
                g = spec.groups[group]
                where = f"{g.notation} {g.params[0]} copy {head} {side}"
                worst = float(ratio[head])
    return worst, where


def _rank(values, i) -> int:
    return sum(v < values[i] for v in values)


def scramble_movers(rows, measures, top: int = 6) -> str:
    """Per invariant measure: how many members the scramble moved, and the worst ones."""
    lines = []
    for m in (m for m in INVARIANT if m in measures):
        before = [r[m] for r in rows]
        after = [r[f"{m} scrambled"] for r in rows]
        rel = [abs(a - b) / max(abs(b), 1e-300) for a, b in zip(after, before, strict=True)]
        moved = sorted(range(len(rows)), key=lambda i: -rel[i])
        count = sum(r > 1e-6 for r in rel)
        lines += [
            f"\n{m}: {count} of {len(rows)} members move by > 1e-6 relative "
            f"(median {statistics.median(rel):.1e}); the largest:",
            "| member | before | after | relative change | rank before → after | worst GL block "
            "σ_min/σ_max (where) | lr | optimizer |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for i in moved[:top]:
            r = rows[i]
            lines.append(
                f"| {r['id']} | {before[i]:.6g} | {after[i]:.6g} | {rel[i]:.1e} | "
                f"{_rank(before, i)} → {_rank(after, i)} | {r['cond']:.1e} ({r['cond_at']}) "
                f"| {r['lr']:.1e} | {r['optimizer']} |"
            )
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
    ap.add_argument(
        "--measures",
        nargs="+",
        default=list(RADIUS_MEASURES),
        choices=RADIUS_MEASURES,
        help="worst-case measures to calibrate and measure (default: all four)",
    )
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
    rhos = calibrate(calibration, batches, spec, args.measures, args.target, steps=args.steps)
    print(f"radii (median over {len(calibration)} val members = {args.target} nats): {rhos}")
    start = time.process_time()
    rows = measure_zoo(zoo, ids, batches, spec, rhos, args.steps, args.probes, not args.no_scramble)
    measured = time.process_time() - start
    measures = [*rhos, *(["hessian-trace"] if args.probes else [])]
    x_ood, y_ood = shifted_test(zoo.manifest["dataset"])
    for row in rows:
        model, member = zoo_member(zoo, row["id"]), zoo.row(row["id"])
        row["cond"], row["cond_at"] = conditioning(spec, model)
        row["optimizer"] = member["optimizer"]
        row["ood_acc"] = accuracy(model, x_ood, y_ood)
        row["ood_gap"] = member["train_acc"] - row["ood_acc"]
    print("\n" + tables(rows, measures, args.boot))
    print("\n" + shift_and_band(rows, measures, args.boot))
    if not args.no_scramble:
        print(scramble_movers(rows, measures))
    print(
        f"\nmeasuring {len(ids)} members: {measured:.0f} s CPU; total "
        f"{time.process_time() - cpu:.0f} s CPU, {time.perf_counter() - wall:.0f} s wall"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": vars(args), "rhos": rhos, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
