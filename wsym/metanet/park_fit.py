r"""Training one :class:`~wsym.metanet.park.ParkNet` on a mixed list of architectures.

The same two stages as :func:`wsym.metanet.fit` (whose training loops this
reuses), on :class:`~wsym.metanet.universal.UniversalSchema` graphs: the
statistics branch on the bucketed statistics, then the graph branch, and with
``branches="both"`` their combination: ``combine="blend"`` trains the graph
branch on its own and picks the weight of the two on the validation members
(from :data:`BLENDS`); ``"residual"`` trains it on the frozen statistics
branch's residual and keeps it only where it raises the validation Kendall tau;
``"joint"`` trains the graph branch on its own, then a second statistics
ensemble on the statistics and the graph branch's frozen readout, and weighs
that against the statistics branch on the validation members; ``"boost"``
trains the graph branch on the statistics branch's *out-of-fold* residuals
(``5`` copies of it, each trained on four fifths of the members, predict the
fifth) and adds it with a weight picked on the validation members;
``"stack"`` cross-fits ``"joint"`` (:func:`cross_folds`: each fold's joint
ensemble is trained on the readout of a graph branch trained on the other
folds, then weighed against the statistics branch likewise).
One branch alone: ``"stats"``, ``"graph"``. Targets are
standardized (``target_transform="standard"``) or first mapped to their
normal scores (``"rank"``: the rank-based inverse normal transform, robust
to the heavy tails of generalization gaps across architectures; predictions
are then monotone in the targets' ranks, which is what Kendall tau reads).
"""

from __future__ import annotations

import copy
import random
import time

import torch

from wsym.errors import WsymInputError
from wsym.metanet.fit import (
    BLENDS,
    FitConfig,
    graph_stage,
    split_validation,
    statistics_stage,
    train_statistics,
)
from wsym.metanet.graph import batch_graphs
from wsym.metanet.metrics import kendall_tau
from wsym.metanet.novelty import TrainingDistribution
from wsym.metanet.park import ParkPredictor, network_of


def normal_scores(y: torch.Tensor) -> torch.Tensor:
    r"""Columnwise :math:`\Phi^{-1}((r - 1/2) / n)` of the ranks ``r`` (ties: average).

    Example:
        >>> normal_scores(torch.tensor([[3.0], [1.0], [2.0]]))[:, 0].round(decimals=3).tolist()
        [0.967, -0.967, 0.0]
    """
    from scipy.stats import rankdata

    r = torch.as_tensor(rankdata(y.numpy(), axis=0), dtype=torch.float64)
    return torch.special.ndtri((r - 0.5) / len(y))


