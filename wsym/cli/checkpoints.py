"""``wsym canon``, ``align``, ``merge`` and ``barrier``: checkpoints modulo symmetries.

Each builds the model from ``--model``/``--config`` (as ``wsym detect``), checks
every checkpoint against it, detects the spec (or reads ``--spec``), and calls
the Python API. Outputs are written only when the whole command succeeded.
"""

from __future__ import annotations

import argparse
import copy
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from wsym.cli.common import EXIT_OK, add_command
from wsym.cli.prepare import (
    add_data_options,
    add_model_options,
    batches,
    check_out,
    check_out_dir,
    l2_distance,
    matching_batches,
    prepare,
    write_out,
)
from wsym.errors import WsymInputError
from wsym.io.files import write_files

METHODS = ("weights", "activations", "activations+weights")  # as wsym.align.alignment.METHODS
_CANON_EXAMPLE = """\
examples:
  wsym canon --model wsym:mlp --config d_in=40 --input 8,40 a.safetensors --out a.canon.safetensors
  wsym canon --model torchvision:resnet18 --spec resnet18.json net.pt --out canon.pt
"""
_ALIGN_EXAMPLE = """\
examples:
  wsym align --model wsym:mlp --config d_in=40 --input 8,40 a.pt b.pt --out b.aligned.pt
  wsym align --model wsym:mlp --config d_in=40 a.pt b.pt --out b.aligned.pt \\
      --method activations --data mnist1d --json
"""
_MERGE_EXAMPLE = """\
examples:
  wsym merge --model wsym:mlp --config d_in=40 --input 8,40 a.pt b.pt c.pt --out merged.pt
  wsym merge --model wsym:cnn --input 8,1,8,8 a.pt b.pt --out merged.pt \\
      --method activations --data digits --reset-batchnorm
"""
_BARRIER_EXAMPLE = """\
examples:
  wsym barrier --model wsym:mlp --config d_in=40 a.pt b.pt --data mnist1d --out barrier/
  wsym barrier --model wsym:cnn --config channels=8 a.pt b.pt --data digits \\
      --align activations --steps 21 --out barrier/ --json

writes DIR/barrier.png (naive and aligned curves) and DIR/barrier.json
"""


def add_commands(commands: Any) -> None:
    """Add ``canon``, ``align``, ``merge`` and ``barrier`` to the ``wsym`` parser."""
    canon = add_command(commands, "canon", "write a checkpoint's canonical form", _CANON_EXAMPLE)
    add_model_options(canon)
    canon.add_argument("checkpoint", metavar="CHECKPOINT", help="checkpoint to canonicalize")
    _add_out(canon)
    canon.set_defaults(handler=run_canon)

    align = add_command(
        commands, "align", "move a checkpoint onto a reference's basis", _ALIGN_EXAMPLE
    )
    add_model_options(align)
    align.add_argument("reference", metavar="REF", help="reference checkpoint")
    align.add_argument("other", metavar="OTHER", help="checkpoint to move onto REF")
    _add_out(align)
    _add_method(align)
    add_data_options(align, "train", "for activation matching")
    align.set_defaults(handler=run_align)

    merge = add_command(
        commands, "merge", "average checkpoints after aligning them", _MERGE_EXAMPLE
    )
    add_model_options(merge)
    merge.add_argument(
        "checkpoints", nargs="+", metavar="CHECKPOINT", help="two or more; the first is the basis"
    )
    _add_out(merge)
    _add_method(merge)
    add_data_options(merge, "train", "for activation matching, --repair and --reset-batchnorm")
    _add_statistics(merge, "the merge")
    merge.set_defaults(handler=run_merge)

    barrier = add_command(
        commands,
        "barrier",
        "loss barrier between two checkpoints, naive and aligned",
        _BARRIER_EXAMPLE,
    )
    add_model_options(barrier)
    barrier.add_argument("a", metavar="A", help="start of the path")
    barrier.add_argument("b", metavar="B", help="end of the path (aligned to A first)")
    barrier.add_argument("--out", required=True, metavar="DIR", help="directory for the results")
    barrier.add_argument(
        "--align",
        choices=(*METHODS, "none"),
        default="weights",
        help="how to align B to A before the second curve (default weights)",
    )
    barrier.add_argument("--steps", type=int, default=11, help="points on the path (default 11)")
    _add_statistics(barrier, "every point of the path (on the train split)")
    _add_continuous(barrier)
    add_data_options(
        barrier, "test", "to evaluate the loss on (activations match on train)", required=True
    )
    barrier.set_defaults(handler=run_barrier)


