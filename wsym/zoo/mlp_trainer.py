"""Stacked MLP classifiers of any batch sizes, trained in lock step.

The fast path of :func:`wsym.zoo.batched.train_members`. All ``M`` members of
one plain MLP architecture (:func:`wsym.zoo.stacked_mlp.mlp_spec`) share one
:class:`~wsym.zoo.stacked_optim.FlatStack` (parameters, gradients, optimizer state)
ordered by batch size, so the members of each batch size ``B`` are a
contiguous block of rows of every layer. One training step is

* per batch size ``B`` still training: the hand-written loss gradients of its
  block, ``(M_B, B, d)`` inputs -> gradients written into the block's rows
  (:func:`~wsym.zoo.stacked_mlp.loss_gradients`, a dozen batched kernels);
* one optimizer update of every member (:class:`~wsym.zoo.stacked_optim.Plan`).

Members of different batch sizes thus share the optimizer kernels and the
steps: training takes as many steps as the longest member needs, instead of
the sum over batch sizes of each one's longest member. A member leaves the
stack (its rows are compacted away) as soon as it has taken its
``epochs * (n // B)`` steps.

Every member's gradient is computed by batched matmuls over its own rows and
the update is element-wise, so a member comes out bit for bit the same
whichever members it trains with (``tests/test_zoo_train.py``). Data order,
label noise and dropout masks are the member's own streams
(:mod:`wsym.zoo.streams`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.func import stack_module_state

from wsym.io.datasets import Dataset
from wsym.zoo import stacked_mlp, stacked_optim
from wsym.zoo.architectures import initialise
from wsym.zoo.streams import (
    BLOCK,
    DataStream,
    DropoutMasks,
    member_metrics,
    member_results,
    member_streams,
)

_EVAL_CHUNK = 1024


class LockstepMLPTrainer:
    """Members of one MLP classifier architecture, every batch size, in one stack.

    ``self.rows`` holds the indices (into ``self.members``) of the members
    in the stack, in stack order: by batch size, then by optimizer (SGD and
    Adam first in turn, so that each rule's rows form as few runs as
    possible), the members with dropout in one run of rows per batch size
    (only they draw and apply masks). ``self.groups`` cuts the stack into
    ``(batch, start, stop)`` blocks of rows.

    Args:
        preset: the zoo preset (its ``dropout_sites``).
        data: the dataset.
        members: :class:`~wsym.zoo.batched.Member` s, one architecture, a plain MLP.
        spec: the architecture's :class:`~wsym.zoo.stacked_mlp.MLPSpec`.
    """

    def __init__(
        self, preset: dict[str, Any], data: Dataset, members: list, spec: stacked_mlp.MLPSpec
    ):
        sizes = sorted({int(m.hyperparameters["batch_size"]) for m in members})

        def order(m):
            # by batch size; SGD and Adam first in turn (fewest runs of rows of one rule);
            # within a batch size, the members with dropout in one run of rows
            hp = m.hyperparameters
            b = int(hp["batch_size"])
            second_rule = (hp["optimizer"] == "adam") != (sizes.index(b) % 2 == 1)
            return b, second_rule, (float(hp["dropout"]) > 0) != second_rule

        members = sorted(members, key=order)
        self.members, self.data, self.spec = members, data, spec
        hp = [m.hyperparameters for m in members]
        seeds = [member_streams(m.seed) for m in members]
        modules = [
            initialise(m.architecture, s["init"], float(h["init_scale"]))
            for m, s, h in zip(members, seeds, hp, strict=True)
        ]
        self.keys = list(modules[0].state_dict())
        params, _ = stack_module_state(modules)
        packed = stacked_mlp.pack({k: v.detach() for k, v in params.items()}, spec)
        self.stack = stacked_optim.FlatStack({f"layer{i}": a for i, a in enumerate(packed)})
        self.x_aug = stacked_mlp.with_ones(data.x_train)
        self.batch = torch.tensor([int(h["batch_size"]) for h in hp])
        self.dropped = torch.tensor([float(h["dropout"]) > 0 for h in hp])
        self.hyper = stacked_optim.Hyper(
            torch.tensor([float(h["lr"]) for h in hp]),
            torch.tensor([float(h["weight_decay"]) for h in hp]),
            torch.tensor([h["optimizer"] == "adam" for h in hp]),
        )
        self.streams = [
            DataStream(data, h, s["data"], int(h["batch_size"]), regression=False)
            for h, s in zip(hp, seeds, strict=True)
        ]
        self.targets = torch.stack([s.targets for s in self.streams])
        self.total = torch.tensor([s.total_steps for s in self.streams])
        widths = [a.shape[1] for a in packed]
        sites = {site: w for site, w in zip(spec.dropout, widths, strict=False) if site}
        rates = [float(h["dropout"]) for h in hp]
        self.dropout = {
            b: DropoutMasks(
                rates, [s["dropout"] for s in seeds], {k: (b, w) for k, w in sites.items()}
            )
            for b in sorted(set(self.batch.tolist()))
        }
        self.rows = torch.arange(len(members))
        self.finished: dict[int, dict[str, torch.Tensor]] = {}
        self.step = 0
        self._restack()

    def run(self) -> list[tuple[Any, dict[str, torch.Tensor], dict[str, float]]]:
        """Train every member its steps; ``[(member, state dict, metrics)]`` in stack order."""
        self._finish()
        while self._compact():
            blocks = [
                self._block(b, start, stop, masked)
                for (b, start, stop), (masked, _, _) in zip(self.groups, self.programs, strict=True)
            ]
            for k in range(BLOCK):
                for g in self.live_groups:
                    _, gradients, x = self.programs[g]
                    idx, y, masks = blocks[g]
                    torch.index_select(self.x_aug, 0, idx[k], out=x.view(-1, x.shape[-1]))
                    gradients(x, y[k], {site: v[:, k] for site, v in masks.items()})
                self.plan.step()
                self.step += 1
                if self.step >= self.next_exit and not self._finish():
                    break
        return self._evaluate()

    def _finish(self) -> bool:
        """Keep the final state of members that have just taken their last step.

        They stay in the stack (their further updates are discarded) until the
        block ends; a batch size whose members have all finished stops
        computing. Returns whether any member in the stack is still training.
        """
        left = self.total[self.rows] - self.step
        state = stacked_mlp.unpack(self.params, self.spec)
        for pos in torch.nonzero(left == 0).flatten().tolist():
            self.finished[int(self.rows[pos])] = {k: v[pos].clone() for k, v in state.items()}
        training = left > 0
        self.live_groups = [
            g for g, (_, start, stop) in enumerate(self.groups) if bool(training[start:stop].any())
        ]
        self.next_exit = self.step + int(left[training].min()) if bool(training.any()) else 0
        return bool(training.any())

    def _compact(self) -> bool:
        """Drop finished members from the stack; returns whether any member is left."""
        keep = torch.nonzero(self.total[self.rows] > self.step).flatten()
        if len(keep) < len(self.rows):
            self.rows = self.rows[keep]
            self.stack = self.stack.select(keep)
            self.hyper = self.hyper.select(keep)
            self._restack()
        return len(self.rows) > 0

    def _restack(self) -> None:
        """Cut the views, batch-size groups, gradient programs and optimizer plan of the stack."""
        self.params = list(self.stack.views("param").values())
        self.grads = list(self.stack.views("grad").values())
        self.plan = self.stack.plan(self.hyper) if len(self.rows) else None
        batch = self.batch[self.rows].tolist()
        self.groups = []
        for pos, b in enumerate(batch):
            if pos == 0 or b != batch[pos - 1]:
                self.groups.append([b, pos, pos + 1])
            else:
                self.groups[-1][2] = pos + 1
        self.programs = []
        for b, start, stop in self.groups:
            dropped = torch.nonzero(self.dropped[self.rows[start:stop]]).flatten().tolist()
            masked = slice(dropped[0], dropped[-1] + 1) if dropped else slice(0, 0)
            assert len(dropped) == masked.stop - masked.start  # one run (the stack's order)
            gradients = stacked_mlp.LossGradients(
                [p[start:stop] for p in self.params],
                self.spec,
                b,
                [g[start:stop] for g in self.grads],
                masked,
            )
            x = self.x_aug.new_empty(stop - start, b, self.x_aug.shape[1])
            self.programs.append((masked, gradients, x))
        self.live_groups = list(range(len(self.groups)))

    def _block(self, b: int, start: int, stop: int, masked: slice):
        """The next :data:`BLOCK` steps of the members of batch size ``b``.

        Data indices ``(K, M_B * B)``, targets ``(K, M_B, B)``, and dropout masks
        ``{site: (M_D, K, B, w)}`` of the ``M_D`` members with dropout (rows ``masked``).
        """
        rows = self.rows[start:stop]
        indices = torch.stack([self.streams[r].next_block() for r in rows.tolist()])
        y = self.targets[rows].gather(1, indices.view(len(rows), -1)).view(indices.shape)
        masks = self.dropout[b].next_block(rows[masked].tolist())
        return indices.transpose(0, 1).reshape(BLOCK, -1), y.transpose(0, 1).contiguous(), masks

    @torch.no_grad()
    def _evaluate(self) -> list[tuple[Any, dict[str, torch.Tensor], dict[str, float]]]:
        order = range(len(self.members))
        state = {k: torch.stack([self.finished[i][k] for i in order]) for k in self.keys}
        train_out = self._outputs(state, self.data.x_train)
        test_out = self._outputs(state, self.data.x_test)
        metrics = member_metrics(train_out, test_out, self.streams, self.data.y_test, False)
        return member_results(self.members, state, self.keys, metrics, self.total)

    def _outputs(self, state: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        m = len(self.members)
        chunks = [
            stacked_mlp.forward(state, x[i : i + _EVAL_CHUNK].expand(m, -1, -1), self.spec)
            for i in range(0, len(x), _EVAL_CHUNK)
        ]
        return torch.cat(chunks, dim=1)
