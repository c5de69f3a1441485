"""Report section: two members aligned and merged, barriers before and after."""

from __future__ import annotations

from wsym.align.alignment import align
from wsym.align.canonicalize import canonicalize
from wsym.align.interpolate import figure, interpolate
from wsym.align.merge import merge
from wsym.models.evaluate import evaluate
from wsym.report.document import Document
from wsym.report.run import ReportRun


def pick_pair(ctx: ReportRun) -> tuple[int, int]:
    """The two members with the best test accuracy (ties by id)."""
    ranked = sorted(ctx.zoo.table, key=lambda r: (-float(r["test_acc"]), int(r["id"])))
    return int(ranked[0]["id"]), int(ranked[1]["id"])


def section(ctx: ReportRun, doc: Document) -> dict:
    """Canonicalize, align (weights, activations), merge; interpolation barriers."""
    a, b = pick_pair(ctx)
    sd_a, sd_b = ctx.zoo.state_dict(a), ctx.zoo.state_dict(b)
    model = ctx.model(a)
    train = ctx.batches("train", 2 if ctx.quick else 8)
    test = ctx.batches("test", 2 if ctx.quick else 4)
    steps = 5 if ctx.quick else 11
    with ctx.bar(5, "align and merge") as bar:
        by_weights = align(sd_a, sd_b, ctx.spec, method="weights")
        bar.update()
        canon_b, canon_aligned = (canonicalize(sd, ctx.spec) for sd in (sd_b, by_weights))
        same = max(float((canon_aligned[k] - canon_b[k]).abs().max()) for k in canon_b)
        bar.update()
        by_acts = align(
            sd_a, sd_b, ctx.spec, method="activations", refine="none", model=model, batches=train
        )
        bar.update()
        curves = {
            "naive": interpolate(model, sd_a, sd_b, test, ctx.loss_fn, steps),
            "weight matching": interpolate(model, sd_a, by_weights, test, ctx.loss_fn, steps),
            "activation matching": interpolate(model, sd_a, by_acts, test, ctx.loss_fn, steps),
        }
        bar.update()
        merged = merge([sd_a, sd_b], ctx.spec, model=model, batches=train, reset_batchnorm=True)
        accuracy = {
            "member a": _accuracy(ctx, a, sd_a, test),
            "member b": _accuracy(ctx, a, sd_b, test),
            "naive average": _accuracy(ctx, a, _average(sd_a, sd_b), test),
            "wsym.merge": _accuracy(ctx, a, merged, test),
        }
        bar.update()
    doc.heading("2. Canonicalize, align and merge two members")
    doc.paragraph(
        f"Members {a} and {b} (the two best on test). Alignment moves member {b} onto member "
        f"{a}'s basis without changing its function; the loss is evaluated on the test set "
        "along the straight line between the two."
    )
    doc.table(
        ["path", "loss barrier", "accuracy barrier"],
        [[k, c.barrier, c.accuracy_barrier] for k, c in curves.items()],
    )
    doc.figure(figure(curves, "test loss between two members"), "Interpolation before/after.")
    doc.table(["weights", "test accuracy"], [[k, v] for k, v in accuracy.items()])
    doc.paragraph(
        f"Aligned and original member {b} have the same canonical form to {same:.1e} "
        "(alignment only moves along the orbit).",
        note=True,
    )
    return {
        "members": [a, b],
        "barriers": {k: c.barrier for k, c in curves.items()},
        "accuracy_barriers": {k: c.accuracy_barrier for k, c in curves.items()},
        "curves": {k: {"alphas": c.alphas, "losses": c.losses} for k, c in curves.items()},
        "merge_accuracy": accuracy,
        "aligned_canonical_deviation": same,
    }


def _average(sd_a: dict, sd_b: dict) -> dict:
    return {k: (v + sd_b[k]) / 2 if v.is_floating_point() else v for k, v in sd_a.items()}


def _accuracy(ctx: ReportRun, member: int, state_dict: dict, batches) -> float:
    return evaluate(ctx.model(member, state_dict), batches, ctx.loss_fn)[1]
