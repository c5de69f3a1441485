r"""One meta-network for a park of architectures: fit, predict, save and load on mixed lists.

:class:`ParkNet` reads :class:`~wsym.metanet.universal.UniversalSchema` graphs of
any architecture with one set of weights (no per-architecture table): role
encoders (a :class:`~wsym.metanet.layers.TypedEncoder` over the fixed role
vocabularies, standardized per role on the training graphs),
``layers`` x :class:`~wsym.metanet.layers.EdgeNodeConv`, and a readout of the
mean and max of the nodes of each group (inputs, hidden, outputs) and the mean
of the edges of each role, with the architecture descriptors, into a
perceptron: the *graph branch*. The *statistics branch*
(:class:`~wsym.metanet.statistics.StatisticsEnsemble`) reads the bucketed
per-tensor statistics ``stat_x``. ``branches`` picks ``"both"`` (statistics
first, then the graph branch on its residual, kept where it raises the
validation tau, as :func:`wsym.metanet.fit`), ``"stats"`` or ``"graph"``.

Members are ``(model, state_dict)`` pairs (the model's symmetries are detected
once per architecture on ``example_inputs``: a tensor, or a callable
``model -> inputs``), ``(spec, state_dict)`` pairs, or bare state dicts of an
architecture the predictor already knows (matched by tensor names and shapes).

Example:
    >>> import torch
    >>> from wsym.reference import MLP
    >>> ms = [(MLP(3, [w], 2), None) for w in (4, 5) for _ in range(4)]
    >>> ms = [(m, m.state_dict()) for m, _ in ms]
    >>> y = torch.tensor([float(sd["0.weight"].norm()) for _, sd in ms])
    >>> p = fit_park(ms, y, example_inputs=torch.randn(2, 3), epochs=1, stat_epochs=2)
    >>> p.predict(ms).shape
    torch.Size([8])
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import Tensor, nn
from torch_geometric.utils import scatter

from wsym.detect import detect
from wsym.errors import WsymInputError, check_finite
from wsym.group.spec import SymmetrySpec
from wsym.metanet.invariant import invariant_form
from wsym.metanet.layers import EdgeNodeConv, TypedEncoder, mlp
from wsym.metanet.statistics import StatisticsEnsemble
from wsym.metanet.universal import (
    ATTR_ROLES,
    ATTR_WIDTH,
    DESCRIPTORS,
    EDGE_ROLES,
    EDGE_WIDTH,
    NODE_GROUPS,
    NODE_WIDTH,
    STAT_WIDTH,
    UniversalSchema,
    check_known,
)

PARK_FORMAT = "park-1"
BRANCHES = ("both", "stats", "graph")


class ParkNet(nn.Module):
    """Graph branch + statistics branch over universal graphs (see the module doc).

    Args:
        hidden: width; layers: message-passing rounds; outputs: targets.
        stat_hidden, members: the statistics branch's width and ensemble size.
        branches: ``"both"``, ``"stats"`` or ``"graph"``.
    """

    def __init__(
        self,
        hidden: int = 32,
        layers: int = 2,
        outputs: int = 1,
        stat_hidden: int = 64,
        members: int = 5,
        branches: str = "both",
    ):
        super().__init__()
        if branches not in BRANCHES:
            raise WsymInputError(f"branches must be one of {', '.join(BRANCHES)}, got {branches!r}")
        self.branches = branches
        self.node_enc = TypedEncoder(1, NODE_WIDTH, hidden)
        self.attr_enc = TypedEncoder(len(ATTR_ROLES), ATTR_WIDTH, hidden)
        self.edge_enc = TypedEncoder(len(EDGE_ROLES), EDGE_WIDTH, hidden)
        self.convs = nn.ModuleList(EdgeNodeConv(hidden) for _ in range(layers))
        pooled = (2 * len(NODE_GROUPS) + len(EDGE_ROLES)) * hidden + DESCRIPTORS
        self.head = mlp(pooled, hidden, outputs)
        self.stats = StatisticsEnsemble(STAT_WIDTH, stat_hidden, members, outputs)

    def fit_inputs(self, batch) -> None:
        """Per-role standardization of the raw features from the training graphs."""
        self.node_enc.fit(batch.node_x.float(), torch.zeros_like(batch.node_group))
        self.attr_enc.fit(batch.attr_x.float(), batch.attr_role)
        self.edge_enc.fit(batch.edge_x.float(), batch.edge_role)

    def forward(self, batch) -> Tensor:
        """``(B, outputs)``: the branches in use, added."""
        if self.branches == "stats":
            return self.stats(batch.stat_x)
        if self.branches == "graph":
            return self.graph_branch(batch)
        return self.graph_branch(batch) + self.stats(batch.stat_x)

    def graph_branch(self, batch) -> Tensor:
        """``(B, outputs)`` the message-passing branch alone."""
        dtype = self.head[0].weight.dtype
        n, b = batch.num_nodes, batch.num_graphs
        h = self.node_enc(batch.node_x.to(dtype), torch.zeros_like(batch.node_group))
        a = self.attr_enc(batch.attr_x.to(dtype), batch.attr_role)
        h = h + scatter(a, batch.attr_node, 0, dim_size=n, reduce="sum")
        e = self.edge_enc(batch.edge_x.to(dtype), batch.edge_role)
        for conv in self.convs:
            h, e = conv(h, batch.edge_index, e)
        groups = batch.batch * len(NODE_GROUPS) + batch.node_group
        size = b * len(NODE_GROUPS)
        mean = scatter(h, groups, 0, dim_size=size, reduce="mean")
        top = scatter(h, groups, 0, dim_size=size, reduce="max")
        roles = batch.batch[batch.edge_index[1]] * len(EDGE_ROLES) + batch.edge_role
        edges = scatter(e, roles, 0, dim_size=b * len(EDGE_ROLES), reduce="mean")
        pooled = [mean.view(b, -1), top.view(b, -1), edges.view(b, -1), batch.graph_x.to(dtype)]
        return self.head(torch.cat(pooled, dim=1))


def _signature_key(spec: SymmetrySpec) -> str:
    return json.dumps(UniversalSchema.from_spec(spec).signature)


class ParkPredictor:
    """Predicts targets from state dicts of any architecture it knows (or is given).

    Attributes:
        net: the :class:`ParkNet`.
        specs: ``{signature key: spec}`` of the known architectures.
        config: hyperparameters, target names and scaling, training report.
    """

    def __init__(self, net: ParkNet, specs: dict, config: dict, example_inputs=None):
        self.net, self.config, self.example_inputs = net, config, example_inputs
        self.schemas = {k: UniversalSchema.from_spec(s) for k, s in specs.items()}
        self.net.eval()

    @property
    def specs(self) -> dict:  # noqa: D102
        return {k: s.spec for k, s in self.schemas.items()}

    def add_architecture(self, spec: SymmetrySpec) -> UniversalSchema:
        """Know ``spec``'s architecture (bare state dicts of it are then accepted)."""
        key = _signature_key(spec)
        if key not in self.schemas:
            self.schemas[key] = UniversalSchema.from_spec(spec)
        return self.schemas[key]

    def _schema(self, member, i: int) -> tuple[UniversalSchema, dict]:
        if isinstance(member, dict):
            return check_known(self.schemas, member, i), member
        if not isinstance(member, (tuple, list)) or len(member) != 2:
            raise WsymInputError(
                f"member {i} is a {type(member).__name__}; pass (model, state_dict), "
                "(spec, state_dict) or a state dict"
            )
        head, sd = member
        if isinstance(head, SymmetrySpec):
            return self.add_architecture(head), sd
        if isinstance(head, nn.Module):
            try:
                return check_known(self.schemas, sd, i), sd
            except WsymInputError:
                pass
            x = self.example_inputs
            if x is None:
                raise WsymInputError(
                    f"member {i}: a new architecture ({type(head).__name__}) needs "
                    "example_inputs to detect its symmetries"
                ) from None
            return self.add_architecture(detect(head, x(head) if callable(x) else x)), sd
        raise WsymInputError(
            f"member {i} pairs a {type(head).__name__} with its state dict; "
            "use an nn.Module or a SymmetrySpec"
        )

    def graphs(self, members: list, canonical: bool = True) -> list:
        """Universal graphs of ``members`` (invariant forms unless ``canonical=False``)."""
        out = []
        for i, m in enumerate(members):
            schema, sd = self._schema(m, i)
            try:
                schema.check(sd)
            except WsymInputError as err:
                raise WsymInputError(f"state dict {i}: {err}") from None
            check_finite(sd, f"state dict {i}")
            form = invariant_form(sd, schema.spec) if canonical else _float64(sd)
            out.append(schema.graph(form))
        return out

    @torch.no_grad()
    def predict_graphs(self, graphs: list, batch_size: int = 64) -> Tensor:
        """Predictions ``(n,)`` (or ``(n, targets)``) in target units, from prepared graphs."""
        from wsym.metanet.graph import batch_graphs

        self.net.eval()
        parts = [
            self.net(batch_graphs(graphs[i : i + batch_size]))
            for i in range(0, len(graphs), batch_size)
        ]
        k = len(self.config["targets"])
        y = torch.cat(parts).double() if parts else torch.zeros(0, k)
        y = y * torch.tensor(self.config["target_std"]) + torch.tensor(self.config["target_mean"])
        return y[:, 0] if k == 1 else y

    def predict(self, members) -> Tensor:
        """Predicted targets for a mixed list of members (or one member / state dict)."""
        single = isinstance(members, dict) or (
            isinstance(members, tuple) and len(members) == 2 and isinstance(members[1], dict)
        )
        y = self.predict_graphs(self.graphs([members] if single else list(members)))
        return y[0] if single else y

    def double(self) -> ParkPredictor:
        """Run the network in float64 (for invariance checks at round-off level)."""
        self.net.double()
        return self

    def save(self, path: str | os.PathLike) -> None:
        """One ``.safetensors`` file: tensors + the JSON config and every known spec."""
        from safetensors.torch import save_file

        from wsym.io.atomic import atomic_path
        from wsym.metanet.predictor import META_KEY

        path = Path(path)
        if path.suffix != ".safetensors":
            raise WsymInputError(f"meta-network files end in .safetensors, got {path.name}")
        meta = {
            "format": PARK_FORMAT,
            "specs": [s.spec.to_json() for s in self.schemas.values()],
            **self.config,
        }
        tensors = {k: v.detach().float().contiguous() for k, v in self.net.state_dict().items()}
        with atomic_path(path) as tmp:
            save_file(tensors, str(tmp), metadata={META_KEY: json.dumps(meta)})


def from_config(config: dict, tensors: dict) -> ParkPredictor:
    """A :class:`ParkPredictor` from a file's JSON config and tensors (see ``load``)."""
    specs = [SymmetrySpec.from_json(s) for s in config.pop("specs")]
    config.pop("format", None)
    net = network_of(config, len(config["targets"]))
    net.load_state_dict(tensors)
    return ParkPredictor(net, {_signature_key(s): s for s in specs}, config)


def network_of(config: dict, outputs: int) -> ParkNet:
    """A fresh :class:`ParkNet` sized by a predictor's config."""
    return ParkNet(
        config["hidden"],
        config["layers"],
        outputs,
        config["stat_hidden"],
        config["members"],
        config["branches"],
    )


def _float64(sd: dict) -> dict:
    return {k: v.detach().double() if v.is_floating_point() else v for k, v in sd.items()}
