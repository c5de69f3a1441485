"""The park metanet's graph-branch options, one fit each, Kendall tau per split and family.

    python experiments/park_graph_options.py --zoo data/zoos/mnist1d-park --epochs 12 \
        --patience 4 --configs '{"as benchmarked": {}, "thirds": {"readout": "thirds"}}'

Every fit is :func:`~wsym.metanet.park_fit.fit_park` on the zoo's train split
(``val`` for early stopping), test accuracy, seed ``--seed``, the benchmarked
configuration (``combine="joint"``, ``stat_readout``, ``paths``, hidden 16, 2
layers) with each ``--configs`` entry's options on top; ``"products": false``
drops the attention-product edges from the graph (as the NG-GNN-style
baseline does; they stay in the statistics). Printed per fit: the test tau of
the statistics branch, the graph branch alone (its head reads the statistics)
and the joint combination, on the held-out members and the held-out
architectures, and per family (the mean of the two splits' taus). The
invariant graphs are prepared once and kept in ``--cache`` (default under
/tmp), so later runs on the same zoo and caps start at once. ``--scales``
prints, instead of fitting, the largest |z| of the graph inputs per family
(standardized per role on the training graphs, as the encoders do).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import time

import torch

from wsym.metanet.metrics import kendall_tau
from wsym.metanet.park_baselines import ParkMetanet
from wsym.metanet.park_evaluate import SPLITS, caps_for, read_park
from wsym.metanet.park_fit import fit_park
from wsym.zoo import load

FAMILIES = ("mlp", "park_cnn1d", "patch_transformer")
BASE = {"hidden": 16, "layers": 2, "combine": "joint", "stat_readout": True, "paths": True}


def prepared(zoo: str, cap: int | None, cache: str) -> tuple[dict, dict, dict]:
    """``(graphs, test accuracies, families)`` per split, read from ``cache`` if there."""
    if os.path.exists(cache):
        return torch.load(cache, weights_only=False)
    start = time.perf_counter()
    data, ys, _ = read_park([load(zoo)], caps_for(cap))
    reader = ParkMetanet()
    out = (
        {s: reader.graphs([(spec, sd) for spec, sd, _ in data[s]]) for s in SPLITS},
        {s: ys[s]["test_acc"] for s in SPLITS},
        {s: [f for _, _, f in data[s]] for s in SPLITS},
    )
    torch.save(out, cache)
    print(f"graphs prepared in {time.perf_counter() - start:.0f}s", flush=True)
    return out


LOG_COLUMNS = ("lr", "init_scale", "batch_size", "epochs", "steps", "train_loss")


def auxiliary_columns(zoo: str, y_train: list, names: list) -> dict:
    """``{name: values}`` of the training members (log scale for ``LOG_COLUMNS``).

    The cached training members are the zoo's ``train`` rows in table order less the
    diverged ones: matched to the rows by their test accuracy, in order.
    """
    rows, out = [r for r in load(zoo).table if r["split"] == "train"], []
    for r in rows:
        if len(out) < len(y_train) and float(r["test_acc"]) == y_train[len(out)]:
            out.append(r)
    assert len(out) == len(y_train), "training members not matched to the zoo's rows"
    return {
        k: [math.log(float(r[k]) + 1e-12) if k in LOG_COLUMNS else float(r[k]) for r in out]
        for k in names
    }


def without_products(graphs: list) -> list:
    """Copies of ``graphs`` without the attention-product (qk, vo) edges."""
    out = []
    for g in graphs:
        g, keep = copy.copy(g), g.edge_role < 3
        g.edge_index, g.edge_x, g.edge_role = (
            g.edge_index[:, keep],
            g.edge_x[keep],
            g.edge_role[keep],
        )
        out.append(g)
    return out


def scores(p, graphs: dict, y: dict, families: dict) -> dict:
    """``{(branch, split[, family]): tau}`` for the statistics, graph and joint branches."""
    net, row = p.net, {}
    for branch in ("stats", "graph", "both"):
        net.branches = branch
        for s in ("train", "test", "test_arch"):
            pred, truth = p.predict_graphs(graphs[s]), torch.tensor(y[s])
            row[(branch, s)] = kendall_tau(truth, pred)
            for fam in FAMILIES:
                idx = [i for i, f in enumerate(families[s]) if f == fam]
                if len(idx) > 1:
                    row[(branch, s, fam)] = kendall_tau(truth[idx], pred[idx])
    net.branches, chosen = "both", float(net.graph_weight)
    if net.combine in ("joint", "stack"):  # the joint ensemble at fixed weights
        for beta in (0.5, 1.0):
            net.graph_weight.fill_(beta)
            for s in ("test", "test_arch"):
                row[(f"joint@{beta}", s)] = kendall_tau(
                    torch.tensor(y[s]), p.predict_graphs(graphs[s])
                )
        net.graph_weight.fill_(chosen)
    return row


def input_scales(graphs: dict, families: dict) -> None:
    """Print per family the largest |z| of node, edge and attribute features (see the doc)."""
    from wsym.metanet.graph import batch_graphs
    from wsym.metanet.park import ParkNet

    net = ParkNet(16, 2, paths=True)
    net.fit_inputs(batch_graphs(graphs["train"]))
    for fam in FAMILIES:
        x = batch_graphs(
            [g for g, f in zip(graphs["train"], families["train"], strict=True) if f == fam]
        )
        n = x.num_graphs

        def z(enc, v, role):
            return ((v.float() - enc.mean[role]) / enc.std[role]).abs().amax(0).round().tolist()

        print(
            f"{fam}: {x.num_nodes / n:.0f} nodes, {x.edge_index.shape[1] / n:.0f} edges per graph; "
            f"edges per role {torch.bincount(x.edge_role, minlength=5).tolist()}\n"
            f"  max |z| node {z(net.node_enc, x.node_x, torch.zeros_like(x.node_group))}\n"
            f"  max |z| edge {z(net.edge_enc, x.edge_x, x.edge_role)}\n"
            f"  max |z| attr {z(net.attr_enc, x.attr_x, x.attr_role)}",
            flush=True,
        )


def main() -> None:  # noqa: D103
    ap = argparse.ArgumentParser()
    ap.add_argument("--zoo", required=True)
    ap.add_argument("--cap-train", type=int)
    ap.add_argument("--configs", default='{"as benchmarked": {}}', help="JSON {label: options}")
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--patience", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache", help="file of the prepared graphs")
    ap.add_argument("--out", help="write the taus as JSON")
    ap.add_argument("--scales", action="store_true", help="the inputs' scales per family only")
    a = ap.parse_args()
    torch.set_num_threads(1)
    cache = a.cache or f"/tmp/park_graphs_{os.path.basename(a.zoo.rstrip('/'))}_{a.cap_train}.pt"
    graphs, y, families = prepared(a.zoo, a.cap_train, cache)
    if a.scales:
        return input_scales(graphs, families)
    results = {}
    for label, opts in json.loads(a.configs).items():
        opts = dict(opts)
        g = (
            {s: without_products(v) for s, v in graphs.items()}
            if not opts.pop("products", 1)
            else graphs
        )
        if "auxiliary" in opts:
            opts["auxiliary"] = auxiliary_columns(a.zoo, y["train"], opts["auxiliary"])
        start = time.perf_counter()
        p = fit_park(
            g["train"],
            y["train"],
            validation=(g["val"], y["val"]),
            target_names=("test_acc",),
            seed=a.seed,
            graphs=g["train"],
            val_graphs=g["val"],
            **{"epochs": a.epochs, "patience": a.patience, **BASE, **opts},
        )
        rep, row = p.config["report"], scores(p, g, y, families)
        print(
            f"{label}: {time.perf_counter() - start:.0f}s, best graph epoch {rep['best_epoch']} of "
            f"{rep['epochs_run']}, graph weight {rep.get('graph_weight')}, val tau statistics "
            f"{rep['statistics_val_tau']:.3f}, graph {rep.get('graph_val_tau', float('nan')):.3f}, "
            f"combined {rep['val_tau']:.3f}",
            flush=True,
        )
        for branch in ("stats", "graph", "both"):
            fam = [
                sum(row.get((branch, s, f), 0.0) for s in ("test", "test_arch")) / 2
                for f in FAMILIES
            ]
            print(
                f"   {branch:5s} train {row[(branch, 'train')]:.3f} "
                f"test {row[(branch, 'test')]:.3f} test_arch "
                f"{row[(branch, 'test_arch')]:.3f} | mlp / cnn / transformer "
                + " / ".join(f"{v:.3f}" for v in fam),
                flush=True,
            )
        if ("joint@0.5", "test") in row:
            print(
                "   joint at graph weight 0.5 / 1: "
                + ", ".join(
                    f"{row[(f'joint@{b}', 'test')]:.3f} / {row[(f'joint@{b}', 'test_arch')]:.3f}"
                    for b in (0.5, 1.0)
                ),
                flush=True,
            )
        results[label] = {" ".join(k): v for k, v in row.items()}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
