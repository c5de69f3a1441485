"""Report section: which sharpness measures survive a move along the orbit."""

from __future__ import annotations

import math

import torch

from wsym.group.kinds import kind_of
from wsym.report.document import Document
from wsym.report.measures import AVERAGE, RHO, measure, relative_difference
from wsym.report.run import ReportRun

WHOLE = (
    "the whole group: scaling, norm_scaling, gl, orthogonal, translation "
    "(quotient at the balanced point), permutation, sign"
)
#: Measures compared, and the group kinds wsym claims each is invariant to (wsym.sharpness).
MEASURES = {
    "euclidean": "none",
    "adaptive": "permutation, scaling, sign, norm_scaling",
    "adaptive" + AVERAGE: "scaling, sign, norm_scaling (same seed); permutation in law only",
    "geodesic-inv": WHOLE,
    "geodesic-mix": WHOLE,
    "geodesic-mix" + AVERAGE: WHOLE + "; same seed, directions drawn in canonical coordinates",
    "fisher": "scaling, sign, norm_scaling, permutation (probes drawn at the canonical point)",
    "hessian-trace": "permutation, orthogonal (exact trace; the Hutchinson estimate in law)",
}


def section(ctx: ReportRun, doc: Document, member: int) -> dict:
    """Each measure at a member and at ``g . member`` for random ``g``: the ratio."""
    import matplotlib.pyplot as plt

    sd = {k: v.to(torch.float64) for k, v in ctx.zoo.state_dict(member).items()}
    batches = ctx.batches("train", 1)
    trials = 1 if ctx.quick else 3
    values = {m: _value(ctx, member, sd, batches, m) for m in MEASURES}
    ratios: dict[str, list[float]] = {m: [] for m in MEASURES}
    with ctx.bar(trials * len(MEASURES), "invariance check") as bar:
        for t in range(trials):
            g = ctx.spec.sample(seed=ctx.seed + t, scale=(1e-2, 1e2))
            moved = ctx.spec.act(g, sd)
            for m in MEASURES:
                after = _value(ctx, member, moved, batches, m)
                ratios[m].append(after.value / values[m].value)
                bar.update()
    worst = {m: max(abs(math.log10(r)) for r in rs) for m, rs in ratios.items()}
    gap = relative_difference(values["geodesic-mix"].value, values["adaptive"].value)
    doc.heading("3. Invariance check: sharpness under random symmetry elements")
    doc.paragraph(
        f"Member {member} moved by {trials} random elements of its whole symmetry group "
        "(every kind at once, scales 1e-2..1e2; every move computes the same function). "
        "A measure of the function gives ratio 1; a measure of the parametrization does "
        "not. Average-case values are means over antithetic pairs of random directions, "
        "shown with their standard error."
    )
    doc.table(
        ["measure", "invariant to (claimed)", "value", "ratios after/before", "max |log10 ratio|"],
        [
            [m, MEASURES[m], str(values[m]), ", ".join(f"{r:.10g}" for r in ratios[m]), worst[m]]
            for m in MEASURES
        ],
    )
    doc.paragraph(_comparison(ctx, gap))
    fig, ax = plt.subplots(figsize=(7.5, 2.8))
    ax.bar(list(worst), [max(w, 1e-12) for w in worst.values()], color="#a85a4a")
    ax.set_yscale("log")
    ax.tick_params(axis="x", labelsize=7)
    ax.set(ylabel="max |log10 ratio|", title="change under symmetry moves (lower is invariant)")
    fig.tight_layout()
    doc.figure(fig, "How far each measure moves when the weights move along their orbit.")
    return {
        "member": member,
        "values": {m: {"value": v.value, "stderr": v.stderr} for m, v in values.items()},
        "ratios": ratios,
        "max_abs_log10_ratio": worst,
        "geodesic_vs_adaptive": gap,
    }


def _comparison(ctx: ReportRun, gap: float) -> str:
    """Geodesic against adaptive, with why they are close where only scalings are continuous."""
    kinds = sorted({g.kind for g in ctx.spec.groups if kind_of(g).continuous})
    text = (
        f"Geodesic-mix against adaptive (worst case, rho {RHO}): relative difference "
        f"{gap:.2g}. The geodesic measures quotient by every continuous group of the spec "
        f"({', '.join(kinds) or 'none'})."
    )
    if kinds == ["scaling"]:
        text += (
            " The adaptive metric is already invariant to scalings, and the loss gradient is "
            "orthogonal to their orbits, so the two ascents differ only through the "
            "horizontal projection of the later steps: close values are expected here."
        )
    return text


def _value(ctx: ReportRun, member: int, sd: dict, batches, name: str):
    return measure(ctx, ctx.model(member, sd, dtype=torch.float64), batches, name)
