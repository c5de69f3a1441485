"""One evaluation of every predictor on one zoo: Kendall tau, R^2, invariance.

``evaluate(zoo)`` reads the zoo's train/val/test members (any object with the
:mod:`wsym.zoo` reading interface: ``table``, ``split``, ``state_dicts``,
``model``, ``example_inputs``; see also :mod:`wsym.metanet.population`), fits
each predictor on the training members (validation members for early
stopping), and scores it on the held-out test members, for each seed. The
*invariance* column is the largest relative change of a prediction when one
test member's weights are moved by random elements of the whole symmetry group
(scales 1e-2..1e2), and by permutations only. ``progress=True`` draws one bar
over the fits (predictor x seed) on stderr, the metanet's epoch and validation
tau beside it; ``report["timing"]`` says where the time went (:func:`format_timing`).
"""

from __future__ import annotations

import time

import torch

from wsym.detect import detect
from wsym.errors import WsymInputError
from wsym.metanet import baselines
from wsym.metanet.metrics import kendall_tau, r2
from wsym.progress import Progress
from wsym.testing import invariance_error

PREDICTORS = ("metanet", "statnn", "statnn-canonical", "flat-mlp", "nfn")
SHARPNESS = ("adaptive", "geodesic-mix", "fisher", "hessian-trace")


def zoo_splits(zoo, split_key: str | None = None) -> dict[str, list[int]]:
    """Train/val/test member ids; with ``split_key``, a *transfer* split.

    Transfer: members sorted by the hyperparameter ``split_key``; the lower 60%
    train (every 4th of them validates), the upper 40% test.
    """
    if split_key is None:
        out = {s: list(zoo.split(s)) for s in ("train", "val", "test")}
        if not out["val"]:
            out["val"], out["train"] = out["train"][::5], [i for i in out["train"] if i % 5]
        return out
    rows = [r for r in zoo.table if split_key in r]
    if len(rows) < len(zoo.table):
        raise WsymInputError(f"zoo members lack the column {split_key!r}; pick a hyperparameter")
    rows.sort(key=lambda r: (r[split_key], r["id"]))
    cut = int(0.6 * len(rows))
    low = [r["id"] for r in rows[:cut]]
    return {
        "train": [i for k, i in enumerate(low) if k % 4],
        "val": low[::4],
        "test": [r["id"] for r in rows[cut:]],
    }


def make_predictor(name: str, spec, zoo, metanet_options: dict | None = None):
    """A fresh predictor by name (``metanet``, ``statnn``, ..., ``sharpness:MEASURE``)."""
    if name == "metanet":
        options = dict(metanet_options or {})
        if "cache" in options:
            options["cache"] = options["cache"].setdefault("metanet", {})
        return baselines.Metanet(spec, **options)
    cache = (metanet_options or {}).get("cache")
    if name == "statnn":
        return baselines.StatNN(cache={} if cache is None else cache.setdefault("statnn", {}))
    if name == "statnn-canonical":
        cache = {} if cache is None else cache.setdefault("statnn-canonical", {})
        return baselines.StatNN(spec, canonical=True, cache=cache)
    if name == "flat-mlp":
        return baselines.FlatMLP()
    if name == "nfn":
        return baselines.NFN(spec)
    if name.startswith("sharpness:"):
        data = zoo.dataset()
        shape = tuple(zoo.example_inputs().shape[1:])  # inputs as the members take them
        x, y = data.x_test[:128].reshape(-1, *shape), data.y_test[:128]
        factory = lambda: zoo.model(zoo.table[0]["id"])  # noqa: E731
        return baselines.Sharpness(factory, [(x, y)], name.split(":", 1)[1], spec=spec)
    raise WsymInputError(f"unknown predictor {name!r}; use one of {', '.join(PREDICTORS)}")


