"""Meta-network benchmark: comparison table, transfer, graphs per second, training time.

    python benchmarks/metanet.py --population /tmp/pop-mlp --arch mlp
    python benchmarks/metanet.py --zoo data/zoos/mnist1d-mlp --transfer train_size

``--population`` reads a directory of experiments/metanet_population.py; ``--zoo``
a wsym zoo. Prints the markdown table (Kendall tau and R^2 on the test members,
mean ± std over seeds, invariance), then throughput of the invariant graph
preparation and of the network, and the training time of one fit.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))

from metanet_population import ARCHS  # noqa: E402

from wsym.detect import detect  # noqa: E402
from wsym.metanet import fit  # noqa: E402
from wsym.metanet.evaluate import PREDICTORS, SHARPNESS, evaluate, format_table  # noqa: E402
from wsym.metanet.population import load_population  # noqa: E402


def main() -> None:  # noqa: D103
    parser = argparse.ArgumentParser()
    parser.add_argument("--zoo")
    parser.add_argument("--population")
    parser.add_argument("--arch", choices=sorted(ARCHS), default="mlp")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--predictors", default=",".join(PREDICTORS))
    parser.add_argument("--sharpness", action="store_true", help="add the sharpness predictors")
    parser.add_argument("--transfer", metavar="KEY")
    parser.add_argument("--epochs", type=int, default=40, help="meta-network epochs")
    parser.add_argument("--patience", type=int, default=10, help="early-stopping patience")
    parser.add_argument("--hidden", type=int, default=16, help="meta-network width")
    parser.add_argument("--layers", type=int, default=2, help="message-passing rounds")
    parser.add_argument(
        "--trees", type=int, default=0, help="boosted trees blended into the statistics branch"
    )
    parser.add_argument("--no-timing", action="store_true", help="skip the training-time lines")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.zoo:
        from wsym.zoo import load

        zoo = load(args.zoo)
    else:
        zoo = load_population(args.population, ARCHS[args.arch])
    names = tuple(args.predictors.split(","))
    if args.sharpness:
        names += tuple(f"sharpness:{m}" for m in SHARPNESS)
    options = {
        "epochs": args.epochs,
        "patience": args.patience,
        "hidden": args.hidden,
        "layers": args.layers,
        "trees": args.trees,
    }
    report = evaluate(
        zoo,
        predictors=names,
        seeds=tuple(range(args.seeds)),
        split_key=args.transfer,
        metanet_options=options,
    )
    print(f"members: {report['members']}, target: gap, split: {args.transfer or 'zoo splits'}")
    print(format_table(report))
    for r in report["rows"]:
        print(f"  {r['name']}: {r['seconds']:.0f}s for {r['seeds']} seed(s)")
        for rep in r.get("reports", []):
            print(
                f"    seed {rep['seed']}: val tau statistics branch {rep['statistics_val_tau']:.3f}"
                f" -> with graph branch {rep['val_tau']:.3f} (best graph epoch "
                f"{rep['best_epoch']} of {rep['epochs_run']}; 0 = graph branch not kept), "
                f"{rep['statistics_seconds']:.0f}s + {rep['train_seconds']:.0f}s"
                + (f", trees blended at {rep['blend']}" if args.trees else "")
            )
    if args.no_timing:
        return
    spec = detect(zoo.model(zoo.table[0]["id"]), zoo.example_inputs())
    sds = zoo.state_dicts()
    ids = zoo.split("train")
    y = [float(zoo.table[i]["gap"]) for i in ids]
    start = time.perf_counter()
    p = fit(None, [sds[i] for i in ids], y, spec=spec, seed=0, **options)
    total = time.perf_counter() - start
    rep = p.config["report"]
    print(
        f"training: {total:.0f}s total ({rep['train_seconds']:.0f}s optimizing, "
        f"{rep['epochs_run']} epochs, best {rep['best_epoch']})"
    )
    start = time.perf_counter()
    graphs = p.graphs(sds[:64])
    prep = 64 / (time.perf_counter() - start)
    start = time.perf_counter()
    p.predict_graphs(graphs)
    infer = 64 / (time.perf_counter() - start)
    e = graphs[0]
    print(
        f"graph: {e.num_nodes} nodes, {e.edge_index.shape[1]} edges; invariant graphs "
        f"prepared {prep:.0f}/s, network forward {infer:.0f} graphs/s (1 thread)"
    )


if __name__ == "__main__":
    main()
