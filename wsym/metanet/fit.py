r"""Training a meta-network on any list of checkpoints of one architecture.

``fit`` detects the symmetry spec (or takes one), maps every state dict to its
invariant weight graph once, and trains a :class:`~wsym.metanet.layers.WeightGraphNet`
with AdamW on standardized targets, minimizing

.. math:: \mathrm{MSE}(p, y) + \lambda \cdot \mathrm{mean}_{y_i \neq y_j}
    \log(1 + e^{-(p_i - p_j)\,\mathrm{sign}(y_i - y_j)})

(a pairwise ranking term), in two stages, each keeping the weights with the
best validation Kendall tau (early stopping):

1. the statistics branch alone: each of its ``members`` perceptrons on the
   quantile-normalized per-tensor statistics (cheap: one vector per member,
   ``stat_epochs`` / ``stat_patience``);
2. the graph branch on top (its last layer starts at zero, so it starts from
   the statistics branch's prediction and learns the residual; the statistics
   branch is frozen), ``epochs`` / ``patience``; it is kept only where it
   raises the validation tau (``epochs=0`` skips it).

Everything random comes from ``seed``.
"""

from __future__ import annotations

import copy
import difflib
import math
import time
from dataclasses import dataclass, fields, replace

import torch
from torch import nn

from wsym.detect import spec_or_detect
from wsym.errors import WsymInputError
from wsym.group.spec import SymmetrySpec
from wsym.metanet.graph import GraphSchema, batch_graphs
from wsym.metanet.layers import log_beyond, stat_input
from wsym.metanet.metrics import kendall_tau, pairwise_rank_loss
from wsym.metanet.novelty import TrainingDistribution
from wsym.metanet.predictor import Predictor, network_for
from wsym.metanet.statistics import train_vector_model

#: Weights of the boosted trees tried against the perceptrons (chosen on validation).
BLENDS = (0.0, 0.25, 0.5, 0.75, 1.0)