def fit_park(
    checkpoints: list,
    targets,
    *,
    validation: tuple[list, object] | None = None,
    example_inputs=None,
    target_names: tuple[str, ...] = ("gap",),
    seed: int = 0,
    branches: str = "both",
    combine: str = "blend",
    target_transform: str = "standard",
    stat_readout: bool = False,
    paths: bool = False,
    readout: str = "roles",
    aggregate: str = "mean",
    inputs: str = "standard",
    joint_reads: str = "readout",
    auxiliary: dict | None = None,
    virtual: bool = False,
    predictor: ParkPredictor | None = None,
    graphs=None,
    val_graphs=None,
    config: FitConfig | None = None,
    on_epoch=None,
    **options,
) -> ParkPredictor:
    """Train one meta-network on ``checkpoints`` of any architectures.

    Args:
        checkpoints: ``(model, state_dict)`` / ``(spec, state_dict)`` pairs, mixed architectures.
        targets: ``(n,)`` or ``(n, k)``; the first column drives early stopping.
        validation: ``(checkpoints, targets)`` for early stopping (default: a seeded
            ``config.val_fraction`` of ``checkpoints``).
        example_inputs: inputs (or ``model -> inputs``) to detect new architectures on.
        target_names: names of the target columns (stored with the predictor).
        seed: seeds the initialization, the batch orders and the default validation split.
        branches: ``"both"``, ``"stats"`` or ``"graph"``.
        combine: ``"blend"``, ``"residual"``, ``"joint"``, ``"boost"`` or ``"stack"`` (see the
            module doc).
        target_transform: ``"standard"`` or ``"rank"`` (see the module doc).
        stat_readout: the graph branch's readout also reads the statistics
            (:class:`~wsym.metanet.park.ParkNet`).
        paths: the graph branch's readout also reads the cross-layer path features.
        readout: the graph branch's readout, ``"roles"`` or ``"thirds"``
            (:class:`~wsym.metanet.park.ParkNet`).
        aggregate: its message aggregation, ``"mean"``, ``"roles"`` or ``"attention"``.
        virtual: a per-graph global node after each message-passing round.
        inputs: its input scaling, ``"standard"`` or ``"squashed"`` (asinh after standardizing).
        joint_reads: what the joint ensemble (``combine="joint"`` / ``"stack"``) reads of the
            graph branch besides the statistics: ``"readout"``, ``"head"`` (the head's hidden
            layer) or ``"prediction"`` (:meth:`~wsym.metanet.park.ParkNet.joint_inputs`).
        auxiliary: ``{name: (n,) values}`` of the training members (e.g. their training
            hyperparameters) that the graph branch's head also learns to predict, standardized,
            as extra outputs that are trained and never predicted: what its message passing
            must then read from the weights.
        predictor: an untrained :class:`ParkPredictor` whose known architectures to reuse.
        graphs: prepared universal graphs of ``checkpoints`` (skips their preparation).
        val_graphs: the same for ``validation[0]``.
        config: the hyperparameters (:class:`~wsym.metanet.fit.FitConfig`).
        on_epoch: progress hook ``on_epoch(epoch, epochs, val_tau)`` of the graph branch.
        **options: fields of :class:`~wsym.metanet.fit.FitConfig` replacing those of ``config``.
    """
    c = FitConfig.of(config, options)
    if target_transform not in ("standard", "rank"):
        raise WsymInputError(f"target_transform is 'standard' or 'rank', got {target_transform!r}")
    y = torch.as_tensor(targets, dtype=torch.float64)
    y = y[:, None] if y.ndim == 1 else y
    if len(y) != len(checkpoints) or len(checkpoints) < 2:
        raise WsymInputError(
            f"need one target per checkpoint and at least 2 of them, got {len(checkpoints)} "
            f"checkpoints and {len(y)} targets"
        )
    meta = {
        "targets": list(target_names)[: y.shape[1]] or [f"y{i}" for i in range(y.shape[1])],
        "hidden": c.hidden,
        "layers": c.layers,
        "stat_hidden": c.stat_hidden,
        "members": c.members,
        "branches": branches,
        "trees": c.trees,
        "combine": combine,
        "target_transform": target_transform,
        "stat_readout": stat_readout,
        "paths": paths,
        "readout": readout,
        "aggregate": aggregate,
        "inputs": inputs,
        "joint_reads": joint_reads,
        "auxiliary": sorted(auxiliary or {}),
        "virtual": virtual,
    }
    torch.manual_seed(seed)
    net = network_of(meta, y.shape[1])
    p = ParkPredictor(net, predictor.specs if predictor else {}, meta, example_inputs)
    start = time.perf_counter()
    graphs = p.graphs(checkpoints) if graphs is None else list(graphs)
    graphs, y, val_graphs, y_val = split_validation(
        graphs, y, validation, val_graphs, p.graphs, c.val_fraction, seed
    )
    graph_seconds = time.perf_counter() - start
    # rank: train on normal scores, report in standardized units of those scores
    z = normal_scores(y) if target_transform == "rank" else y
    mean, std = z.mean(0), z.std(0).clamp(min=1e-12)
    meta.update(target_mean=mean.tolist(), target_std=std.tolist())
    z = (z - mean) / std
    whole = batch_graphs(graphs)
    meta["novelty"] = TrainingDistribution.fit(whole.stat_x).to_json()
    net.fit_inputs(whole)
    x = x_val = z_val = None  # the statistics branch's inputs, unless it is left out
    if branches != "graph":
        x, x_val = whole.stat_x, batch_graphs(val_graphs).stat_x
        # validation targets on the training scale only matter for ranking (tau)
        z_val = ((y_val - y.mean(0)) / y.std(0).clamp(min=1e-12)).float()
    stat_tau, _, stat_seconds = statistics_stage(net, x, z.float(), x_val, z_val, c, seed)
    blend = branches == "both" and combine in ("blend", "joint", "stack")
    boost = branches == "both" and combine == "boost"
    stack = branches == "both" and combine == "stack"
    if blend:
        net.branches = "graph"  # trained on its own, then weighed against the statistics
    target = z
    if auxiliary and (validation is None or boost):
        raise WsymInputError("auxiliary targets need validation=(...) and combine other than boost")
    if auxiliary:  # standardized extra columns of the graph branch's targets
        a = torch.stack(
            [torch.as_tensor(auxiliary[k], dtype=z.dtype) for k in meta["auxiliary"]], 1
        )
        if len(a) != len(checkpoints):
            raise WsymInputError(f"auxiliary: {len(a)} rows for {len(checkpoints)} checkpoints")
        target = torch.cat([z, (a - a.mean(0)) / a.std(0).clamp(min=1e-12)], dim=1)
    if boost:  # s + g on z - oof + s: g fits the out-of-fold residual z - oof
        start = time.perf_counter()
        target = _boost_targets(net.stats, x, z, x_val, z_val, c, seed)
        stat_seconds += time.perf_counter() - start
        net.graph_weight.fill_(1.0)
    epochs = c.epochs if branches != "stats" and not stack else 0
    report = graph_stage(
        p, graphs, target, val_graphs, y_val, c, seed, epochs=epochs, on_epoch=on_epoch
    )
    if stack:
        report.update(_fit_stack(p, graphs, target, val_graphs, y_val, z_val, c, seed, on_epoch))
    report.update(
        statistics_val_tau=stat_tau, statistics_seconds=stat_seconds, graph_seconds=graph_seconds
    )
    if blend or boost:
        net.branches = "both"
        report["graph_val_tau"] = report["val_tau"]
        if combine == "stack":
            report["joint_val_tau"] = report["fold_joint_val_taus"]
        if combine == "joint":
            report["joint_val_tau"] = _fit_joint(net, graphs, z, val_graphs, z_val, c, seed)
        report["blend_val_taus"] = taus = {}
        for beta in BLENDS:
            net.graph_weight.fill_(beta)
            taus[beta] = kendall_tau(y_val[:, 0], _first(p.predict_graphs(val_graphs)))
        best = max(taus, key=lambda b: (taus[b], -b))  # ties: the smaller graph weight
        net.graph_weight.fill_(best)
        report.update(graph_weight=best, val_tau=taus[best])
    meta["report"] = report
    return p


