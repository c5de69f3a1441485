"""What every report section reads: the zoo, its spec, data and the run's settings."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import islice
from typing import Any

import torch
from torch import nn

from wsym.group.spec import SymmetrySpec
from wsym.io.progress import Progress


@dataclass
class ReportRun:
    """A zoo and its detected spec, with the knobs of one report run.

    Attributes:
        zoo: a loaded :class:`wsym.zoo.Zoo` (anything with its ``table``,
            ``model``, ``state_dict``, ``split``, ``dataset`` and ``example_inputs``).
        spec: the zoo architecture's symmetries.
        seed: seeds every random choice of the run.
        quick: fewer members and batches (tests, smoke runs).
        progress: draw progress bars on stderr.
    """

    zoo: Any
    spec: SymmetrySpec
    seed: int = 0
    quick: bool = False
    progress: bool = True

    @property
    def data(self) -> Any:
        """The zoo's dataset (the zoo caches it)."""
        return self.zoo.dataset()

    @property
    def steps(self) -> int:
        """Ascent steps (worst case) or antithetic pairs (average case) per measurement."""
        return 3 if self.quick else 10

    @property
    def regression(self) -> bool:
        """Whether members regress (MSE) rather than classify (cross-entropy)."""
        return self.zoo.manifest["config"].get("task", "classification") == "regression"

    def loss_fn(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The members' training loss (mean over the batch)."""
        if self.regression:
            return ((outputs.squeeze(-1) - targets) ** 2).mean()
        return nn.functional.cross_entropy(outputs, targets)

    def model(
        self, member: int, state_dict: dict | None = None, dtype: torch.dtype | None = None
    ) -> nn.Module:
        """Member ``member``'s module in eval mode, with its (or the given) weights."""
        module = self.zoo.model(member)
        if dtype is not None:
            module = module.to(dtype)
        module.load_state_dict(self.zoo.state_dict(member) if state_dict is None else state_dict)
        return module.eval()

    def batches(self, split: str, count: int, size: int = 256) -> list:
        """The first ``count`` batches of the dataset's ``split`` (a fixed order)."""
        return list(islice(self.data.batches(split, size), count))

    def bar(self, total: int, label: str) -> Progress:
        """A progress bar for a step of ``total`` items."""
        return Progress(total, label, enabled=self.progress, min_seconds=1.0)
