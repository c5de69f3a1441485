"""Reading and writing state dicts safely.

Checkpoints are read without ever unpickling arbitrary objects: ``.safetensors``
files through :mod:`safetensors`, and ``.pt``/``.pth``/``.bin`` files through
``torch.load(..., weights_only=True)``. Every problem a user can fix (a missing or
corrupt file, a pickle of a whole model, keys that do not fit the model) raises a
one-line :class:`~wsym.errors.WsymInputError`.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Mapping
from pathlib import Path

import torch

from wsym.errors import WsymInputError
from wsym.io.atomic import atomic_path

SAFETENSORS_SUFFIXES = frozenset({".safetensors"})
TORCH_SUFFIXES = frozenset({".pt", ".pth", ".bin"})
WRAPPER_KEYS = ("state_dict", "model")
_MAX_LISTED = 3
_RESAVE_HINT = "re-save it with torch.save(model.state_dict(), path) or safetensors.torch.save_file"


def load_state_dict(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """Load a state dict from a safetensors or weights-only PyTorch checkpoint.

    A ``.pt``/``.pth``/``.bin`` file may hold the state dict itself or a dict
    with the state dict under ``"state_dict"`` or ``"model"`` (as training
    scripts often save it, next to an epoch counter or optimizer state).

    Args:
        path: A ``.safetensors``, ``.pt``, ``.pth`` or ``.bin`` file.

    Returns:
        Mapping from parameter/buffer name to tensor, on the CPU.

    Raises:
        WsymInputError: The file is missing, truncated or corrupt, is not a
            weights-only checkpoint, or does not hold a dict of tensors.

    Example:
        >>> import tempfile, torch
        >>> path = tempfile.mkdtemp() + "/w.safetensors"
        >>> save_state_dict({"w": torch.ones(2)}, path)
        >>> load_state_dict(path)
        {'w': tensor([1., 1.])}
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in SAFETENSORS_SUFFIXES | TORCH_SUFFIXES:
        raise WsymInputError(
            f"unsupported checkpoint type {suffix or '(no suffix)'!r} for {path}; "
            "use a .safetensors, .pt, .pth or .bin file"
        )
    if not path.is_file():
        what = "is a directory, not a file" if path.is_dir() else "not found"
        raise WsymInputError(f"checkpoint {path} {what}; check the path")
    if suffix in SAFETENSORS_SUFFIXES:
        return _load_safetensors(path)
    return _state_dict_from(_load_torch(path), path)


def _load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    try:
        return load_file(path, device="cpu")
    except OSError as err:
        raise WsymInputError(f"cannot read checkpoint {path}: {err.strerror or err}") from err
    except Exception as err:  # SafetensorError and friends: a corrupt or truncated file
        raise WsymInputError(
            f"checkpoint {path} is truncated or corrupt ({_first_line(err)}); "
            "re-download or re-save it"
        ) from err


def _load_torch(path: Path) -> object:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        if "weights only load failed" in str(err).lower():
            raise WsymInputError(
                f"{path} is not a weights-only checkpoint (it pickles Python objects, "
                f"which wsym never unpickles); {_RESAVE_HINT}"
            ) from err
        raise _corrupt(path, err) from err
    except OSError as err:
        raise WsymInputError(f"cannot read checkpoint {path}: {err.strerror or err}") from err
    except Exception as err:  # RuntimeError, EOFError, KeyError, struct.error, ...
        raise _corrupt(path, err) from err


def _corrupt(path: Path, err: BaseException) -> WsymInputError:
    return WsymInputError(
        f"checkpoint {path} is truncated or corrupt ({type(err).__name__}: "
        f"{_first_line(err)}); re-download or re-save it"
    )


def _state_dict_from(obj: object, path: Path) -> dict[str, torch.Tensor]:
    """Unwrap ``{"state_dict": ...}``/``{"model": ...}`` and check every value is a tensor."""
    if isinstance(obj, Mapping):
        for key in WRAPPER_KEYS:
            if isinstance(obj.get(key), Mapping):
                obj = obj[key]
                break
    if not isinstance(obj, Mapping):
        raise WsymInputError(
            f"{path} holds a {type(obj).__name__}, not a dict of tensors; {_RESAVE_HINT}"
        )
    if not obj:
        raise WsymInputError(f"{path} holds an empty dict; {_RESAVE_HINT}")
    bad = [
        key
        for key, value in obj.items()
        if not isinstance(key, str) or not isinstance(value, torch.Tensor)
    ]
    if bad:
        raise WsymInputError(
            f"{path} holds non-tensor entries ({_listing([repr(k) for k in bad])}), "
            f"not a state dict; {_RESAVE_HINT}"
        )
    return dict(obj)


