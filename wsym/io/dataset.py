"""A classification dataset held in memory: train and test tensors, and their minibatches."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from wsym.errors import WsymInputError

SPLITS = ("train", "test")


@dataclass(frozen=True, eq=False)
class Dataset:
    """A classification dataset held in memory, split into train and test.

    Attributes:
        x_train: training inputs, float32, ``(N, ...)``.
        y_train: training labels, int64, ``(N,)``.
        x_test: test inputs, float32, ``(M, ...)``.
        y_test: test labels, int64, ``(M,)``.
        name: the name it was loaded under.

    Example:
        >>> from wsym.io.datasets import load
        >>> data = load("digits")
        >>> inputs, targets = next(data.batches("test", 32))
        >>> inputs.shape, targets.dtype
        (torch.Size([32, 1, 8, 8]), torch.int64)
    """

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    name: str = ""

    @property
    def num_classes(self) -> int:
        """Number of classes, ``max label + 1`` over both splits."""
        return int(max(self.y_train.max(), self.y_test.max())) + 1

    def split(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``(inputs, labels)`` of ``"train"`` or ``"test"``."""
        if split not in SPLITS:
            raise WsymInputError(f"unknown split {split!r}; use one of {', '.join(SPLITS)}")
        if split == "train":
            return self.x_train, self.y_train
        return self.x_test, self.y_test

    def batches(
        self,
        split: str = "train",
        batch_size: int = 128,
        seed: int | None = None,
        shuffle: bool = False,
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Minibatches ``(inputs, targets)`` of one split; the last may be smaller.

        Args:
            split: ``"train"`` or ``"test"``.
            batch_size: examples per batch.
            seed: seed of the shuffling order (a private generator, so global
                RNG state is untouched); ``None`` draws it from torch's global
                RNG. Ignored unless ``shuffle``.
            shuffle: visit the examples in a random order instead of in order.

        Returns:
            An iterator of ``(inputs, targets)`` with leading dimension
            ``<= batch_size``; the order is drawn when this is called.
        """
        x, y = self.split(split)
        if batch_size < 1:
            raise WsymInputError(f"batch_size must be positive, got {batch_size}")
        order = None
        if shuffle:
            gen = None if seed is None else torch.Generator().manual_seed(seed)
            order = torch.randperm(len(y), generator=gen)
        return minibatches(x, y, batch_size, order)


def minibatches(
    x: torch.Tensor, y: torch.Tensor, batch_size: int, order: torch.Tensor | None
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Consecutive slices of ``(x, y)`` of ``batch_size``, in ``order`` if given."""
    for start in range(0, len(y), batch_size):
        if order is None:
            yield x[start : start + batch_size], y[start : start + batch_size]
        else:
            idx = order[start : start + batch_size]
            yield x[idx], y[idx]
