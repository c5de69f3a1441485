"""One meta-network for a park of architectures, against the baselines, in one run.

    python benchmarks/metanet_park.py --zoo data/zoos/mnist1d-park
    python benchmarks/metanet_park.py --zoo data/zoos/mnist1d-mlp+data/zoos/mnist1d-cnn
    python benchmarks/metanet_park.py --zoo data/zoos/mnist1d-mlp --quick

``--zoo`` takes one zoo or several joined by ``+`` (their members pooled into
one park, each keeping its own split); several ``--zoo`` are evaluated one
after the other. Members of split ``test_arch`` (the park's held-out
architectures) are the *held-out architecture* test set; ``test`` the held-out
members. For each target (test accuracy, gap) and seed every predictor is
fitted on ``train`` (``val`` for early stopping) and scored by Kendall tau:

* wsym park metanet: both branches blended (weight chosen on validation), and
  each branch of that same fit alone (each is trained on its own);
* the residual combination (graph branch trained on the frozen statistics
  branch's residual, as the per-architecture meta-network);
* NG-GNN-style graph network on raw weights (same message passing, no
  invariant forms, no attention products);
* StatNN on per-layer statistics padded to the deepest architecture, on raw and
  on canonical weights;
* per-architecture wsym meta-networks (none for held-out architectures).

Also printed: the prediction change under a random element of each member's
whole group (one test member per family), fit seconds, graphs/s.
``--cap-train N``: at most N train, N/4 val, N/2 test members per zoo (a seeded
subsample); ``--quick``: at most 160/40/80 members, 2 seeds, 8 epochs (a smoke run).
``--study``: the park metanet alone, seed 0, under each change of :data:`STUDY`
(message-passing depth, width, target normalization, training budget, the
joint readout): test tau of its statistics branch, its graph branch and the
combination; ``--study-rows`` picks rows by label (comma list; labels hold no
comma). ``--combine joint|boost``, ``--stat-readout``, ``--paths``, ``--aggregate
attention``, ``--virtual`` (a global node per graph), ``--warmup`` and ``--ema`` (the
graph branch's warm-up epochs and weight averaging) configure the park
metanet (:mod:`wsym.metanet.park`); ``--targets`` picks the target columns;
``--graph-cache FILE`` keeps the invariant graphs (minutes to prepare on a park)
between runs of the same zoo and caps; the fits
and tables are
:mod:`wsym.metanet.park_evaluate`'s, as ``wsym metanet eval`` on a park.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

from wsym.metanet.metrics import kendall_tau
from wsym.metanet.park_baselines import ParkMetanet
from wsym.metanet.park_evaluate import (
    PREDICTORS,
    SPLITS,
    TARGETS,
    branch_alone,
    caps_for,
    evaluate_park,
    format_park_table,
    format_park_timing,
    read_park,
    training_line,
)
from wsym.zoo import load


def park_options(args) -> dict:
    """The park metanet's options from the command line."""
    return {
        "epochs": args.epochs,
        "patience": args.patience,
        "hidden": args.hidden,
        "layers": args.layers,
        "stat_epochs": args.stat_epochs,
        "target_transform": args.target_transform,
        "trees": args.trees,
        "stat_readout": args.stat_readout,
        "lr": args.lr,
        "combine": args.combine,
        "paths": args.paths,
        "readout": args.readout,
        "aggregate": args.aggregate,
        "inputs": args.inputs,
        "joint_reads": args.joint_reads,
        "batch_size": args.batch_size,
        "virtual": args.virtual,
        "warmup": args.warmup,
        "ema": args.ema,
    }


def graph_cache(data: dict, path: str | None) -> tuple[dict, list]:
    """``(caches, members)``: the invariant graphs stored at ``path`` (if any), keyed as
    :class:`~wsym.metanet.park_baselines.ParkMetanet` keys them; ``members`` in file order."""
    members = [sd for s in SPLITS for _, sd, _ in data[s]]
    caches: dict = {"canonical": {}}
    if path and os.path.exists(path):
        graphs = torch.load(path, weights_only=False)
        if len(graphs) != len(members):
            raise SystemExit(f"{path} holds {len(graphs)} graphs, the park {len(members)}")
        caches["canonical"] = {id(sd): (sd, g) for sd, g in zip(members, graphs, strict=True)}
    return caches, members


