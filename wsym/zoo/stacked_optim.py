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

Only the rule a member uses is computed: each rule runs on the runs of
consecutive rows whose members use it, one ``torch._foreach`` kernel per
operation for all of them.

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
#: Up to this many parameters (all members), a stack mixing SGD and Adam members computes
#: both rules on one tensor (fewer kernels) rather than each on its own rows.
SMALL_STACK = 2**16


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

    Each member is updated by its own rule only (:class:`Plan`), in any order;
    ``grads`` are left as they are.
    """
    Plan(params, {k: g.clone() for k, g in grads.items()}, state, hyper).step()


class Plan:
    """:func:`step` for a fixed stack, its row blocks and per-member views cut once.

    ``grads`` are the tensors the gradients will be written into (in place)
    before each :meth:`step`, which uses them up (adds the weight decay to them
    in place); the plan holds views of them, of ``params`` and
    of ``state``, so a step is only the update kernels (``torch._foreach``,
    one call per kernel for all parameters). Build a new plan whenever the
    stack changes. The members may come in any order: each rule runs on the
    runs of consecutive rows that use it (one ``_foreach`` list of all of
    them), fewest when the members are ordered by rule (``hyper.n_sgd``).
    With ``whole`` (the 1-D buffers of a :class:`FlatStack`), a rule that all
    members use runs on one tensor, with per-element learning rates and weight
    decays: the fewest kernels, which matters once few members are left.
    """

    def __init__(
        self,
        params: dict[str, torch.Tensor],
        grads: dict[str, torch.Tensor],
        state: dict[str, torch.Tensor],
        hyper: Hyper,
        whole: dict[str, torch.Tensor] | None = None,
    ):
        names, total = list(params), len(hyper.lr)
        n_adam = int(hyper.is_adam.sum())
        self.state, self.blocks = state, []
        self.tracked = any(p.requires_grad for p in params.values())
        mixed = 0 < n_adam < total
        if whole is not None and (not mixed or whole["param"].numel() <= SMALL_STACK):
            # one tensor for everything, per-element hyperparameters
            sizes = [params[n][0].numel() for n in names]
            lr, wd, adam = (
                torch.cat([h.view(-1, 1).expand(-1, n).reshape(-1) for n in sizes])
                for h in (hyper.lr, hyper.weight_decay, hyper.is_adam)
            )
            rule = _mixed if mixed else _adam if n_adam else _sgd
            slots = {s: [whole[s]] for s in "bmv"}
            if mixed:
                slots["adam"] = [adam]
            if n_adam:
                slots["work"] = [torch.empty_like(whole["param"])]
            self.blocks.append((rule, [whole["param"]], [whole["grad"]], slots, [-lr], [wd]))
            return
        runs = _runs(hyper.is_adam.tolist())
        for flag, rule in ((False, _sgd), (True, _adam)):
            rows = [r for r, f in runs if f == flag]
            if not rows:
                continue
            p = [params[n][r] for r in rows for n in names]
            self.blocks.append(
                (
                    rule,
                    p,
                    [grads[n][r] for r in rows for n in names],
                    {
                        **{s: [state[f"{s}:{n}"][r] for r in rows for n in names] for s in "bmv"},
                        "work": [torch.empty_like(x) for x in p] if flag else [],
                    },
                    [_per_member(-hyper.lr[r], params[n]) for r in rows for n in names],
                    [_per_member(hyper.weight_decay[r], params[n]) for r in rows for n in names],
                )
            )

    def step(self) -> None:
        """One step of every member, with the gradients now in the plan's ``grads``."""
        if self.tracked:
            with torch.no_grad():
                self._step()
        else:  # no autograd to keep out: spare the context manager (a step is ~20 us)
            self._step()

    def _step(self) -> None:
        step = self.state["step"]
        t = float(step) + 1
        step.fill_(t)
        for rule, p, g, slots, neg_lr, wd in self.blocks:
            rule(p, g, slots, neg_lr, wd, t)


def _runs(flags: list[bool]) -> list[tuple[slice, bool]]:
    """Maximal runs of equal consecutive ``flags``: ``[(rows, flag), ...]``."""
    runs, start = [], 0
    for i in range(1, len(flags) + 1):
        if i == len(flags) or flags[i] != flags[start]:
            runs.append((slice(start, i), flags[start]))
            start = i
    return runs


