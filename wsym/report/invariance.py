"""Report section: which sharpness measures survive a move along the orbit."""

from __future__ import annotations

import math

import torch

from wsym.report.context import Context
from wsym.report.document import Document
from wsym.sharpness import sharpness

#: Measures compared, and the group kinds wsym claims each is invariant to (wsym.sharpness).
MEASURES = {
    "euclidean": "none",
    "adaptive": "permutation, scaling, sign, norm_scaling",
    "geodesic-mix": "as adaptive, plus gl",
    "fisher": "scaling, sign, norm_scaling; permutation in distribution (random probes)",
    "hessian-trace": "permutation, orthogonal",
}


def section(ctx: Context, doc: Document, member: int) -> dict:
    """Each measure at a member and at ``g . member`` for random ``g``: the ratio."""
    import matplotlib.pyplot as plt

    sd = {k: v.to(torch.float64) for k, v in ctx.zoo.state_dict(member).items()}
    batches = ctx.batches("train", 1)
    trials = 1 if ctx.quick else 3
    ratios: dict[str, list[float]] = {m: [] for m in MEASURES}
    with ctx.bar(trials * len(MEASURES), "invariance check") as bar:
        for t in range(trials):
            g = ctx.spec.sample(seed=ctx.seed + t, scale=(1e-2, 1e2))
            moved = ctx.spec.act(g, sd)
            for m in MEASURES:
                before = _value(ctx, member, sd, batches, m)
                after = _value(ctx, member, moved, batches, m)
                ratios[m].append(after / before)
                bar.update()
    worst = {m: max(abs(math.log10(r)) for r in rs) for m, rs in ratios.items()}
    doc.heading("3. Invariance check: sharpness under random symmetry elements")
    doc.paragraph(
        f"Member {member} moved by {trials} random elements of its symmetry group (scales "
        "1e-2..1e2; every move computes the same function). A measure of the function "
        "gives ratio 1; a measure of the parametrization does not."
    )
    doc.table(
        ["measure", "invariant to (claimed)", "ratios after/before", "max |log10 ratio|"],
        [[m, MEASURES[m], ", ".join(f"{r:.3g}" for r in ratios[m]), worst[m]] for m in MEASURES],
    )
    fig, ax = plt.subplots(figsize=(6.5, 2.8))
    ax.bar(list(worst), [max(w, 1e-12) for w in worst.values()], color="#a85a4a")
    ax.set_yscale("log")
    ax.set(ylabel="max |log10 ratio|", title="change under symmetry moves (lower is invariant)")
    fig.tight_layout()
    doc.figure(fig, "How far each measure moves when the weights move along their orbit.")
    return {"member": member, "ratios": ratios, "max_abs_log10_ratio": worst}


def _value(ctx: Context, member: int, sd: dict, batches, measure: str) -> float:
    model = ctx.model(member, sd, dtype=torch.float64)
    return sharpness(
        model, batches, ctx.loss_fn, spec=ctx.spec, measure=measure, rho=0.05, seed=ctx.seed
    )
