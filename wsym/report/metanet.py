"""Report section: predict the generalization gap from weights alone, against baselines."""

from __future__ import annotations

from pathlib import Path

import torch

from wsym.errors import WsymInputError
from wsym.io.resources import MODELS
from wsym.report.document import Document
from wsym.report.run import ReportRun


def section(ctx: ReportRun, doc: Document, path: str | Path | None = None) -> dict:
    """The shipped (or a freshly trained) meta-network and StatNN on the held-out members."""
    import matplotlib.pyplot as plt

    from wsym.metanet import baselines, kendall_tau, r2
    from wsym.metanet.evaluate import zoo_splits
    from wsym.testing import invariance_error

    ids = zoo_splits(ctx.zoo)
    sds = {s: ctx.zoo.state_dicts(ids[s]) for s in ids}
    ys = {s: torch.tensor([float(ctx.zoo.row(i)["gap"]) for i in ids[s]]) for s in ids}
    predictors, origin = {}, ""
    with ctx.bar(3, "meta-network vs StatNN") as bar:
        predictor, origin = _metanet(ctx, path, sds, ys)
        predictors["wsym metanet"] = predictor.predict
        bar.update()
        for name, model in (
            ("StatNN", baselines.StatNN()),
            ("StatNN (canonical weights)", baselines.StatNN(ctx.spec, canonical=True)),
        ):
            model.fit(sds["train"], ys["train"], sds["val"], ys["val"], seed=ctx.seed)
            predictors[name] = model.predict
            bar.update()
    test, rows, out = ys["test"], [], {}
    probe = {k: v.double() if v.is_floating_point() else v for k, v in sds["test"][0].items()}
    fig, axes = plt.subplots(1, len(predictors), figsize=(4 * len(predictors), 3.4))
    for ax, (name, predict) in zip(axes, predictors.items(), strict=True):
        pred = predict(sds["test"]).double()
        change = invariance_error(lambda sd, f=predict: f([sd]), ctx.spec, probe, seeds=(ctx.seed,))
        tau, score = kendall_tau(test, pred), r2(test, pred)
        rows.append([name, tau, score, change])
        out[name] = {"tau": tau, "r2": score, "change_under_g": change}
        ax.scatter(test, pred, s=12, alpha=0.7)
        ax.set(xlabel="true gap", ylabel="predicted gap", title=f"{name}\ntau = {tau:.2f}")
    fig.tight_layout()
    doc.heading("5. Predicting the generalization gap from the weights alone")
    doc.paragraph(
        f"{origin} Held-out members: {len(ids['test'])} (the zoo's fixed test split). 'change "
        "under g': relative change of the prediction when the input weights are moved by a "
        "random symmetry element (scales 1e-2..1e2); an invariant predictor shows round-off."
    )
    doc.table(["predictor", "Kendall tau", "R^2", "change under g"], rows)
    doc.figure(fig, "Predicted against true generalization gap on the held-out members.")
    return {"origin": origin, "test_members": len(ids["test"]), "predictors": out}


def _metanet(ctx: ReportRun, path, sds: dict, ys: dict):
    """The meta-network at ``path`` (or the shipped one for this preset), else a fresh fit."""
    import wsym.metanet

    preset = ctx.zoo.manifest.get("preset", "")
    path = Path(path) if path else MODELS / f"metanet-{preset}.safetensors"
    if path.is_file():
        predictor = wsym.metanet.load(path)
        try:
            predictor.predict(sds["test"][:1])
            return (
                predictor,
                f"Meta-network loaded from {path.name} (trained on this zoo's train split).",
            )
        except WsymInputError:
            pass  # trained for another architecture: fit one below
    epochs = 5 if ctx.quick else 60
    predictor = wsym.metanet.fit(
        None,
        sds["train"],
        ys["train"],
        spec=ctx.spec,
        validation=(sds["val"], ys["val"]),
        seed=ctx.seed,
        epochs=epochs,
    )
    return predictor, f"Meta-network trained here for {epochs} epochs on the train split."
