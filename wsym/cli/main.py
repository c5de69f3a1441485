"""The ``wsym`` command line: a thin layer over the Python API.

Exit codes: 0 on success, 2 for bad input (:class:`~wsym.errors.WsymInputError`
or an argparse error), 1 for any other error. Errors print one line on stderr;
``--debug`` adds the traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from wsym.cli import checkpoints, metanet, report, sharpness, zoo
from wsym.cli.common import EXIT_ERROR, EXIT_INPUT, EXIT_OK, add_command
from wsym.errors import WsymInputError

GRAPH_SUFFIXES = (".graphml", ".json")

#: Architectures ``wsym tour`` runs detection on: (model spec, config, input shape).
TOUR_CASES: tuple[tuple[str, str, str], ...] = (
    ("wsym:mlp", "d_in=40", "8,40"),
    ("wsym:cnn", "channels=16", "2,1,16,16"),
    ("wsym:transformer", "seq=8", "2,8,4"),
    ("torchvision:resnet18", "", "1,3,64,64"),
    (
        "hf:bert",
        "hidden_size=64,num_hidden_layers=2,num_attention_heads=4,"
        "intermediate_size=128,vocab_size=256",
        "2,8",
    ),
)

_DETECT_EXAMPLE = """\
examples:
  wsym detect --model torchvision:resnet18 --input 1,3,64,64
  wsym detect --model hf:bert --config hidden_size=64,num_hidden_layers=2 --input 2,8 --json
  wsym detect --model mypkg.models:make_net --config width=32 --input 4,10 \\
      --checkpoint net.safetensors --graph net.graphml

model specs: torchvision:NAME, timm:NAME, hf:MODEL_TYPE, wsym:NAME, package.module:factory_fn
  (imported from the working directory too), path/to/file.py:factory_fn
"""
_MAIN_EXAMPLE = """\
examples:
  wsym detect --model torchvision:resnet18 --input 1,3,64,64
  wsym align --model wsym:mlp --config d_in=40 --input 8,40 a.pt b.pt --out b.aligned.pt
  wsym barrier --model wsym:mlp --config d_in=40 a.pt b.pt --data mnist1d --out barrier/
  wsym sharpness --model wsym:mlp --config d_in=40 --checkpoint a.pt --data mnist1d \\
      --measure adaptive

run 'wsym COMMAND --help' for a command's options
"""
_TOUR_EXAMPLE = """\
example:
  wsym tour
