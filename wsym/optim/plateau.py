"""A stated stopping rule: train until the smoothed training loss plateaus.

The rule is the same for every optimizer it is applied to, so "trained to its plateau"
means one thing across a comparison.
"""

from __future__ import annotations

import math

from wsym.errors import WsymInputError


class Plateau:
    r"""Stop when the smoothed training loss stops improving, or at a step cap.

    Each step's training loss :math:`\ell_t` feeds a bias-corrected exponential moving
    average :math:`s_t` (weight ``beta``). Every ``every`` steps :math:`s_t` is recorded
    as a check :math:`c_k`; from the ``window``-th check on, the relative improvement
    over the last ``window`` checks is

    .. math::  r_k = \frac{c_{k - w} - c_k}{|c_{k - w}|},

    and a check with :math:`r_k < \mathrm{tol}` is a strike (any other check resets the
    strikes to 0). Training stops at the ``patience``-th strike in a row
    (``reason == "plateau"``), at a check with :math:`c_k < \mathrm{floor}`
    (``reason == "fit"``: the training set is fit, and further steps only shrink an
    already small loss, relative gains of 1 % per window going on for thousands of
    steps), or after ``max_steps`` steps (``reason == "cap"``), whichever comes first.
    A non-finite loss stops at once (``reason == "diverged"``).

    Args:
        every: steps between checks.
        window: checks ``w`` the improvement is measured over (``window * every`` steps).
        tol: relative improvement below which a check is a strike.
        patience: strikes in a row that stop training.
        max_steps: the cap.
        beta: weight of the moving average.
        floor: smoothed loss at which training has fit the data (0: never).

    Example:
        >>> rule = Plateau(every=10, window=2, tol=0.01, patience=2, max_steps=1000)
        >>> t = 0
        >>> while not rule.update(1.0 + 1.0 / (1 + t)):  # falls, then flattens
        ...     t += 1
        >>> rule.reason, rule.steps < 1000
        ('plateau', True)
    """

    def __init__(
        self,
        every: int = 25,
        window: int = 4,
        tol: float = 0.01,
        patience: int = 3,
        max_steps: int = 5000,
        beta: float = 0.9,
        floor: float = 0.0,
    ) -> None:
        for name, value in (("every", every), ("window", window), ("patience", patience)):
            if int(value) != value or value < 1:
                raise WsymInputError(f"Plateau: {name} must be a positive integer, got {value}")
        if max_steps < 1:
            raise WsymInputError(f"Plateau: max_steps must be >= 1, got {max_steps}")
        if not 0.0 <= beta < 1.0:
            raise WsymInputError(f"Plateau: beta must be in [0, 1), got {beta}")
        for name, value in (("tol", tol), ("floor", floor)):
            if not value >= 0:
                raise WsymInputError(f"Plateau: {name} must be >= 0, got {value}")
        self.every, self.window, self.tol = int(every), int(window), float(tol)
        self.patience, self.max_steps, self.beta = int(patience), int(max_steps), float(beta)
        self.floor = float(floor)
        self.steps = 0
        self.strikes = 0
        self.checks: list[float] = []
        self.reason: str | None = None
        self._avg = 0.0

    @property
    def smoothed(self) -> float:
        """The bias-corrected moving average of the losses seen so far."""
        return self._avg / (1.0 - self.beta**self.steps) if self.steps else float("nan")

    @property
    def stopped(self) -> bool:
        """Whether the rule has fired."""
        return self.reason is not None

    def update(self, loss: float) -> bool:
        """Record one step's training loss; ``True`` when training should stop."""
        if self.stopped:
            return True
        loss = float(loss)
        self.steps += 1
        if not math.isfinite(loss):
            self.reason = "diverged"
            return True
        self._avg = self.beta * self._avg + (1.0 - self.beta) * loss
        if self.steps % self.every == 0:
            self._check(self.smoothed)
        if self.reason is None and self.steps >= self.max_steps:
            self.reason = "cap"
        return self.stopped

    def _check(self, value: float) -> None:
        self.checks.append(value)
        if value < self.floor:
            self.reason = "fit"
            return
        if len(self.checks) <= self.window:
            return
        before = self.checks[-1 - self.window]
        gain = (before - value) / abs(before) if before else 0.0
        self.strikes = self.strikes + 1 if gain < self.tol else 0
        if self.strikes >= self.patience:
            self.reason = "plateau"

    def __repr__(self) -> str:
        return (
            f"Plateau(every={self.every}, window={self.window}, tol={self.tol}, "
            f"patience={self.patience}, max_steps={self.max_steps}, beta={self.beta}, "
            f"floor={self.floor})"
        )
