"""Report section: every sharpness measure over the zoo against the generalization gap."""

from __future__ import annotations

import math

import torch
from scipy.stats import kendalltau

from wsym.report.document import Document
from wsym.report.measures import RHO, measure, relative_difference
from wsym.report.run import ReportRun

MEASURES = ("euclidean", "adaptive", "geodesic-mix", "fisher", "hessian-trace", "lambda-max")


def members(ctx: ReportRun, limit: int) -> list[int]:
    """Up to ``limit`` members of the zoo's test split (all members if it has fewer than 5)."""
    ids = list(ctx.zoo.split("test"))
    if len(ids) < 5:
        ids = [int(r["id"]) for r in ctx.zoo.table]
    return [int(i) for i in ids[:limit]]


def section(ctx: ReportRun, doc: Document) -> dict:
    """Kendall tau between each measure and the gap, with one scatter per measure."""
    import matplotlib.pyplot as plt

    ids = members(ctx, 6 if ctx.quick else 60)
    batches = ctx.batches("train", 1)
    gaps = [float(ctx.zoo.row(i)["gap"]) for i in ids]
    values: dict[str, list[float]] = {m: [] for m in MEASURES}
    with ctx.bar(len(ids), "sharpness over the zoo") as bar:
        for i in ids:
            model = ctx.model(i, dtype=torch.float64)
            for m in MEASURES:
                values[m].append(measure(ctx, model, batches, m).value)
            bar.update()
    taus = {}
    for m in MEASURES:
        tau, p = kendalltau(values[m], gaps)
        taus[m] = {"tau": _finite(tau), "p": _finite(p)}
    diff = [
        relative_difference(a, b)
        for a, b in zip(values["geodesic-mix"], values["adaptive"], strict=True)
    ]
    doc.heading("4. Sharpness against the generalization gap")
    doc.paragraph(
        f"{len(ids)} members of the zoo's held-out split; sharpness on one batch of 256 "
        f"training examples (rho = {RHO} for the worst-case measures); Kendall tau with the "
        "gap (train minus test accuracy). Geodesic-mix against adaptive, relative difference "
        f"per member: median {sorted(diff)[len(diff) // 2]:.2g}, largest {max(diff):.2g}."
    )
    doc.table(
        ["measure", "Kendall tau", "p-value"], [[m, t["tau"], t["p"]] for m, t in taus.items()]
    )
    cols = 3
    rows = math.ceil(len(MEASURES) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(10, 3.1 * rows))
    for ax, m in zip(axes.flat, MEASURES, strict=False):
        ax.scatter(values[m], gaps, s=12, alpha=0.7)
        ax.set_xscale("log" if min(values[m]) > 0 else "linear")
        ax.set(xlabel=m, ylabel="gap", title=f"tau = {_text(taus[m]['tau'])}")
    for ax in list(axes.flat)[len(MEASURES) :]:
        ax.axis("off")
    fig.tight_layout()
    doc.figure(fig, "Each measure against the generalization gap, one point per member.")
    return {
        "members": ids,
        "gaps": gaps,
        "values": values,
        "kendall": taus,
        "geodesic_vs_adaptive": diff,
    }


def _finite(x: float) -> float | None:
    return None if x is None or math.isnan(x) else float(x)


def _text(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"
