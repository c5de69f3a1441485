"""Report section: sharpness of fine-tuned transformers against the gap, and the scramble.

On the shipped ViT-style fine-tune zoo (``data/zoos/vit-finetune``; every member
fine-tuned from one pretrained model, see ``data/README.md``), whatever zoo the
report is about: the worst-case measures at the radii that
``experiments/finetune_sharpness.py``'s protocol fixed (:data:`RADII`), and the
Hessian trace, on the first 256 downstream training examples; Kendall tau with
the gap before and after moving every member by a random element of its whole
symmetry group. A measure of the function keeps its tau exactly.
"""

from __future__ import annotations

from pathlib import Path

from wsym.io.resources import ZOOS
from wsym.report.document import Document
from wsym.report.run import ReportRun

#: The shipped fine-tune zoo the section measures.
FINETUNE_ZOO = ZOOS / "vit-finetune"
#: Radii from ``experiments/finetune_sharpness.py`` (median sharpness 0.1 nats on the val split).
RADII = {"adaptive": 0.1, "geodesic-inv": 0.05, "geodesic-mix": 0.05, "euclidean": 0.05}
MEMBERS, QUICK_MEMBERS, PROBES = 40, 3, 10


def section(ctx: ReportRun, doc: Document, path: str | Path | None = None) -> dict:
    """Tau with the gap per measure, before and after the scramble, on the fine-tune zoo."""
    import wsym.zoo
    from wsym.detect import detect
    from wsym.sharpness.correlation import kendall, measure_zoo, training_subset, zoo_member

    path = Path(path) if path is not None else FINETUNE_ZOO
    doc.heading("6. Fine-tuned transformers: invariant sharpness and the scramble")
    if not (path / "manifest.json").is_file():
        doc.paragraph(
            f"No fine-tune zoo at {path}; build it with wsym zoo build --preset "
            f"vit-finetune --members 120 --out {path}.",
            note=True,
        )
        return {}
    zoo = wsym.zoo.load(path)
    ids = zoo.ids[: QUICK_MEMBERS if ctx.quick else MEMBERS]
    batches = training_subset(zoo)
    spec = detect(zoo_member(zoo, ids[0]).float(), batches[0][0][:8])
    with ctx.bar(len(ids), "fine-tune zoo: sharpness, scrambled") as bar:
        probes = 2 if ctx.quick else PROBES
        rows = measure_zoo(
            zoo, ids, batches, spec, RADII, ctx.steps, probes=probes, progress=bar.update
        )
    gaps = [r["gap"] for r in rows]
    measures = [*RADII, "hessian-trace"]
    taus, table = {}, []
    for m in measures:
        before = [r[m] for r in rows]
        after = [r[f"{m} scrambled"] for r in rows]
        change = max(abs(a - b) / max(abs(b), 1e-300) for a, b in zip(after, before, strict=True))
        taus[m] = {
            "before": kendall(before, gaps, boot=1).tau,
            "after": kendall(after, gaps, boot=1).tau,
            "max_relative_change": change,
        }
        table.append([m, taus[m]["before"], taus[m]["after"], change])
    doc.paragraph(
        f"{len(ids)} of the {len(zoo)} members of {path.name} (fine-tuned from one pretrained "
        "pre-LN patch transformer); worst-case sharpness on the first 256 downstream training "
        f"examples at the radii {RADII} ({ctx.steps} ascent steps), Hessian trace with {probes} "
        "probes. Every member is "
        "then moved by spec.sample(seed=member, scale=(1e-2, 1e2)), which leaves its function "
        f"unchanged (largest logit change {max(r['drift'] for r in rows):.1e}), and measured "
        "again. Paper (ViT): adaptive / geodesic-inv / geodesic-mix tau -0.41 / -0.71 / -0.70."
    )
    doc.table(["measure", "tau (gap)", "tau after scramble", "largest relative change"], table)
    return {"zoo": str(path), "members": ids, "radii": RADII, "kendall": taus, "rows": rows}
