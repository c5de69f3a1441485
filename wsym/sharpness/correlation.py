r"""Does sharpness predict generalization? Rank statistics over a zoo, and the controls.

The seed paper's test (da Silva, Dangel & Oore 2025): Kendall's :math:`\tau` between
a sharpness measure and the generalization gap over many fine-tuned networks. Here:

* :func:`kendall`: :math:`\tau_b` (scipy) with its two-sided p-value and a
  percentile bootstrap confidence interval (members resampled with replacement);
* :func:`partial_kendall`: the partial :math:`\tau` controlling for a third
  variable :math:`z` (Kendall 1942),

  .. math::
      \tau_{xy\cdot z} = \frac{\tau_{xy} - \tau_{xz}\tau_{yz}}
                              {\sqrt{(1 - \tau_{xz}^2)(1 - \tau_{yz}^2)}},

  with a bootstrap interval and the normal-approximation p-value
  :math:`2\Phi(-|\tau_{xy\cdot z}| / \mathrm{se})`, ``se`` the bootstrap standard
  deviation (Andriushchenko et al. 2023 control for the learning rate this way);
  NaN where ``z`` orders ``x`` or ``y`` completely (nothing is left to correlate);
* :func:`calibrate_rho`: the protocol fixing :math:`\rho` before any :math:`\tau`
  is looked at: the radius, on a doubling grid from ``rho0``, whose median sharpness
  over calibration members is closest (in log) to a target loss increase;
* :func:`scramble`: a member moved by a random element of its whole symmetry
  group, ``spec.sample(seed, scale)``: the same function at another point.

Example:
    >>> t = kendall([1.0, 2.0, 3.0, 4.0], [1.0, 3.0, 2.0, 4.0], boot=200)
    >>> round(t.tau, 3), t.low <= t.tau <= t.high
    (0.667, True)
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from scipy.stats import kendalltau, norm

from wsym.errors import WsymInputError


@dataclass(frozen=True)
class Tau:
    """A Kendall tau, its p-value and a 95% bootstrap interval ``[low, high]``."""

    tau: float
    p: float
    low: float
    high: float

    def __str__(self) -> str:
        return f"{self.tau:+.3f} [{self.low:+.2f}, {self.high:+.2f}] (p={self.p:.1e})"


def _tau(x: np.ndarray, y: np.ndarray) -> float:
    value = kendalltau(x, y).statistic
    return 0.0 if math.isnan(value) else float(value)


def _partial(x: np.ndarray, y: np.ndarray, z: np.ndarray) -> float:
    xy, xz, yz = _tau(x, y), _tau(x, z), _tau(y, z)
    denom = math.sqrt(max((1 - xz**2) * (1 - yz**2), 0.0))
    return (xy - xz * yz) / denom if denom > 1e-6 else float("nan")


def _boot(stat: Callable, columns: list[np.ndarray], boot: int, seed: int) -> np.ndarray:
    n = len(columns[0])
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, n, size=(boot, n))
    return np.array([stat(*(c[idx] for c in columns)) for idx in draws])


def _columns(*values: Sequence[float]) -> list[np.ndarray]:
    columns = [np.asarray(v, dtype=np.float64) for v in values]
    if len({len(c) for c in columns}) != 1 or len(columns[0]) < 3:
        raise WsymInputError("Kendall tau needs equally long sequences of at least 3 values")
    return columns


def kendall(x: Sequence[float], y: Sequence[float], boot: int = 1000, seed: int = 0) -> Tau:
    """Kendall's tau_b of ``x`` and ``y``, scipy's p-value, a bootstrap 95% interval."""
    cx, cy = _columns(x, y)
    result = kendalltau(cx, cy)
    low, high = np.percentile(_boot(_tau, [cx, cy], boot, seed), [2.5, 97.5])
    return Tau(float(result.statistic), float(result.pvalue), float(low), float(high))


def partial_kendall(
    x: Sequence[float], y: Sequence[float], z: Sequence[float], boot: int = 1000, seed: int = 0
) -> Tau:
    """Partial Kendall tau of ``x`` and ``y`` given ``z`` (see the module docstring)."""
    cx, cy, cz = _columns(x, y, z)
    value = _partial(cx, cy, cz)
    draws = _boot(_partial, [cx, cy, cz], boot, seed)
    draws = draws[np.isfinite(draws)]
    if not math.isfinite(value) or len(draws) < 2:
        return Tau(value, float("nan"), float("nan"), float("nan"))
    se = float(draws.std())
    p = float(2 * norm.sf(abs(value) / se)) if se > 0 else float("nan")
    low, high = np.percentile(draws, [2.5, 97.5])
    return Tau(value, p, float(low), float(high))


def calibrate_rho(
    values: Callable[[float], Sequence[float]],
    target: float = 0.1,
    rho0: float = 0.05,
    max_doublings: int = 12,
) -> float:
    """The radius on the grid ``rho0 * 2^k`` whose median sharpness is closest to ``target``.

    ``values(rho)`` returns the sharpness of the calibration members at ``rho``
    (increasing in ``rho`` for worst-case measures). From ``rho0`` the radius is
    doubled (or halved) until the median crosses ``target``; of the two grid points
    around the crossing, the one closer in ``log`` wins.
    """
    if target <= 0 or rho0 <= 0:
        raise WsymInputError("calibrate_rho needs a positive target and rho0")

    def gap(rho: float) -> float:
        m = statistics.median(values(rho))
        return math.log(max(m, 1e-300) / target)

    rho, here = rho0, gap(rho0)
    factor = 2.0 if here < 0 else 0.5
    for _ in range(max_doublings):
        nxt = rho * factor
        there = gap(nxt)
        if (there < 0) != (here < 0):
            return nxt if abs(there) < abs(here) else rho
        rho, here = nxt, there
    return rho


def scramble(spec, state: dict[str, torch.Tensor], seed: int, scale=(1e-2, 1e2)) -> dict:
    """``state`` moved by ``spec.sample(seed, scale)`` (float64): the same function elsewhere."""
    state64 = {k: v.double() if v.is_floating_point() else v for k, v in state.items()}
    return spec.act(spec.sample(seed, scale=scale), state64)


#: The worst-case measures whose radius :func:`calibrate_rho` fixes, and the curvature control.
RADIUS_MEASURES = ("adaptive", "geodesic-inv", "geodesic-mix", "euclidean")
CURVATURE_MEASURES = ("hessian-trace",)


def member_sharpness(
    model: torch.nn.Module,
    batches: list,
    spec,
    rhos: dict[str, float],
    steps: int = 10,
    probes: int = 20,
) -> dict[str, float]:
    """Worst-case sharpness of ``model`` per measure in ``rhos``, and the Hessian trace.

    Each measure at its radius ``rhos[measure]``; the Hessian trace with ``probes``
    Rademacher probes (seed 0), skipped when ``probes`` is 0. Cross-entropy on
    ``batches``; the spec is shared by every member of a zoo.
    """
    from wsym.sharpness import sharpness

    loss = torch.nn.functional.cross_entropy
    out = {
        m: sharpness(model, batches, loss, spec=spec, measure=m, rho=rho, steps=steps)
        for m, rho in rhos.items()
    }
    if probes:
        out["hessian-trace"] = sharpness(
            model, batches, loss, spec=spec, measure="hessian-trace", probes=probes
        )
    return out


def calibrate(
    models: list[torch.nn.Module],
    batches: list,
    spec,
    measures: Sequence[str] = RADIUS_MEASURES,
    target: float = 0.1,
    rho0: float = 0.05,
    steps: int = 10,
) -> dict[str, float]:
    """Each measure's radius by :func:`calibrate_rho` over the calibration ``models``."""

    def values(measure: str) -> Callable[[float], list[float]]:
        def at(rho: float) -> list[float]:
            rhos = {measure: rho}
            return [member_sharpness(m, batches, spec, rhos, steps, 0)[measure] for m in models]

        return at

    return {m: calibrate_rho(values(m), target, rho0) for m in measures}


