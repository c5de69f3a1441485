"""What the checkpoint subcommands share: model, spec, checkpoints and data from options.

Every input is checked before anything slow runs, in this order: the option
strings, the output path, the checkpoints (readable, finite, fitting the model),
the dataset (its inputs run through the model), and only then detection. Outputs
are written at the very end, atomically (temporary file, then rename), so a
failed command leaves nothing behind.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from wsym.errors import WsymInputError

#: Examples of a dataset fed through the model as example inputs for detection.
DATA_EXAMPLES = 8


@dataclass(frozen=True, eq=False)
class Prepared:
    """A model with the first checkpoint loaded, its spec, the checkpoints and the data.

    Attributes:
        model: The model built from ``--model``/``--config`` (or a model
            directory), in eval mode.
        spec: Detected on ``model`` or read from ``--spec``.
        states: One state dict per checkpoint, in the order given.
        data: The ``--data`` dataset, or None.
        layout: The first checkpoint's Hugging Face directory layout
            (:class:`wsym.io.hf.Directory`), where it is one: outputs are then
            written as such a directory.
        dtype: The working precision ``--dtype`` names, or None.
    """

    model: torch.nn.Module
    spec: Any
    states: list[dict[str, torch.Tensor]]
    data: Any = None
    layout: Any = None
    dtype: torch.dtype | None = None


def add_model_options(parser: argparse.ArgumentParser) -> None:
    """Add the options that build a model and find its symmetries (as ``wsym detect``)."""
    parser.add_argument(
        "--model",
        metavar="SPEC",
        help="model spec to build, or a Hugging Face model directory "
        "(default: the first checkpoint, when it is such a directory)",
    )
    parser.add_argument("--config", default="", metavar="K=V,...", help="builder config")
    parser.add_argument(
        "--input",
        metavar="SHAPE",
        help="example input shape for detection, e.g. 8,40 "
        "(not needed with --spec; defaults to a batch of --data)",
    )
    parser.add_argument(
        "--spec", metavar="FILE", help="use a spec saved by 'wsym detect --json' instead"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed for weights and inputs")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def add_data_options(
    parser: argparse.ArgumentParser, split: str, used_for: str, required: bool = False
) -> None:
    """Add ``--data``, ``--split`` (default ``split``) and ``--batch-size``."""
    from wsym.io.datasets import NAMES, SPLITS

    parser.add_argument(
        "--data",
        required=required,
        metavar="NAME",
        help=f"dataset {used_for}: {', '.join(NAMES)}, or your own: a .safetensors / .pt / "
        ".npz file of x_train, y_train (x_test, y_test), or module:function",
    )
    parser.add_argument(
        "--split", choices=SPLITS, default=split, help=f"split of --data (default {split})"
    )
    parser.add_argument(
        "--batch-size", type=int, default=500, metavar="N", help="examples per batch"
    )


def prepare(
    args: argparse.Namespace,
    checkpoints: Sequence[str],
    *,
    loss: bool = False,
    detect: bool = True,
) -> Prepared:
    """Check and load everything a checkpoint command needs; see the module docstring.

    Args:
        args: Parsed options of :func:`add_model_options` (and :func:`add_data_options`).
        checkpoints: Paths of the checkpoints, the first one loaded into the model;
            none keeps the freshly built (seeded) weights.
        loss: Also check that cross-entropy accepts the model's outputs on the data.
        detect: Detect the spec when no ``--spec`` is given; False leaves it None
            (and needs no example input).

    Raises:
        WsymInputError: Any problem with the options, the files or the data.
    """
    import wsym
    from wsym.io.datasets import load as load_data
    from wsym.models.registry import example_inputs, parse_config, parse_input_shape

    config = parse_config(args.config)
    shape = parse_input_shape(args.input) if args.input else None
    data_name = getattr(args, "data", None)
    dtype = working_dtype(getattr(args, "dtype", None), args)
    if getattr(args, "batch_size", 1) < 1:
        raise WsymInputError(f"--batch-size must be positive, got {args.batch_size}")
    spec_text = read_spec_file(args.spec) if args.spec else None
    no_input = detect and shape is None and spec_text is None and data_name is None
    if no_input and not _from_directory(args, checkpoints):
        raise WsymInputError(NO_INPUT)
    model_spec, model, states, layout = _model_and_states(args, checkpoints, config)
    if no_input:  # a Hugging Face directory: its config says what an input looks like
        shape = default_shape(model.config)
    data = load_data(data_name) if data_name else None
    if data is not None:
        check_data_fits(model, data, model_spec, loss=loss)
    if spec_text is not None:
        spec = spec_from_text(spec_text, args.spec, model)
    elif not detect:
        spec = None
    elif shape is not None:
        spec = wsym.detect(
            model, example_inputs(model_spec, shape, model=model, config=config, seed=args.seed)
        )
    else:
        spec = wsym.detect(model, data.x_train[:DATA_EXAMPLES])
    return Prepared(model=model, spec=spec, states=states, data=data, layout=layout, dtype=dtype)


NO_INPUT = (
    "no example input to detect symmetries with: pass --input SHAPE (e.g. 8,40), "
    "--data NAME, or --spec FILE saved by 'wsym detect --json'"
)
#: Tokens per example of the default input of a Hugging Face text model.
DEFAULT_TOKENS = 16


def _from_directory(args: argparse.Namespace, checkpoints: Sequence[str]) -> bool:
    """Whether the model is built from a Hugging Face directory (``--model`` or the first one)."""
    from wsym.io import hf

    source = args.model if args.model is not None else (checkpoints[0] if checkpoints else None)
    return source is not None and hf.is_directory(source)


def default_shape(config: Any) -> tuple[int, ...]:
    """An example input's shape for a Hugging Face model: 2 x 16 token ids, or 2 images.

    Raises:
        WsymInputError: The config names neither a vocabulary nor an image size.
    """
    if getattr(config, "vocab_size", None):
        longest = getattr(config, "max_position_embeddings", None)
        tokens = min(DEFAULT_TOKENS, longest) if isinstance(longest, int) else DEFAULT_TOKENS
        return (2, tokens)
    size = getattr(config, "image_size", None)
    if isinstance(size, int):
        return (2, getattr(config, "num_channels", 3), size, size)
    raise WsymInputError(NO_INPUT)


def _model_and_states(args: argparse.Namespace, checkpoints: Sequence[str], config: dict):
    """``(model spec, model, states, layout)``: the model and every checkpoint, checked.

    A model directory (``--model DIR``, or the first checkpoint when ``--model``
    is left out) builds the model from its config with its weights; a checkpoint
    that is a directory is read shard by shard (:mod:`wsym.io.hf`), any other
    as a file. The first checkpoint is loaded into the model.
    """
    from wsym.io import hf, load_state_dict
    from wsym.io.checkpoint import check_compatible, check_finite
    from wsym.models.registry import build_model

    source = args.model
    if source is None:
        if not checkpoints or not hf.is_directory(checkpoints[0]):
            raise WsymInputError(
                "no model: pass --model SPEC (e.g. --model wsym:mlp), or give Hugging Face "
                "model directories as the checkpoints"
            )
        source = checkpoints[0]
    layout = (
        hf.read_directory(checkpoints[0])
        if checkpoints and hf.is_directory(checkpoints[0])
        else None
    )
    if hf.is_directory(source):
        model, own = hf.build_from_directory(source)
        model_spec = f"hf:{model.config.model_type}"
    else:
        torch.manual_seed(args.seed)
        model, own, model_spec = build_model(source, config), None, source
    tied = hf.tied_keys(model)
    states = []
    for path in checkpoints:
        if (
            own is not None
            and hf.is_directory(path)
            and Path(path).resolve() == Path(source).resolve()
        ):
            state = own
        elif hf.is_directory(path):
            directory = hf.read_directory(path)
            hf.check_fits(directory, model)
            state = hf.load_directory(directory, tied)
        else:
            state = load_state_dict(path)
        check_finite(state, path)
        check_compatible(model.state_dict(), state, path)
        states.append(state)
    if states and states[0] is not own:
        model.load_state_dict(states[0])
    return model_spec, model, states, layout


#: Working precisions of canonicalization, alignment and merging (their SVDs, eigensolves).
DTYPES = {"float32": torch.float32, "float64": torch.float64}


def working_dtype(name: str | None, args: argparse.Namespace) -> torch.dtype | None:
    """The ``--dtype`` a checkpoint command works in (None: the default), or a one-line error."""
    if name is None:
        return None
    if name in DTYPES:
        return DTYPES[name]
    if name in ("float16", "half", "bfloat16"):
        raise WsymInputError(
            f"wsym {args.command} cannot run in {name} (its SVDs and eigensolves have no {name} "
            "kernels on the CPU); use --dtype float32 (the outputs keep the checkpoints' "
            f"{name} storage)"
        )
    raise WsymInputError(f"unknown --dtype {name}; use float32 or float64")


def read_spec_file(path: str) -> str:
    """The text of a spec file, or a one-line error."""
    file = Path(path)
    if not file.is_file():
        what = "is a directory, not a file" if file.is_dir() else "not found"
        raise WsymInputError(f"spec {path} {what}; check the path")
    try:
        return file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise WsymInputError(f"cannot read spec {path}: {err}") from err


def spec_from_text(text: str, path: str, model: torch.nn.Module) -> Any:
    """Parse a saved spec and check that its tensors are the model's, with the same shapes."""
    from wsym import SymmetrySpec

    try:
        spec = SymmetrySpec.from_json(text)
    except (ValueError, KeyError, TypeError, IndexError) as err:
        raise WsymInputError(
            f"spec {path} is not a wsym spec ({type(err).__name__}: {err}); "
            "write one with 'wsym detect --json'"
        ) from err
    state = model.state_dict()
    for key, dims in spec.layouts:
        shape = tuple(tree.size for tree in dims)
        found = tuple(state[key].shape) if key in state else None
        if found != shape:
            what = "has no tensor" if found is None else f"has shape {list(found)} for"
            raise WsymInputError(
                f"spec {path} does not fit the model: the model {what} {key} "
                f"(spec {list(shape)}); detect the spec again on this model"
            )
    return spec


