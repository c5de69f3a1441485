"""``wsym metanet train|eval`` on a park zoo (members of several architectures).

A zoo whose members have more than one architecture (``wsym zoo build
--preset mnist1d-park``) gets the universal meta-network
(:func:`wsym.metanet.park_fit.fit_zoo`: one network for every architecture)
instead of the per-architecture one. ``train`` writes it with its model card;
``eval`` runs :func:`wsym.metanet.park_evaluate.evaluate_park` (the park
metanet, its statistics and graph branches alone, and the park baselines) on
the held-out members and the held-out architectures. Both draw progress on
stderr (per fit: predictor, target, seed, graph epoch and validation tau), say
beforehand when a run is estimated to take a minute or more
(:func:`estimate_park_seconds`, from one small calibration fit), and end with
where the time went. ``--max-members N`` caps the members (N train, N/4 val,
N/2 of each test split; a seeded subsample).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from wsym.cli.common import EXIT_OK, announce
from wsym.errors import WsymInputError

#: ``metanet eval``'s predictors on a park zoo unless ``--predictors`` says otherwise.
PARK_PREDICTORS = "park,statnn,statnn-canonical"
_CALIBRATION_MEMBERS = 8
_GRAPH_PREDICTORS = ("park", "residual", "ng")


def estimate_park_seconds(zoo: Any, ids: dict, options: dict, graph_fits: int) -> dict:
    """Upper estimate of a park run's seconds by stage, from one small calibration fit.

    Fits the park metanet on :data:`_CALIBRATION_MEMBERS` training members (one graph
    epoch, two statistics epochs) and scales its costs: detection per architecture,
    invariant graphs per member, the graph branch per training graph and epoch
    (``epochs`` per fit: early stopping only shortens it) and the statistics branch
    per epoch, for ``graph_fits`` fits (predictors x targets x seeds that train a graph
    branch).
    """
    from wsym.metanet.fit import FitConfig
    from wsym.metanet.park_fit import fit_park, zoo_members, zoo_specs

    few = ids["train"][:_CALIBRATION_MEMBERS]
    if len(few) < 4:
        return {}
    start = time.perf_counter()
    cache = zoo_specs(zoo)
    known = len(cache)
    members = zoo_members(zoo, few)
    per_arch = (time.perf_counter() - start) / max(len(cache) - known, 1)
    y = [float(zoo.row(i)["gap"]) for i in few]
    calibration = {**options, "epochs": 1, "patience": 1, "stat_epochs": 2}
    rep = fit_park(members, y, seed=0, **calibration).config["report"]
    chosen = {i for v in ids.values() for i in v}
    archs = {json.dumps(r["architecture"], sort_keys=True) for r in zoo.table if r["id"] in chosen}
    per_graph = 1 / rep["graphs_per_second"] if rep["graphs_per_second"] > 0 else 0.0
    stat_epochs = options.get("stat_epochs", FitConfig().stat_epochs)
    epochs = options.get("epochs", FitConfig().epochs)
    return {
        "calibration": time.perf_counter() - start,
        "detect and load": per_arch * len(archs - set(cache)),
        "invariant graphs": rep["graph_seconds"] / len(few) * len(chosen),
        "metanet fits": graph_fits
        * (epochs * len(ids["train"]) * per_graph + stat_epochs * rep["statistics_seconds"] / 2),
    }


def train_park(args: argparse.Namespace, zoo: Any, out: Any, options: dict) -> int:
    """``wsym metanet train`` on a park zoo."""
    from wsym.io.progress import Progress
    from wsym.metanet.park_evaluate import caps_for
    from wsym.metanet.park_fit import fit_zoo, park_card, zoo_ids

    ids = zoo_ids(zoo, caps_for(args.max_members))
    announce(estimate_park_seconds(zoo, ids, options, 1))
    bar = Progress(options["epochs"], "metanet train (park)", unit="epochs")

    def on_epoch(epoch: int, _: int, tau: float) -> None:
        bar.update(epoch - bar.n)
        bar.set_description_str(f"metanet train (park): graph epoch {epoch}, val tau {tau:.3f}")

    p, taus = fit_zoo(zoo, seed=args.seed, ids=ids, on_epoch=on_epoch, **options)
    bar.close()
    p.save(out)
    command = (
        f"wsym metanet train --zoo {args.zoo} --out {args.out} --seed {args.seed} "
        f"--epochs {options['epochs']} --patience {options['patience']} --hidden "
        f"{options['hidden']}" + (f" --max-members {args.max_members}" if args.max_members else "")
    )
    out.with_suffix(".md").write_text(park_card(p, args.zoo, command))
    timing = dict(p.config["card"]["timing"])
    total = timing.pop("total")
    said = ", ".join(f"{k} tau {v:.3f}" for k, v in taus.items())
    print(f"wrote {out} (park metanet, {len(p.schemas)} architectures; {said or 'no test split'})")
    print(f"time {total:.0f}s: " + ", ".join(f"{k} {v:.0f}s" for k, v in timing.items()))
    return EXIT_OK


def eval_park(args: argparse.Namespace, zoo: Any, options: dict) -> int:
    """``wsym metanet eval`` on a park zoo."""
    from wsym.metanet.park_evaluate import (
        TARGETS,
        caps_for,
        check_names,
        evaluate_park,
        format_park_table,
        format_park_timing,
        read_park,
        training_line,
    )
    from wsym.metanet.park_fit import zoo_ids

    for flag in ("transfer", "plot"):
        if getattr(args, flag):
            raise WsymInputError(f"--{flag} is for single-architecture zoos; drop it for a park")
    if args.target not in TARGETS:
        raise WsymInputError(f"--target on a park is one of {', '.join(TARGETS)}")
    names = [n.strip() for n in (args.predictors or PARK_PREDICTORS).split(",") if n.strip()]
    check_names(names)
    caps = caps_for(args.max_members)
    graph_fits = sum(n in _GRAPH_PREDICTORS for n in names) * args.seeds
    announce(estimate_park_seconds(zoo, zoo_ids(zoo, caps), options, graph_fits))
    start = time.perf_counter()
    data, ys, _ = read_park([zoo], caps)
    read_s = time.perf_counter() - start
    report = evaluate_park(
        data,
        ys,
        names=names,
        targets=(args.target,),
        seeds=tuple(range(args.seeds)),
        options=options,
        progress=True,
    )
    report["timing"]["detect and load"] = read_s
    report["timing"]["total"] += read_s
    if args.json:
        rows = {
            n: {k: v for k, v in r.items() if k != "reports"} for n, r in report["rows"].items()
        }
        print(json.dumps({**report, "rows": rows}, indent=2))
        print(format_park_timing(report), file=sys.stderr)
        return EXIT_OK
    print(format_park_table(report))
    for name, r in report["rows"].items():
        for rep in r["reports"]:
            print(training_line(name, rep))
    print(format_park_timing(report))
    return EXIT_OK