"""


def build_parser() -> argparse.ArgumentParser:
    """Build the ``wsym`` argument parser with its subcommands."""
    parser = argparse.ArgumentParser(
        prog="wsym",
        description="Symmetry-aware weight-space toolkit for PyTorch.",
        epilog=_MAIN_EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    detect = add_command(
        commands, "detect", "detect a model's parameter-space symmetries", _DETECT_EXAMPLE
    )
    detect.add_argument("--model", required=True, metavar="SPEC", help="model spec to build")
    detect.add_argument(
        "--input", required=True, metavar="SHAPE", help="example input shape, e.g. 1,3,224,224"
    )
    detect.add_argument("--config", default="", metavar="K=V,...", help="builder config")
    detect.add_argument(
        "--checkpoint", metavar="FILE", help="weights to load (.safetensors/.pt/.pth/.bin)"
    )
    detect.add_argument("--json", action="store_true", help="print the spec as JSON")
    detect.add_argument(
        "--graph", metavar="OUT", help="write the architecture graph (.graphml or .json)"
    )
    detect.add_argument("--seed", type=int, default=0, help="seed for weights and inputs")
    detect.set_defaults(handler=run_detect)
    checkpoints.add_commands(commands)
    sharpness.add_command_to(commands)
    report.add_command_to(commands)
    zoo.add_command_to(commands)
    metanet.add_commands(commands)

    tour = add_command(
        commands, "tour", "detect symmetries of a few bundled architectures", _TOUR_EXAMPLE
    )
    tour.set_defaults(handler=run_tour)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``wsym`` command line.

    Args:
        argv: Arguments without the program name; None reads ``sys.argv``.

    Returns:
        The exit code: 0 ok, 2 bad input, 1 other error.
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # argparse: 0 after --help, 2 after a usage error
        return exit_.code if isinstance(exit_.code, int) else EXIT_INPUT
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_INPUT
    if not args.debug:
        return _run_guarded(args.handler, args, debug=False)
    with debug_logging():
        return _run_guarded(args.handler, args, debug=True)


@contextlib.contextmanager
def debug_logging():
    """``--debug``: the ``wsym`` loggers at DEBUG level on stderr while the command runs.

    Detection then keeps torch's own report of a failed export (guard logs, the
    partial FX graph), which it otherwise holds back.
    """
    logger = logging.getLogger("wsym")
    handler = logging.StreamHandler(sys.stderr)
    level = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _run_guarded(handler: Callable[[argparse.Namespace], int], args: Any, debug: bool) -> int:
    try:
        return handler(args)
    except WsymInputError as err:
        _report(err, debug)
        return EXIT_INPUT
    except KeyboardInterrupt:
        print("wsym: interrupted", file=sys.stderr)
        return 130
    except Exception as err:
        _report(err, debug, hint=True)
        return EXIT_ERROR


def _report(err: BaseException, debug: bool, hint: bool = False) -> None:
    if debug:
        traceback.print_exception(err, file=sys.stderr)
    suffix = " (rerun with --debug for the traceback)" if hint and not debug else ""
    print(f"wsym: error: {describe_error(err)}{suffix}", file=sys.stderr)


def describe_error(err: BaseException) -> str:
    """One line describing ``err``: the message as is for input errors, else type and message."""
    lines = str(err).strip().splitlines()
    first = lines[0].strip() if lines else ""
    if isinstance(err, WsymInputError):
        return first or "bad input"
    return f"{type(err).__name__}: {first}" if first else type(err).__name__


def run_detect(args: argparse.Namespace) -> int:
    """``wsym detect``: build, optionally load a checkpoint, detect, print."""
    spec = detect_spec(
        args.model,
        args.input,
        config_text=args.config,
        checkpoint=args.checkpoint,
        graph=args.graph,
        seed=args.seed,
    )
    print(spec.to_json() if args.json else spec.table())
    return EXIT_OK


def detect_spec(
    model_spec: str,
    input_shape: str,
    *,
    config_text: str = "",
    checkpoint: str | None = None,
    graph: str | None = None,
    seed: int = 0,
) -> Any:
    """Build a model from command-line strings and return ``wsym.detect``'s SymmetrySpec.

    Every input is checked before the (slow) model build and detection run.
    """
    import torch

    import wsym
    from wsym.io import check_compatible, load_state_dict
    from wsym.models.registry import build_model, example_inputs, parse_config, parse_input_shape

    config = parse_config(config_text)
    shape = parse_input_shape(input_shape)
    graph_path = _check_graph_path(graph) if graph else None
    state = load_state_dict(checkpoint) if checkpoint else None
    torch.manual_seed(seed)
    model = build_model(model_spec, config)
    if state is not None:
        check_compatible(model.state_dict(), state)
        model.load_state_dict(state)
    inputs = example_inputs(model_spec, shape, model=model, config=config, seed=seed)
    spec = wsym.detect(model, inputs)
    if graph_path is not None:
        from wsym.detect.tracing import write_graph

        write_graph(spec.graph, graph_path)
    return spec


def _check_graph_path(graph: str) -> Path:
    path = Path(graph)
    if path.suffix.lower() not in GRAPH_SUFFIXES:
        raise WsymInputError(
            f"cannot write graph to {graph}: unknown format {path.suffix or '(no suffix)'!r}; "
            "end the file name in .graphml or .json"
        )
    if not path.parent.is_dir():
        raise WsymInputError(f"cannot write graph to {graph}: directory {path.parent} is missing")
    return path


def run_tour(args: argparse.Namespace) -> int:
    """``wsym tour``: detect and print the symmetries of :data:`TOUR_CASES`."""
    failed = 0
    for model_spec, config_text, input_shape in TOUR_CASES:
        title = f"{model_spec}  input {input_shape}" + (
            f"  config {config_text}" if config_text else ""
        )
        print(f"== {title}", flush=True)
        try:
            spec = detect_spec(model_spec, input_shape, config_text=config_text)
        except Exception as err:  # keep going: show every case, fail at the end
            failed += 1
            _report(err, args.debug)
            continue
        print(spec.table(), end="\n\n", flush=True)
    if failed:
        print(f"wsym: error: {failed} of {len(TOUR_CASES)} tour models failed", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
