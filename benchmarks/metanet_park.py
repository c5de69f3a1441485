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
(message-passing depth, width, target normalization, training budget): test tau
of its statistics branch, its graph branch and the blend.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time

import torch

from wsym.detect import detect
from wsym.metanet.metrics import kendall_tau
from wsym.metanet.park_baselines import LayerStatNN, ParkMetanet, PerArchitecture
from wsym.zoo import load

TARGETS = ("test_acc", "gap")
SPLITS = ("train", "val", "test", "test_arch")
SHORT = ("park", "residual", "ng", "statnn", "statnn-canonical", "per-arch")


def read_park(paths: str, caps: dict | None):
    """``{split: [(spec, sd, family)]}`` and targets, from zoos joined by ``+``."""
    specs, out = {}, {s: [] for s in SPLITS}
    ys = {s: {t: [] for t in TARGETS} for s in SPLITS}
    for path in paths.split("+"):
        zoo = load(path)
        x = zoo.example_inputs()
        has_val = any(r["split"] == "val" for r in zoo.table)
        for r in zoo.table:
            split = r["split"]
            if not has_val and split == "train" and r["id"] % 5 == 0:
                split = "val"
            arch = json.dumps(r["architecture"], sort_keys=True)
            if arch not in specs:
                specs[arch] = detect(zoo.model(r["id"]), x)
            out[split].append((specs[arch], zoo.state_dict(r["id"]), r["architecture"]["name"]))
            for t in TARGETS:
                ys[split][t].append(float(r[t]))
    if caps:
        for s, cap in caps.items():
            keep = sorted(random.Random(0).sample(range(len(out[s])), min(cap, len(out[s]))))
            out[s] = [out[s][i] for i in keep]
            ys[s] = {t: [v[i] for i in keep] for t, v in ys[s].items()}
    return out, ys, len(specs)


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
    }


def predictors(args, caches):
    """``{row name: factory}``; the park metanet rows share one fit (both / stats alone)."""
    opts = park_options(args)
    canon, raw = caches.setdefault("canonical", {}), caches.setdefault("raw", {})
    rows = {
        "wsym park metanet": lambda: ParkMetanet("both", cache=canon, **opts),
        "residual combination": lambda: ParkMetanet(
            "both", cache=canon, **{**opts, "combine": "residual"}
        ),
        "NG-GNN-style, raw weights": lambda: ParkMetanet(
            "graph", canonical=False, products=False, cache=raw, **opts
        ),
        "StatNN per layer, padded": lambda: LayerStatNN(),
        "StatNN per layer, canonical": lambda: LayerStatNN(canonical=True),
        "per-architecture wsym metanets": lambda: PerArchitecture(
            epochs=args.epochs, patience=args.patience, hidden=args.hidden
        ),
    }
    keep = [k for k, short in zip(rows, SHORT, strict=True) if short in args.predictors.split(",")]
    return {k: rows[k] for k in keep}


def invariance(p, members) -> float:
    """Largest relative prediction change under one random element of each member's group."""
    worst = 0.0
    for spec, sd in members:
        sd64 = {k: v.double() if v.is_floating_point() else v for k, v in sd.items()}
        a = p.predict([(spec, sd64)])
        b = p.predict([(spec, spec.act(spec.sample(seed=0), sd64))])
        worst = max(worst, float((a - b).abs().max() / a.abs().max().clamp(min=1e-12)))
    return worst


def run(paths: str, args) -> dict:
    """Every predictor, target and seed on one park; the report."""
    data, ys, n_arch = read_park(paths, args.caps)
    pairs = {s: [(spec, sd) for spec, sd, _ in data[s]] for s in SPLITS}
    probes, seen = [], set()
    for spec, sd, family in data["test"] + data["test_arch"]:
        if family not in seen:
            seen.add(family)
            probes.append((spec, sd))
    counts = {s: len(v) for s, v in data.items()}
    print(f"\n## {paths}: {counts} members, {n_arch} architectures, families {sorted(seen)}")
    sys.stdout.flush()
    caches: dict = {}
    rows: dict = {}
    reader = ParkMetanet(cache=caches.setdefault("canonical", {}))
    start = time.perf_counter()
    reader.graphs(pairs["test"])
    prep = len(pairs["test"]) / (time.perf_counter() - start)
    for name, make in predictors(args, caches).items():
        for target in TARGETS:
            for seed in range(args.seeds):
                p, start = make(), time.perf_counter()
                p.fit(pairs["train"], ys["train"][target], pairs["val"], ys["val"][target], seed)
                fit_s = time.perf_counter() - start
                variants = {name: p}
                if name == "wsym park metanet":
                    variants["statistics branch alone"] = _branch(p, "stats")
                    variants["graph branch alone"] = _branch(p, "graph")
                    if seed == 0 and target == TARGETS[0]:
                        start = time.perf_counter()
                        p.predict(pairs["test"])
                        forward = len(pairs["test"]) / (time.perf_counter() - start)
                for row, q in variants.items():
                    r = rows.setdefault(row, {"claims": p.claims, "seconds": [], "reports": []})
                    for split in ("test", "test_arch"):
                        if not pairs[split]:
                            continue
                        try:
                            pred = q.predict(pairs[split])
                            tau = kendall_tau(ys[split][target], pred)
                        except Exception as err:  # noqa: BLE001 (a baseline that cannot apply)
                            tau, r["note"] = float("nan"), str(err).split(";")[0]
                        r.setdefault((split, target), []).append(tau)
                    if row == name:
                        r["seconds"].append(fit_s)
                        rep = getattr(getattr(p, "predictor", None), "config", {}).get("report")
                        if rep:
                            r["reports"].append(rep)
                    if target == TARGETS[0] and seed == 0:
                        r["invariance"] = invariance(q, probes)
            print(f"  {name}: {sum(rows[name]['seconds']):.0f}s", file=sys.stderr)
    if "wsym park metanet" in rows:
        print(
            f"invariant graphs prepared {prep:.0f}/s; park metanet forward {forward:.0f} "
            "graphs/s (1 thread)"
        )
    return {"zoo": paths, "members": counts, "architectures": n_arch, "rows": rows}


