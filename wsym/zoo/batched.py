"""Train many zoo members at once, as one batched model.

Members that share an architecture and a batch size train together: their
parameters and buffers are stacked on a leading member axis, so each step is a
few batched matmuls (or grouped convolutions) instead of one small step per
member. Plain MLP classifiers run :mod:`wsym.zoo.stacked_mlp` (batched matmuls
and a hand-written backward, no autograd); other modules run under
``torch.func.vmap(functional_call(...))`` with autograd. The optimizer update
is :mod:`wsym.zoo.optim`, per member (own learning rate, weight decay, SGD or
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
a shard's members, split by architecture and batch size.

Per member:

* **data**: a random subset of ``max(B, round(train_fraction * N))`` training
  examples; each epoch visits it in a fresh random order in batches of ``B``,
  dropping the last incomplete batch, so every step sees exactly ``B`` examples.
* **label noise**: a fraction ``label_noise`` of the subset gets a wrong label,
  uniform over the other classes (classification), or Gaussian noise of standard
  deviation ``label_noise * std(y)`` on the targets (regression).
* **dropout**: inverted dropout with the member's rate on the outputs of the
  preset's ``dropout_sites`` (forward hooks; the stored modules have no dropout
  layer, as dropout has no parameters).
* **BatchNorm**: the members' running statistics are stacked buffers passed to
  ``functional_call`` in train mode, so each member normalizes with its own batch
  statistics and updates its own running mean and variance in place, exactly as
  a lone ``nn.BatchNorm`` in train mode would; evaluation uses eval mode and the
  stored running statistics.
* **metrics**: loss and accuracy (eval mode) on the member's own training subset
  with its own (noisy) labels, and on the clean test split.

A member leaves the stack as soon as it has taken its ``epochs * (n // B)``
steps, so members with short schedules do not slow down the others.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, stack_module_state, vmap
from torch.nn import functional as F

from wsym.data import Dataset
from wsym.errors import WsymInputError
from wsym.zoo import optim, stacked_mlp
from wsym.zoo.architectures import initialise
from wsym.zoo.presets import member_seed

#: Steps of data order drawn at once per member (amortizes the per-member Python work).
BLOCK = 32
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


def member_streams(seed: int) -> dict[str, int]:
    """Independent seeds of a member's initial weights, data and dropout masks."""
    return {name: member_seed(seed, 0, k) for k, name in enumerate(("init", "data", "dropout"), 1)}


def train_members(preset: dict[str, Any], data: Dataset, members: list[Member]) -> list[Trained]:
    """Train ``members`` of ``preset`` on ``data``, batched; results in the order given.

    Members are grouped by architecture and batch size; each group trains as one
    batched model (see the module docstring). Training runs on one thread
    (restored after): with more, these small batched ops run
    many times slower on a busy machine, and the bits would depend on the count.
    """
    groups: dict[str, list[Member]] = {}
    for member in members:
        key = json.dumps([member.architecture, member.hyperparameters["batch_size"]])
        groups.setdefault(key, []).append(member)
    done: dict[int, Trained] = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for group in groups.values():
            for result in _GroupTrainer(preset, data, group).run():
                done[result.id] = result
    finally:
        torch.set_num_threads(threads)
    return [done[m.id] for m in members]


