"""What each zoo member draws from its own seeds, and how a member is scored.

A member's randomness comes from three independent streams
(:func:`member_streams`): its initial weights, its data (training subset,
label noise, data order) and its dropout masks. Nothing here depends on the
other members trained alongside, which is what lets batched training give
each member the same bits whichever members it trains with.

* **data** (:class:`DataStream`): a random subset of
  ``n = max(B, round(train_fraction * N))`` training examples; each epoch
  visits it in a fresh random order in batches of ``B``, dropping the last
  incomplete batch, so every step sees exactly ``B`` examples
  (``epochs * (n // B)`` steps in all).
* **label noise**: a fraction ``label_noise`` of the subset gets a wrong label,
  uniform over the other classes (classification), or Gaussian noise of standard
  deviation ``label_noise * std(y)`` on the targets (regression).
* **dropout** (:class:`DropoutMasks`): inverted dropout, a unit kept where the
  member's uniform draw is ``>= p`` and scaled by ``1 / (1 - p)``.
* **metrics** (:func:`member_metrics`): loss and accuracy on the member's own
  training subset with its own (noisy) labels, and on the clean test split.

Data order and masks are drawn :data:`BLOCK` steps at a time.

Example:
    >>> from wsym.zoo.presets import load_preset
    >>> from wsym.zoo.tasks import load_task
    >>> data = load_task(load_preset("mnist1d-mlp")["dataset"])
    >>> hp = {"train_fraction": 0.1, "label_noise": 0.0, "epochs": 3}
    >>> stream = DataStream(data, hp, seed=0, batch=32, regression=False)
    >>> stream.total_steps, tuple(stream.next_block().shape)
    (36, (32, 32))
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn import functional as F

from wsym.errors import WsymInputError
from wsym.io.datasets import Dataset
from wsym.zoo.presets import member_seed
from wsym.zoo.tasks import IGNORE

#: Steps of data order (and dropout masks) drawn at once per member.
BLOCK = 32


def member_streams(seed: int) -> dict[str, int]:
    """Independent seeds of a member's initial weights, data and dropout masks."""
    return {name: member_seed(seed, 0, k) for k, name in enumerate(("init", "data", "dropout"), 1)}


class DataStream:
    """One member's training subset, noisy targets and data order (its own generator)."""

    def __init__(self, data: Dataset, hp: dict[str, Any], seed: int, batch: int, regression: bool):
        gen = torch.Generator().manual_seed(seed)
        n_all = len(data.y_train)
        n = min(n_all, max(batch, round(float(hp["train_fraction"]) * n_all)))
        self.subset = torch.randperm(n_all, generator=gen)[:n]
        targets = data.y_train.clone()
        noise = float(hp["label_noise"])
        if regression:
            scale = noise * float(data.y_train.std())
            targets[self.subset] += scale * torch.randn(n, generator=gen)
        else:
            classes = int(max(data.y_train.max(), data.y_test.max())) + 1
            noisy = self.subset[torch.randperm(n, generator=gen)[: round(noise * n)]]
            shift = torch.randint(1, classes, (len(noisy),), generator=gen)
            if len(noisy) and targets.dim() > 1:
                raise WsymInputError("label_noise needs one label per example, not token targets")
            if len(noisy):
                targets[noisy] = (targets[noisy] + shift) % classes
        self.targets = targets
        self.mask = torch.zeros(n_all, dtype=torch.bool)
        self.mask[self.subset] = True
        self.batch, self.per_epoch = batch, n // batch
        # fine-tune presets fix the number of steps; the others count epochs
        steps = hp.get("steps")
        self.total_steps = int(steps) if steps is not None else int(hp["epochs"]) * self.per_epoch
        self.gen = gen
        self.pending = torch.empty(0, dtype=torch.long)

    def next_block(self) -> torch.Tensor:
        """Example indices of the next :data:`BLOCK` steps, ``(BLOCK, B)``."""
        need, epoch = BLOCK * self.batch, self.per_epoch * self.batch
        parts, have = [self.pending], len(self.pending)
        while have < need:  # one fresh order per epoch, its last incomplete batch dropped
            parts.append(self.subset[torch.randperm(len(self.subset), generator=self.gen)[:epoch]])
            have += epoch
        pending = torch.cat(parts) if len(parts) > 1 else self.pending
        block, self.pending = pending[:need], pending[need:]
        return block.view(BLOCK, self.batch)


class DropoutMasks:
    """Inverted dropout masks of members at named sites, a generator per member.

    Args:
        rates: dropout rate ``p_m`` of each member.
        seeds: dropout seed of each member (:func:`member_streams`).
        shapes: per-example output shape of each site, in forward order (the
            masks of a block are drawn site by site, member by member).
    """

    def __init__(self, rates: list[float], seeds: list[int], shapes: dict[str, torch.Size]):
        self.rates, self.shapes = rates, dict(shapes)
        self.gens = [
            torch.Generator().manual_seed(s) if r > 0 else None
            for r, s in zip(rates, seeds, strict=True)
        ]

    def next_block(self, rows: list[int]) -> dict[str, torch.Tensor]:
        """Masks ``(M, BLOCK, *shape)`` of members ``rows`` for the next steps (``{}``: none).

        Member ``r`` keeps a unit where its uniform draw is ``>= p_r`` and scales
        it by ``1 / (1 - p_r)``; members with ``p_r = 0`` draw nothing (all ones).
        """
        rates = [self.rates[r] for r in rows]
        if not self.shapes or not any(rates):
            return {}
        rate = torch.tensor(rates)
        scale = 1.0 / (1.0 - rate)
        out = {}
        for site, shape in self.shapes.items():
            draws = torch.empty(len(rows), BLOCK, *shape)
            for slot, r, p in zip(draws, rows, rates, strict=True):
                if p == 0:
                    slot.fill_(1.0)
                else:
                    slot.uniform_(generator=self.gens[r])
            per_member = (-1, *(1,) * (draws.dim() - 1))
            torch.ge(draws, rate.view(per_member), out=draws)  # 1.0 where kept, else 0.0
            out[site] = draws.mul_(scale.view(per_member))
        return out


