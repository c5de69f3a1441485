"""The sharpness measures the report compares, each evaluated the one way the report states.

A measure name is one of :data:`wsym.sharpness.MEASURES`, optionally followed by
:data:`AVERAGE` for the average case (antithetic random directions, reported with
its standard error). :func:`wsym.sharpness.sharpness` takes ``fisher`` at the
canonical point of the orbit (weight-relative damping), where its Hutchinson probes
are transported with the units.
"""

from __future__ import annotations

from wsym.report.run import ReportRun
from wsym.sharpness import Estimate, sharpness

AVERAGE = " (average)"
RHO = 0.05


def measure(ctx: ReportRun, model, batches: list, name: str) -> Estimate:
    """Measure ``name`` of ``model`` (float64) on ``batches``: value and standard error."""
    average = name.endswith(AVERAGE)
    return sharpness(
        model,
        batches,
        ctx.loss_fn,
        spec=ctx.spec,
        measure=name.removesuffix(AVERAGE),
        rho=RHO,
        average=average,
        seed=ctx.seed,
        steps=ctx.steps,
        with_error=True,
    )


def relative_difference(a: float, b: float) -> float:
    """``|a - b| / max(|a|, |b|)`` (0 when both are 0)."""
    scale = max(abs(a), abs(b))
    return abs(a - b) / scale if scale > 0 else 0.0