def _add_out(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out",
        required=True,
        metavar="PATH",
        help="output checkpoint (.safetensors/.pt), or a model directory when the "
        "checkpoints are Hugging Face directories (replaced atomically)",
    )
    parser.add_argument(
        "--dtype",
        metavar="{float32,float64}",
        help="working precision (default: float64 up to 2**24 parameters, float32 above; "
        "the outputs keep the checkpoints' dtypes)",
    )


def _add_method(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--method", choices=METHODS, default="weights", help="alignment method (default weights)"
    )
    _add_continuous(parser)


def _continuous_options() -> dict[str, tuple[tuple[str, ...], str]]:
    """``{flag: (choices, help)}`` of :func:`_add_continuous`, the first choice the default."""
    from wsym.align.alignment import CONTINUOUS, REFINE, RESIDUAL

    return {
        "--continuous": (CONTINUOUS, "continuous groups: fitted to the reference or canonicalized"),
        "--residual": (RESIDUAL, "residual stream: permuted or rotated (pre-LN; needs --data)"),
        "--refine": (
            REFINE,
            "path: the continuous groups then fitted to the train loss along the path "
            "(needs --data); auto: path with --data, else none",
        ),
    }


def _add_continuous(parser: argparse.ArgumentParser) -> None:
    """``--continuous``, ``--residual`` and ``--refine``: how the non-permutation groups align.

    Their values are checked by :func:`_check_continuous` (one line, exit 2), not by argparse.
    """
    for flag, (choices, text) in _continuous_options().items():
        parser.add_argument(
            flag,
            default=choices[0],
            metavar="{" + ",".join(choices) + "}",
            help=f"{text} (default {choices[0]})",
        )


def _check_continuous(args: argparse.Namespace) -> None:
    """A bad ``--continuous``, ``--residual`` or ``--refine`` in one line, before any work.

    An unknown value names the choices; ``--residual rotation`` and ``--refine path``
    work with ``--continuous auto`` or ``reference`` only, need ``--data``, and (``wsym barrier``)
    an alignment.
    """
    from wsym.align.alignment import NEEDS_MODEL

    for flag, (choices, _) in _continuous_options().items():
        value = getattr(args, flag[2:])
        if value not in choices:
            raise WsymInputError(f"unknown {flag} {value!r}; use one of {', '.join(choices)}")
    for flag in ("--residual", "--refine"):
        value = getattr(args, flag[2:])
        if value not in NEEDS_MODEL[flag[2:]][0]:
            continue
        if args.continuous not in ("auto", "reference"):
            raise WsymInputError(
                f"{flag} {value} works with --continuous auto or reference, not {args.continuous}"
            )
        _need_data(args, True, f"{flag} {value}")
        if getattr(args, "align", None) == "none":
            raise WsymInputError(f"{flag} {value} acts on an alignment; drop --align none")


def _add_statistics(parser: argparse.ArgumentParser, where: str) -> None:
    parser.add_argument(
        "--repair",
        action="store_true",
        help=f"REPAIR {where}: BatchNorm statistics reset, other units' mean and std "
        "set to the endpoints' interpolation (needs --data)",
    )
    parser.add_argument(
        "--reset-batchnorm",
        action="store_true",
        help=f"recompute BatchNorm running statistics of {where} on --data",
    )


