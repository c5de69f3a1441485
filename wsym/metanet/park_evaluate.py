"""Every park predictor on one park of architectures, in one run (``wsym metanet eval``).

:func:`read_park` reads the members of one or more zoos (each keeping its own
split; split ``test_arch`` holds the park's held-out architectures);
:func:`evaluate_park` fits each predictor of :data:`PREDICTORS` on ``train``
(``val`` for early stopping) for every target and seed and scores Kendall tau
on the held-out members (``test``) and the held-out architectures
(``test_arch``). The park metanet's fit is also scored with its statistics
branch alone and its graph branch alone (each trained on its own: the
ablation). Also measured: the prediction change under one random element of
each member's whole group (one test member per family), fit seconds, graphs/s,
and where the time went (``report["timing"]``). ``progress=True`` draws one bar
over the fits on stderr, with the graph branch's epoch and validation tau.
"""

from __future__ import annotations

import json
import time

import torch

from wsym.detect import detect
from wsym.errors import WsymInputError
from wsym.io.progress import Progress
from wsym.metanet.metrics import kendall_tau
from wsym.metanet.park_baselines import LayerStatNN, ParkMetanet, PerArchitecture
from wsym.metanet.park_fit import capped, is_finite, zoo_specs

TARGETS = ("test_acc", "gap")
SPLITS = ("train", "val", "test", "test_arch")
#: Short names (``--predictors``) and the rows they print.
PREDICTORS = {
    "park": "wsym park metanet",
    "residual": "residual combination",
    "ng": "NG-GNN-style, raw weights",
    "statnn": "StatNN per layer, padded",
    "statnn-canonical": "StatNN per layer, canonical",
    "per-arch": "per-architecture wsym metanets",
}
PARK_ROW = PREDICTORS["park"]


def is_park(zoo) -> bool:
    """Whether the zoo's members are of more than one architecture (a population: no)."""
    return len({json.dumps(r.get("architecture"), sort_keys=True) for r in zoo.table}) > 1


