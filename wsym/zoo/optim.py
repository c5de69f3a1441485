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
  ``p <- p - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)``.

Only the rule a member uses is computed: with the members ordered SGD first
(then Adam), each rule runs on a contiguous block of rows with
``torch._foreach`` kernels.

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

from dataclasses import dataclass, field

import torch

MOMENTUM, BETA1, BETA2, EPS = 0.9, 0.9, 0.999, 1e-8


@dataclass
class Hyper:
    """Per-member optimizer hyperparameters, each ``(M,)``.

    ``n_sgd`` (derived) is the number of leading SGD members when the members
    are ordered SGD first, then Adam; ``None`` otherwise.
    """

    lr: torch.Tensor
    weight_decay: torch.Tensor
    is_adam: torch.Tensor
    n_sgd: int | None = field(init=False)

    def __post_init__(self) -> None:
        k = int((~self.is_adam).sum())
        self.n_sgd = k if not bool(self.is_adam[:k].any()) else None

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
    """One optimizer step of every member, in place on ``params`` and ``state``.

    Each member
    is updated by its own rule only: with the members ordered SGD first
    (``hyper.n_sgd``), both rules run on contiguous row ranges with
    ``torch._foreach`` kernels; otherwise the rows are permuted into that order
    and back.
    """
    state["step"] += 1
    t = float(state["step"])
    if hyper.n_sgd is None:
        _step_unordered(params, grads, state, hyper, t)
    else:
        _step_ordered(params, grads, state, hyper, t)


def _step_ordered(params, grads, state, hyper, t) -> None:
    k, total, names = hyper.n_sgd, len(hyper.lr), list(params)
    for rows, rule in ((slice(0, k), _sgd), (slice(k, total), _adam)):
        if rows.start == rows.stop:
            continue
        rule(
            [params[n][rows] for n in names],
            [grads[n][rows] for n in names],
            {s: [state[f"{s}:{n}"][rows] for n in names] for s in "bmv"},
            hyper.lr[rows],
            hyper.weight_decay[rows],
            t,
        )


def _per_member(values: torch.Tensor, like: list[torch.Tensor]) -> list[torch.Tensor]:
    return [values.view(-1, *(1,) * (p.dim() - 1)) for p in like]


def _sgd(p, g, state, lr, wd, t) -> None:
    """SGD: ``g <- g + wd p``, ``b <- mu b + g``, ``p <- p - lr b`` (``b`` starts at 0)."""
    g = torch._foreach_addcmul(g, p, _per_member(wd, p))
    b = state["b"]
    torch._foreach_mul_(b, MOMENTUM)
    torch._foreach_add_(b, g)
    torch._foreach_addcmul_(p, b, _per_member(-lr, p))


def _adam(p, g, state, lr, wd, t) -> None:
    """``torch.optim.Adam``'s update, per-member ``lr`` and coupled weight decay ``wd``."""
    g = torch._foreach_addcmul(g, p, _per_member(wd, p))
    m, v = state["m"], state["v"]
    torch._foreach_lerp_(m, g, 1 - BETA1)
    torch._foreach_mul_(v, BETA2)
    torch._foreach_addcmul_(v, g, g, value=1 - BETA2)
    denom = torch._foreach_sqrt(v)
    torch._foreach_div_(denom, (1 - BETA2**t) ** 0.5)
    torch._foreach_add_(denom, EPS)
    direction = torch._foreach_div(m, denom)
    torch._foreach_addcmul_(p, direction, _per_member(-lr / (1 - BETA1**t), p))


def _step_unordered(params, grads, state, hyper, t) -> None:
    """:func:`step` for members in any order: permute SGD first, update, permute back."""
    order = torch.argsort(hyper.is_adam.to(torch.int8), stable=True)
    ordered = hyper.select(order)
    state_sorted = {k: v[order] for k, v in state.items() if k != "step"}
    params_sorted = {k: v[order] for k, v in params.items()}
    grads_sorted = {k: v[order] for k, v in grads.items()}
    _step_ordered(params_sorted, grads_sorted, state_sorted, ordered, t)
    for k, v in params_sorted.items():
        params[k][order] = v
    for k, v in state_sorted.items():
        state[k][order] = v


def select_state(state: dict[str, torch.Tensor], rows: torch.Tensor) -> dict[str, torch.Tensor]:
    """The optimizer state of members ``rows`` only (the step count is shared)."""
    return {k: (v if k == "step" else v[rows]) for k, v in state.items()}