def run(paths: str, args) -> dict:
    """Every predictor, target and seed on one park (zoos joined by ``+``); the report."""
    data, ys, n_arch = read_park([load(p) for p in paths.split("+")], args.caps)
    counts = {s: len(v) for s, v in data.items()}
    print(f"\n## {paths}: {counts} members, {n_arch} architectures")
    sys.stdout.flush()
    caches, members = graph_cache(data, args.graph_cache)
    report = evaluate_park(
        data,
        ys,
        names=args.predictors.split(","),
        seeds=tuple(range(args.seeds)),
        options=park_options(args),
        targets=tuple(args.targets),
        progress=True,
        caches=caches,
    )
    store = caches["canonical"]
    if args.graph_cache and not os.path.exists(args.graph_cache) and len(store) == len(members):
        torch.save([store[id(sd)][1] for sd in members], args.graph_cache)
    return {"zoo": paths, "architectures": n_arch, **report}


#: ``--study``: what each change does to the two branches (one fit per target, seed 0).
STUDY = {
    "as benchmarked": {},
    "no message passing (layers 0)": {"layers": 0},
    "deeper message passing (layers 3)": {"layers": 3},
    "wider (hidden 32)": {"hidden": 32},
    "rank-normal targets": {"target_transform": "rank"},
    "twice the epochs": {"epochs": "x2", "patience": "x2"},
    "readout also reads the statistics": {"stat_readout": True},
    "... and no message passing (layers 0)": {"stat_readout": True, "layers": 0},
    "learning rate x2.5": {"lr": "x2.5"},
    "joint readout (combine joint)": {"combine": "joint"},
    "joint readout without message passing": {"combine": "joint", "layers": 0},
    "joint readout (graph branch trained beside the statistics)": {
        "combine": "joint",
        "stat_readout": True,
    },
    "boosted on out-of-fold residuals": {"combine": "boost", "stat_readout": True},
    "boosted with a graph head without the statistics": {"combine": "boost"},
    "cross-layer path features in the readout": {"paths": True},
    "path features without message passing (layers 0)": {"paths": True, "layers": 0},
    "boosted with cross-layer path features": {"combine": "boost", "paths": True},
    "path features and deeper message passing (layers 3)": {"paths": True, "layers": 3},
    "path features and twice the epochs": {"paths": True, "epochs": "x2", "patience": "x2"},
}


def study(paths: str, args) -> str:
    """The park metanet's branches under each :data:`STUDY` change; a markdown table."""
    data, ys, _ = read_park([load(p) for p in paths.split("+")], args.caps)
    pairs = {s: [(spec, sd) for spec, sd, _ in data[s]] for s in SPLITS}
    splits = [s for s in ("test", "test_arch") if pairs[s]]
    cache: dict = {}
    lines = [
        "| change | "
        + " | ".join(f"{t} {s}: stats / graph / blended" for s in splits for t in args.targets)
        + " | fit s |",
        "|---|" + "---|" * (len(splits) * len(args.targets)) + "---|",
    ]
    rows = STUDY if not args.study_rows else {k: STUDY[k] for k in args.study_rows.split(",")}
    for label, change in rows.items():
        base = park_options(args)
        opts = {
            k: base[k] * float(v[1:]) if isinstance(v, str) and v[0] == "x" else v
            for k, v in change.items()
        }
        opts = {k: int(v) if k in ("epochs", "patience") else v for k, v in opts.items()}
        cells, seconds = {}, 0.0
        for target in args.targets:
            p, start = ParkMetanet("both", cache=cache, **{**base, **opts}), time.perf_counter()
            p.fit(pairs["train"], ys["train"][target], pairs["val"], ys["val"][target], 0)
            seconds += time.perf_counter() - start
            for split in splits:
                taus = [
                    kendall_tau(ys[split][target], q.predict(pairs[split]))
                    for q in (branch_alone(p, "stats"), branch_alone(p, "graph"), p)
                ]
                cells[(split, target)] = " / ".join(f"{t:.3f}" for t in taus)
        row = " | ".join(cells[(s, t)] for s in splits for t in args.targets)
        lines.append(f"| {label} | {row} | {seconds:.0f} |")
        print(lines[-1], file=sys.stderr)
    return "\n".join(lines)