@dataclass(frozen=True)
class FitConfig:
    """Hyperparameters of :func:`fit` (the defaults are the shipped predictor's).

    Attributes:
        hidden: network width.
        layers: message-passing rounds.
        epochs: largest number of passes over the training members (graph branch).
        lr: peak AdamW learning rate, annealed to 0 over ``epochs`` by a cosine.
        weight_decay: AdamW weight decay.
        batch_size: graphs per step.
        rank_weight: weight of the pairwise ranking term.
        patience: epochs without a better validation tau before stopping.
        val_fraction: share of members held out for validation when no
            ``validation`` set is given.
        members: perceptrons averaged in the statistics branch (an ensemble).
        stat_hidden: their width.
        stat_epochs: largest number of epochs of each of them (stage 1).
        stat_patience: their early-stopping patience.
        stat_lr: their AdamW learning rate.
        trees: boosting stages of gradient-boosted trees on the same statistics,
            blended into the statistics branch with a weight chosen on the
            validation members (0, the default: perceptrons only; see
            ``benchmarks/metanet_results.md`` for the ablation).
        tree_depth: depth of each tree.
        warmup: epochs of linear learning-rate warm-up of the graph branch (0, the
            default: none, and the cosine steps once per epoch); with it the rate is
            set every step: up linearly over ``warmup`` epochs, then a cosine to 0 by
            ``epochs``.
        ema: decay per step of an exponential moving average of the graph branch's
            weights (0, the default: none); with it the average is what each epoch's
            validation reads and what is kept.
    """

    hidden: int = 32
    layers: int = 2
    epochs: int = 80
    lr: float = 2e-3
    weight_decay: float = 1e-4
    batch_size: int = 32
    rank_weight: float = 1.0
    patience: int = 20
    val_fraction: float = 0.2
    members: int = 5
    stat_hidden: int = 64
    stat_epochs: int = 300
    stat_patience: int = 40
    stat_lr: float = 1e-3
    trees: int = 0
    tree_depth: int = 3
    warmup: int = 0
    ema: float = 0.0

    @classmethod
    def of(cls, config: FitConfig | None, options: dict) -> FitConfig:
        """``config`` (default: the defaults) with ``options`` replacing fields."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            close = difflib.get_close_matches(unknown[0], sorted(known), n=2)
            hint = f"did you mean {', '.join(close)}?" if close else "see wsym.metanet.FitConfig"
            raise WsymInputError(f"wsym.metanet.fit has no option {', '.join(unknown)}; {hint}")
        return replace(config or cls(), **options)


def fit(
    factory,
    state_dicts: list[dict],
    targets,
    *,
    example_inputs=None,
    spec: SymmetrySpec | None = None,
    validation: tuple[list[dict], object] | None = None,
    target_names: tuple[str, ...] = ("gap",),
    seed: int = 0,
    graphs=None,
    val_graphs=None,
    config: FitConfig | None = None,
    on_epoch=None,
    **options,
) -> Predictor:
    """Train a meta-network predicting ``targets`` from ``state_dicts``.

    Args:
        factory: the architecture: a module, or a zero-argument callable returning one.
        state_dicts: training checkpoints (same architecture).
        targets: ``(n,)`` or ``(n, k)`` values to predict (e.g. generalization gaps).
        example_inputs: inputs for detection (or pass ``spec``).
        spec: the architecture's spec, if already detected.
        validation: ``(state_dicts, targets)`` for early stopping; default: a
            seeded random ``config.val_fraction`` of the training members.
        target_names: names of the target columns (stored with the predictor).
        seed: seeds the network's initialization and the batch orders.
        graphs: precomputed invariant graphs of ``state_dicts`` (skips their preparation).
        val_graphs: the same for ``validation[0]``.
        config: the hyperparameters (:class:`FitConfig`; default its defaults).
        on_epoch: progress hook, called ``on_epoch(epoch, epochs, val_tau)`` after
            each epoch of the graph branch.
        **options: fields of :class:`FitConfig` replacing those of ``config``
            (``epochs=0``, ``hidden=64``, ...).

    Returns:
        A :class:`~wsym.metanet.predictor.Predictor`; ``config["report"]`` has the
        best epoch, validation tau and training time.

    Example:
        >>> import torch
        >>> from wsym.models.networks import MLP
        >>> sds = [MLP(3, [4], 2).state_dict() for _ in range(8)]
        >>> y = torch.tensor([float(sd["0.weight"].norm()) for sd in sds])
        >>> p = fit(lambda: MLP(3, [4], 2), sds, y, example_inputs=torch.randn(2, 3), epochs=2)
        >>> p.predict(sds).shape
        torch.Size([8])
    """
    c = FitConfig.of(config, options)
    spec = spec_or_detect(spec, factory, example_inputs, "wsym.metanet.fit")
    y = torch.as_tensor(targets, dtype=torch.float64)
    y = y[:, None] if y.ndim == 1 else y
    if len(y) != len(state_dicts) or len(state_dicts) < 2:
        raise WsymInputError(
            f"need one target per state dict and at least 2 of them, got {len(state_dicts)} "
            f"state dicts and {len(y)} targets"
        )
    probe = Predictor(spec, network_for(GraphSchema.from_spec(spec), c.hidden, c.layers, 1), {})
    start = time.perf_counter()
    graphs = probe.graphs(state_dicts) if graphs is None else list(graphs)
    graphs, y, val_graphs, y_val = split_validation(
        graphs, y, validation, val_graphs, probe.graphs, c.val_fraction, seed
    )
    graph_seconds = time.perf_counter() - start
    mean, std = y.mean(0), y.std(0).clamp(min=1e-12) if len(y) > 1 else torch.ones(y.shape[1])
    meta = {
        "targets": list(target_names)[: y.shape[1]] or [f"y{i}" for i in range(y.shape[1])],
        "target_mean": mean.tolist(),
        "target_std": std.tolist(),
        "hidden": c.hidden,
        "layers": c.layers,
        "stat_hidden": c.stat_hidden,
        "members": c.members,
        "trees": c.trees,
        "tree_depth": c.tree_depth,
    }
    torch.manual_seed(seed)
    net = network_for(
        probe.schema,
        c.hidden,
        c.layers,
        y.shape[1],
        c.stat_hidden,
        c.members,
        c.trees,
        c.tree_depth,
    )
    whole = batch_graphs(graphs)
    meta["novelty"] = TrainingDistribution.fit(stat_input(whole)).to_json()
    net.edge_enc.fit(log_beyond(whole.edge_attr).float(), whole.edge_type)
    net.attr_enc.fit(log_beyond(whole.attr_val).float(), whole.attr_type)
    stat_tau, blend_taus, stat_seconds = statistics_stage(
        net,
        stat_input(whole),
        ((y - mean) / std).float(),
        stat_input(batch_graphs(val_graphs)),
        ((y_val - mean) / std).float(),
        c,
        seed,
    )
    predictor = Predictor(spec, net, meta)
    report = graph_stage(
        predictor, graphs, (y - mean) / std, val_graphs, y_val, c, seed, on_epoch=on_epoch
    )
    report.update(
        graph_seconds=graph_seconds,
        statistics_val_tau=stat_tau,
        statistics_seconds=stat_seconds,
        blend=float(net.stats.blend) if c.trees else 0.0,
        blend_val_taus=blend_taus,
    )
    meta["report"] = report
    return predictor


def statistics_stage(net, x, z, x_val, z_val, c: FitConfig, seed: int) -> tuple:
    """Stage 1 on ``net.stats`` (skipped when ``x`` is None), then the graph branch's start.

    The head is zeroed and the statistics branch frozen, so the graph branch starts from
    the statistics' predictions. Returns ``(validation tau, {blend: tau}, seconds)``.
    """
    start = time.perf_counter()
    tau, taus = float("nan"), {}
    if x is not None:
        tau, taus = train_statistics(net.stats, x, z, x_val, z_val, c, seed)
    seconds = time.perf_counter() - start
    nn.init.zeros_(net.head[-1].weight)
    nn.init.zeros_(net.head[-1].bias)
    net.stats.requires_grad_(False)
    return tau, taus, seconds


def graph_stage(
    predictor, graphs, z, val_graphs, y_val, c: FitConfig, seed: int, epochs=None, on_epoch=None
) -> dict:
    """Stage 2: the graph branch, trained with ``c``'s settings (``epochs`` overrides its own)."""
    return _train(
        predictor,
        graphs,
        z,
        val_graphs,
        y_val,
        epochs=c.epochs if epochs is None else epochs,
        lr=c.lr,
        weight_decay=c.weight_decay,
        batch_size=c.batch_size,
        rank_weight=c.rank_weight,
        patience=c.patience,
        seed=seed,
        on_epoch=on_epoch,
        warmup=c.warmup,
        ema=c.ema,
    )


