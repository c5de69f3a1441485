"""``wsym sharpness``: a checkpoint's sharpness on a dataset, by any of wsym's measures.

Builds the model from ``--model``/``--config`` (as ``wsym detect``), loads the
checkpoint, takes the first ``--batches`` batches of ``--data`` and calls
:func:`wsym.sharpness` with cross-entropy. The spec (detected, or read from
``--spec``) is only needed by the geodesic measures. With ``--average`` the value is
printed with its standard error (over the antithetic pairs of random directions).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
from typing import Any

from wsym.cli.common import EXIT_OK, add_command
from wsym.cli.prepare import add_data_options, add_model_options, prepare
from wsym.errors import WsymInputError

#: Measures on the quotient by the spec's continuous groups, so need a spec.
GEODESIC = ("geodesic-inv", "geodesic-mix")
_EXAMPLE = """\
examples:
  wsym sharpness --model wsym:mlp --config d_in=40 --checkpoint net.safetensors \\
      --data mnist1d --measure adaptive --rho 0.05
  wsym sharpness --model wsym:mlp --config d_in=40 --checkpoint net.pt --data mnist1d \\
      --split test --batches 2 --measure geodesic-mix --average --json

measures: euclidean, adaptive, geodesic-inv, geodesic-mix (worst case, or --average
over random directions), hessian-trace, lambda-max, fisher (curvature; --rho unused)
"""


def add_command_to(commands: Any) -> None:
    """Add ``sharpness`` to the ``wsym`` parser."""
    from wsym.sharpness import MEASURES

    parser = add_command(
        commands, "sharpness", "measure a checkpoint's sharpness on a dataset", _EXAMPLE
    )
    add_model_options(parser)
    parser.add_argument(
        "--checkpoint",
        metavar="FILE",
        help="weights to load (.safetensors/.pt/.pth/.bin); default: seeded fresh weights",
    )
    add_data_options(parser, "train", "to measure the loss on", required=True)
    parser.add_argument(
        "--batches", type=int, default=4, metavar="K", help="first K batches of --split (default 4)"
    )
    parser.add_argument("--measure", required=True, choices=MEASURES, help="sharpness measure")
    parser.add_argument(
        "--rho", type=float, default=0.05, help="perturbation radius, > 0 (default 0.05)"
    )
    parser.add_argument(
        "--average",
        action="store_true",
        help="mean over random directions (printed +- its standard error), not the worst case",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=10,
        help="ascent steps, or antithetic pairs of random directions with --average (default 10)",
    )
    parser.add_argument(
        "--dtype",
        choices=("float64", "float32"),
        default="float64",
        help="working precision (default float64; float32 for large models)",
    )
    parser.add_argument(
        "--micro-batch",
        type=int,
        metavar="N",
        help="evaluate each batch in micro-batches of N samples (bounds activation memory)",
    )
    parser.set_defaults(handler=run_sharpness)


def run_sharpness(args: argparse.Namespace) -> int:
    """``wsym sharpness``: print the measure and its value (or a JSON report)."""
    import torch

    import wsym

    if not math.isfinite(args.rho) or args.rho <= 0:
        raise WsymInputError(f"--rho must be a positive number, got {args.rho:g}")
    if args.batches < 1:
        raise WsymInputError(f"--batches must be positive, got {args.batches}")
    if args.steps < 1:
        raise WsymInputError(f"--steps must be positive, got {args.steps}")
    if args.micro_batch is not None and args.micro_batch < 1:
        raise WsymInputError(f"--micro-batch must be positive, got {args.micro_batch}")
    checkpoints = [args.checkpoint] if args.checkpoint else []
    job = prepare(args, checkpoints, loss=True, detect=args.measure in GEODESIC)
    # evaluated at --dtype (float64 by default: a float64 checkpoint loads exactly)
    model = job.model.to(getattr(torch, args.dtype))
    if job.states:
        model.load_state_dict(job.states[0])
    data = list(itertools.islice(job.data.batches(args.split, args.batch_size), args.batches))
    estimate = wsym.sharpness(
        model,
        data,
        torch.nn.functional.cross_entropy,
        spec=job.spec,
        measure=args.measure,
        rho=args.rho,
        average=args.average,
        seed=args.seed,
        steps=args.steps,
        with_error=True,
        dtype=args.dtype,
        micro_batch=args.micro_batch,
    )
    value = estimate.value
    if args.json:
        report = {
            "measure": args.measure,
            "rho": args.rho,
            "value": value,
            "stderr": estimate.stderr,
            "average": args.average,
            "model": args.model,
            "config": args.config,
            "checkpoint": args.checkpoint,
            "data": args.data,
            "split": args.split,
            "batches": len(data),
            "batch_size": args.batch_size,
            "steps": args.steps,
            "seed": args.seed,
            "dtype": args.dtype,
            "micro_batch": args.micro_batch,
        }
        print(json.dumps(report, indent=2))
    else:
        error = f" +- {estimate.stderr:.2g}" if args.average else ""
        print(f"{args.measure} {value:.8g}{error}")
    return EXIT_OK