def zoo_member(zoo, member: int, state: dict | None = None) -> torch.nn.Module:
    """``member``'s module of ``zoo`` in float64, with its weights (or ``state``)."""
    model = zoo.model(member).double()
    model.load_state_dict(state if state is not None else zoo.state_dict(member))
    return model


def training_subset(zoo, n: int = 256) -> list:
    """The first ``n`` training examples: in every member's data (all train on the full split)."""
    fractions = {float(row["train_fraction"]) for row in zoo.table}
    if fractions != {1.0}:
        raise WsymInputError(
            f"the members of {zoo.path} train on subsets (train_fraction {sorted(fractions)}); "
            "a fixed subset of every member's training data needs train_fraction 1"
        )
    data = zoo.dataset()
    return [(data.x_train[:n], data.y_train[:n])]


def measure_zoo(
    zoo,
    ids: Sequence[int],
    batches: list,
    spec,
    rhos: dict[str, float],
    steps: int = 10,
    probes: int = 20,
    scrambled: bool = True,
    progress: Callable[[], None] | None = None,
) -> list[dict[str, float]]:
    """Per member: ``id``, ``gap``, ``test_error``, ``lr``, ``train_loss``, each measure's value.

    With ``scrambled``, also ``"<measure> scrambled"``: the same measure of the
    member moved by :func:`scramble` (seed = member id), and ``drift``, the largest
    change of any logit on the batch that the move caused (round-off only).
    """
    rows = []
    x = batches[0][0]
    x = x.double() if x.is_floating_point() else x  # token ids stay integers
    for member in ids:
        row = zoo.row(member)
        model = zoo_member(zoo, member)
        out = {
            "id": member,
            "gap": row["gap"],
            "test_error": 1 - row["test_acc"],
            "lr": row["lr"],
            "train_loss": row["train_loss"],
            **member_sharpness(model, batches, spec, rhos, steps, probes),
        }
        if scrambled:
            moved = zoo_member(zoo, member, scramble(spec, model.state_dict(), member))
            with torch.no_grad():
                out["drift"] = float((moved(x) - model(x)).abs().max())
            after = member_sharpness(moved, batches, spec, rhos, steps, probes)
            out.update({f"{k} scrambled": v for k, v in after.items()})
        rows.append(out)
        if progress is not None:
            progress()
    return rows
