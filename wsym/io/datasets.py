"""Offline datasets as tensors: procedural mnist1d and scikit-learn's digits.

Nothing here downloads. mnist1d comes from the ``mnist1d`` package's procedural
generator (``mnist1d.data.make_dataset``), scikit-learn bundles the digits with
the package.

* ``mnist1d``: inputs ``(N, 40)``, 4000 train / 1000 test, from the generator.
* ``mnist1d-seq``: the same, as 10 patches of 4 features, ``(N, 10, 4)``.
* ``mnist1d-large``: five times as many examples from the same generator and
  arguments, 20000 train / 5000 test (about 7 s to generate, then cached); for
  experiments where 4000 examples are memorized (wide MLPs reach 100% train
  accuracy).
* ``digits``: images ``(N, 1, 8, 8)`` in [0, 1], 1437 train / 360 test (an 80/20
  split of scikit-learn's 1797 digits, shuffled by ``seed``: a user's own split of the
  same digits overlaps it).
* a user's own data: a file or a function (:mod:`wsym.io.datafile`).

Inputs are float32, labels int64 in ``0..9``.
"""

from __future__ import annotations

import functools
import random

import numpy as np
import torch

from wsym.errors import WsymInputError
from wsym.io.datafile import is_user_data, load_user_data
from wsym.io.dataset import SPLITS, Dataset

__all__ = ["NAMES", "SPLITS", "Dataset", "load"]

NAMES = ("mnist1d", "mnist1d-seq", "mnist1d-large", "digits")


def load(name: str, seed: int = 0) -> Dataset:
    """Load a dataset by name (see the module docstring); nothing is downloaded.

    Args:
        name: one of ``"mnist1d"``, ``"mnist1d-seq"``, ``"mnist1d-large"``, ``"digits"``,
            or a user's data file or function (:mod:`wsym.io.datafile`).
        seed: for mnist1d, the seed of its procedural generator (the published
            mnist1d uses 42); for digits, the seed of the 80/20 train/test split.

    Returns:
        A :class:`Dataset` with fresh tensors (safe to modify).

    Example:
        >>> load("digits").x_train.shape
        torch.Size([1437, 1, 8, 8])
    """
    if name == "mnist1d":
        return _from_numpy(*_mnist1d(seed), name=name)
    if name == "mnist1d-large":
        return _from_numpy(*_mnist1d(seed, LARGE), name=name)
    if name == "mnist1d-seq":
        x_train, y_train, x_test, y_test = _mnist1d(seed)
        return _from_numpy(
            x_train.reshape(-1, 10, 4), y_train, x_test.reshape(-1, 10, 4), y_test, name=name
        )
    if name == "digits":
        return _from_numpy(*_digits(seed), name=name)
    if is_user_data(name):
        return load_user_data(name)
    raise WsymInputError(
        f"unknown dataset {name!r}; use one of {', '.join(NAMES)}, a .safetensors / .pt / "
        ".npz file of x_train, y_train (x_test, y_test), or module:function"
    )


def _from_numpy(x_train, y_train, x_test, y_test, name: str) -> Dataset:
    def inputs(a):
        return torch.tensor(a, dtype=torch.float32)

    def labels(a):
        return torch.tensor(a, dtype=torch.int64)

    return Dataset(inputs(x_train), labels(y_train), inputs(x_test), labels(y_test), name=name)


LARGE = 25000  # examples of mnist1d-large (the published mnist1d has 5000)


@functools.lru_cache(maxsize=8)
def _mnist1d(
    seed: int, num_samples: int = 5000, options: tuple[tuple[str, float], ...] = ()
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Generate mnist1d (``num_samples`` examples, 80/20 split); seconds, hence cached.

    ``options`` replace generator arguments (``(("iid_noise_scale", 0.1),)``: a
    shifted distribution). The generator seeds Python's and numpy's global RNGs;
    their states are restored.
    """
    from mnist1d.data import get_dataset_args, make_dataset

    args = get_dataset_args()
    args.seed = seed
    args.num_samples = num_samples
    for key, value in options:
        setattr(args, key, value)
    py_state, np_state = random.getstate(), np.random.get_state()
    try:
        data = make_dataset(args)
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)
    arrays = data["x"], data["y"], data["x_test"], data["y_test"]
    for a in arrays:
        a.setflags(write=False)
    return arrays


@functools.lru_cache(maxsize=1)
def _digits_raw() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 8x8 digits as ``(1797, 1, 8, 8)`` in [0, 1] and labels, read-only."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x, y = (digits.images / 16.0)[:, None], digits.target
    x.setflags(write=False)
    y.setflags(write=False)
    return x, y


def _digits(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The digits split 80/20 by a seeded permutation."""
    x, y = _digits_raw()
    order = np.random.default_rng(seed).permutation(len(y))
    n_train = int(0.8 * len(y))
    train, test = order[:n_train], order[n_train:]
    return x[train], y[train], x[test], y[test]