def cross_folds(n: int, folds: int, seed: int) -> list[torch.Tensor]:
    """A seeded partition of ``range(n)`` into ``folds`` near-equal parts.

    Example:
        >>> sorted(torch.cat(cross_folds(7, 2, seed=0)).tolist())
        [0, 1, 2, 3, 4, 5, 6]
    """
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return [order[k::folds] for k in range(folds)]


def _fit_stack(p, graphs, z, val_graphs, y_val, z_val, c: FitConfig, seed: int, on_epoch):
    """Cross-fitting: fold k's graph branch on the other folds, its joint ensemble on fold k.

    The joint ensemble then reads the frozen message-passing readout of members
    the graph branch was not trained on, at training time as at prediction time
    (the in-sample readout of ``combine="joint"`` is fitted to those very members).
    Returns the graph branches' mean validation tau and the joint ensembles'.
    """
    graph_taus, joint_taus, seconds, epochs_run = [], [], 0.0, 0
    for k, (fold, held) in enumerate(
        zip(p.net.folds, cross_folds(len(graphs), len(p.net.folds), seed), strict=True)
    ):
        keep = torch.ones(len(graphs), dtype=torch.bool)
        keep[held] = False
        inside = [graphs[i] for i in keep.nonzero()[:, 0].tolist()]
        fold.branches = "graph"
        rep = graph_stage(
            ParkPredictor(fold, {}, p.config),
            inside,
            z[keep],
            val_graphs,
            y_val,
            c,
            seed + 7919 * (k + 1),
            on_epoch=on_epoch,
        )
        fold.branches = "both"
        graph_taus.append(rep["val_tau"])
        seconds, epochs_run = seconds + rep["train_seconds"], epochs_run + rep["epochs_run"]
        outside = [graphs[i] for i in held.tolist()]
        x, x_val = _joint_inputs(fold, outside), _joint_inputs(fold, val_graphs)
        zk = z[held, : z_val.shape[1]].float()  # the targets, not the auxiliary columns
        tau, _ = train_statistics(fold.joint, x, zk, x_val, z_val, c, seed + k)
        fold.joint.requires_grad_(False)
        joint_taus.append(tau)
    p.net.branches = "graph"
    graph_tau = kendall_tau(y_val[:, 0], _first(p.predict_graphs(val_graphs)))
    return {
        "val_tau": graph_tau,
        "fold_graph_val_taus": graph_taus,
        "fold_joint_val_taus": joint_taus,
        "train_seconds": seconds,
        "epochs_run": epochs_run,
        "best_epoch": None,
    }