def caps_for(train: int | None) -> dict[str, int] | None:
    """The caps of ``train`` members: N train, N/4 val, N/2 test and test_arch members."""
    if not train:
        return None
    return {"train": train, "val": max(train // 4, 2), "test": train // 2, "test_arch": train // 2}


def read_park(zoos, caps: dict[str, int] | None = None):
    """``({split: [(spec, sd, family)]}, {split: {target: [y]}}, architectures)`` of ``zoos``.

    A zoo without a ``val`` split lends every 5th training member to it; members
    with non-finite weights (diverged in training) are left out.
    """
    out, seen = {s: [] for s in SPLITS}, set()
    ys = {s: {t: [] for t in TARGETS} for s in SPLITS}
    for zoo in zoos:
        x = zoo.example_inputs()
        specs = zoo_specs(zoo)
        has_val = any(r["split"] == "val" for r in zoo.table)
        rows = {s: [] for s in SPLITS}
        for r in zoo.table:
            split = r["split"]
            if not has_val and split == "train" and r["id"] % 5 == 0:
                split = "val"
            rows.setdefault(split, []).append(r)
        for split, chosen in capped(rows, caps).items():
            for r in chosen if split in out else ():
                arch = json.dumps(r["architecture"], sort_keys=True)
                if arch not in specs:
                    specs[arch] = detect(zoo.model(r["id"]), x)
                seen.add((id(zoo), arch))
                family, sd = r["architecture"]["name"], zoo.state_dict(r["id"])
                if not is_finite(sd):  # diverged in training: no weights to read
                    continue
                out[split].append((specs[arch], sd, family))
                for t in TARGETS:
                    ys[split][t].append(float(r[t]))
    return out, ys, len(seen)


def check_names(names) -> None:
    """Raise :class:`WsymInputError` on a name that is not in :data:`PREDICTORS`."""
    unknown = [n for n in names if n not in PREDICTORS]
    if unknown:
        raise WsymInputError(
            f"unknown park predictor {unknown[0]!r}; use one of {', '.join(PREDICTORS)}"
        )


def park_predictors(names, options: dict, caches: dict) -> dict:
    """``{row name: factory}`` of the short ``names`` (:data:`PREDICTORS`), in that order."""
    check_names(names)
    canon, raw = caches.setdefault("canonical", {}), caches.setdefault("raw", {})
    rows = {
        "park": lambda: ParkMetanet("both", cache=canon, **options),
        "residual": lambda: ParkMetanet("both", cache=canon, **{**options, "combine": "residual"}),
        "ng": lambda: ParkMetanet(  # message passing on raw weights alone, no statistics
            "graph",
            canonical=False,
            products=False,
            cache=raw,
            **{**options, "stat_readout": False},
        ),
        "statnn": lambda: LayerStatNN(),
        "statnn-canonical": lambda: LayerStatNN(canonical=True),
        "per-arch": lambda: PerArchitecture(
            epochs=options.get("epochs", 30),
            patience=options.get("patience", 10),
            hidden=options.get("hidden", 16),
        ),
    }
    return {PREDICTORS[n]: rows[n] for n in names}


def invariance(p, members) -> float:
    """Largest relative prediction change under one random element of each member's group."""
    worst = 0.0
    for spec, sd in members:
        sd64 = {k: v.double() if v.is_floating_point() else v for k, v in sd.items()}
        a = p.predict([(spec, sd64)])
        b = p.predict([(spec, spec.act(spec.sample(seed=0), sd64))])
        worst = max(worst, float((a - b).abs().max() / a.abs().max().clamp(min=1e-12)))
    return worst


def branch_alone(p, which: str):
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


def evaluate_park(
    data: dict,
    ys: dict,
    *,
    names=("park", "ng", "statnn", "statnn-canonical", "per-arch"),
    targets=TARGETS,
    seeds=(0, 1, 2),
    options: dict | None = None,
    progress: bool = False,
    caches: dict | None = None,
) -> dict:
    """Fit and score every predictor (see the module doc); a JSON-ready report.

    Args:
        data: members per split, from :func:`read_park`.
        ys: their targets, from :func:`read_park`.
        names: short predictor names (:data:`PREDICTORS`).
        targets: target columns.
        seeds: training seeds.
        options: the park metanets' options (:func:`~wsym.metanet.park_fit.fit_park`).
        progress: a bar over the fits on stderr.
        caches: ``{"canonical": {...}, "raw": {...}}``, the prepared graphs of
            :class:`~wsym.metanet.park_baselines.ParkMetanet` (filled here; pass one
            filled before to skip preparing them again).

    Returns:
        ``{"members": {split: n}, "rows": {row: {"claims", (split, target): [tau per seed],
        "seconds", "reports", "invariance"}}, "timing": {stage: seconds},
        "graphs_per_second": {...}}``.
    """
    clock = time.perf_counter()
    options = dict(options or {})
    pairs = {s: [(spec, sd) for spec, sd, _ in data[s]] for s in SPLITS}
    if len(pairs["train"]) < 2 or not (pairs["test"] or pairs["test_arch"]):
        raise WsymInputError(
            f"a park evaluation needs >= 2 train members and a test split, got "
            f"{ {s: len(v) for s, v in pairs.items()} }; use a larger zoo or cap"
        )
    probes, seen = [], set()
    for spec, sd, family in data["test"] + data["test_arch"]:
        if family not in seen:
            seen.add(family)
            probes.append((spec, sd))
    caches = {} if caches is None else caches
    factories = park_predictors(names, options, caches)
    timing, rates = {}, {}
    if {"park", "residual"} & set(names):
        start, everyone = time.perf_counter(), [m for s in SPLITS for m in pairs[s]]
        ParkMetanet(cache=caches["canonical"]).graphs(everyone)  # invariant graphs, once
        timing["invariant graphs"] = time.perf_counter() - start
        rates["prepared"] = len(everyone) / max(timing["invariant graphs"], 1e-9)
    fits = len(factories) * len(targets) * len(seeds)
    bar = Progress(fits, "park eval", unit="fits", enabled=progress)
    rows: dict = {}
    for name, make in factories.items():
        for target in targets:
            for seed in seeds:
                label = f"park eval: {name}, {target}, seed {seed}"
                bar.set_description_str(label)
                p, start = make(), time.perf_counter()
                if isinstance(p, ParkMetanet):
                    p.on_epoch = _epoch_hook(bar, label)
                p.fit(pairs["train"], ys["train"][target], pairs["val"], ys["val"][target], seed)
                fit_s = time.perf_counter() - start
                variants = {name: p}
                if name == PARK_ROW:
                    variants["statistics branch alone"] = branch_alone(p, "stats")
                    variants["graph branch alone"] = branch_alone(p, "graph")
                    if "forward" not in rates:
                        start = time.perf_counter()
                        p.predict(pairs["test"] or pairs["test_arch"])
                        n = len(pairs["test"] or pairs["test_arch"])
                        rates["forward"] = n / (time.perf_counter() - start)
                for row, q in variants.items():
                    _score(rows, row, q, p, pairs, ys, target, fit_s if row == name else None)
                    if "invariance" not in rows[row]:
                        rows[row]["invariance"] = invariance(q, probes)
                bar.update(1)
        timing.update(_timing(name, rows[name]))
    bar.close()
    timing["total"] = time.perf_counter() - clock
    return {
        "members": {s: len(v) for s, v in pairs.items()},
        "families": sorted(seen),
        "targets": list(targets),
        "rows": rows,
        "timing": timing,
        "graphs_per_second": rates,
    }


def _score(rows, row, q, p, pairs, ys, target, fit_s) -> None:
    r = rows.setdefault(row, {"claims": p.claims, "seconds": [], "reports": []})
    for split in ("test", "test_arch"):
        if not pairs[split]:
            continue
        try:
            tau = kendall_tau(ys[split][target], q.predict(pairs[split]))
        except WsymInputError as err:  # a baseline that cannot read unseen architectures
            tau, r["note"] = float("nan"), str(err).split(";")[0]
        r.setdefault(f"{split}/{target}", []).append(tau)
    if fit_s is not None:
        r["seconds"].append(fit_s)
        rep = getattr(getattr(p, "predictor", None), "config", {}).get("report")
        if rep:
            r["reports"].append(rep)


def _epoch_hook(bar, label: str):
    def hook(epoch: int, epochs: int, tau: float) -> None:
        bar.set_description_str(f"{label}, graph epoch {epoch}/{epochs}, val tau {tau:.3f}")

    return hook


def _timing(name: str, row: dict) -> dict[str, float]:
    """Seconds of one predictor (all targets and seeds); a park metanet's by stage."""
    reports = row["reports"]
    if not reports:
        return {name: sum(row["seconds"])}
    stats = sum(r["statistics_seconds"] for r in reports)
    graph = sum(r["train_seconds"] for r in reports)
    return {
        f"{name}: statistics branch": stats,
        f"{name}: graph branch": graph,
        f"{name}: the rest (graphs, blend)": sum(row["seconds"]) - stats - graph,
    }


def format_park_timing(report: dict) -> str:
    """One line: where the time of :func:`evaluate_park` went, largest first."""
    timing = dict(report["timing"])
    total = timing.pop("total")
    parts = sorted(timing.items(), key=lambda kv: -kv[1])
    rates = report["graphs_per_second"]
    rate = ", ".join(f"{k} {v:.0f} graphs/s" for k, v in rates.items())
    return f"time {total:.0f}s: " + ", ".join(f"{k} {v:.0f}s" for k, v in parts) + f" ({rate})"


def _cell(v) -> str:
    if not v:
        return "n/a"
    t = torch.tensor(v)
    if torch.isnan(t).any():
        return "n/a"
    return f"{t.mean():.3f} ± {t.std() if len(t) > 1 else 0.0:.3f}"


def format_park_table(report: dict) -> str:
    """The markdown comparison table of one report (mean ± std over seeds)."""
    splits = [s for s in ("test", "test_arch") if report["members"][s]]
    cols = [(s, t) for s in splits for t in report["targets"]]
    head = " | ".join(
        f"τ {t} ({'held-out members' if s == 'test' else 'held-out archs'})" for s, t in cols
    )
    lines = [
        f"| predictor | invariant to | {head} | change under g | fit s/seed |",
        "|---|---|" + "---|" * len(cols) + "---|---|",
    ]
    for name, r in report["rows"].items():
        secs = f"{sum(r['seconds']) / len(r['seconds']):.0f}" if r["seconds"] else "(shared)"
        cells = " | ".join(_cell(r.get(f"{s}/{t}")) for s, t in cols)
        change = r.get("invariance", float("nan"))
        lines.append(f"| {name} | {r['claims']} | {cells} | {change:.1e} | {secs} |")
    return "\n".join(lines)


def training_line(name: str, rep: dict) -> str:
    """One fit's validation taus, blend weight, best epoch and training rate."""
    stats = rep["statistics_val_tau"]
    graph = f", graph alone {rep['graph_val_tau']:.3f}" if "graph_val_tau" in rep else ""
    weight = f", graph weight {rep['graph_weight']}" if "graph_weight" in rep else ""
    return (
        f"  {name}, seed {rep['seed']}: val tau statistics {stats:.3f}{graph} -> combined "
        f"{rep['val_tau']:.3f}{weight} (best graph epoch {rep['best_epoch']} of "
        f"{rep['epochs_run']}), {rep['graphs_per_second']:.0f} training graphs/s"
    )
