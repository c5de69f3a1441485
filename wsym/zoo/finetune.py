r"""Pretrain-then-fine-tune zoos: one pretrained model, many fine-tuned members.

A preset with a ``pretrain`` entry describes the upstream run, done once per
zoo (:func:`wsym.zoo.pretrain.pretrain`, deterministic; stored as ``pretrained.safetensors`` in
the zoo directory and reused when a build resumes):

* ``dataset``: the upstream task (:mod:`wsym.zoo.tasks`);
* ``architecture``: entries replacing the preset's for the upstream model
  (e.g. ``{"classes": 10}`` for an upstream head of another size);
* ``hyperparameters``: fixed values of the :data:`~wsym.zoo.presets.REQUIRED`
  keys (plus ``steps``, ``warmup``, ``label_smoothing``) for the upstream run;
* ``seed``: the upstream member's seed;
* ``reinit``: state-dict prefixes that every member draws afresh from its own
  init seed instead of taking them from the pretrained model (the head).

Members then start from the pretrained weights and are fine-tuned with their
own hyperparameters. Two of those are fine-tuning's own:

* ``warmup``: fraction ``w`` of the member's ``T`` steps; the learning rate at
  step :math:`t` (:func:`learning_rate`) is

  .. math::
      \eta_t = \eta \min\left(1, \tfrac{t + 1}{W}\right) \ (t < W), \qquad
      \eta_t = \tfrac{\eta}{2}\left(1 + \cos \pi \tfrac{t - W}{T - W}\right) \ (t \ge W),

  with :math:`W = \operatorname{round}(w T)`: linear warm-up, then cosine decay;
* ``label_smoothing``: :math:`\varepsilon`, the loss
  :math:`(1-\varepsilon)\,\mathrm{CE} + \varepsilon\,\overline{-\log p}`.

Example:
    >>> learning_rate(torch.tensor(0), torch.tensor([1.0]), torch.tensor([4]), torch.tensor([8]))
    tensor([0.2500])
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from wsym.errors import WsymInputError

#: Key of the pretrained state dict in the config handed to training units.
STATE_KEY = "pretrained_state"


def learning_rate(
    step: torch.Tensor, lr: torch.Tensor, warmup: torch.Tensor, total: torch.Tensor
) -> torch.Tensor:
    """Per-member learning rates ``(M,)`` at ``step``: warm-up, then cosine decay."""
    t = step.to(torch.float64)
    w, n = warmup.to(torch.float64), total.to(torch.float64)
    ramp = torch.clamp((t + 1) / w.clamp(min=1), max=1.0)
    progress = ((t - w) / (n - w).clamp(min=1)).clamp(0.0, 1.0)
    cosine = 0.5 * (1 + torch.cos(math.pi * progress))
    return (lr.to(torch.float64) * torch.where(t < w, ramp, cosine)).to(lr.dtype)


@dataclass
class Schedule:
    """Members' learning-rate schedules and label smoothing, aligned with the member list.

    ``None`` fields mean none of the members uses them (constant learning rate,
    plain cross-entropy): the trainers then run exactly as without this.
    """

    lr: torch.Tensor | None
    warmup: torch.Tensor | None
    total: torch.Tensor | None
    eps: torch.Tensor | None

    @staticmethod
    def of(hp: list[dict[str, Any]], total: torch.Tensor) -> Schedule:
        """The schedule of members with hyperparameters ``hp`` and ``total`` steps."""
        if any("warmup" in h for h in hp):
            frac = torch.tensor([float(h.get("warmup", 0.0)) for h in hp], dtype=torch.float64)
            lr = torch.tensor([float(h["lr"]) for h in hp])
            warmup = torch.round(frac * total).long()
        else:
            lr = warmup = None
        eps = None
        if any(float(h.get("label_smoothing", 0.0)) for h in hp):
            eps = torch.tensor([float(h.get("label_smoothing", 0.0)) for h in hp])
        return Schedule(lr, warmup, total if lr is not None else None, eps)

    def hyper(self, hyper, rows: torch.Tensor, step: int):
        """``hyper`` (of the members ``rows``) with this step's learning rates."""
        if self.lr is None:
            return hyper
        lr = learning_rate(torch.tensor(step), self.lr[rows], self.warmup[rows], self.total[rows])
        return type(hyper)(lr, hyper.weight_decay, hyper.is_adam)

    def smoothing(self, rows: torch.Tensor) -> torch.Tensor | None:
        """Label smoothing ``(M,)`` of the members ``rows`` (``None``: none smooths)."""
        return None if self.eps is None else self.eps[rows]


def start_from(module: nn.Module, state: dict[str, torch.Tensor], reinit: list[str]) -> None:
    """Load ``state`` into ``module`` in place, but for the entries under ``reinit`` prefixes."""
    own = module.state_dict()
    with torch.no_grad():
        for key, value in own.items():
            if any(key == p or key.startswith(p + ".") for p in reinit):
                continue
            if key not in state or state[key].shape != value.shape:
                raise WsymInputError(
                    f"pretrained model lacks {key!r} of shape {tuple(value.shape)}; list it in "
                    "the preset's pretrain.reinit or make the architectures agree"
                )
            value.copy_(state[key])


def unit_config(config: dict[str, Any], state: dict[str, torch.Tensor] | None) -> dict[str, Any]:
    """The config handed to training units: the preset's, with the pretrained state attached."""
    return config if state is None else {**config, STATE_KEY: state}