def _branch(p, which: str):
    """The same fit with only its ``which`` branch (``stats`` or ``graph``) switched on."""

    class Alone:
        claims = p.claims

        def predict(self, members):
            net = p.predictor.net
            saved, net.branches = net.branches, which
            try:
                return p.predict(members)
            finally:
                net.branches = saved

    return Alone()


def _cell(v) -> str:
    if not v:
        return "n/a"
    t = torch.tensor(v)
    if torch.isnan(t).any():
        return "n/a"
    return f"{t.mean():.3f} ± {t.std() if len(t) > 1 else 0.0:.3f}"


def table(report: dict) -> str:
    """The markdown comparison table of one report."""
    cols = [(s, t) for s in ("test", "test_arch") for t in TARGETS]
    head = " | ".join(
        f"τ {t} ({'held-out members' if s == 'test' else 'held-out archs'})" for s, t in cols
    )
    lines = [
        f"| predictor | invariant to | {head} | change under g | fit s/seed |",
        "|---|---|" + "---|" * len(cols) + "---|---|",
    ]
    for name, r in report["rows"].items():
        secs = f"{sum(r['seconds']) / len(r['seconds']):.0f}" if r["seconds"] else "(shared)"
        cells = " | ".join(_cell(r.get(c)) for c in cols)
        change = r.get("invariance", float("nan"))
        lines.append(f"| {name} | {r['claims']} | {cells} | {change:.1e} | {secs} |")
    return "\n".join(lines)


def _training_line(name: str, rep: dict) -> str:
    stats = rep["statistics_val_tau"]
    graph = f", graph alone {rep['graph_val_tau']:.3f}" if "graph_val_tau" in rep else ""
    weight = f", graph weight {rep['graph_weight']}" if "graph_weight" in rep else ""
    return (
        f"  {name}, seed {rep['seed']}: val tau statistics {stats:.3f}{graph} -> combined "
        f"{rep['val_tau']:.3f}{weight} (best graph epoch {rep['best_epoch']} of "
        f"{rep['epochs_run']}), {rep['graphs_per_second']:.0f} training graphs/s"
    )


#: ``--study``: what each change does to the two branches (one fit per target, seed 0).
STUDY = {
    "as benchmarked": {},
    "no message passing (layers 0)": {"layers": 0},
    "deeper message passing (layers 3)": {"layers": 3},
    "wider (hidden 32)": {"hidden": 32},
    "rank-normal targets": {"target_transform": "rank"},
    "twice the epochs": {"epochs": "x2", "patience": "x2"},
}


def study(paths: str, args) -> str:
    """The park metanet's branches under each :data:`STUDY` change; a markdown table."""
    data, ys, _ = read_park(paths, args.caps)
    pairs = {s: [(spec, sd) for spec, sd, _ in data[s]] for s in SPLITS}
    splits = [s for s in ("test", "test_arch") if pairs[s]]
    cache: dict = {}
    lines = [
        "| change | "
        + " | ".join(f"{t} {s}: stats / graph / blended" for s in splits for t in TARGETS)
        + " | fit s |",
        "|---|" + "---|" * (len(splits) * len(TARGETS)) + "---|",
    ]
    for label, change in STUDY.items():
        base = park_options(args)
        opts = {k: base[k] * 2 if v == "x2" else v for k, v in change.items()}
        cells, seconds = {}, 0.0
        for target in TARGETS:
            p, start = ParkMetanet("both", cache=cache, **{**base, **opts}), time.perf_counter()
            p.fit(pairs["train"], ys["train"][target], pairs["val"], ys["val"][target], 0)
            seconds += time.perf_counter() - start
            for split in splits:
                taus = [
                    kendall_tau(ys[split][target], q.predict(pairs[split]))
                    for q in (_branch(p, "stats"), _branch(p, "graph"), p)
                ]
                cells[(split, target)] = " / ".join(f"{t:.3f}" for t in taus)
        row = " | ".join(cells[(s, t)] for s in splits for t in TARGETS)
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
    parser.add_argument(
        "--predictors", default=",".join(SHORT), help="comma list of " + ",".join(SHORT)
    )
    parser.add_argument(
        "--cap-train", type=int, help="at most N train, N/4 val, N/2 test members (seeded)"
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--study", action="store_true", help="the branches under each change")
    parser.add_argument("--json", metavar="FILE", help="write the reports as JSON")
    args = parser.parse_args()
    args.caps = None
    if args.cap_train:  # the validation and test splits capped in proportion
        n = args.cap_train
        args.caps = {"train": n, "val": n // 4, "test": n // 2, "test_arch": n // 2}
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
        print(table(report))
        for name, r in report["rows"].items():
            for rep in r["reports"]:
                print(_training_line(name, rep))
        sys.stdout.flush()
        reports.append(report)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                [
                    {
                        **r,
                        "rows": {
                            n: {str(k): v for k, v in row.items()} for n, row in r["rows"].items()
                        },
                    }
                    for r in reports
                ],
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