def check_data_fits(
    model: torch.nn.Module, data: Any, model_spec: str, *, loss: bool = False
) -> None:
    """Run the model on a few test examples (and cross-entropy on its outputs)."""
    from wsym.models.calling import eval_mode, model_inputs

    inputs, targets = next(data.batches("test", DATA_EXAMPLES))
    try:
        with torch.no_grad(), eval_mode(model):
            args, kwargs = model_inputs(model, inputs)
            out = model(*args, **kwargs)
            if loss:
                torch.nn.functional.cross_entropy(out, targets)
    except Exception as err:  # shape or dtype errors from inside the model
        raise WsymInputError(
            f"dataset {data.name} (inputs {list(inputs.shape)}, {data.num_classes} classes) "
            f"does not fit {model_spec} ({type(err).__name__}: {first_line(err)}); "
            "pick a matching --data or model config"
        ) from err


def batches(data: Any, split: str, batch_size: int) -> list:
    """All ``(inputs, targets)`` batches of one split, in order."""
    return list(data.batches(split, batch_size))


def matching_batches(data: Any, split: str, batch_size: int) -> list:
    """Batches for activation matching: float64 inputs, all of one size.

    Activation matching traces the model once, on the first batch, with the
    batch size fixed, so a smaller last batch is dropped; it runs in float64.
    """
    out = [
        (x.double() if x.is_floating_point() else x, y) for x, y in batches(data, split, batch_size)
    ]
    if len(out) > 1 and len(out[-1][1]) < len(out[0][1]):
        out.pop()
    return out