class _GroupTrainer:
    """Members of one architecture and batch size, trained as one stacked model.

    Plain MLPs train with :mod:`wsym.zoo.stacked_mlp` (hand-written backward,
    parameters ``self.params`` = one augmented tensor per layer); anything else
    keeps the parameters of all members in one tensor ``{"flat": (M, P)}``,
    which :meth:`_views` cuts into the module's parameter shapes, and runs
    autograd through ``vmap``. Members are stacked SGD first, then Adam, so
    the optimizer computes each rule on a contiguous block of rows only.
    ``self.rows`` holds the indices (into ``self.members``) of the members
    still training, in stack order; every per-member tensor is kept aligned
    with it.
    """

    def __init__(self, preset: dict[str, Any], data: Dataset, members: list[Member]):
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
        self.base = initialise(members[0].architecture, 0).train()
        self.keys = list(self.base.state_dict())
        params, buffers = stack_module_state(modules)
        params = {k: v.detach() for k, v in params.items()}
        self.shapes = {k: v.shape[1:] for k, v in params.items()}
        sites = preset.get("dropout_sites", [])
        self.mlp = stacked_mlp.mlp_spec(self.base, sites)
        if self.mlp is not None:
            packed = stacked_mlp.pack(params, self.mlp)
            self.stack = optim.FlatStack({f"layer{i}": a for i, a in enumerate(packed)})
            self.params = self.stack.views("param")
            self.x_aug = stacked_mlp.with_ones(data.x_train)
        else:
            flat = torch.cat([v.reshape(len(members), -1) for v in params.values()], 1)
            self.params = {"flat": flat}
        self.buffers = {k: v.clone() for k, v in buffers.items()}
        self.opt_state = self.stack.state() if self.mlp else optim.init_state(self.params)
        self.plan: optim.Plan | None = None
        self.hyper = optim.Hyper(
            torch.tensor([float(h["lr"]) for h in hp]),
            torch.tensor([float(h["weight_decay"]) for h in hp]),
            torch.tensor([h["optimizer"] == "adam" for h in hp]),
        )
        self.streams = [
            _DataStream(data, h, s["data"], self.batch, self.regression)
            for h, s in zip(hp, seeds, strict=True)
        ]
        self.all_targets = torch.stack([s.targets for s in self.streams])
        self.targets = self.all_targets
        self.total = torch.tensor([s.total_steps for s in self.streams])
        rates = [float(h["dropout"]) for h in hp]
        self.dropout = _Dropout(
            self.base, sites, data.x_train, self.batch, rates, [s["dropout"] for s in seeds]
        )
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
            self.block = indices, self.dropout.next_block(rows)
            for k in range(BLOCK):
                indices, masks = self.block
                self._train_step(indices[:, k], {site: m[:, k] for site, m in masks.items()})
                self.step += 1
                self._retire()
                if not len(self.rows):
                    break
        return self._evaluate()

    def _state(self) -> dict[str, torch.Tensor]:
        """Stacked state dict ``{name: (M, ...)}`` of the members in the stack (views)."""
        if self.mlp is not None:
            params = stacked_mlp.unpack(list(self.params.values()), self.mlp)
        else:
            params = self._views(self.params["flat"])
        return {**params, **self.buffers}

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
        y = self.targets.gather(1, idx)
        if self.mlp is not None and not self.regression:
            m, b = idx.shape
            x = self.x_aug.index_select(0, idx.reshape(-1)).view(m, b, -1)
            if self.plan is None:  # the stack changed
                self.plan = self.stack.plan(self.hyper)
                self.grad_views = list(self.stack.views("grad").values())
                self.workspace: dict = {}
            params = list(self.params.values())
            stacked_mlp.loss_gradients(
                params, x, y, masks, self.mlp, self.grad_views, self.workspace
            )
            self.plan.step()
            return
        x = self.data.x_train[idx]
        # differentiate w.r.t. leaf views of ``flat`` (not ``flat`` itself, whose slice
        # backward would zero-fill a full (M, P) gradient once per parameter)
        flat = self.params["flat"]
        params = {k: v.requires_grad_(True) for k, v in self._views(flat).items()}
        out = self._batched(params, self.buffers, x, masks)
        loss = _loss(out, y, self.regression).mean(dim=1).sum()
        grads = torch.autograd.grad(loss, list(params.values()))
        grad = torch.cat([g.reshape(len(g), -1) for g in grads], dim=1)
        optim.step(self.params, {"flat": grad}, self.opt_state, self.hyper)

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
        self.plan = None
        state = self._state()
        for pos in torch.nonzero(done).flatten().tolist():
            row = int(self.rows[pos])
            self.finished[row] = {k: v[pos].clone() for k, v in state.items()}
        keep = torch.nonzero(~done).flatten()
        self.rows = self.rows[keep]
        self.next_exit = int(self.total[self.rows].min()) if len(self.rows) else 0
        if self.mlp is not None:
            self.stack = self.stack.select(keep)
            self.params, self.opt_state = self.stack.views("param"), self.stack.state()
        else:
            self.params = {k: v[keep] for k, v in self.params.items()}
            self.opt_state = optim.select_state(self.opt_state, keep)
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
        train_loss = _loss(train_out, self.all_targets, self.regression)
        mask = torch.stack([s.mask for s in self.streams]).float()
        count = mask.sum(dim=1)
        test_out = self._outputs(params, buffers, self.data.x_test)
        test_y = self.data.y_test.expand(len(self.members), -1)
        metrics = {
            "train_loss": (train_loss * mask).sum(1) / count,
            "test_loss": _loss(test_out, test_y, self.regression).mean(dim=1),
        }
        if self.regression:
            metrics["train_acc"] = metrics["test_acc"] = torch.full_like(count, math.nan)
            metrics["gap"] = metrics["test_loss"] - metrics["train_loss"]
        else:
            correct = (train_out.argmax(-1) == self.all_targets).float()
            metrics["train_acc"] = (correct * mask).sum(1) / count
            metrics["test_acc"] = (test_out.argmax(-1) == test_y).float().mean(dim=1)
            metrics["gap"] = metrics["train_acc"] - metrics["test_acc"]
        results = []
        for i, member in enumerate(self.members):
            values = {k: float(v[i]) for k, v in metrics.items()}
            values["epoch"] = int(member.hyperparameters["epochs"])
            values["steps"] = int(self.total[i])
            sd = {k: state[k][i].contiguous() for k in self.keys}
            results.append(Trained(member.id, sd, values))
        return results

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