def evaluate(
    zoo,
    *,
    predictors=PREDICTORS,
    seeds=(0, 1, 2),
    target: str = "gap",
    split_key: str | None = None,
    metanet_options: dict | None = None,
    progress: bool = False,
) -> dict:
    """Fit and score every predictor; returns a JSON-ready report.

    Returns:
        ``{"members": {split: n}, "rows": [{name, claims, tau_mean, tau_std, r2_mean,
        r2_std, tau_ensemble, invariance_all, invariance_perm, seconds, status}], "test_targets",
        "test_predictions": {name: [...]}, "timing": {stage: seconds}}``.
    """
    clock = time.perf_counter()
    ids = zoo_splits(zoo, split_key)
    spec = detect(zoo.model(zoo.table[0]["id"]), zoo.example_inputs())
    y_all = {r["id"]: float(r[target]) for r in zoo.table}
    sds = {s: zoo.state_dicts(ids[s]) for s in ids}
    ys = {s: torch.tensor([y_all[i] for i in ids[s]], dtype=torch.float64) for s in ids}
    report = {
        "members": {s: len(v) for s, v in ids.items()},
        "target": target,
        "split_key": split_key,
        "rows": [],
        "test_targets": ys["test"].tolist(),
        "test_predictions": {},
    }
    report["timing"] = {"detect and load": time.perf_counter() - clock}
    runs = {n: seeds if not n.startswith("sharpness:") else seeds[:1] for n in predictors}
    bar = Progress(sum(map(len, runs.values())), "metanet eval", unit="fits", enabled=progress)
    metanet_options = {**(metanet_options or {}), "cache": {}}  # invariant forms computed once
    probe = {k: v.double() if v.is_floating_point() else v for k, v in sds["test"][0].items()}
    for name in predictors:
        row = {"name": name, "status": "ok"}
        taus, r2s, preds, start = [], [], [], time.perf_counter()
        try:
            for seed in runs[name]:
                bar.set_postfix_str(f"{name} seed {seed}")
                hook = _epoch_hook(bar, name, seed) if name == "metanet" else None
                p = make_predictor(name, spec, zoo, {**metanet_options, "on_epoch": hook})
                p.fit(sds["train"], ys["train"], sds["val"], ys["val"], seed=seed)
                pred = p.predict(sds["test"])
                bar.update(1)
                taus.append(kendall_tau(ys["test"], pred))
                r2s.append(r2(ys["test"], pred))
                preds.append(pred)
                if getattr(p, "predictor", None) is not None:  # the metanet's training report
                    row.setdefault("reports", []).append(p.predictor.config["report"])
                report["test_predictions"].setdefault(name, pred.tolist())
            row["claims"] = p.claims
            fn = lambda sd, p=p: p.predict([sd])  # noqa: E731
            row["invariance_all"] = invariance_error(fn, spec, probe, seeds=(0,))
            row["invariance_perm"] = invariance_error(
                fn, spec, probe, seeds=(0,), kinds=("permutation",)
            )
        except (WsymInputError, ImportError) as err:
            row["status"] = f"n/a: {err}"
        t, q = torch.tensor(taus or [float("nan")]), torch.tensor(r2s or [float("nan")])
        row.update(
            tau_mean=float(t.mean()),
            tau_std=float(t.std()) if len(t) > 1 else 0.0,
            r2_mean=float(q.mean()),
            r2_std=float(q.std()) if len(q) > 1 else 0.0,
            seeds=len(taus),
            tau_ensemble=kendall_tau(ys["test"], torch.stack(preds).mean(0)) if preds else None,
            seconds=time.perf_counter() - start,
        )
        report["rows"].append(row)
        report["timing"].update(_timing(row))
    bar.close()
    report["timing"]["total"] = time.perf_counter() - clock
    return report


def _epoch_hook(bar, name: str, seed: int):
    """``on_epoch`` of :func:`wsym.metanet.fit`: the epoch and validation tau on the bar."""

    def hook(epoch: int, epochs: int, tau: float) -> None:
        bar.set_postfix_str(f"{name} seed {seed} epoch {epoch}/{epochs} val tau {tau:.3f}")

    return hook


def _timing(row: dict) -> dict[str, float]:
    """Seconds of one predictor's row; the metanet's split into its stages (all seeds)."""
    reports = row.get("reports", [])
    if not reports:
        return {row["name"]: row["seconds"]}
    stats = sum(r["statistics_seconds"] for r in reports)
    graph_branch = sum(r["train_seconds"] for r in reports)
    return {
        f"{row['name']}: graphs and scoring": row["seconds"] - stats - graph_branch,
        f"{row['name']}: statistics branch": stats,
        f"{row['name']}: graph branch": graph_branch,
    }


def format_timing(report: dict) -> str:
    """One line: where the time of :func:`evaluate` went, largest first."""
    timing = dict(report["timing"])
    total = timing.pop("total")
    parts = sorted(timing.items(), key=lambda kv: -kv[1])
    return f"time {total:.0f}s: " + ", ".join(f"{k} {v:.0f}s" for k, v in parts)


def format_table(report: dict) -> str:
    """Markdown table: predictor, Kendall tau, R^2 (mean +- std over seeds), invariance.

    *ensemble tau*: Kendall tau of the seeds' mean prediction (one number).
    """
    lines = [
        "| predictor | Kendall tau | ensemble tau | R^2 | invariant to "
        "| change under g (all / perm) |",
        "|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        if r["status"] != "ok":
            lines.append(f"| {r['name']} | {r['status']} | | | | |")
            continue
        lines.append(
            f"| {r['name']} | {r['tau_mean']:.3f} ± {r['tau_std']:.3f} | {r['tau_ensemble']:.3f} | "
            f"{r['r2_mean']:.3f} ± {r['r2_std']:.3f} | {r['claims']} | "
            f"{r['invariance_all']:.1e} / {r['invariance_perm']:.1e} |"
        )
    return "\n".join(lines)


def scatter_plot(report: dict, path: str) -> None:
    """Predicted vs true target on the test members, one panel per predictor (matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    preds = report["test_predictions"]
    fig, axes = plt.subplots(1, max(len(preds), 1), figsize=(3.2 * max(len(preds), 1), 3.2))
    axes = [axes] if len(preds) <= 1 else list(axes)
    y = report["test_targets"]
    for ax, (name, p) in zip(axes, preds.items(), strict=False):
        ax.scatter(y, p, s=8)
        lo, hi = min(y), max(y)
        ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel(f"true {report['target']}")
    axes[0].set_ylabel("predicted")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