def check_out(path: str, first: str) -> Path:
    """Where a checkpoint command writes: a model directory when ``first`` is one, else a file."""
    from wsym.io import hf

    if not hf.is_directory(first):
        return check_state_dict_out(path)
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise WsymInputError(f"cannot write {path}: it is a file; name a directory for the model")
    if not out.parent.is_dir():
        raise WsymInputError(f"cannot write {path}: directory {out.parent} does not exist")
    return out


def write_out(job: Prepared, state: Mapping[str, torch.Tensor], out: Path) -> None:
    """``state`` written atomically: laid out as the first checkpoint's directory, or as a file."""
    from wsym.io import hf, save_state_dict

    if job.layout is not None:
        hf.save_directory(state, job.layout, out)
    else:
        save_state_dict(state, out)


def check_state_dict_out(path: str) -> Path:
    """A checkpoint destination whose suffix and directory are usable."""
    from wsym.io.checkpoint import SAFETENSORS_SUFFIXES, TORCH_SUFFIXES

    out = Path(path)
    if out.suffix.lower() not in SAFETENSORS_SUFFIXES | TORCH_SUFFIXES:
        raise WsymInputError(
            f"cannot write {path}: unsupported suffix {out.suffix or '(none)'!r}; "
            "end --out in .safetensors, .pt, .pth or .bin"
        )
    if out.is_dir():
        raise WsymInputError(f"cannot write {path}: it is a directory; name a file")
    if not out.parent.is_dir():
        raise WsymInputError(f"cannot write {path}: directory {out.parent} does not exist")
    return out


def check_out_dir(path: str) -> Path:
    """An output directory that exists or can be created in an existing parent."""
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise WsymInputError(f"--out {path} is a file; name a directory")
    if not out.exists() and not out.parent.is_dir():
        raise WsymInputError(f"cannot create {path}: directory {out.parent} does not exist")
    return out


def l2_distance(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> float:
    """Euclidean distance over the floating-point tensors the two state dicts share."""
    total = torch.zeros((), dtype=torch.float64)
    for key, value in a.items():
        if key in b and value.is_floating_point():
            total += (value.double() - b[key].double()).pow(2).sum()
    return float(total.sqrt())


def first_line(err: BaseException) -> str:
    """The first line of an exception's message (its type name when empty)."""
    lines = str(err).strip().splitlines()
    return lines[0].strip() if lines else type(err).__name__