def _loss(out: torch.Tensor, y: torch.Tensor, regression: bool) -> torch.Tensor:
    """Per-example loss ``(M, B)`` of outputs ``(M, B, C)`` (or ``(M, B)``) and targets."""
    if regression:
        return (out - y) ** 2
    m, b = y.shape
    return F.cross_entropy(out.reshape(m * b, -1), y.reshape(-1), reduction="none").view(m, b)


class _DataStream:
    """One member's training subset, noisy targets and data order (its own generator)."""

    def __init__(self, data: Dataset, hp: dict[str, Any], seed: int, batch: int, regression: bool):
        gen = torch.Generator().manual_seed(seed)
        n_all = len(data.y_train)
        n = min(n_all, max(batch, round(float(hp["train_fraction"]) * n_all)))
        self.subset = torch.randperm(n_all, generator=gen)[:n]
        targets = data.y_train.clone()
        noise = float(hp["label_noise"])
        if regression:
            scale = noise * float(data.y_train.std())
            targets[self.subset] += scale * torch.randn(n, generator=gen)
        else:
            classes = int(max(data.y_train.max(), data.y_test.max())) + 1
            noisy = self.subset[torch.randperm(n, generator=gen)[: round(noise * n)]]
            shift = torch.randint(1, classes, (len(noisy),), generator=gen)
            targets[noisy] = (targets[noisy] + shift) % classes
        self.targets = targets
        self.mask = torch.zeros(n_all, dtype=torch.bool)
        self.mask[self.subset] = True
        self.batch, self.per_epoch = batch, n // batch
        self.total_steps = int(hp["epochs"]) * self.per_epoch
        self.gen = gen
        self.pending = torch.empty(0, dtype=torch.long)

    def next_block(self) -> torch.Tensor:
        """Example indices of the next :data:`BLOCK` steps, ``(BLOCK, B)``."""
        need = BLOCK * self.batch
        while len(self.pending) < need:
            order = self.subset[torch.randperm(len(self.subset), generator=self.gen)]
            self.pending = torch.cat([self.pending, order[: self.per_epoch * self.batch]])
        block, self.pending = self.pending[:need], self.pending[need:]
        return block.view(BLOCK, self.batch)


class _Dropout:
    """Inverted dropout on the outputs of named submodules, a mask stream per member."""

    def __init__(
        self,
        base: nn.Module,
        sites: list[str],
        x: torch.Tensor,
        batch: int,
        rates: list[float],
        seeds: list[int],
    ):
        self.rates = rates
        self.gens = [
            torch.Generator().manual_seed(s) if r > 0 else None
            for r, s in zip(rates, seeds, strict=True)
        ]
        self.current: dict[str, torch.Tensor] | None = None
        self._probe = False
        self.shapes: dict[str, torch.Size] = {}
        if not sites or not any(r > 0 for r in rates):
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
            base(x[:batch])  # records each site's output shape
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

    def next_block(self, rows: list[int]) -> dict[str, torch.Tensor]:
        """Masks ``(M, BLOCK, B, ...)`` of members ``rows`` for the next steps (``{}``: none).

        Member ``r`` keeps a unit where its uniform draw is ``>= p_r`` and scales
        it by ``1 / (1 - p_r)``; members with ``p_r = 0`` draw nothing (all ones).
        """
        rates = [self.rates[r] for r in rows]
        if not self.shapes or not any(rates):
            return {}
        rate = torch.tensor(rates)
        scale = 1.0 / (1.0 - rate)
        out = {}
        for site, shape in self.shapes.items():
            draws = torch.empty(len(rows), BLOCK, *shape)
            for slot, r, p in zip(draws, rows, rates, strict=True):
                if p == 0:
                    slot.fill_(1.0)
                else:
                    slot.uniform_(generator=self.gens[r])
            per_member = (-1, *(1,) * (draws.dim() - 1))
            torch.ge(draws, rate.view(per_member), out=draws)  # 1.0 where kept, else 0.0
            out[site] = draws.mul_(scale.view(per_member))
        return out