def split_validation(graphs, y, validation, val_graphs, read, val_fraction: float, seed: int):
    """``(graphs, y, val_graphs, y_val)``: ``validation`` read by ``read``, or a seeded share."""
    if validation is None:
        order = torch.randperm(len(graphs), generator=torch.Generator().manual_seed(seed))
        n_val = max(1, int(round(val_fraction * len(graphs))))
        val_idx, tr_idx = order[:n_val].tolist(), order[n_val:].tolist()
        return [graphs[i] for i in tr_idx], y[tr_idx], [graphs[i] for i in val_idx], y[val_idx]
    val_graphs = read(validation[0]) if val_graphs is None else list(val_graphs)
    y_val = torch.as_tensor(validation[1], dtype=torch.float64).reshape(len(val_graphs), -1)
    return graphs, y, val_graphs, y_val


def train_statistics(branch, x, z, x_val, z_val, c: FitConfig, seed: int):
    """Stage 1: quantile knots, each perceptron, the trees, the blend; validation taus.

    ``c``'s ``stat_epochs``, ``stat_patience`` and ``stat_lr`` for every perceptron.
    Returns the branch's validation tau and ``{blend: validation tau}`` over the grid.
    """
    epochs, patience, lr = c.stat_epochs, c.stat_patience, c.stat_lr
    dtype = branch.normal.knots.dtype
    branch.normal.fit(x.to(dtype))
    with torch.no_grad():
        q, q_val = branch.normal(x.to(dtype)), branch.normal(x_val.to(dtype))
    for j, member in enumerate(branch.members):
        torch.manual_seed(seed * 1009 + j)
        for layer in member:
            if hasattr(layer, "reset_parameters"):
                layer.reset_parameters()
        train_vector_model(
            member, q, z, q_val, z_val, epochs=epochs, lr=lr, patience=patience, seed=seed + j
        )
    for j, trees in enumerate(branch.trees):
        trees.fit(branch.tree_features(x), z[:, j], seed=seed)
    branch.eval()
    taus = {}
    with torch.no_grad():
        mlp, boosted = branch.perceptrons(x_val)[:, 0], branch.boosted(x_val)[:, 0]
        for beta in BLENDS if len(branch.trees) else (0.0,):
            taus[beta] = kendall_tau(z_val[:, 0], (1 - beta) * mlp + beta * boosted)
    best = max(taus, key=lambda b: (taus[b], -abs(b - 0.5)))  # ties: the even blend
    if len(branch.trees):
        branch.blend.fill_(best)
    return taus[best], taus