def _boost_targets(stats, x, z, x_val, z_val, c: FitConfig, seed: int, folds: int = 5):
    """``z - oof + s(x)``: on them ``s + g`` (``s`` frozen) makes ``g`` fit ``z - oof``.

    ``z - oof`` is the statistics branch's out-of-fold residual; ``oof``: each member
    predicted by a copy of ``stats`` trained (as ``stats`` was, early stopping on the
    validation members) on the other ``folds - 1`` folds.
    """
    order = torch.randperm(len(z), generator=torch.Generator().manual_seed(seed))
    oof = torch.empty_like(z)
    for k in range(folds):
        held = order[k::folds]
        keep = torch.ones(len(z), dtype=torch.bool)
        keep[held] = False
        fold = copy.deepcopy(stats).requires_grad_(True)
        train_statistics(fold, x[keep], z[keep].float(), x_val, z_val, c, seed + 101 * (k + 1))
        with torch.no_grad():
            oof[held] = fold(x[held]).to(z.dtype)
    stats.eval()
    with torch.no_grad():
        return z - oof + stats(x).to(z.dtype)


@torch.no_grad()
def _joint_inputs(net, graphs, batch_size: int = 64) -> torch.Tensor:
    net.eval()
    parts = [
        net.joint_inputs(batch_graphs(graphs[i : i + batch_size]))
        for i in range(0, len(graphs), batch_size)
    ]
    return torch.cat(parts)


def _fit_joint(net, graphs, z, val_graphs, z_val, c: FitConfig, seed: int) -> float:
    """Train ``net.joint`` on the statistics and the frozen graph readout; its validation tau."""
    x, x_val = _joint_inputs(net, graphs), _joint_inputs(net, val_graphs)
    tau, _ = train_statistics(net.joint, x, z.float(), x_val, z_val, c, seed)
    net.joint.requires_grad_(False)
    return tau


def _first(y: torch.Tensor) -> torch.Tensor:
    return y if y.ndim == 1 else y[:, 0]


def zoo_specs(zoo) -> dict:
    """``{architecture JSON: spec}``: the specs detected on ``zoo`` so far, kept on the zoo."""
    return zoo.__dict__.setdefault("_park_specs", {})


def zoo_members(zoo, ids) -> list:
    """``(spec, state_dict)`` of the zoo members ``ids``, detected once per architecture."""
    import json

    from wsym.detect import detect

    cache = zoo_specs(zoo)
    out = []
    for i in ids:
        arch = json.dumps(zoo.row(i)["architecture"], sort_keys=True)
        if arch not in cache:
            cache[arch] = detect(zoo.model(i), zoo.example_inputs())
        out.append((cache[arch], zoo.state_dict(i)))
    return out


def zoo_space(zoo):
    """The architecture space of ``zoo``'s preset, knowing the specs :func:`zoo_members` found.

    ``None`` when the preset's architecture space is not finite.
    """
    import json

    from wsym.errors import WsymInputError
    from wsym.zoo.space import ArchitectureSpace, architecture_space

    preset = zoo.manifest["config"]
    try:
        architecture_space(preset)
    except WsymInputError:
        return None
    space = ArchitectureSpace(preset, zoo.example_inputs())
    for text, spec in zoo_specs(zoo).items():
        space.know(json.loads(text), spec)
    return space


def is_finite(sd: dict) -> bool:
    """Whether every floating tensor of ``sd`` is finite (a diverged member is not)."""
    return all(
        bool(torch.isfinite(v).all())
        for v in sd.values()
        if torch.is_tensor(v) and v.is_floating_point()
    )


def capped(ids: dict[str, list], caps: dict[str, int] | None) -> dict[str, list]:
    """At most ``caps[split]`` of each split's entries (a seeded subsample, order kept)."""
    out = dict(ids)
    for s, cap in (caps or {}).items():
        v = out.get(s, [])
        keep = sorted(random.Random(0).sample(range(len(v)), min(cap, len(v))))
        out[s] = [v[i] for i in keep]
    return out


def zoo_ids(zoo, caps: dict[str, int] | None = None) -> dict[str, list[int]]:
    """``{split: member ids}`` of :data:`SPLITS` (capped by ``caps``: a seeded subsample)."""
    return capped({s: [r["id"] for r in zoo.table if r["split"] == s] for s in SPLITS}, caps)