def _per_member(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return values.view(-1, *(1,) * (like.dim() - 1))


def _sgd(p, g, state, neg_lr, wd, t) -> None:
    """SGD: ``g <- g + wd p``, ``b <- mu b + g``, ``p <- p - lr b`` (``b`` starts at 0)."""
    torch._foreach_addcmul_(g, p, wd)  # the gradient buffers are rewritten before each step
    b = state["b"]
    torch._foreach_mul_(b, MOMENTUM)
    torch._foreach_add_(b, g)
    torch._foreach_addcmul_(p, b, neg_lr)


def _adam(p, g, state, neg_lr, wd, t) -> None:
    """``torch.optim.Adam``'s update, per-member ``lr`` and coupled weight decay ``wd``."""
    torch._foreach_addcmul_(g, p, wd)  # the gradient buffers are rewritten before each step
    direction = _adam_direction(g, state["m"], state["v"], t, state["work"])
    torch._foreach_addcmul_(p, direction, neg_lr)


def _adam_direction(g, m, v, t, work) -> list:
    """Adam's bias-corrected direction (in ``work``), updating the moments ``m``, ``v`` with ``g``.

    Shared by :func:`_adam` and :func:`_mixed`, so both give the same bits. The
    kernels are those of ``torch._foreach_sqrt`` and ``torch._foreach_div`` (one
    ``at::sqrt`` / ``at::div`` per tensor), written into the preallocated ``work``
    buffers instead of new tensors.
    """
    torch._foreach_lerp_(m, g, 1 - BETA1)
    torch._foreach_mul_(v, BETA2)
    torch._foreach_addcmul_(v, g, g, value=1 - BETA2)
    for second, denom in zip(v, work, strict=True):
        torch.sqrt(second, out=denom)
    torch._foreach_div_(work, (1 - BETA2**t) ** 0.5)
    torch._foreach_add_(work, EPS)
    for first, denom in zip(m, work, strict=True):
        torch.div(first, denom, out=denom)
    torch._foreach_mul_(work, 1 / (1 - BETA1**t))
    return work


def _mixed(p, g, state, neg_lr, wd, t) -> None:
    """Both rules on every element, each element keeping its member's (``state["adam"]``)."""
    torch._foreach_addcmul_(g, p, wd)  # the gradient buffers are rewritten before each step
    b = state["b"]
    torch._foreach_mul_(b, MOMENTUM)
    torch._foreach_add_(b, g)
    direction = _adam_direction(g, state["m"], state["v"], t, state["work"])
    for d, adam, momentum in zip(direction, state["adam"], b, strict=True):
        torch.where(adam, d, momentum, out=d)
    torch._foreach_addcmul_(p, direction, neg_lr)


class FlatStack:
    """Parameters, gradients and optimizer state of a stack, one 1-D buffer each.

    Each buffer (``param``, ``grad`` and the slots ``b``, ``m``, ``v``) holds
    every parameter of every member, parameter by parameter (``(M, ...)``
    blocks one after another), so each parameter is a contiguous view
    (:meth:`views`) and an update over everything is one kernel.

    Example:
        >>> stack = FlatStack({"w": torch.ones(2, 3), "b": torch.zeros(2)})
        >>> stack.views("param")["w"].shape, stack.buffers["param"].shape
        (torch.Size([2, 3]), torch.Size([8]))
        >>> stack.select(torch.tensor([1])).views("param")["b"].shape
        torch.Size([1])
    """

    KINDS = ("param", "grad", "b", "m", "v")

    def __init__(self, params: dict[str, torch.Tensor], buffers=None, step=None):
        self.shapes = {k: v.shape for k, v in params.items()}
        if buffers is None:
            flat = torch.cat([v.reshape(-1) for v in params.values()])
            buffers = {k: flat if k == "param" else torch.zeros_like(flat) for k in self.KINDS}
        self.buffers = buffers
        self.step = torch.zeros(()) if step is None else step

    def views(self, kind: str) -> dict[str, torch.Tensor]:
        """Per-parameter views ``(M, ...)`` of buffer ``kind``."""
        views, start, flat = {}, 0, self.buffers[kind]
        for name, shape in self.shapes.items():
            size = shape.numel()
            views[name] = flat[start : start + size].view(shape)
            start += size
        return views

    def state(self) -> dict[str, torch.Tensor]:
        """The optimizer state in :func:`init_state`'s form (views of the buffers)."""
        state = {"step": self.step}
        for slot in "bmv":
            state.update({f"{slot}:{k}": v for k, v in self.views(slot).items()})
        return state

    def plan(self, hyper: Hyper) -> Plan:
        """A :class:`Plan` of this stack (gradients to be written into ``views("grad")``)."""
        return Plan(self.views("param"), self.views("grad"), self.state(), hyper, self.buffers)

    def select(self, rows: torch.Tensor) -> FlatStack:
        """The stack of members ``rows`` only (new buffers)."""
        buffers = {
            kind: torch.cat([v[rows].reshape(-1) for v in self.views(kind).values()])
            for kind in self.KINDS
        }
        params = {k: v[rows] for k, v in self.views("param").items()}
        return FlatStack(params, buffers, self.step)


def select_state(state: dict[str, torch.Tensor], rows: torch.Tensor) -> dict[str, torch.Tensor]:
    """The optimizer state of members ``rows`` only (the step count is shared)."""
    return {k: (v if k == "step" else v[rows]) for k, v in state.items()}