def main() -> None:  # noqa: D103
    parser = argparse.ArgumentParser()
    parser.add_argument("--zoo", action="append", required=True)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--patience", type=int, default=10)
    parser.add_argument("--hidden", type=int, default=16)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--stat-epochs", type=int, default=300)
    parser.add_argument("--target-transform", default="standard", choices=("standard", "rank"))
    parser.add_argument("--trees", type=int, default=0, help="trees in the statistics branch")
    parser.add_argument("--lr", type=float, default=2e-3, help="graph branch's peak learning rate")
    parser.add_argument(
        "--stat-readout", action="store_true", help="graph readout also reads the statistics"
    )
    parser.add_argument(
        "--combine",
        default="blend",
        choices=("blend", "joint", "boost", "stack"),
        help="the park metanet's",
    )
    parser.add_argument(
        "--targets", default=",".join(TARGETS), help="comma list of " + ",".join(TARGETS)
    )
    parser.add_argument(
        "--paths", action="store_true", help="graph readout also reads cross-layer paths"
    )
    parser.add_argument(
        "--readout", default="roles", choices=("roles", "thirds"), help="graph readout buckets"
    )
    parser.add_argument(
        "--aggregate",
        default="mean",
        choices=("mean", "roles", "attention"),
        help="message aggregation",
    )
    parser.add_argument(
        "--inputs", default="standard", choices=("standard", "squashed"), help="graph input scaling"
    )
    parser.add_argument(
        "--joint-reads",
        default="readout",
        choices=("readout", "head", "prediction"),
        help="what the joint ensemble reads of the graph branch",
    )
    parser.add_argument("--batch-size", type=int, default=32, help="graphs per graph-branch step")
    parser.add_argument(
        "--virtual", action="store_true", help="a global node per graph after each round"
    )
    parser.add_argument(
        "--warmup", type=int, default=0, help="graph branch's warm-up epochs (then a cosine)"
    )
    parser.add_argument(
        "--ema", type=float, default=0.0, help="decay per step of the graph weights' average"
    )
    parser.add_argument(
        "--graph-cache", metavar="FILE", help="invariant graphs stored here (read if present)"
    )
    parser.add_argument("--study-rows", help="comma list of study rows (default: all)")
    parser.add_argument(
        "--predictors", default=",".join(PREDICTORS), help="comma list of " + ",".join(PREDICTORS)
    )
    parser.add_argument(
        "--cap-train", type=int, help="at most N train, N/4 val, N/2 test members (seeded)"
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--study", action="store_true", help="the branches under each change")
    parser.add_argument("--json", metavar="FILE", help="write the reports as JSON")
    args = parser.parse_args()
    args.targets = args.targets.split(",")
    args.caps = caps_for(args.cap_train)  # the validation and test splits capped in proportion
    if args.quick:
        args.seeds, args.epochs, args.stat_epochs = min(args.seeds, 2), min(args.epochs, 8), 60
        args.caps = {"train": 160, "val": 40, "test": 80, "test_arch": 80}
    torch.set_num_threads(1)
    if args.study:
        for paths in args.zoo:
            print(f"\n## study on {paths}\n" + study(paths, args))
        return
    reports = []
    for paths in args.zoo:
        report = run(paths, args)
        print(format_park_table(report))
        print(format_park_timing(report))
        for name, r in report["rows"].items():
            for rep in r["reports"]:
                print(training_line(name, rep))
        sys.stdout.flush()
        reports.append(report)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                [
                    {
                        **r,
                        "rows": {
                            n: {k: v for k, v in row.items() if k != "reports"}
                            for n, row in r["rows"].items()
                        },
                    }
                    for r in reports
                ],
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
