"""``wsym metanet train|eval`` and ``wsym predict``: meta-networks on zoos and checkpoints.

* ``metanet train --zoo DIR --out FILE``: fit the invariant meta-network on the
  zoo's train split (val split for early stopping), write ``FILE`` (safetensors
  + JSON config) and a model card ``FILE`` with ``.md`` (zoo, split, tau).
* ``metanet eval --zoo DIR``: the comparison table of every predictor (Kendall
  tau, R^2 over seeds, invariance), ``--plot PNG`` for predicted vs true gap.
* on a park zoo (members of several architectures) both fit and evaluate the
  universal meta-network instead (:mod:`wsym.cli.metanet_park`);
* ``predict --checkpoint FILE``: predicted generalization gap of one checkpoint,
  with the shipped meta-network by default (``--metanet`` to use another).

``train`` and ``eval`` draw progress on stderr (per fit and seed, the metanet's
epoch and validation tau; ``TQDM_DISABLE=1`` silences it), say beforehand when a
run is estimated to take a minute or more (:func:`estimate_seconds`, from one
small calibration fit), and end with where the time went.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from wsym.cli.common import EXIT_OK, add_command, announce
from wsym.errors import WsymInputError
from wsym.io.resources import MODELS

#: The shipped meta-networks ``wsym predict`` uses without ``--metanet``, in order: the
#: first that reads the checkpoint's architecture predicts (the default zoo's MLP, then
#: every architecture of the park).
DEFAULT_METANETS = (
    MODELS / "metanet-mnist1d-mlp.safetensors",
    MODELS / "metanet-mnist1d-park.safetensors",
)

#: Default predictors of ``metanet eval`` (as :data:`wsym.metanet.evaluate.PREDICTORS`;
#: spelled out here so that the parser does not import torch-geometric).
PREDICTORS = "metanet,statnn,statnn-canonical,flat-mlp,nfn"
_CALIBRATION_MEMBERS = 8

_TRAIN_EXAMPLE = """\
examples:
  wsym metanet train --zoo data/zoos/mnist1d-mlp --out models/metanet-mnist1d-mlp.safetensors
  wsym metanet eval --zoo data/zoos/mnist1d-mlp --seeds 3 --plot gap.png
  wsym metanet eval --zoo data/zoos/mnist1d-mlp --transfer train_size --json
  wsym metanet train --zoo data/zoos/mnist1d-park --out park.safetensors --epochs 30
  wsym metanet eval --zoo data/zoos/mnist1d-park --predictors park,statnn --max-members 200
"""
_PREDICT_EXAMPLE = """\
examples:
  wsym predict --checkpoint net.safetensors --model wsym:mlp
  wsym predict --checkpoint digits.safetensors --model wsym:mlp --config d_in=64 --input 8,64
  wsym predict --checkpoint net.pt --metanet my-metanet.safetensors --json