def run_canon(args: argparse.Namespace) -> int:
    """``wsym canon``: the canonical representative of a checkpoint's orbit."""
    import wsym

    out = check_out(args.out, args.checkpoint)
    job = prepare(args, [args.checkpoint])
    canon = wsym.canonicalize(job.states[0], job.spec, dtype=job.dtype)
    write_out(job, canon, out)
    moved = l2_distance(job.states[0], canon)
    report = {"checkpoint": args.checkpoint, "out": str(out), "groups": len(job.spec.groups)}
    text = f"canonical form ({len(job.spec.groups)} groups, moved by {moved:.6g}) written to {out}"
    _print(args, {**report, "moved": moved}, text)
    return EXIT_OK


def run_align(args: argparse.Namespace) -> int:
    """``wsym align``: OTHER moved onto REF's basis; prints the distance before and after."""
    out = check_out(args.out, args.reference)
    _need_data(args, args.method != "weights", f"--method {args.method}")
    _check_continuous(args)
    job = prepare(args, [args.reference, args.other])
    ref, other = job.states
    data = matching_batches(job.data, args.split, args.batch_size) if job.data else None
    aligned = _align(job, ref, other, args.method, data, args)
    write_out(job, aligned, out)
    before, after = l2_distance(ref, other), l2_distance(ref, aligned)
    report = {
        "reference": args.reference,
        "other": args.other,
        "out": str(out),
        "method": args.method,
        "residual": args.residual,
        "refine": args.refine,
        "distance_before": before,
        "distance_after": after,
    }
    text = (
        f"L2 distance to {args.reference}: before {before:.6g}, after {after:.6g}\n"
        f"aligned {args.other} ({args.method} matching) written to {out}"
    )
    _print(args, report, text)
    return EXIT_OK


def run_merge(args: argparse.Namespace) -> int:
    """``wsym merge``: the average of the checkpoints aligned to the first."""
    import wsym

    out = check_out(args.out, args.checkpoints[0])
    if len(args.checkpoints) < 2:
        raise WsymInputError("merge needs at least two checkpoints; pass CK1 CK2 [CK3 ...]")
    _need_data(args, args.method != "weights", f"--method {args.method}")
    _need_data(args, args.reset_batchnorm, "--reset-batchnorm")
    _need_data(args, args.repair, "--repair")
    _check_continuous(args)
    job = prepare(args, args.checkpoints)
    matching = matching_batches(job.data, args.split, args.batch_size) if job.data else None
    if args.repair:  # the statistics are measured on the whole split
        matching = batches(job.data, args.split, args.batch_size)
    merged = wsym.merge(
        job.states,
        job.spec,
        method=args.method,
        continuous=args.continuous,
        residual=args.residual,
        refine=args.refine,
        model=_scratch(job.model, args.method, args.residual, args.refine),
        batches=matching,
        repair=args.repair,
        seed=args.seed,
        dtype=job.dtype,
    )
    if args.reset_batchnorm and not args.repair:
        data = batches(job.data, args.split, args.batch_size)
        merged = _reset_batchnorm(job.model, merged, data)
    write_out(job, merged, out)
    report = {
        "checkpoints": list(args.checkpoints),
        "out": str(out),
        "method": args.method,
        "continuous": args.continuous,
        "residual": args.residual,
        "refine": args.refine,
        "repair": args.repair,
        "reset_batchnorm": args.reset_batchnorm,
    }
    text = f"merge of {len(args.checkpoints)} checkpoints ({args.method} matching) written to {out}"
    _print(args, report, text)
    return EXIT_OK


def run_barrier(args: argparse.Namespace) -> int:
    """``wsym barrier``: loss and accuracy along A -> B, naive and with B aligned to A."""
    out = check_out_dir(args.out)
    if args.steps < 2:
        raise WsymInputError(f"--steps must be at least 2 (both endpoints), got {args.steps}")
    _check_continuous(args)
    job = prepare(args, [args.a, args.b], loss=True)
    sd_a, sd_b = job.states
    curves = {"naive": _curve(job, sd_a, sd_b, args)}
    if args.align != "none":
        matching = matching_batches(job.data, "train", args.batch_size)
        aligned = _align(job, sd_a, sd_b, args.align, matching, args)
        curves["aligned"] = _curve(job, sd_a, aligned, args)
    report = _barrier_report(args, curves)
    title = f"{Path(args.a).name} -> {Path(args.b).name} ({args.data} {args.split})"
    naive, other = curves["naive"], curves.get("aligned")
    write_files(
        out,
        {
            "barrier.png": lambda path: naive.plot(
                path, title=title, other=other, labels=("naive", f"aligned by {args.align}")
            ),
            "barrier.json": lambda path: path.write_text(json.dumps(report, indent=2) + "\n"),
        },
    )
    lines = [
        f"loss barrier: {_barriers(curves, 'barrier')}",
        f"accuracy barrier: {_barriers(curves, 'accuracy_barrier')}",
        f"wrote {out / 'barrier.png'} and {out / 'barrier.json'}",
    ]
    _print(args, report, "\n".join(lines))
    return EXIT_OK


