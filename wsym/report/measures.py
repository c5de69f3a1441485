"""The sharpness measures the report compares, each evaluated the one way the report states.

A measure name is one of :data:`wsym.sharpness.MEASURES`, optionally followed by
:data:`AVERAGE` for the average case (antithetic random directions, reported with
its standard error). ``fisher`` is taken at the canonical point of the orbit
(:func:`wsym.curvature.fisher_riemannian_sharpness` with the spec, weight-relative
damping), where its Hutchinson probes are transported with the units.
"""

from __future__ import annotations

from wsym.curvature import fisher_riemannian_sharpness
from wsym.curvature.objective import as_double
from wsym.report.context import Context
from wsym.sharpness import Estimate, sharpness

AVERAGE = " (average)"
RHO = 0.05


def measure(ctx: Context, model, batches: list, name: str) -> Estimate:
    """Measure ``name`` of ``model`` (float64) on ``batches``: value and standard error."""
    if name == "fisher":
        batches64 = [(as_double(x), as_double(y)) for x, y in batches]
        value = fisher_riemannian_sharpness(
            model, batches64, ctx.loss_fn, seed=ctx.seed, relative=True, spec=ctx.spec
        )
        return Estimate(value, 0.0)
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
        with_error=True,
    )


def relative_difference(a: float, b: float) -> float:
    """``|a - b| / max(|a|, |b|)`` (0 when both are 0)."""
    scale = max(abs(a), abs(b))
    return abs(a - b) / scale if scale > 0 else 0.0