def example_loss(
    out: torch.Tensor, y: torch.Tensor, regression: bool, smoothing: torch.Tensor | None = None
) -> torch.Tensor:
    """Per-example loss ``(M, B)`` of outputs ``(M, B, C)`` (or ``(M, B)``) and targets.

    ``smoothing`` ``(M,)``: each member's label smoothing ``eps``, the loss
    ``(1 - eps) CE + eps mean_c(-log p_c)`` (``F.cross_entropy``'s ``label_smoothing``).
    Token targets ``(M, B, T)`` (outputs ``(M, B, T, C)``, masked-token pretraining):
    the mean cross-entropy over each example's positions not marked ``IGNORE``.
    """
    if regression:
        return (out - y) ** 2
    if y.dim() == 3:
        return _token_loss(out, y)
    m, b = y.shape
    ce = F.cross_entropy(out.reshape(m * b, -1), y.reshape(-1), reduction="none").view(m, b)
    if smoothing is None:
        return ce
    uniform = -out.log_softmax(dim=-1).mean(dim=-1)
    eps = smoothing.view(m, 1)
    return (1 - eps) * ce + eps * uniform


def _token_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    ce = F.cross_entropy(out.flatten(0, 2), y.flatten(), reduction="none").view(y.shape)
    return ce.sum(-1) / (y != IGNORE).sum(-1).clamp(min=1)


def _token_metrics(train_out, test_out, targets, member_mask, y_test) -> dict[str, torch.Tensor]:
    """Loss and accuracy over the scored (not ``IGNORE``) tokens of each member's examples."""

    def score(out, y, rows):
        valid = (y != IGNORE) & rows.unsqueeze(-1)
        ce = F.cross_entropy(out.flatten(0, 2), y.flatten(), reduction="none").view(y.shape)
        right = (out.argmax(-1) == y) & valid
        count = valid.sum((1, 2)).clamp(min=1)
        return (ce * valid).sum((1, 2)) / count, right.sum((1, 2)) / count

    test_y = y_test.expand(len(targets), *y_test.shape)
    train_loss, train_acc = score(train_out, targets, member_mask)
    test_loss, test_acc = score(test_out, test_y, torch.ones(test_y.shape[:2], dtype=torch.bool))
    return {
        "train_loss": train_loss,
        "test_loss": test_loss,
        "train_acc": train_acc,
        "test_acc": test_acc,
        "gap": train_acc - test_acc,
    }


def member_metrics(
    train_out: torch.Tensor,
    test_out: torch.Tensor,
    streams: list[DataStream],
    y_test: torch.Tensor,
    regression: bool,
) -> dict[str, torch.Tensor]:
    """Loss, accuracy and gap ``(M,)`` of members from their outputs on all examples.

    ``train_out`` ``(M, N, ...)`` are the members' outputs on every training
    example; each member is scored on its own subset with its own targets
    (``streams``); a classifier's loss is computed on that subset only.
    ``test_out`` ``(M, N_test, ...)`` is scored against the clean ``y_test``.
    The gap is ``train_acc - test_acc`` (classification) or
    ``test_loss - train_loss`` (regression, whose accuracies are NaN).
    """
    targets = torch.stack([s.targets for s in streams])
    member_mask = torch.stack([s.mask for s in streams])
    if targets.dim() == 3:
        return _token_metrics(train_out, test_out, targets, member_mask, y_test)
    mask = member_mask.float()
    count = mask.sum(dim=1)
    test_y = y_test.expand(len(streams), -1)
    if regression:
        train_loss = example_loss(train_out, targets, regression)
    else:  # cross-entropy on each member's own subset only (zero elsewhere, masked anyway)
        train_loss = torch.zeros(member_mask.shape, dtype=train_out.dtype)
        rows, cols = torch.nonzero(member_mask, as_tuple=True)
        train_loss[rows, cols] = F.cross_entropy(
            train_out[rows, cols], targets[rows, cols], reduction="none"
        )
    metrics = {
        "train_loss": (train_loss * mask).sum(1) / count,
        "test_loss": example_loss(test_out, test_y, regression).mean(dim=1),
    }
    if regression:
        metrics["train_acc"] = metrics["test_acc"] = torch.full_like(count, float("nan"))
        metrics["gap"] = metrics["test_loss"] - metrics["train_loss"]
    else:
        correct = (train_out.argmax(-1) == targets).float()
        metrics["train_acc"] = (correct * mask).sum(1) / count
        metrics["test_acc"] = (test_out.argmax(-1) == test_y).float().mean(dim=1)
        metrics["gap"] = metrics["train_acc"] - metrics["test_acc"]
    return metrics


def member_results(
    members: list, state: dict[str, torch.Tensor], keys: list[str], metrics: dict, totals
) -> list[tuple[Any, dict[str, torch.Tensor], dict[str, float]]]:
    """``(member, state dict, values)`` per member from stacked states and metrics.

    ``state`` holds ``(M, ...)`` stacks; ``values`` are the member's metrics as floats,
    its checkpoint epoch and its number of optimizer steps (``totals``).
    """
    results = []
    for i, member in enumerate(members):
        values = {k: float(v[i]) for k, v in metrics.items()}
        values["epoch"] = int(member.hyperparameters["epochs"])
        values["steps"] = int(totals[i])
        results.append((member, {k: state[k][i].contiguous() for k in keys}, values))
    return results