def _align(job: Any, ref: dict, other: dict, method: str, data, args: argparse.Namespace) -> dict:
    """``other`` aligned to ``ref`` by ``method`` with the command's options and seed."""
    import wsym

    model = _scratch(job.model, method, args.residual, args.refine)
    return wsym.align(
        ref,
        other,
        job.spec,
        method,
        continuous=args.continuous,
        residual=args.residual,
        refine=args.refine,
        model=model,
        batches=data,
        seed=args.seed,
        dtype=job.dtype,
    )


def _curve(job: Any, sd_a: dict, sd_b: dict, args: argparse.Namespace) -> Any:
    """Cross-entropy curve on ``--split``, evaluated in the model's own dtypes."""
    import torch

    import wsym

    own = job.model.state_dict()

    def cast(sd: dict) -> dict:
        return {k: v.to(own[k].dtype) if k in own else v for k, v in sd.items()}

    data = batches(job.data, args.split, args.batch_size)
    loss = torch.nn.functional.cross_entropy
    repair = True if args.repair else "batchnorm" if args.reset_batchnorm else False
    train = batches(job.data, "train", args.batch_size) if repair else None
    return wsym.interpolate(
        job.model,
        cast(sd_a),
        cast(sd_b),
        data,
        loss,
        steps=args.steps,
        repair=repair,
        repair_batches=train,
    )


def _barrier_report(args: argparse.Namespace, curves: dict) -> dict:
    return {
        "model": args.model,
        "config": args.config,
        "checkpoints": [args.a, args.b],
        "data": args.data,
        "split": args.split,
        "align": args.align,
        "refine": args.refine,
        "steps": args.steps,
        "barrier": {name: curve.barrier for name, curve in curves.items()},
        "accuracy_barrier": {name: curve.accuracy_barrier for name, curve in curves.items()},
        "curves": {name: asdict(curve) for name, curve in curves.items()},
    }


def _barriers(curves: dict, field: str) -> str:
    return ", ".join(f"{name} {getattr(curve, field):.4g}" for name, curve in curves.items())


def _reset_batchnorm(model: Any, merged: dict, data: list) -> dict:
    """``merged`` with the buffers (running statistics) recomputed on ``data``.

    The statistics come from the model in its own dtype; the weights keep the
    merge's precision.
    """
    from wsym.align.batchnorm import reset_batchnorm_stats

    fresh = reset_batchnorm_stats(model, merged, data)
    buffers = {name for name, _ in model.named_buffers()}
    return {k: fresh[k].to(v.dtype) if k in buffers else v for k, v in merged.items()}


def _scratch(model: Any, method: str, residual: str = "permutation", refine: str = "auto") -> Any:
    """For activations, a rotated stream or a requested path fit, a float64 copy of ``model``.

    The default path fit (``--refine auto`` with ``--data``) runs at the model's dtype.
    """
    needs = method not in ("weights", "none") or residual == "rotation" or refine == "path"
    return copy.deepcopy(model).double() if needs else model


def _need_data(args: argparse.Namespace, needed: bool, what: str) -> None:
    if needed and args.data is None:
        raise WsymInputError(f"{what} needs a dataset: pass --data NAME (e.g. --data mnist1d)")


def _print(args: argparse.Namespace, report: dict, text: str) -> None:
    print(json.dumps(report, indent=2) if args.json else text)
