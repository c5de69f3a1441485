"""SGD with momentum and Adam as pure functions on stacked member parameters.

Every tensor carries the members on its leading axis: parameters ``(M, ...)``,
and per-member learning rates, weight decays and optimizer flags ``(M,)``. One
call updates all members at once, each with its own hyperparameters and with
the rule it was sampled with (``is_adam`` selects Adam's update, else SGD's).
Weight decay is the coupled L2 penalty of ``torch.optim.SGD``/``Adam``:
``g <- g + wd * p``. Then

* SGD (momentum ``mu``, dampening 0, as ``torch.optim.SGD``):
  ``b <- mu b + g`` (``b = g`` at the first step), ``p <- p - lr b``;
* Adam (``beta1, beta2, eps`` as ``torch.optim.Adam``):
  ``m <- b1 m + (1 - b1) g``, ``v <- b2 v + (1 - b2) g^2``,
  ``p <- p - lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)``.

The updates match ``torch.optim`` to float32 rounding (``tests/test_zoo_train.py``
checks this against a member trained alone).

Example:
    >>> params = {"w": torch.ones(2, 3)}
    >>> state = init_state(params)
    >>> hyper = Hyper(torch.tensor([0.1, 0.1]), torch.zeros(2), torch.tensor([False, True]))
    >>> step(params, {"w": torch.ones(2, 3)}, state, hyper)
    >>> params["w"][:, 0]
    tensor([0.9000, 0.9000])
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MOMENTUM, BETA1, BETA2, EPS = 0.9, 0.9, 0.999, 1e-8


@dataclass
class Hyper:
    """Per-member optimizer hyperparameters, each ``(M,)``."""

    lr: torch.Tensor
    weight_decay: torch.Tensor
    is_adam: torch.Tensor

    def select(self, rows: torch.Tensor) -> Hyper:
        """The hyperparameters of members ``rows`` only."""
        return Hyper(self.lr[rows], self.weight_decay[rows], self.is_adam[rows])


def init_state(params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Zero momentum ``b``, first moment ``m`` and second moment ``v`` per parameter, step 0."""
    state: dict[str, torch.Tensor] = {"step": torch.zeros(())}
    for name, p in params.items():
        for slot in ("b", "m", "v"):
            state[f"{slot}:{name}"] = torch.zeros_like(p)
    return state


@torch.no_grad()
def step(
    params: dict[str, torch.Tensor],
    grads: dict[str, torch.Tensor],
    state: dict[str, torch.Tensor],
    hyper: Hyper,
) -> None:
    """One optimizer step of every member, in place on ``params`` and ``state``."""
    state["step"] += 1
    t = float(state["step"])
    first = t == 1.0
    for name, p in params.items():
        shape = (-1,) + (1,) * (p.dim() - 1)
        lr, wd = hyper.lr.view(shape), hyper.weight_decay.view(shape)
        adam = hyper.is_adam.view(shape)
        g = grads[name] + wd * p
        b, m, v = state[f"b:{name}"], state[f"m:{name}"], state[f"v:{name}"]
        if first:
            b.copy_(g)
        else:
            b.mul_(MOMENTUM).add_(g)
        m.mul_(BETA1).add_(g, alpha=1 - BETA1)
        v.mul_(BETA2).addcmul_(g, g, value=1 - BETA2)
        denom = (v / (1 - BETA2**t)).sqrt_().add_(EPS)
        adam_dir = (m / (1 - BETA1**t)) / denom
        p.sub_(lr * torch.where(adam, adam_dir, b))


def select_state(state: dict[str, torch.Tensor], rows: torch.Tensor) -> dict[str, torch.Tensor]:
    """The optimizer state of members ``rows`` only (the step count is shared)."""
    return {k: (v if k == "step" else v[rows]) for k, v in state.items()}
