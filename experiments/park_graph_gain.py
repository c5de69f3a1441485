"""Where the park metanet's graph branch can add to its statistics branch (test accuracy).

    python experiments/park_graph_gain.py --zoo /tmp/park2000 --cap-train 1000 --seeds 3 \
        --epochs 12 --patience 4 --out /tmp/park19_gain.json

For each seed, three fits on the park's train split (``val`` for early stopping
and for every weight chosen below), with the cross-layer path features
(``paths=True``) throughout:

* ``joint``: :func:`~wsym.metanet.park_fit.fit_park` with ``combine="joint"`` and
  ``stat_readout`` (the benchmarked park metanet); it yields the *statistics*
  branch, the *graph + statistics head* (its graph branch alone, whose head also
  reads the statistics), the joint ensemble alone and the joint combination;
* ``graph``: the graph branch alone, trained without the statistics in its head
  (``branches="graph"``): the least correlated of the graph predictors;
* ``stats-rank``: the statistics branch on rank-normal targets.

Every component's predictions on train / val / test / test_arch are stored
(``--out``), then combined: a weighted average of the components' *normal
scores* (each prediction mapped through the normal quantile of its rank among
that component's predictions on the training members: a rank average with a
reference population fixed at training time), the weight picked on the
validation members from a grid; the graph seeds averaged (an ensemble of
independently trained graph branches) against the statistics seeds averaged.
Also printed: Kendall tau per family (MLP / CNN / transformer), per label-noise
level and per size (parameter count below / above the median), for each
component: where each branch fails.
``--from FILE`` recomputes the tables from a stored run without fitting.
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch

from wsym.metanet.metrics import kendall_tau
from wsym.metanet.park_baselines import ParkMetanet
from wsym.metanet.park_evaluate import SPLITS, caps_for
from wsym.metanet.park_fit import capped, is_finite, zoo_members
from wsym.zoo import load

WEIGHTS = tuple(k / 20 for k in range(21))


def read(zoo, caps):
    """``({split: [(spec, sd)]}, {split: [row]})`` of the zoo's finite members."""
    ids = capped({s: [r["id"] for r in zoo.table if r["split"] == s] for s in SPLITS}, caps)
    pairs, rows = {}, {}
    for s, v in ids.items():
        members = zoo_members(zoo, v)
        keep = [k for k, (_, sd) in enumerate(members) if is_finite(sd)]
        pairs[s] = [members[k] for k in keep]
        rows[s] = [zoo.row(v[k]) for k in keep]
    return pairs, rows


def _predict(p: ParkMetanet, pairs, branches: str | None = None, weight: float | None = None):
    net = p.predictor.net
    saved = net.branches, float(net.graph_weight)
    net.branches = branches or saved[0]
    if weight is not None:
        net.graph_weight.fill_(weight)
    try:
        return {s: p.predict(v).tolist() for s, v in pairs.items()}
    finally:
        net.branches = saved[0]
        net.graph_weight.fill_(saved[1])


def fit_components(pairs, y, seed: int, options: dict, cache: dict) -> dict:
    """``{component: {split: predictions}}`` of one seed's three fits (see the module doc)."""
    out, seconds, epochs = {}, {}, {}
    fits = {
        "joint": ParkMetanet("both", cache=cache, combine="joint", stat_readout=True, **options),
        "graph": ParkMetanet("graph", cache=cache, **options),
        "stats-rank": ParkMetanet(
            "stats", cache=cache, target_transform="rank", **{**options, "epochs": 0}
        ),
    }
    for name, p in fits.items():
        start = time.perf_counter()
        p.fit(pairs["train"], y["train"], pairs["val"], y["val"], seed)
        seconds[name] = time.perf_counter() - start
        rep = p.predictor.config["report"]
        epochs[name] = (rep["best_epoch"], rep["epochs_run"])
        print(
            f"  seed {seed}: {name} fitted in {seconds[name]:.0f}s, best graph epoch "
            f"{rep['best_epoch']} of {rep['epochs_run']}",
            flush=True,
        )
        if name == "joint":
            out["stats"] = _predict(p, pairs, "stats")
            out["graph+stats head"] = _predict(p, pairs, "graph")
            out["joint ensemble"] = _predict(p, pairs, "both", 1.0)
            out["joint combination"] = _predict(p, pairs)
        else:
            out[name] = _predict(p, pairs)
    return {"predictions": out, "seconds": seconds, "epochs": epochs}


