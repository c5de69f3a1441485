"""Build models with random weights from short specs, and example inputs for them.

A model spec is ``SOURCE:NAME``:

- ``torchvision:resnet18`` -- any ``torchvision.models`` builder, ``weights=None``;
- ``timm:vit_tiny_patch16_224`` -- ``timm.create_model(name, pretrained=False)``;
- ``hf:bert`` -- a Hugging Face ``model_type``, through ``AutoConfig.for_model``
  and ``AutoModel.from_config``;
- ``wsym:mlp`` -- a model registered in :data:`BUILTIN_MODELS`;
- ``package.module:factory_fn`` -- any callable returning a module, importable from the
  working directory (as ``python -m`` would) or from the installed packages;
- ``path/to/file.py:factory_fn`` -- the same, from a Python file.

A config (``{"num_classes": 10}``, or ``"num_classes=10"`` on the command line)
is passed as keyword arguments. Weights are never downloaded.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
import os
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from wsym.errors import WsymInputError
from wsym.models import networks, park

#: The architectures that ship with wsym, by name: a zoo member's config
#: ``{"name": NAME, **kwargs}`` builds one; values are ``fn(**config)``.
ARCHITECTURES: dict[str, Callable[..., nn.Module]] = {
    "mlp": networks.MLP,
    "cnn1d": networks.CNN1d,
    "residual_cnn": networks.ResidualCNN,
    "transformer": networks.TinyTransformer,
    "diagonal": networks.DiagonalLinear,
    "park_cnn1d": park.ParkCNN1d,
    "patch_transformer": park.PatchTransformer,
}
#: What ``wsym:NAME`` builds: every shipped architecture, and ``cnn`` for ``residual_cnn``.
BUILTIN_MODELS: dict[str, Callable[..., nn.Module]] = {
    **ARCHITECTURES,
    "cnn": networks.ResidualCNN,
}
#: Optional example-input makers for builtins: ``fn(shape, dtype, generator) -> inputs``.
#: A builtin without one gets ``torch.randn(shape)``.
BUILTIN_INPUTS: dict[str, Callable[[tuple[int, ...], torch.dtype, torch.Generator], Any]] = {}

MODELS_EXTRA_HINT = "pip install 'wsym[models]'"
SPELLING_HINT = (
    "spell a model as torchvision:NAME, timm:NAME, hf:MODEL_TYPE, wsym:NAME, "
    "package.module:factory_fn or file.py:factory_fn"
)
_INT = re.compile(r"[+-]?\d+")
_FLOAT = re.compile(r"[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?")
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def parse_config(text: str | None) -> dict[str, Any]:
    """Parse ``"k=v,k=v"`` into a dict, turning ints, floats and bools into Python values.

    Args:
        text: Comma-separated ``key=value`` pairs; empty or ``None`` gives ``{}``.
            ``true``/``false`` (any case) become bools and ``none``/``null`` None;
            anything that is not a number stays a string.

    Returns:
        The parsed keyword arguments.

    Raises:
        WsymInputError: An item without ``=``, a key that is not an identifier,
            or a key given twice.

    Example:
        >>> parse_config("hidden_size=64,dropout=0.1,bias=false,act=gelu")
        {'hidden_size': 64, 'dropout': 0.1, 'bias': False, 'act': 'gelu'}
    """
    config: dict[str, Any] = {}
    if text is None or not text.strip():
        return config
    for item in text.split(","):
        key, sep, value = (part.strip() for part in item.partition("="))
        if not sep or not _KEY.fullmatch(key):
            raise WsymInputError(
                f"bad config item {item.strip()!r}; write the config as key=value,key=value"
            )
        if key in config:
            raise WsymInputError(f"config key {key!r} is given twice; keep one of them")
        config[key] = _parse_value(value)
    return config


def _parse_value(value: str) -> Any:
    lowered = value.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("none", "null"):
        return None
    if _INT.fullmatch(value):
        return int(value)
    if _FLOAT.fullmatch(value):
        return float(value)
    return value


def parse_input_shape(text: str) -> tuple[int, ...]:
    """Parse an input shape such as ``"1,3,224,224"``.

    Args:
        text: Comma-separated positive integers.

    Returns:
        The shape as a tuple of ints.

    Raises:
        WsymInputError: Empty text, or an entry that is not a positive integer.

    Example:
        >>> parse_input_shape("1, 3, 224, 224")
        (1, 3, 224, 224)
    """
    items = [item.strip() for item in text.split(",")]
    if not all(item.isdigit() and int(item) > 0 for item in items):
        raise WsymInputError(
            f"bad input shape {text!r}; write positive integers separated by commas, "
            "e.g. 1,3,224,224"
        )
    return tuple(int(item) for item in items)


def split_spec(spec: str) -> tuple[str, str]:
    """Split ``"SOURCE:NAME"`` into its two parts.

    Raises:
        WsymInputError: The spec has no ``:`` or an empty side.
    """
    source, sep, name = spec.strip().partition(":")
    if not sep or not source or not name:
        raise WsymInputError(f"unknown model spec {spec!r}; {SPELLING_HINT}")
    return source, name


def build_model(spec: str, config: Mapping[str, Any] | None = None) -> nn.Module:
    """Build a model with random weights from a spec and a config; see the module docstring.

    Args:
        spec: ``torchvision:NAME``, ``timm:NAME``, ``hf:MODEL_TYPE``, ``wsym:NAME``
            or ``package.module:factory_fn``.
        config: Keyword arguments for the builder (the Hugging Face config for ``hf:``).

    Returns:
        The model, in eval mode (dropout off, batch norm on running statistics).

    Raises:
        WsymInputError: Unknown spec or name, a config the builder rejects, an
            attempt to load pretrained weights, or a missing optional package.

    Example:
        >>> build_model("torch.nn:Linear", {"in_features": 4, "out_features": 2})
        Linear(in_features=4, out_features=2, bias=True)
    """
    source, name = split_spec(spec)
    config = dict(config or {})
    if source in _SOURCES:
        model = _SOURCES[source](name, config)
    else:
        model = _build_from_module(source, name, config)
    if not isinstance(model, nn.Module):
        raise WsymInputError(
            f"{spec} returned a {type(model).__name__}, not a torch.nn.Module; "
            "make the factory return the model"
        )
    return model.eval()


def _build_torchvision(name: str, config: dict[str, Any]) -> nn.Module:
    import torchvision.models as models

    _check_known(name, models.list_models(), "torchvision")
    _refuse_pretrained(config, ("weights", "weights_backbone"))
    builder = models.get_model_builder(name)
    if "weights_backbone" in inspect.signature(builder).parameters:
        config["weights_backbone"] = None  # its default downloads an ImageNet backbone
    return _call(builder, f"torchvision:{name}", weights=None, **config)


def _build_timm(name: str, config: dict[str, Any]) -> nn.Module:
    timm = _import_optional("timm", "timm", "timm")
    if not timm.is_model(name):
        _check_known(name, timm.list_models(), "timm")
    _refuse_pretrained(config, ("pretrained",))
    return _call(timm.create_model, f"timm:{name}", name, pretrained=False, **config)


def _build_hf(name: str, config: dict[str, Any]) -> nn.Module:
    transformers = _import_optional("transformers", "transformers", "hf")
    hf_config = hf_model_config(name, config)
    try:
        return transformers.AutoModel.from_config(hf_config)
    except ValueError as err:
        raise WsymInputError(
            f"hf:{name} has no AutoModel class ({_first_line(err)}); pick another model_type"
        ) from err


def hf_model_config(model_type: str, config: Mapping[str, Any] | None = None) -> Any:
    """Hugging Face config for ``model_type`` with ``config`` overrides, typos refused.

    Args:
        model_type: A ``transformers`` model type, e.g. ``"bert"`` or ``"gpt2"``.
        config: Overrides such as ``{"hidden_size": 64}``.

    Returns:
        A ``transformers.PretrainedConfig``.

    Raises:
        WsymInputError: Unknown model type or a config key the model type lacks.
    """
    transformers = _import_optional("transformers", "transformers", "hf")
    config = dict(config or {})
    _check_known(model_type, list(transformers.CONFIG_MAPPING.keys()), "hf")
    default = transformers.AutoConfig.for_model(model_type)
    known = set(default.to_dict()) | set(default.attribute_map)
    known |= set(inspect.signature(type(default).__init__).parameters)
    unknown = sorted(set(config) - known)
    if unknown:
        close = difflib.get_close_matches(unknown[0], sorted(known), n=3)
        hint = f"did you mean {', '.join(close)}?" if close else "check the key names"
        raise WsymInputError(f"hf:{model_type} config has no key {', '.join(unknown)}; {hint}")
    return transformers.AutoConfig.for_model(model_type, **config)


def _build_builtin(name: str, config: dict[str, Any]) -> nn.Module:
    if name not in BUILTIN_MODELS:
        names = ", ".join(f"wsym:{key}" for key in sorted(BUILTIN_MODELS)) or "none yet"
        raise WsymInputError(f"unknown builtin model wsym:{name}; available: {names}")
    return _call(BUILTIN_MODELS[name], f"wsym:{name}", **config)


def _build_from_module(module_name: str, attr: str, config: dict[str, Any]) -> nn.Module:
    spec = f"{module_name}:{attr}"
    return _call(import_callable(spec, "a function returning a model"), spec, **config)


def import_callable(spec: str, what: str) -> Callable[..., Any]:
    """The callable named ``module:attr`` or ``path/to/file.py:attr``.

    The module is imported from the working directory (as ``python -m`` would) or the
    installed packages, a ``.py`` file from its path.

    Args:
        spec: ``package.module:name`` (``name`` may be dotted) or ``file.py:name``.
        what: what the callable should be, for the error message.

    Raises:
        WsymInputError: Nothing importable there, or not a callable.

    Example:
        >>> import_callable("torch.nn:Identity", "a model class")
        <class 'torch.nn.modules.linear.Identity'>
    """
    module_name, attr = split_spec(spec)
    target: Any = _import_file(module_name) if module_name.endswith(".py") else None
    if target is None:
        target = _import_from_working_directory(module_name, spec)
    for part in attr.split("."):
        if not hasattr(target, part):
            raise WsymInputError(f"{module_name} has no attribute {attr!r}; {SPELLING_HINT}")
        target = getattr(target, part)
    if not callable(target):
        raise WsymInputError(f"{spec} is not callable; point to {what}")
    return target


def _import_from_working_directory(module_name: str, spec: str) -> Any:
    """``import module_name`` with the working directory first on the path, as ``python -m``."""
    cwd = os.getcwd()
    added = cwd not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        raise WsymInputError(
            f"cannot import {module_name!r} for {spec} ({err}; looked in the working "
            f"directory {cwd} and the installed packages); run from the directory holding "
            f"it, or name the file, e.g. path/to/{module_name.split('.')[-1]}.py:factory"
        ) from err
    finally:
        if added:
            sys.path.remove(cwd)


def _import_file(path_text: str) -> Any:
    """The module in the Python file ``path_text`` (relative to the working directory)."""
    path = Path(path_text).expanduser()
    if not path.is_file():
        raise WsymInputError(
            f"no Python file {path_text!r} (looked in {Path.cwd()}); give the path of the "
            "file that defines the factory, e.g. models/my_model.py:build"
        )
    name = f"wsym_user_{path.stem}_{abs(hash(str(path.resolve())))}"
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    sys.path.insert(0, str(path.resolve().parent))  # its own imports of sibling files
    try:
        module_spec.loader.exec_module(module)
    except Exception as err:
        raise WsymInputError(
            f"importing {path_text} failed: {type(err).__name__}: {_first_line(err)}; "
            f"fix the file (run `python {path_text}` to see the traceback)"
        ) from err
    finally:
        sys.path.remove(str(path.resolve().parent))
    return module


_SOURCES: dict[str, Callable[..., nn.Module]] = {
    "torchvision": _build_torchvision,
    "timm": _build_timm,
    "hf": _build_hf,
    "wsym": _build_builtin,
}


def example_inputs(
    model_spec: str,
    shape: tuple[int, ...],
    dtype: torch.dtype = torch.float32,
    *,
    model: nn.Module | None = None,
    config: Mapping[str, Any] | None = None,
    seed: int | None = None,
) -> Any:
    """Random example inputs for a model built by :func:`build_model`.

    Vision and generic models get ``torch.randn(shape)``. Hugging Face text
    models get ``{"input_ids": randint(vocab_size, shape)}`` with ``shape`` read
    as ``(batch, seq)`` (plus ``decoder_input_ids`` for encoder-decoders); ones
    without a vocabulary get ``{"pixel_values": randn(shape)}``.

    Args:
        model_spec: The spec the model was built from.
        shape: Input shape.
        dtype: Floating dtype for float inputs (token ids are always int64).
        model: The built model; for ``hf:`` its config gives the vocabulary size.
        config: The config the model was built with (used when ``model`` is None).
        seed: Seed for a private generator; None draws from the global RNG.

    Returns:
        A tensor, or a dict of keyword arguments for ``model(**inputs)``.

    Raises:
        WsymInputError: A shape that does not fit the model (e.g. not 2-D for text).

    Example:
        >>> example_inputs("torchvision:resnet18", (1, 3, 8, 8), seed=0).shape
        torch.Size([1, 3, 8, 8])
    """
    source, name = split_spec(model_spec)
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    if source == "hf":
        hf_config = getattr(model, "config", None)
        if hf_config is None:
            hf_config = hf_model_config(name, config)
        return _hf_inputs(f"hf:{name}", hf_config, shape, dtype, generator)
    if source == "wsym" and name in BUILTIN_INPUTS:
        return BUILTIN_INPUTS[name](shape, dtype, generator or torch.default_generator)
    return torch.randn(shape, dtype=dtype, generator=generator)


def _hf_inputs(
    spec: str,
    hf_config: Any,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    generator: torch.Generator | None,
) -> dict[str, torch.Tensor]:
    vocab = getattr(hf_config, "vocab_size", None)
    if not vocab:
        return {"pixel_values": torch.randn(shape, dtype=dtype, generator=generator)}
    if len(shape) != 2:
        raise WsymInputError(
            f"{spec} takes token ids of shape batch,seq but got {len(shape)}-D shape "
            f"{','.join(map(str, shape))}; pass e.g. --input 2,8"
        )
    max_len = getattr(hf_config, "max_position_embeddings", None)
    if isinstance(max_len, int) and shape[1] > max_len:
        raise WsymInputError(
            f"{spec} takes at most {max_len} tokens but the input has {shape[1]}; "
            "shorten the sequence or raise max_position_embeddings"
        )
    ids = torch.randint(0, vocab, shape, generator=generator)
    inputs = {"input_ids": ids}
    if getattr(hf_config, "is_encoder_decoder", False):
        inputs["decoder_input_ids"] = torch.randint(0, vocab, shape, generator=generator)
    return inputs


def _import_optional(module: str, package: str, source: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise WsymInputError(
            f"{source}: models need the {package} package, which is not installed; "
            f"{MODELS_EXTRA_HINT}"
        ) from err


def _check_known(name: str, names: list[str], source: str) -> None:
    if name in names:
        return
    close = sorted((known for known in names if known.startswith(name)), key=len)[:3]
    close = close or difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(f'{source}:{c}' for c in close)}?" if close else ""
    raise WsymInputError(
        f"unknown model {source}:{name}; {hint or 'check the name'} ({SPELLING_HINT})"
    )


def _refuse_pretrained(config: dict[str, Any], keys: tuple[str, ...]) -> None:
    """Refuse (and remove) config keys that would download weights."""
    for key in keys:
        if config.pop(key, None) not in (None, False):
            raise WsymInputError(
                f"config key {key!r} asks for pretrained weights, which wsym never downloads; "
                "drop it and pass a local file with --checkpoint"
            )


def _call(fn: Callable[..., Any], spec: str, *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except TypeError as err:
        message = _first_line(err)
        if "argument" not in message:  # a bug inside the builder, not a bad config
            raise
        raise WsymInputError(
            f"{spec} rejected the config ({message}); fix the config keys"
        ) from err


def _first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return lines[0].strip() if lines else type(err).__name__
