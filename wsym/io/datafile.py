"""A user's own classification data for ``--data``: a file of tensors or a function.

* ``path.safetensors`` / ``path.pt`` / ``path.npz``: tensors ``x_train``, ``y_train`` and
  optionally ``x_test``, ``y_test`` (or ``inputs``, ``targets``: one set, used for both
  splits). ``.pt`` files load with ``weights_only=True``, ``.npz`` without pickles.
* ``module:function`` or ``file.py:function``: returns a :class:`wsym.io.dataset.Dataset`,
  a tuple ``(x_train, y_train)`` or ``(x_train, y_train, x_test, y_test)``, or a dict
  with the keys above.

Inputs become float32, labels int64 (one label per example, ``0..C-1``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from wsym.errors import WsymInputError
from wsym.io.dataset import Dataset

SUFFIXES = (".safetensors", ".pt", ".pth", ".npz")
_KEYS = "x_train, y_train (and x_test, y_test) or inputs, targets"


def is_user_data(name: str) -> bool:
    """Whether ``name`` names a user's data (a file or a function) rather than a built-in."""
    return name.lower().endswith(SUFFIXES) or ":" in name


def load_user_data(name: str):
    """The :class:`wsym.io.dataset.Dataset` in the file or from the function ``name``."""
    if name.lower().endswith(SUFFIXES):
        tensors: Any = _read_file(Path(name))
    else:
        from wsym.models.registry import import_callable

        fn = import_callable(name, "a function returning the data")
        try:
            tensors = fn()
        except Exception as err:
            raise WsymInputError(
                f"--data {name} raised {type(err).__name__}: {err}; fix the function"
            ) from err
    return _dataset(tensors, name)


def _read_file(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise WsymInputError(f"data file {path} not found (looked in {Path.cwd()}); check the path")
    if path.suffix.lower() == ".npz":
        try:
            with np.load(path, allow_pickle=False) as arrays:
                return {k: torch.from_numpy(np.array(arrays[k])) for k in arrays.files}
        except (ValueError, OSError) as err:
            raise WsymInputError(
                f"cannot read {path} as .npz without pickles ({err}); "
                "save it with numpy.savez(path, x_train=..., y_train=...)"
            ) from err
    from wsym.io.checkpoint import load_state_dict

    return load_state_dict(path)


def _dataset(tensors: Any, name: str):
    if isinstance(tensors, Dataset):
        return tensors
    if isinstance(tensors, tuple | list) and len(tensors) in (2, 4):
        keys = ("x_train", "y_train", "x_test", "y_test")[: len(tensors)]
        tensors = dict(zip(keys, tensors, strict=True))
    if not isinstance(tensors, Mapping):
        raise WsymInputError(f"--data {name} gave a {type(tensors).__name__}; give tensors {_KEYS}")
    if "inputs" in tensors and "targets" in tensors and "x_train" not in tensors:
        tensors = {"x_train": tensors["inputs"], "y_train": tensors["targets"]}
    missing = [k for k in ("x_train", "y_train") if k not in tensors]
    if missing:
        raise WsymInputError(
            f"--data {name} has no {', '.join(missing)} (found {', '.join(map(str, tensors))}); "
            f"give tensors {_KEYS}"
        )
    x_train, y_train = _inputs(tensors["x_train"], name), _labels(tensors["y_train"], name)
    x_test = _inputs(tensors.get("x_test", x_train), name)
    y_test = _labels(tensors.get("y_test", y_train), name)
    for x, y, split in ((x_train, y_train, "train"), (x_test, y_test, "test")):
        if len(x) != len(y) or len(x) == 0:
            raise WsymInputError(
                f"--data {name}: {split} has {len(x)} inputs and {len(y)} labels; "
                "give one label per example"
            )
    return Dataset(x_train, y_train, x_test, y_test, name=name)


def _inputs(x: Any, name: str) -> torch.Tensor:
    x = torch.as_tensor(x)
    if not x.is_floating_point() or not bool(torch.isfinite(x).all()):
        raise WsymInputError(f"--data {name}: inputs must be finite floats; got {x.dtype}")
    return x.float()


def _labels(y: Any, name: str) -> torch.Tensor:
    y = torch.as_tensor(y)
    if y.ndim != 1 or y.is_floating_point() or (len(y) and int(y.min()) < 0):
        raise WsymInputError(
            f"--data {name}: labels must be one non-negative integer per example "
            f"(got {y.dtype} of shape {tuple(y.shape)})"
        )
    return y.long()