def fit_zoo(
    zoo, *, target: str = "gap", seed: int = 0, ids: dict | None = None, **options
) -> tuple[ParkPredictor, dict]:
    """Fit on a zoo's ``train`` split (``val`` for early stopping); it knows every architecture.

    ``ids``: the members of each split (default :func:`zoo_ids`, every member);
    members with non-finite weights (diverged in training) are left out.
    The predictor carries the architecture space of the zoo's preset
    (:func:`zoo_space`), so it reads bare state dicts of every architecture the
    preset can draw. Returns the predictor and ``{split: Kendall tau}`` on ``test``
    and ``test_arch`` (the held-out members and architectures; absent splits left out). Its
    ``config["card"]`` has the split sizes, the taus and ``timing`` (seconds per stage).
    """
    clock = time.perf_counter()
    ids = zoo_ids(zoo) if ids is None else ids
    members = {s: zoo_members(zoo, v) for s, v in ids.items()}
    keep = {s: [k for k, (_, sd) in enumerate(m) if is_finite(sd)] for s, m in members.items()}
    ids = {s: [ids[s][k] for k in keep[s]] for s in ids}  # diverged members left out
    members = {s: [members[s][k] for k in keep[s]] for s in members}
    y = {s: [float(zoo.row(i)[target]) for i in v] for s, v in ids.items()}
    timing = {"detect and load": time.perf_counter() - clock}
    p = fit_park(
        members["train"],
        y["train"],
        validation=(members["val"], y["val"]),
        target_names=(target,),
        seed=seed,
        **options,
    )
    rep = p.config["report"]
    timing.update(
        {
            "invariant graphs": rep["graph_seconds"],
            "statistics branch": rep["statistics_seconds"],
            "graph branch": rep["train_seconds"],
        }
    )
    start = time.perf_counter()
    for spec, _ in members["test"] + members["test_arch"]:
        p.add_architecture(spec)
    p.space = zoo_space(zoo)
    taus = {
        s: kendall_tau(torch.tensor(y[s]), p.predict(members[s]))
        for s in ("test", "test_arch")
        if len(ids[s]) > 1
    }
    timing["scoring"] = time.perf_counter() - start
    timing["total"] = time.perf_counter() - clock
    splits = {s: len(v) for s, v in ids.items()}
    p.config["card"] = {"splits": splits, "test_tau": taus, "timing": timing}
    return p, taus


def park_card(p: ParkPredictor, zoo: str, command: str) -> str:
    """A short markdown model card of a :func:`fit_zoo` predictor."""
    from wsym.zoo.space import architecture_space

    rep, c = p.config["report"], p.config
    splits, taus = c["card"]["splits"], c["card"]["test_tau"]
    seconds = c["card"]["timing"]["total"]
    lines = [
        f"# Meta-network: {c['targets'][0]} on `{zoo}` (one network, every park architecture)",
        "",
        f"- architectures known: {len(p.schemas)} (every architecture of the zoo, held-out ones "
        "included)"
        + (
            f"; reads all {len(architecture_space(p.space.preset))} architectures of the zoo's "
            "preset (the others' symmetries detected when first met)"
            if p.space is not None
            else ""
        ),
        f"- training: {splits['train']} train / {splits['val']} val members, seed {rep['seed']}, "
        f"best graph epoch {rep['best_epoch']} of {rep['epochs_run']}, {seconds:.0f}s on CPU",
        f"- held-out members ({splits['test']}): Kendall tau {taus.get('test', float('nan')):.3f}",
        f"- held-out architectures ({splits['test_arch']}): Kendall tau "
        f"{taus.get('test_arch', float('nan')):.3f}",
        f"- validation Kendall tau: statistics branch {rep['statistics_val_tau']:.3f}, graph "
        f"branch alone {rep.get('graph_val_tau', float('nan')):.3f}, blended "
        f"{rep['val_tau']:.3f} (graph weight {rep.get('graph_weight', 1.0)}, chosen on the "
        "validation members)",
        f"- network: universal role-featured graphs, {c['layers']} message-passing layers, "
        f"width {c['hidden']}"
        + (", readout also reads the statistics" if c.get("stat_readout") else "")
        + f"; statistics branch {c['members']} perceptrons; combination {c.get('combine', 'blend')}"
        + (f" + {c['trees']} boosted trees" if c.get("trees") else ""),
        "- invariant to each member's whole symmetry group (canonical forms + message passing)",
        "- bare checkpoints are matched to the "
        + ("preset's" if p.space is not None else "known")
        + " architectures by tensor names and shapes; where several share them (MLPs "
        "differing only in the activation, CNNs in the residual connections, transformers in the "
        "head count) the prediction is "
        "the mean over those",
        f"- command: `{command}`",
        "",
    ]
    return "\n".join(lines)


SPLITS = ("train", "val", "test", "test_arch")
