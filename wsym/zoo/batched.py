"""Train many zoo members at once, as one batched model.

Members that share an architecture (and, but for MLP classifiers, a batch
size) train together: their parameters and buffers are stacked on a leading
member axis, so each step is a few batched matmuls (or grouped convolutions)
instead of one small step per member. Plain MLP classifiers run
:mod:`wsym.zoo.mlp_trainer` (batched matmuls and a hand-written backward, no
autograd, every batch size in one stack); other modules run under
``torch.func.vmap(functional_call(...))`` with autograd. The optimizer update
is :mod:`wsym.zoo.stacked_optim`, per member (own learning rate, weight decay, SGD or
Adam, only the rule the member uses).

Each member draws everything from its own seeds (:func:`member_streams`):
initial weights, its training subset (``train_fraction``), its label noise, its
data order and its dropout masks. Nothing depends on the other members in its
group, so a member comes out the same whichever members it trains with, in
whichever order: bit for bit for MLPs, transformers and diagonal networks
(batched matmuls compute each member's product on its own); for the CNNs
to float32 rounding only, because oneDNN's grouped convolutions (what
``vmap`` makes of a convolution) round a member's output differently
depending on the group (``tests/test_zoo_train.py`` checks both). PyTorch's
native convolutions would be bit-independent but lose accuracy in float32
training of BatchNorm nets (drifting ~1e-3 from a float64 reference within 30
steps, where oneDNN stays within 1e-6), so oneDNN stays on. Builds are
bit-identical regardless, because members always train in the same groups:
a shard's members, split by architecture (and batch size).

Per member (:mod:`wsym.zoo.streams`): its data subset, label noise, data
order and dropout masks come from its own seeds. Here:

* **dropout**: inverted dropout with the member's rate on the outputs of the
  preset's ``dropout_sites`` (forward hooks; the stored modules have no dropout
  layer, as dropout has no parameters).
* **BatchNorm**: the members' running statistics are stacked buffers passed to
  ``functional_call`` in train mode, so each member normalizes with its own batch
  statistics and updates its own running mean and variance in place, exactly as
  a lone ``nn.BatchNorm`` in train mode would; evaluation uses eval mode and the
  stored running statistics.

MLP classifiers of every batch size train together in lock step
(:mod:`wsym.zoo.mlp_trainer`); other architectures are grouped by batch size.
A member leaves the stack as soon as it has taken its ``epochs * (n // B)``
steps, so members with short schedules do not slow down the others.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from wsym.errors import WsymInputError
from wsym.io.datasets import Dataset
from wsym.zoo import finetune, stacked_mlp, stacked_optim
from wsym.zoo.architectures import initialise
from wsym.zoo.mlp_trainer import LockstepMLPTrainer
from wsym.zoo.streams import (
    BLOCK,
    DataStream,
    DropoutMasks,
    example_loss,
    member_metrics,
    member_results,
    member_streams,
)

_EVAL_CHUNK = 1024


@dataclass
class Member:
    """One member to train: id, seed (stream 0), hyperparameters, architecture config."""

    id: int
    seed: int
    hyperparameters: dict[str, Any]
    architecture: dict[str, Any]


@dataclass
class Trained:
    """A trained member: its state dict and its metrics (loss, accuracy, gap, epoch, steps)."""

    id: int
    state_dict: dict[str, torch.Tensor]
    metrics: dict[str, float] = field(default_factory=dict)


def train_members(
    preset: dict[str, Any],
    data: Dataset,
    members: list[Member],
    start: dict[str, torch.Tensor] | None = None,
) -> list[Trained]:
    """Train ``members`` of ``preset`` on ``data``, batched; results in the order given.

    With ``start`` (a pretrained state dict, :mod:`wsym.zoo.finetune`), members
    start from it, but for the entries the preset's ``pretrain.reinit`` names.

    Members are grouped by architecture; MLP classifiers of one architecture
    train as one stacked model (:mod:`wsym.zoo.mlp_trainer`), other
    architectures as one batched model per batch size (see the module
    docstring). Training runs on one thread (restored after): with more,
    these small batched ops run many times slower on a busy machine, and the
    bits would depend on the count.
    """
    groups: dict[str, list[Member]] = {}
    for member in members:
        groups.setdefault(json.dumps(member.architecture), []).append(member)
    done: dict[int, Trained] = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for group in groups.values():
            for result in _train_architecture(preset, data, group, start):
                done[result.id] = result
    finally:
        torch.set_num_threads(threads)
    return [done[m.id] for m in members]


def _train_architecture(preset, data: Dataset, members: list[Member], start) -> list[Trained]:
    base = initialise(members[0].architecture, 0)
    spec = stacked_mlp.mlp_spec(base, preset.get("dropout_sites", []))
    if spec is not None and preset["task"] != "regression" and start is None:
        trained = LockstepMLPTrainer(preset, data, members, spec).run()
        return [Trained(member.id, sd, metrics) for member, sd, metrics in trained]
    by_batch: dict[int, list[Member]] = {}
    for member in members:
        by_batch.setdefault(int(member.hyperparameters["batch_size"]), []).append(member)
    return [
        r for group in by_batch.values() for r in _GroupTrainer(preset, data, group, start).run()
    ]


class _GroupTrainer:
    """Members of one architecture and batch size, trained as one batched model.

    The parameters of all members live in one tensor ``{"flat": (M, P)}``,
    which :meth:`_views` cuts into the module's parameter shapes; the loss
    gradient comes from autograd through ``vmap`` (or, for MLP regressors,
    through the batched MLP forward). ``self.rows`` holds the indices (into
    ``self.members``) of the members still training, in stack order; every
    per-member tensor is kept aligned with it. Members whose hyperparameters
    hold ``warmup`` follow :func:`~wsym.zoo.finetune.learning_rate` (warm-up,
    then cosine decay), those with ``label_smoothing`` smooth their targets.
    """

    def __init__(
        self,
        preset: dict[str, Any],
        data: Dataset,
        members: list[Member],
        start: dict[str, torch.Tensor] | None = None,
    ):
        members = sorted(members, key=lambda m: m.hyperparameters["optimizer"] == "adam")
        self.members, self.data = members, data
        self.regression = preset["task"] == "regression"
        self.batch = int(members[0].hyperparameters["batch_size"])
        hp = [m.hyperparameters for m in members]
        seeds = [member_streams(m.seed) for m in members]
        modules = [
            initialise(m.architecture, s["init"], float(h["init_scale"]))
            for m, s, h in zip(members, seeds, hp, strict=True)
        ]
        if start is not None:
            reinit = preset["pretrain"].get("reinit", [])
            for module in modules:
                finetune.start_from(module, start, reinit)
        self.base = initialise(members[0].architecture, 0).train()
        self.keys = list(self.base.state_dict())
        params, buffers = stack_module_state(modules)
        params = {k: v.detach() for k, v in params.items()}
        self.shapes = {k: v.shape[1:] for k, v in params.items()}
        sites = preset.get("dropout_sites", [])
        self.mlp = stacked_mlp.mlp_spec(self.base, sites)
        flat = torch.cat([v.reshape(len(members), -1) for v in params.values()], 1)
        self.params = {"flat": flat}
        self.buffers = {k: v.clone() for k, v in buffers.items()}
        self.opt_state = stacked_optim.init_state(self.params)
        self.hyper = stacked_optim.Hyper(
            torch.tensor([float(h["lr"]) for h in hp]),
            torch.tensor([float(h["weight_decay"]) for h in hp]),
            torch.tensor([h["optimizer"] == "adam" for h in hp]),
        )
        self.streams = [
            DataStream(data, h, s["data"], self.batch, self.regression)
            for h, s in zip(hp, seeds, strict=True)
        ]
        self.targets = torch.stack([s.targets for s in self.streams])
        self.total = torch.tensor([s.total_steps for s in self.streams])
        self.schedule = finetune.Schedule.of(hp, self.total)
        rates = [float(h["dropout"]) for h in hp]
        x = data.x_train[: self.batch]
        self.dropout = _DropoutHooks(self.base, sites if any(rates) else [], x)
        self.masks = DropoutMasks(rates, [s["dropout"] for s in seeds], self.dropout.shapes)
        self.rows = torch.arange(len(members))
        self.next_exit = 0
        self.block: tuple[torch.Tensor, dict[str, torch.Tensor]] | None = None
        self.finished: dict[int, dict[str, torch.Tensor]] = {}
        self.step = 0

    def run(self) -> list[Trained]:
        """Train until every member has taken its steps, then evaluate all of them."""
        self._retire()
        while len(self.rows):
            rows = self.rows.tolist()
            indices = torch.stack([self.streams[r].next_block() for r in rows])  # (M, K, B)
            self.block = indices, self.masks.next_block(rows)
            for k in range(BLOCK):
                indices, masks = self.block
                self._train_step(indices[:, k], {site: m[:, k] for site, m in masks.items()})
                self.step += 1
                self._retire()
                if not len(self.rows):
                    break
        return self._evaluate()

    def _views(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        views, start = {}, 0
        for name, shape in self.shapes.items():
            size = shape.numel()
            views[name] = flat[:, start : start + size].view(len(flat), *shape)
            start += size
        return views

    def _forward(self, params, buffers, x, masks):
        self.dropout.current = masks
        try:
            return functional_call(self.base, (params, buffers), (x,))
        finally:
            self.dropout.current = None

    def _train_step(self, idx: torch.Tensor, masks: dict[str, torch.Tensor]) -> None:
        """One step of every training member on its batch ``idx`` ``(M, B)``."""
        y = self.targets[torch.arange(len(idx)).unsqueeze(1), idx]  # (M, B) or (M, B, T)
        x = self.data.x_train[idx]
        # differentiate w.r.t. leaf views of ``flat`` (not ``flat`` itself, whose slice
        # backward would zero-fill a full (M, P) gradient once per parameter)
        flat = self.params["flat"]
        params = {k: v.requires_grad_(True) for k, v in self._views(flat).items()}
        out = self._batched(params, self.buffers, x, masks)
        smoothing = self.schedule.smoothing(self.rows)
        loss = example_loss(out, y, self.regression, smoothing).mean(dim=1).sum()
        grads = torch.autograd.grad(loss, list(params.values()))
        grad = torch.cat([g.reshape(len(g), -1) for g in grads], dim=1)
        hyper = self.schedule.hyper(self.hyper, self.rows, self.step)
        stacked_optim.step(self.params, {"flat": grad}, self.opt_state, hyper)

    def _batched(self, params, buffers, x, masks) -> torch.Tensor:
        """Outputs ``(M, B, ...)`` of every member on its own inputs ``x`` ``(M, B, ...)``."""
        if self.mlp is not None:
            return _mlp_forward(params, x, masks, self.mlp)
        return vmap(self._forward)(params, buffers, x, masks)

    def _retire(self) -> None:
        """Take members that have taken all their steps off the stack."""
        if self.step < self.next_exit:
            return
        done = self.total[self.rows] <= self.step
        if not bool(done.any()):
            self.next_exit = int(self.total[self.rows].min())
            return
        state = {**self._views(self.params["flat"]), **self.buffers}
        for pos in torch.nonzero(done).flatten().tolist():
            row = int(self.rows[pos])
            self.finished[row] = {k: v[pos].clone() for k, v in state.items()}
        keep = torch.nonzero(~done).flatten()
        self.rows = self.rows[keep]
        self.next_exit = int(self.total[self.rows].min()) if len(self.rows) else 0
        self.params = {k: v[keep] for k, v in self.params.items()}
        self.opt_state = stacked_optim.select_state(self.opt_state, keep)
        self.buffers = {k: v[keep] for k, v in self.buffers.items()}
        self.hyper = self.hyper.select(keep)
        self.targets = self.targets[keep]
        if self.block is not None:
            indices, masks = self.block
            self.block = indices[keep], {site: m[keep] for site, m in masks.items()}

    @torch.no_grad()
    def _evaluate(self) -> list[Trained]:
        order = range(len(self.members))
        state = {k: torch.stack([self.finished[i][k] for i in order]) for k in self.finished[0]}
        params = {k: state[k] for k in self.shapes}
        buffers = {k: state[k] for k in self.buffers}
        self.base.eval()
        train_out = self._outputs(params, buffers, self.data.x_train)
        test_out = self._outputs(params, buffers, self.data.x_test)
        metrics = member_metrics(
            train_out, test_out, self.streams, self.data.y_test, self.regression
        )
        results = member_results(self.members, state, self.keys, metrics, self.total)
        return [Trained(member.id, sd, values) for member, sd, values in results]

    def _outputs(self, params, buffers, x: torch.Tensor) -> torch.Tensor:
        if self.mlp is not None:
            chunks = [
                stacked_mlp.forward(
                    params, x[i : i + _EVAL_CHUNK].expand(len(self.members), -1, -1), self.mlp
                )
                for i in range(0, len(x), _EVAL_CHUNK)
            ]
            return torch.cat(chunks, dim=1)
        forward = vmap(self._forward, in_dims=(0, 0, None, None))
        chunks = [
            forward(params, buffers, x[i : i + _EVAL_CHUNK], {})
            for i in range(0, len(x), _EVAL_CHUNK)
        ]
        return torch.cat(chunks, dim=1)


def _mlp_forward(params, x, masks, spec: stacked_mlp.MLPSpec) -> torch.Tensor:
    """Batched MLP forward with dropout (autograd path: regression MLPs), ``x`` ``(M, B, d)``."""
    h = x
    for name, act, drop in zip(spec.layers, spec.activations, spec.dropout, strict=True):
        weight, bias = params[f"{name}.weight"], params[f"{name}.bias"]
        h = torch.baddbmm(bias.unsqueeze(1), h, weight.transpose(1, 2))
        if act is not None:
            h = stacked_mlp.activation(act, h)
        if drop is not None and drop in masks:
            h = h * masks[drop]
    return h


class _DropoutHooks:
    """Forward hooks applying the current step's masks to the outputs of ``sites``.

    ``shapes`` (empty without ``sites``) records each site's per-example output
    shape (a probe forward on ``x``, one batch), in forward order.
    """

    def __init__(self, base: nn.Module, sites: list[str], x: torch.Tensor):
        self.current: dict[str, torch.Tensor] | None = None
        self.shapes: dict[str, torch.Size] = {}
        self._probe = False
        if not sites:
            return
        modules = dict(base.named_modules())
        for site in sites:
            if site not in modules:
                raise WsymInputError(
                    f"dropout site {site!r} is not a submodule of the zoo architecture; "
                    "fix the preset's dropout_sites"
                )
            modules[site].register_forward_hook(self._hook(site))
        self._probe = True
        with torch.no_grad():
            base(x)  # records each site's output shape
        self._probe = False

    def _hook(self, site: str):
        def hook(module, inputs, output):
            if self._probe:
                self.shapes[site] = output.shape
            masks = self.current
            if masks and site in masks:
                return output * masks[site]
            return output

        return hook