"""


def open_zoo(path: str) -> Any:
    """A zoo directory through :func:`wsym.zoo.load` (one-line error if unavailable)."""
    try:
        from wsym import zoo as zoo_module
    except ImportError:
        raise WsymInputError("wsym.zoo is not installed in this build; cannot read --zoo") from None
    if not Path(path).is_dir():
        raise WsymInputError(f"zoo directory not found: {path}; check the path")
    return zoo_module.load(path)


def add_commands(commands: Any) -> None:
    """Add ``metanet`` (train, eval) and ``predict`` to the ``wsym`` parser."""
    meta = add_command(
        commands, "metanet", "train or evaluate meta-networks on a zoo", _TRAIN_EXAMPLE
    )
    sub = meta.add_subparsers(dest="metanet_command", metavar="ACTION", required=True)
    train = add_command(sub, "train", "fit the invariant meta-network on a zoo", _TRAIN_EXAMPLE)
    train.add_argument("--zoo", required=True, metavar="DIR", help="zoo directory")
    train.add_argument("--out", required=True, metavar="FILE", help="output .safetensors")
    train.add_argument("--seed", type=int, default=0, help="training seed (default 0)")
    _add_network_options(train)
    train.set_defaults(handler=run_train)
    ev = add_command(sub, "eval", "compare meta-networks and baselines on a zoo", _TRAIN_EXAMPLE)
    ev.add_argument("--zoo", required=True, metavar="DIR", help="zoo directory")
    ev.add_argument("--seeds", type=int, default=3, help="seeds per predictor (default 3)")
    ev.add_argument(
        "--predictors",
        help=f"comma list of: {PREDICTORS} (the default), sharpness:MEASURE (adaptive, "
        "geodesic-mix, fisher, hessian-trace, ...); on a park zoo: park, residual, ng, statnn, "
        "statnn-canonical, per-arch (default park,statnn,statnn-canonical)",
    )
    ev.add_argument("--target", default="gap", help="target column (default gap)")
    ev.add_argument("--transfer", metavar="KEY", help="train on low KEY values, test on high")
    _add_network_options(ev)
    ev.add_argument("--plot", metavar="PNG", help="scatter plot of predicted vs true gap")
    ev.add_argument("--json", action="store_true", help="print the report as JSON")
    ev.set_defaults(handler=run_eval)
    pred = add_command(
        commands, "predict", "predict a checkpoint's generalization gap", _PREDICT_EXAMPLE
    )
    pred.add_argument("--checkpoint", required=True, metavar="FILE", help="weights to read")
    pred.add_argument("--model", metavar="SPEC", help="model spec the checkpoint must fit")
    pred.add_argument("--config", default="", metavar="K=V,...", help="builder config")
    pred.add_argument(
        "--input",
        metavar="SHAPE",
        help="example input shape for --model's detection, e.g. 8,64 (default: the zoo's)",
    )
    pred.add_argument("--metanet", metavar="FILE", help="meta-network (default: the shipped one)")
    pred.add_argument("--json", action="store_true", help="print the result as JSON")
    pred.set_defaults(handler=run_predict)


def _add_network_options(parser: Any) -> None:
    parser.add_argument(
        "--max-members",
        type=int,
        metavar="N",
        help="park zoos: at most N train, N/4 val, N/2 test members (seeded subsample)",
    )
    parser.add_argument("--epochs", type=int, default=60, help="largest epoch count (default 60)")
    parser.add_argument(
        "--patience", type=int, default=15, help="epochs without a better val tau (default 15)"
    )
    parser.add_argument("--hidden", type=int, default=16, help="meta-network width (default 16)")


def _network_options(args: argparse.Namespace) -> dict:
    for key in ("epochs", "patience", "hidden"):
        if getattr(args, key) < 1:
            raise WsymInputError(f"--{key} must be >= 1, got {getattr(args, key)}")
    if args.max_members is not None and args.max_members < 4:
        raise WsymInputError(f"--max-members must be >= 4, got {args.max_members}")
    return {"epochs": args.epochs, "patience": args.patience, "hidden": args.hidden}


def _single_architecture(args: argparse.Namespace) -> None:
    if args.max_members is not None:
        raise WsymInputError(
            "--max-members is for park zoos (several architectures); drop it for this zoo"
        )


def _check_out(path: str) -> Path:
    out = Path(path)
    if out.suffix != ".safetensors":
        raise WsymInputError(f"--out must end in .safetensors, got {out.name}")
    if not out.parent.is_dir():
        raise WsymInputError(f"output directory does not exist: {out.parent}; create it first")
    return out


def run_train(args: argparse.Namespace) -> int:
    """``wsym metanet train``."""
    import torch

    from wsym.cli.metanet_park import train_park
    from wsym.detect import detect
    from wsym.io.progress import Progress
    from wsym.metanet import fit, kendall_tau
    from wsym.metanet.evaluate import zoo_splits
    from wsym.metanet.park_evaluate import is_park

    out = _check_out(args.out)
    options = _network_options(args)
    zoo = open_zoo(args.zoo)
    if is_park(zoo):
        return train_park(args, zoo, out, options)
    _single_architecture(args)
    ids = zoo_splits(zoo)
    gap = {r["id"]: float(r["gap"]) for r in zoo.table}
    spec = detect(zoo.model(zoo.table[0]["id"]), zoo.example_inputs())
    announce(estimate_seconds(zoo, ids, spec, options, ("metanet",), 1))
    val = (zoo.state_dicts(ids["val"]), [gap[i] for i in ids["val"]])
    bar = Progress(options["epochs"], "metanet train", unit="epochs")
    p = fit(
        None,
        zoo.state_dicts(ids["train"]),
        [gap[i] for i in ids["train"]],
        spec=spec,
        validation=val,
        seed=args.seed,
        on_epoch=lambda epoch, _, tau: _advance(bar, epoch, tau),
        **options,
    )
    bar.close()
    y_test = torch.tensor([gap[i] for i in ids["test"]])
    tau = kendall_tau(y_test, p.predict(zoo.state_dicts(ids["test"]))) if ids["test"] else None
    p.config["card"] = {
        "zoo": str(args.zoo),
        "splits": {k: len(v) for k, v in ids.items()},
        "test_tau": tau,
    }
    p.save(out)
    out.with_suffix(".md").write_text(model_card(p, args.zoo, ids, tau))
    rep = p.config["report"]
    print(
        f"wrote {out} (test Kendall tau {tau:.3f}, "
        f"{rep['statistics_seconds'] + rep['train_seconds']:.0f}s training, "
        f"{rep['graphs_per_second']:.0f} graphs/s)"
    )
    print(
        f"time: graph building {rep['graph_seconds']:.0f}s, statistics branch "
        f"{rep['statistics_seconds']:.0f}s, graph branch {rep['train_seconds']:.0f}s "
        f"({rep['epochs_run']} epochs)"
    )
    return EXIT_OK


def _advance(bar: Any, epoch: int, tau: float) -> None:
    bar.update(epoch - bar.n)
    bar.set_description_str(f"metanet train: val tau {tau:.3f}")


def estimate_seconds(
    zoo: Any, ids: dict, spec: Any, options: dict, predictors: tuple, seeds: int
) -> dict[str, float]:
    """Upper estimate of a metanet run's seconds, by stage, from one small calibration fit.

    The calibration fits the metanet on :data:`_CALIBRATION_MEMBERS` training members
    (two graph epochs, two statistics epochs) and scales its measured costs: graph
    building per member (every member, once), the graph branch per training graph and
    epoch (validation included; ``epochs`` epochs per seed: early stopping only
    shortens it), the statistics branch per epoch (full-batch, so about constant in
    the number of members; :class:`~wsym.metanet.fit.FitConfig`'s ``stat_epochs``). Other
    predictors are not estimated (``"baselines": nan`` when there are any).
    """
    from wsym.metanet import fit
    from wsym.metanet.fit import FitConfig

    gap = {r["id"]: float(r["gap"]) for r in zoo.table}
    few = ids["train"][:_CALIBRATION_MEMBERS]
    if len(few) < 4:
        return {}
    rep = fit(
        None,
        zoo.state_dicts(few),
        [gap[i] for i in few],
        spec=spec,
        seed=0,
        **{**options, "epochs": 2, "patience": 2, "stat_epochs": 2},
    ).config["report"]
    members = sum(len(v) for v in ids.values())
    per_graph = 1 / rep["graphs_per_second"] if rep["graphs_per_second"] > 0 else 0.0
    per_stat_epoch = rep["statistics_seconds"] / 2  # full-batch: about constant in members
    estimate = {
        "calibration": rep["graph_seconds"] + rep["statistics_seconds"] + rep["train_seconds"],
        "graph building": rep["graph_seconds"] / len(few) * members,
    }
    if "metanet" in predictors:
        stat_epochs = options.get("stat_epochs", FitConfig().stat_epochs)
        estimate["metanet"] = seeds * (
            options["epochs"] * len(ids["train"]) * per_graph + stat_epochs * per_stat_epoch
        )
    if any(p != "metanet" for p in predictors):
        estimate["baselines"] = float("nan")
    return estimate


def model_card(p: Any, zoo: str, ids: dict, tau: float | None) -> str:
    """A short markdown model card for a trained meta-network."""
    rep = p.config["report"]
    kinds = ", ".join(f"{n} {k}" for k, n in sorted(p.spec.kinds().items()))
    return "\n".join(
        [
            f"# Meta-network: generalization gap on `{zoo}`",
            "",
            f"- architecture: {len(p.schema.plans)} tensors; symmetries: {kinds}",
            f"- training: {len(ids['train'])} train / {len(ids['val'])} val members (zoo splits), "
            f"seed {rep['seed']}, best graph epoch {rep['best_epoch']} of {rep['epochs_run']}, "
            f"{rep['statistics_seconds'] + rep['train_seconds']:.0f}s on CPU "
            f"({rep.get('graphs_per_second', 0):.0f} training graphs/s in the graph stage)",
            f"- test split: {len(ids['test'])} members, Kendall tau {tau:.3f}"
            if tau is not None
            else "- test split: none",
            f"- validation Kendall tau: {rep['val_tau']:.3f}",
            f"- network: {p.config['layers']} message-passing layers, width {p.config['hidden']}",
            "- invariant to every group of the spec (canonical forms + message passing)",
            f"- statistics branch: {p.config['members']} perceptrons (width "
            f"{p.config['stat_hidden']}) on quantile-normalized per-tensor statistics of the "
            f"invariant weights (validation tau {rep['statistics_val_tau']:.3f} alone); graph "
            "branch on top "
            + ("kept" if rep["best_epoch"] else "not kept (did not raise the validation tau)"),
            f"- command: `wsym metanet train --zoo {zoo} --out FILE --seed {rep['seed']} "
            f"--hidden {p.config['hidden']}`",
            "",
        ]
    )


def run_eval(args: argparse.Namespace) -> int:
    """``wsym metanet eval``."""
    from wsym.metanet.evaluate import evaluate, format_table, format_timing, scatter_plot

    if args.seeds < 1:
        raise WsymInputError(f"--seeds must be >= 1, got {args.seeds}")
    zoo = open_zoo(args.zoo)
    options = _network_options(args)
    from wsym.metanet.park_evaluate import is_park

    if is_park(zoo):
        from wsym.cli.metanet_park import eval_park

        return eval_park(args, zoo, options)
    _single_architecture(args)
    predictors = args.predictors or PREDICTORS
    names = tuple(n.strip() for n in predictors.split(",") if n.strip())
    if "metanet" in names:
        from wsym.detect import detect
        from wsym.metanet.evaluate import zoo_splits

        spec = detect(zoo.model(zoo.table[0]["id"]), zoo.example_inputs())
        ids = zoo_splits(zoo, args.transfer)
        announce(estimate_seconds(zoo, ids, spec, options, names, args.seeds))
    report = evaluate(
        zoo,
        predictors=names,
        seeds=tuple(range(args.seeds)),
        target=args.target,
        split_key=args.transfer,
        metanet_options=options,
        progress=True,
    )
    if args.plot:
        scatter_plot(report, args.plot)
    if args.json:
        print(json.dumps({k: v for k, v in report.items() if k != "test_predictions"}, indent=2))
        print(format_timing(report), file=sys.stderr)
    else:
        print(format_table(report))
        print(format_timing(report))
    return EXIT_OK


def run_predict(args: argparse.Namespace) -> int:
    """``wsym predict``."""
    from wsym.io.checkpoint import load_state_dict
    from wsym.metanet import load

    if args.input and not args.model:
        raise WsymInputError("--input needs --model SPEC (the model the input shape feeds)")
    paths = [Path(args.metanet)] if args.metanet else [p for p in DEFAULT_METANETS if p.is_file()]
    if not paths:
        raise WsymInputError(f"no shipped meta-network in {MODELS}; pass --metanet FILE")
    sd = load_state_dict(args.checkpoint)
    head = _model_or_spec(args, sd) if args.model else None
    for i, path in enumerate(paths):
        try:
            predictor = load(path)
            gap = _predict(predictor, head, sd)
            break
        except WsymInputError as err:
            if i < len(paths) - 1:
                continue
            if args.model and not args.input and "example inputs" in str(err):
                raise WsymInputError(f"{err}; or pass --input SHAPE (e.g. 8,64)") from None
            raise
    novelty = _novelty(predictor, head, sd)
    flag = None if novelty is None else novelty["out_of_distribution"]
    if args.json:
        out = {"checkpoint": args.checkpoint, "metanet": str(path), "gap": gap}
        out["out_of_distribution"] = flag
        if novelty is not None:
            out.update(distance=novelty["distance"], threshold=novelty["threshold"])
        print(json.dumps(out))
        return EXIT_OK
    print(f"predicted generalization gap: {gap:.4f} ({path.name})")
    if novelty is None:
        print("out of distribution: unknown (this meta-network file stores no training statistics)")
    elif flag:
        print(
            f"out of distribution: YES, distance {novelty['distance']:.2f} > threshold "
            f"{novelty['threshold']:.2f} (the training members' 99th percentile): the "
            "checkpoint is unlike every member the meta-network learned from; do not trust "
            "the prediction"
        )
    else:
        print(
            f"out of distribution: no (distance {novelty['distance']:.2f}, threshold "
            f"{novelty['threshold']:.2f})"
        )
    return EXIT_OK


def _model_or_spec(args: argparse.Namespace, sd: dict) -> Any:
    """The ``--model`` built and checked against ``sd``; with ``--input``, its detected spec."""
    from wsym.io.checkpoint import check_compatible
    from wsym.models.registry import build_model, example_inputs, parse_config, parse_input_shape

    config = parse_config(args.config)
    shape = parse_input_shape(args.input) if args.input else None
    model = build_model(args.model, config)
    check_compatible(model.state_dict(), sd, args.checkpoint)
    if shape is None:
        return model
    import wsym

    return wsym.detect(model, example_inputs(args.model, shape, model=model, config=config, seed=0))


def _predict(predictor: Any, head: Any, sd: dict) -> float:
    """One checkpoint's predicted gap; a park predictor reads any architecture given its model."""
    from wsym.metanet.park import ParkPredictor

    if isinstance(predictor, ParkPredictor) and head is not None:
        return float(predictor.predict((head, sd)))
    return float(predictor.predict(sd))


def _novelty(predictor: Any, head: Any, sd: dict) -> dict | None:
    from wsym.metanet.park import ParkPredictor

    if isinstance(predictor, ParkPredictor) and head is not None:
        return predictor.novelty((head, sd))
    return predictor.novelty(sd)