def save_state_dict(
    state_dict: Mapping[str, torch.Tensor],
    path: str | os.PathLike[str],
    metadata: Mapping[str, str] | None = None,
) -> None:
    """Write a state dict atomically, as safetensors or as a PyTorch ``.pt`` file.

    The tensors are written to a temporary file in the destination's directory,
    flushed to disk, and moved over ``path`` with :func:`os.replace`; a reader
    never sees a partly written checkpoint, and a failed write leaves nothing.
    Tensors that share storage (tied weights) are copied apart for safetensors.

    Args:
        state_dict: Mapping from name to tensor.
        path: Destination ending in ``.safetensors``, ``.pt``, ``.pth`` or ``.bin``.
        metadata: Optional string metadata (safetensors header only).

    Raises:
        WsymInputError: Unsupported suffix, missing directory, or non-tensor values.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in SAFETENSORS_SUFFIXES | TORCH_SUFFIXES:
        raise WsymInputError(
            f"cannot save to {path}: unsupported suffix {suffix or '(none)'!r}; "
            "use .safetensors, .pt, .pth or .bin"
        )
    if not path.parent.is_dir():
        raise WsymInputError(f"cannot save to {path}: directory {path.parent} does not exist")
    tensors = _detached(state_dict)
    with atomic_path(path) as tmp:
        if suffix in SAFETENSORS_SUFFIXES:
            from safetensors.torch import save_file

            save_file(tensors, tmp, metadata=dict(metadata) if metadata else None)
        else:
            torch.save(tensors, tmp)


def _detached(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """CPU, contiguous tensors that each own their storage (as safetensors requires)."""
    seen: set[int] = set()
    out: dict[str, torch.Tensor] = {}
    for key, value in state_dict.items():
        if not isinstance(key, str) or not isinstance(value, torch.Tensor):
            raise WsymInputError(
                f"cannot save entry {key!r} of type {type(value).__name__}; "
                "a state dict maps str names to tensors"
            )
        tensor = value.detach().cpu()
        storage = tensor.untyped_storage()
        is_view = storage.nbytes() != tensor.numel() * tensor.element_size()
        if storage.data_ptr() in seen or is_view or not tensor.is_contiguous():
            tensor = tensor.clone(memory_format=torch.contiguous_format)
        seen.add(tensor.untyped_storage().data_ptr())
        out[key] = tensor
    return out


def check_compatible(
    model_state: Mapping[str, torch.Tensor],
    loaded_state: Mapping[str, torch.Tensor],
    source: str | os.PathLike[str] | None = None,
) -> None:
    """Check that a loaded state dict fits a model's state dict key for key.

    Args:
        model_state: The model's own ``state_dict()``.
        loaded_state: The state dict read from a checkpoint.
        source: The checkpoint's path, named in the error message.

    Raises:
        WsymInputError: One line listing (a few of) the missing keys, the
            unexpected keys and the shape mismatches.

    Example:
        >>> import torch
        >>> check_compatible({"w": torch.zeros(2, 3)}, {"w": torch.ones(2, 3)})
        >>> check_compatible({"w": torch.zeros(2, 3)}, {"w": torch.ones(3)})
        Traceback (most recent call last):
        ...
        wsym.errors.WsymInputError: checkpoint does not fit the model: 1 shape mismatch (w: model [2, 3] vs checkpoint [3]); build the model with the config the checkpoint was saved from
    """  # noqa: E501
    missing = sorted(set(model_state) - set(loaded_state))
    unexpected = sorted(set(loaded_state) - set(model_state))
    mismatched = [
        f"{key}: model {list(model_state[key].shape)} vs checkpoint {list(loaded_state[key].shape)}"
        for key in sorted(set(model_state) & set(loaded_state))
        if tuple(model_state[key].shape) != tuple(loaded_state[key].shape)
    ]
    problems = [
        f"{len(items)} {label}{'' if len(items) == 1 else plural} ({_listing(items)})"
        for items, label, plural in (
            (missing, "missing key", "s"),
            (unexpected, "unexpected key", "s"),
            (mismatched, "shape mismatch", "es"),
        )
        if items
    ]
    if problems:
        name = f"checkpoint {source}" if source is not None else "checkpoint"
        raise WsymInputError(
            f"{name} does not fit the model: {', '.join(problems)}; "
            "build the model with the config the checkpoint was saved from"
        )


def check_finite(
    state_dict: Mapping[str, torch.Tensor], source: str | os.PathLike[str] | None = None
) -> None:
    """Check that every floating-point tensor of a state dict is free of NaN and infinity.

    Args:
        state_dict: Mapping from name to tensor.
        source: The checkpoint's path, named in the error message.

    Raises:
        WsymInputError: One line naming the first tensor with non-finite entries.

    Example:
        >>> import torch
        >>> check_finite({"w": torch.ones(2)})
        >>> check_finite({"w": torch.tensor([1.0, float("nan")])}, "w.pt")
        Traceback (most recent call last):
        ...
        wsym.errors.WsymInputError: checkpoint w.pt has NaN values in tensor 'w' (1 of 2 entries); use a checkpoint from before the training run diverged
    """  # noqa: E501
    for key, value in state_dict.items():
        if not (value.is_floating_point() or value.is_complex()):
            continue
        bad = ~torch.isfinite(value)
        count = int(bad.sum())
        if count:
            kind = "NaN" if bool(torch.isnan(value).any()) else "infinite"
            name = f"checkpoint {source}" if source is not None else "checkpoint"
            raise WsymInputError(
                f"{name} has {kind} values in tensor {key!r} ({count} of {value.numel()} "
                "entries); use a checkpoint from before the training run diverged"
            )


def _listing(items: list[str]) -> str:
    shown = ", ".join(str(item) for item in items[:_MAX_LISTED])
    extra = len(items) - _MAX_LISTED
    return f"{shown}, and {extra} more" if extra > 0 else shown


def _first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return lines[0].strip() if lines else type(err).__name__