def _train(
    predictor,
    graphs,
    z,
    val_graphs,
    y_val,
    *,
    epochs,
    lr,
    weight_decay,
    batch_size,
    rank_weight,
    patience,
    seed,
    on_epoch=None,
    warmup: int = 0,
    ema: float = 0.0,
) -> dict:
    if warmup < 0 or not 0 <= ema <= 1:
        raise WsymInputError(f"warmup is >= 0 and ema in [0, 1], got {warmup} and {ema}")
    net = predictor.net
    params = [p for p in net.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    steps = -(-len(graphs) // batch_size)  # per epoch (an upper bound: lone graphs skipped)
    if warmup:
        schedule = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: warmup_cosine(s, warmup * steps, max(epochs, 1) * steps)
        )
    else:
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(epochs, 1))
    average = [p.detach().clone() for p in params] if ema else None
    gen = torch.Generator().manual_seed(seed)
    tau0 = kendall_tau(y_val[:, 0], _column(predictor.predict_graphs(val_graphs)))
    best = (tau0, 0, copy.deepcopy(net.state_dict()))
    start = time.perf_counter()
    epoch = 0
    for epoch in range(1, epochs + 1):
        net.train()
        net.stats.eval()  # frozen, no dropout
        for idx in torch.randperm(len(graphs), generator=gen).split(batch_size):
            if len(idx) < 2:
                continue
            pred = net(batch_graphs([graphs[i] for i in idx.tolist()])).double()
            target = z[idx]
            loss = nn.functional.mse_loss(pred, target)
            if rank_weight:
                loss = loss + rank_weight * pairwise_rank_loss(pred[:, 0], target[:, 0])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if warmup:
                schedule.step()
            if ema:
                with torch.no_grad():
                    for mean, p in zip(average, params, strict=True):
                        mean.lerp_(p, 1 - ema)
        if not warmup:
            schedule.step()
        raw = _swap(params, average) if ema else None  # validate (and keep) the average
        tau = kendall_tau(y_val[:, 0], _column(predictor.predict_graphs(val_graphs)))
        if on_epoch is not None:
            on_epoch(epoch, epochs, tau)
        if tau > best[0]:
            best = (tau, epoch, copy.deepcopy(net.state_dict()))
        if ema:
            _swap(params, raw)
        if epoch - best[1] >= patience:
            break
    net.load_state_dict(best[2])
    net.eval()
    seconds = time.perf_counter() - start
    return {
        "val_tau": best[0],
        "best_epoch": best[1],
        "epochs_run": epoch,
        "train_members": len(graphs),
        "val_members": len(val_graphs),
        "train_seconds": seconds,
        "graphs_per_second": len(graphs) * epoch / seconds if seconds > 0 else float("nan"),
        "seed": seed,
    }


def warmup_cosine(step: int, warm: int, total: int) -> float:
    """The learning-rate factor at ``step``: linear up over ``warm`` steps, then a cosine to 0.

    Example:
        >>> [round(warmup_cosine(s, 2, 6), 2) for s in range(7)]
        [0.0, 0.5, 1.0, 0.85, 0.5, 0.15, 0.0]
    """
    if step < warm:
        return step / warm
    return 0.5 * (1 + math.cos(math.pi * min(step - warm, total - warm) / max(total - warm, 1)))


@torch.no_grad()
def _swap(params: list, values: list) -> list:
    """Set ``params`` to ``values``; their previous values."""
    old = [p.detach().clone() for p in params]
    for p, v in zip(params, values, strict=True):
        p.copy_(v)
    return old


def _column(y: torch.Tensor) -> torch.Tensor:
    return y if y.ndim == 1 else y[:, 0]