def normal_scores(train: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Normal quantile of each ``x``'s rank among the training predictions ``train``."""
    ref = train.sort().values
    below = torch.searchsorted(ref, x, right=False).double()
    upto = torch.searchsorted(ref, x, right=True).double()
    u = ((below + upto) / 2 + 0.5) / (len(ref) + 1)
    return torch.special.ndtri(u)


def scores(pred: dict) -> dict:
    """``{split: normal scores}`` of one component's predictions (reference: its train ones)."""
    train = torch.tensor(pred["train"], dtype=torch.float64)
    return {s: normal_scores(train, torch.tensor(v, dtype=torch.float64)) for s, v in pred.items()}


def blend(a: dict, b: dict, y: dict) -> tuple[float, dict]:
    """Weight ``w`` of ``b`` in ``(1 - w) a + w b`` best on validation; the blended scores."""
    taus = {w: kendall_tau(y["val"], (1 - w) * a["val"] + w * b["val"]) for w in WEIGHTS}
    w = max(taus, key=lambda k: (taus[k], -k))
    return w, {s: (1 - w) * a[s] + w * b[s] for s in a}


def mean_scores(items: list[dict]) -> dict:
    """``{split: mean of the items' scores}`` (an ensemble over seeds)."""
    return {s: torch.stack([d[s] for d in items]).mean(0) for s in items[0]}


def _cell(v: list[float]) -> str:
    t = torch.tensor(v)
    return f"{t.mean():.3f} ± {t.std() if len(t) > 1 else 0.0:.3f}"


def tables(run: dict) -> str:
    """The markdown tables of a stored run."""
    y = {s: torch.tensor(v) for s, v in run["y"].items()}
    seeds = run["seeds"]
    comps = list(seeds[0]["predictions"])
    z = [{c: scores(sd["predictions"][c]) for c in comps} for sd in seeds]
    rows: dict[str, list] = {}

    def add(label, per_seed, weights=None):
        for s in ("test", "test_arch"):
            rows.setdefault(label, {}).setdefault(s, []).extend(
                kendall_tau(y[s], d[s]) for d in per_seed
            )
        if weights is not None:
            rows[label]["w"] = weights

    for c in comps:
        add(c, [d[c] for d in z])
    for other in ("graph", "graph+stats head", "joint ensemble", "stats-rank"):
        got = [blend(d["stats"], d[other], y) for d in z]
        add(f"stats + {other} (normal-score blend)", [g[1] for g in got], [g[0] for g in got])
    raw = [
        {c: {s: torch.tensor(v) for s, v in sd["predictions"][c].items()} for c in comps}
        for sd in seeds
    ]
    got = [blend(d["stats"], d["graph"], y) for d in raw]
    add("stats + graph (blend in target units)", [g[1] for g in got], [g[0] for g in got])
    for s in ("test", "test_arch"):  # the headroom: the weight best on the test members
        rows.setdefault("stats + graph, weight best on the test members (headroom)", {})[s] = [
            max(kendall_tau(y[s], (1 - w) * d["stats"][s] + w * d["graph"][s]) for w in WEIGHTS)
            for d in z
        ]
    got = [blend(blend(d["stats"], d["graph"], y)[1], d["joint ensemble"], y) for d in z]
    add("stats + graph, then + joint ensemble", [g[1] for g in got], [g[0] for g in got])
    if len(z) > 1:  # seeds averaged: a 3-member ensemble of each, scored once
        avg = {c: mean_scores([d[c] for d in z]) for c in comps}
        add("stats, seeds averaged", [avg["stats"]])
        add("graph, seeds averaged", [avg["graph"]])
        for other in ("graph", "graph+stats head", "joint ensemble"):
            w, b = blend(avg["stats"], avg[other], y)
            add(f"stats + {other}, seeds averaged (blend)", [b], [w])
    lines = [
        "| predictor | τ test_acc (held-out members) | τ test_acc (held-out archs) | weight |",
        "|---|---|---|---|",
    ]
    for label, r in rows.items():
        w = ", ".join(f"{v:g}" for v in r.get("w", [])) or "-"
        lines.append(f"| {label} | {_cell(r['test'])} | {_cell(r['test_arch'])} | {w} |")
    lines += ["", agreement(raw), "", breakdown(run, z, y, comps)]
    return "\n".join(lines)


def agreement(raw: list) -> str:
    """Kendall tau between two predictors' rankings (mean over seeds): how alike they rank."""
    pairs = [("stats", "graph"), ("stats", "graph+stats head"), ("stats", "joint ensemble")]
    lines = ["| rankings compared | held-out members | held-out archs |", "|---|---|---|"]
    for a, b in pairs:
        cells = [_cell([kendall_tau(d[a][s], d[b][s]) for d in raw]) for s in ("test", "test_arch")]
        lines.append(f"| {a} vs {b} | {cells[0]} | {cells[1]} |")
    if len(raw) > 1:
        cells = [
            _cell([kendall_tau(d["graph"][s], raw[k - 1]["graph"][s]) for k, d in enumerate(raw)])
            for s in ("test", "test_arch")
        ]
        lines.append(f"| graph vs graph of another seed | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def breakdown(run: dict, z: list, y: dict, comps: list) -> str:
    """Kendall tau per family, label noise and size on test + test_arch, seed 0."""
    meta = run["rows"]["test"] + run["rows"]["test_arch"]
    yy = torch.cat([y["test"], y["test_arch"]])
    pred = {c: torch.cat([z[0][c]["test"], z[0][c]["test_arch"]]) for c in comps}
    median = sorted(m["params"] for m in meta)[len(meta) // 2]
    groups = {
        f"family {f}": [m["family"] == f for m in meta] for f in ("mlp", "cnn", "transformer")
    }
    groups |= {f"label noise {n:g}": [m["noise"] == n for m in meta] for n in (0, 0.1, 0.2, 0.3)}
    groups["small (params < median)"] = [m["params"] < median for m in meta]
    groups["large"] = [m["params"] >= median for m in meta]
    shown = [c for c in ("stats", "graph", "graph+stats head", "joint combination") if c in comps]
    lines = [
        "| members (test + test_arch, seed 0) | n | " + " | ".join(f"τ {c}" for c in shown) + " |",
        "|---|---|" + "---|" * len(shown),
    ]
    for label, mask in groups.items():
        m = torch.tensor(mask)
        if m.sum() < 3:
            continue
        taus = " | ".join(f"{kendall_tau(yy[m], pred[c][m]):.3f}" for c in shown)
        lines.append(f"| {label} | {int(m.sum())} | {taus} |")
    return "\n".join(lines)


def main() -> None:  # noqa: D103
    parser = argparse.ArgumentParser()
    parser.add_argument("--zoo")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--patience", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=16)
    parser.add_argument("--cap-train", type=int)
    parser.add_argument("--out", help="store the run (predictions) as JSON")
    parser.add_argument("--from", dest="source", help="tables of a stored run, no fitting")
    args = parser.parse_args()
    if args.source:
        with open(args.source) as f:
            print(tables(json.load(f)))
        return
    torch.set_num_threads(1)
    zoo = load(args.zoo)
    pairs, rows = read(zoo, caps_for(args.cap_train))
    y = {s: [float(r["test_acc"]) for r in v] for s, v in rows.items()}
    print({s: len(v) for s, v in pairs.items()}, flush=True)
    options = {"epochs": args.epochs, "patience": args.patience, "hidden": args.hidden}
    options["paths"] = True
    cache: dict = {}
    start = time.perf_counter()
    ParkMetanet(cache=cache).graphs([m for v in pairs.values() for m in v])
    print(f"graphs prepared in {time.perf_counter() - start:.0f}s", flush=True)
    run = {
        "options": options,
        "y": y,
        "rows": {
            s: [
                {
                    "family": r["family"],
                    "noise": float(r.get("label_noise", math.nan)),
                    "params": sum(t.numel() for t in sd.values()),
                }
                for r, (_, sd) in zip(v, pairs[s], strict=True)
            ]
            for s, v in rows.items()
        },
        "seeds": [],
    }
    for seed in range(args.seeds):
        run["seeds"].append(fit_components(pairs, y, seed, options, cache))
        if args.out:
            with open(args.out, "w") as f:
                json.dump(run, f)
    print(tables(run))


if __name__ == "__main__":
    main()
