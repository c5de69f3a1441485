"""The plateau stopping rule (wsym.optim.Plateau) on synthetic loss curves."""

import math

import pytest

from wsym.errors import WsymInputError
from wsym.optim import Plateau


def _run(rule: Plateau, curve) -> int:
    t = 0
    while not rule.update(curve(t)):
        t += 1
    return rule.steps


def test_stops_after_the_knee():
    # falls 2% a step to t = 300, then flat at 0.1
    def curve(t):
        return max(0.1, math.exp(-0.02 * t)) if t < 300 else 0.1

    rule = Plateau(every=10, window=3, tol=0.01, patience=3, max_steps=10_000, beta=0.0)
    steps = _run(rule, curve)
    assert rule.reason == "plateau"
    # exp(-0.02 t) reaches 0.1 at t = 115; the flat window plus patience is 60 steps
    assert 115 + 30 <= steps <= 115 + 30 + 30 + 10


def test_keeps_going_while_falling():
    # exp(-t / 1000): 3% relative gain over every 30-step window, never below tol
    rule = Plateau(every=10, window=3, tol=0.01, patience=3, max_steps=2000)
    steps = _run(rule, lambda t: math.exp(-t / 1000))
    assert rule.reason == "cap" and steps == 2000


def test_noise_is_smoothed():
    import random

    rng = random.Random(0)
    noisy = Plateau(every=10, window=3, tol=0.01, patience=3, max_steps=5000, beta=0.98)
    steps = _run(noisy, lambda t: 2.0 * math.exp(-0.01 * t) + 0.5 + 0.05 * rng.gauss(0, 1))
    assert noisy.reason == "plateau"
    assert 300 <= steps <= 1200  # the curve is within 1% of its floor from t ~ 400


def test_cap_and_divergence():
    rule = Plateau(every=5, max_steps=7)
    assert _run(rule, lambda t: 1.0 - 0.1 * t) == 7 and rule.reason == "cap"
    rule = Plateau(every=5, max_steps=100)
    assert _run(rule, lambda t: 1.0 if t < 3 else float("nan")) == 4
    assert rule.reason == "diverged"
    assert rule.update(0.0) is True  # stays stopped


def test_a_loss_below_the_floor_has_fit_the_data():
    """An exponentially vanishing loss improves by over 1 % per window forever."""
    curve = lambda t: math.exp(-0.01 * t)  # noqa: E731
    endless = Plateau(every=10, window=3, tol=0.01, patience=3, max_steps=3000, beta=0.0)
    assert _run(endless, curve) == 3000 and endless.reason == "cap"
    fit = Plateau(every=10, window=3, tol=0.01, patience=3, max_steps=3000, beta=0.0, floor=0.01)
    assert _run(fit, curve) == 470 and fit.reason == "fit"  # first check with e^(-t/100) < 0.01


def test_a_single_improving_check_resets_the_strikes():
    rule = Plateau(every=1, window=1, tol=0.1, patience=2, max_steps=100, beta=0.0)
    for loss in (1.0, 0.99, 0.5, 0.49):  # strike, reset, strike
        assert not rule.update(loss)
    assert rule.update(0.48) and rule.reason == "plateau" and rule.steps == 5


@pytest.mark.parametrize(
    "kw",
    [
        {"every": 0},
        {"window": 1.5},
        {"patience": -1},
        {"max_steps": 0},
        {"beta": 1.0},
        {"floor": -1.0},
    ],
)
def test_bad_input(kw):
    with pytest.raises(WsymInputError, match=next(iter(kw))):
        Plateau(**kw)
