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
per-tensor statistics ``stat_x``. ``branches`` picks ``"both"``, ``"stats"`` or
``"graph"``; two branches are combined by ``combine``: ``"blend"``
(:math:`(1 - \beta)\,s + \beta\,g`, each branch trained on its own and the
weight :math:`\beta`, buffer ``graph_weight``, chosen on the validation
members), ``"residual"`` (:math:`s + g`, the graph branch trained on the
frozen statistics branch's residual, as :func:`wsym.metanet.fit`) or
``"joint"`` (:math:`(1 - \beta)\,s + \beta\,j`: a second statistics ensemble
:math:`j`, ``joint``, on the statistics *and* the graph branch's frozen
message-passing readout :meth:`ParkNet.embed`, trained after the graph branch
as long as the statistics branch is: the readout's features get a readout as
well trained as the statistics') or ``"boost"`` (:math:`s + \beta\,g`: the graph
branch fitted to the *out-of-fold* residuals of the statistics branch, so it
learns what the statistics miss on members they were not trained on, not the
near-zero residual of members they were fitted to) or ``"stack"`` (``"joint"``
cross-fitted: :data:`FOLDS` graph branches, each trained on all members but one
fold, each with its joint ensemble trained on that fold, so the ensembles read
the readout of members its graph branch never saw; their mean).

Members are ``(model, state_dict)`` pairs (the model's symmetries are detected
once per architecture on ``example_inputs``: a tensor, or a callable
``model -> inputs``), ``(spec, state_dict)`` pairs, or bare state dicts of an
architecture the predictor knows or, when it carries its zoo preset's
architecture space (:func:`~wsym.metanet.park_fit.fit_zoo` stores it), of any
architecture of that space (matched by tensor names and shapes; where several
share them, e.g. MLPs differing only in the activation,
:meth:`ParkPredictor.predict` averages over those).

Example:
    >>> import torch
    >>> from wsym.metanet.park_fit import fit_park
    >>> from wsym.models.networks import MLP
    >>> ms = [(MLP(3, [w], 2), None) for w in (4, 5) for _ in range(4)]
    >>> ms = [(m, m.state_dict()) for m, _ in ms]
    >>> y = torch.tensor([float(sd["0.weight"].norm()) for _, sd in ms])
    >>> p = fit_park(ms, y, example_inputs=torch.randn(2, 3), epochs=1, stat_epochs=2)
    >>> p.predict(ms).shape
    torch.Size([8])
"""

from __future__ import annotations

import os

import torch
from torch import Tensor, nn
from torch_geometric.utils import scatter

from wsym.detect import detect
from wsym.errors import WsymInputError, check_finite
from wsym.group.spec import SymmetrySpec
from wsym.group.verify import float64_probe, screen
from wsym.metanet.files import write_file
from wsym.metanet.invariant import invariant_form
from wsym.metanet.layers import (
    AttentionConv,
    EdgeNodeConv,
    RoleConv,
    TypedEncoder,
    VirtualNode,
    mlp,
)
from wsym.metanet.novelty import TrainingDistribution
from wsym.metanet.statistics import QuantileNormal, StatisticsEnsemble
from wsym.metanet.universal import (
    ATTR_ROLES,
    ATTR_WIDTH,
    DESCRIPTORS,
    EDGE_ROLES,
    EDGE_WIDTH,
    NODE_GROUPS,
    NODE_WIDTH,
    PATH_WIDTH,
    STAT_WIDTH,
    UniversalSchema,
    matching,
    signature_of,
)

PARK_FORMAT = "park-1"
BRANCHES = ("both", "stats", "graph")
COMBINE = ("blend", "residual", "joint", "boost", "stack")
FOLDS = 2  # cross-fitting folds of combine="stack"
JOINT_READS = ("readout", "head", "prediction")
READOUTS = ("roles", "thirds")
AGGREGATES = ("mean", "roles", "attention")
HEADS = 4  # attention heads of aggregate="attention"
INPUTS = ("standard", "squashed")
THIRDS = 3  # depth / forward-order buckets of the "thirds" readout


class ParkNet(nn.Module):
    """Graph branch + statistics branch over universal graphs (see the module doc).

    Args:
        hidden: width; layers: message-passing rounds; outputs: targets.
        stat_hidden, members: the statistics branch's width and ensemble size.
        trees: boosting stages of the trees blended into the statistics branch and the joint
            ensemble (0: none).
        branches: ``"both"``, ``"stats"`` or ``"graph"``.
        combine: ``"blend"``, ``"residual"``, ``"joint"``, ``"boost"`` or ``"stack"`` (how
            two branches are combined; ``"stack"``: :data:`FOLDS` graph branches, each with
            its joint ensemble trained on the members that graph branch was not, averaged).
        stat_readout: the graph branch's readout also reads the quantile-normalized
            statistics (a shared readout: message passing adds to what they say).
        paths: the readout also reads the quantile-normalized cross-layer path
            features ``path_x`` (:mod:`wsym.metanet.universal`), which the statistics lack.
        readout: ``"roles"`` (mean and max of the input, hidden and output nodes, mean
            of the edges of each role) or ``"thirds"`` (the hidden nodes split by depth
            third, the edges of each role by the third of the forward order they sit
            in: a layer-resolved readout; depth and order are invariant labels).
        aggregate: ``"mean"`` (:class:`~wsym.metanet.layers.EdgeNodeConv`: one mean over
            all incoming / outgoing messages) or ``"roles"``
            (:class:`~wsym.metanet.layers.RoleConv`: one mean per edge role) or ``"attention"``
            (:class:`~wsym.metanet.layers.AttentionConv`: :data:`HEADS`-head attention over
            each node's incoming and outgoing edges, keys and values read from the edges).
        virtual: after each message-passing round, a per-graph global node that every
            node writes to and reads from (:class:`~wsym.metanet.layers.VirtualNode`).
        inputs: ``"standard"`` (node, attribute and edge features standardized per role)
            or ``"squashed"`` (then through asinh: robust to a family's heavy tails;
            :class:`~wsym.metanet.layers.TypedEncoder`).
        stats_members: the statistics branch's ensemble size where it differs from the
            joint ensemble's ``members`` (the folds of ``"stack"`` keep one, unused).
        joint_reads: what the joint ensemble reads besides the statistics (:meth:`joint_inputs`).
        auxiliary: extra outputs of the graph head, trained and never predicted
            (:func:`~wsym.metanet.park_fit.fit_park`'s ``auxiliary``).
    """

    def __init__(
        self,
        hidden: int = 32,
        layers: int = 2,
        outputs: int = 1,
        stat_hidden: int = 64,
        members: int = 5,
        branches: str = "both",
        trees: int = 0,
        combine: str = "blend",
        stat_readout: bool = False,
        paths: bool = False,
        readout: str = "roles",
        aggregate: str = "mean",
        inputs: str = "standard",
        stats_members: int | None = None,
        joint_reads: str = "readout",
        auxiliary: int = 0,
        virtual: bool = False,
    ):
        super().__init__()
        if branches not in BRANCHES:
            raise WsymInputError(f"branches must be one of {', '.join(BRANCHES)}, got {branches!r}")
        if combine not in COMBINE:
            raise WsymInputError(f"combine must be one of {', '.join(COMBINE)}, got {combine!r}")
        if readout not in READOUTS or aggregate not in AGGREGATES or inputs not in INPUTS:
            raise WsymInputError(
                f"readout is one of {', '.join(READOUTS)}, aggregate one of "
                f"{', '.join(AGGREGATES)} and inputs one of {', '.join(INPUTS)}, got "
                f"{readout!r}, {aggregate!r} and {inputs!r}"
            )
        self.branches, self.combine, self.stat_readout = branches, combine, stat_readout
        self.paths, self.readout, self.aggregate = paths, readout, aggregate
        self.virtual = virtual
        if joint_reads not in JOINT_READS:
            raise WsymInputError(
                f"joint_reads is one of {', '.join(JOINT_READS)}, got {joint_reads!r}"
            )
        self.joint_reads, self.outputs, self.auxiliary = joint_reads, outputs, auxiliary
        self.register_buffer("graph_weight", torch.tensor(0.5))
        squash, self.inputs = inputs == "squashed", inputs
        self.node_enc = TypedEncoder(1, NODE_WIDTH, hidden, squash)
        self.attr_enc = TypedEncoder(len(ATTR_ROLES), ATTR_WIDTH, hidden, squash)
        self.edge_enc = TypedEncoder(len(EDGE_ROLES), EDGE_WIDTH, hidden, squash)
        roles = len(EDGE_ROLES)
        self.convs = nn.ModuleList(_conv(aggregate, hidden, roles) for _ in range(layers))
        if virtual:
            self.virtual_nodes = nn.ModuleList(VirtualNode(hidden) for _ in range(layers))
        thirds = THIRDS if readout == "thirds" else 1
        groups = len(NODE_GROUPS) - 1 + thirds  # the hidden group split in thirds
        pooled = (2 * groups + roles * thirds) * hidden + DESCRIPTORS
        if paths:
            self.path_normal = QuantileNormal(PATH_WIDTH)
            pooled += PATH_WIDTH
        head_in = pooled + (STAT_WIDTH if stat_readout else 0)
        self.head = mlp(head_in, hidden, outputs + auxiliary)
        self.stats = StatisticsEnsemble(
            STAT_WIDTH, stat_hidden, stats_members or members, outputs, trees=trees
        )
        if combine == "joint":
            read = {"readout": pooled, "head": hidden, "prediction": outputs}[joint_reads]
            self.joint = StatisticsEnsemble(
                STAT_WIDTH + read, stat_hidden, members, outputs, trees=trees
            )
        if combine == "stack":  # FOLDS graph branches, each with a joint ensemble on the others
            self.folds = nn.ModuleList(
                ParkNet(
                    hidden,
                    layers,
                    outputs,
                    stat_hidden,
                    members,
                    "graph",
                    0,
                    "joint",
                    stat_readout,
                    paths,
                    readout,
                    aggregate,
                    inputs,
                    stats_members=1,
                    joint_reads=joint_reads,
                    auxiliary=auxiliary,
                    virtual=virtual,
                )
                for _ in range(FOLDS)
            )

    def fit_inputs(self, batch) -> None:
        """Per-role standardization of the raw features from the training graphs."""
        self.node_enc.fit(batch.node_x.float(), torch.zeros_like(batch.node_group))
        self.attr_enc.fit(batch.attr_x.float(), batch.attr_role)
        self.edge_enc.fit(batch.edge_x.float(), batch.edge_role)
        self.stats.normal.fit(batch.stat_x.to(self.stats.normal.knots.dtype))
        if self.paths:
            self.path_normal.fit(batch.path_x.to(self.path_normal.knots.dtype))
        for fold in getattr(self, "folds", ()):
            fold.fit_inputs(batch)

    def forward(self, batch) -> Tensor:
        """``(B, outputs)``: the branches in use, blended or added."""
        if self.branches == "stats":
            return self.stats(batch.stat_x)
        if self.branches == "graph":
            return self.graph_branch(batch)
        s = self.stats(batch.stat_x)
        if self.combine == "stack":
            g = torch.stack([f.joint(f.joint_inputs(batch)) for f in self.folds]).mean(0)
        elif self.combine == "joint":
            g = self.joint(self.joint_inputs(batch))
        else:
            g = self.graph_branch(batch)
        if self.combine == "residual":
            return g + s
        if self.combine == "boost":
            return s.to(g.dtype) + self.graph_weight.to(g.dtype) * g
        beta = self.graph_weight.to(g.dtype)
        return (1 - beta) * s.to(g.dtype) + beta * g

    def joint_inputs(self, batch) -> Tensor:
        """``(B, STAT_WIDTH + k)``: the statistics and the graph branch's ``joint_reads``.

        ``"readout"``: the message-passing readout (:meth:`embed`); ``"head"``: the graph
        head's hidden layer; ``"prediction"``: the graph branch's prediction.
        """
        knots = self.stats.normal.knots.dtype
        if self.joint_reads == "readout":
            g = self.embed(batch)
        else:
            g = self.head[:-1](self.head_inputs(batch))
            g = g if self.joint_reads == "head" else self.head[-1](g)[:, : self.outputs]
        return torch.cat([batch.stat_x.to(knots), g.to(knots)], dim=1)

    def graph_branch(self, batch) -> Tensor:
        """``(B, outputs)`` the message-passing branch alone (``"stack"``: the folds' mean)."""
        if self.combine == "stack":
            return torch.stack([f.graph_branch(batch) for f in self.folds]).mean(0)
        y = self.head(self.head_inputs(batch))
        return y if self.training else y[:, : self.outputs]  # auxiliary outputs: trained only

    def head_inputs(self, batch) -> Tensor:
        """``(B, head width)``: the readout (and the statistics where ``stat_readout``)."""
        pooled = [self.embed(batch)]
        if self.stat_readout:
            pooled.append(self.stats.normal(batch.stat_x.to(self.stats.normal.knots.dtype)))
        return torch.cat([t.to(pooled[0].dtype) for t in pooled], dim=1)

    def embed(self, batch) -> Tensor:
        """``(B, readout)``: mean and max of each node group, mean per edge role, descriptors."""
        dtype = self.head[0].weight.dtype
        n, b = batch.num_nodes, batch.num_graphs
        h = self.node_enc(batch.node_x.to(dtype), torch.zeros_like(batch.node_group))
        a = self.attr_enc(batch.attr_x.to(dtype), batch.attr_role)
        h = h + scatter(a, batch.attr_node, 0, dim_size=n, reduce="sum")
        e = self.edge_enc(batch.edge_x.to(dtype), batch.edge_role)
        for k, conv in enumerate(self.convs):
            if self.aggregate == "roles":
                h, e = conv(h, batch.edge_index, e, batch.edge_role)
            else:
                h, e = conv(h, batch.edge_index, e)
            if self.virtual:
                h = self.virtual_nodes[k](h, batch.batch)
        group, k = batch.node_group, len(NODE_GROUPS)
        roles, r = batch.edge_role, len(EDGE_ROLES)
        if self.readout == "thirds":  # node_x[:, 0]: depth fraction; edge_x[:, 6]: order
            third = _third(batch.node_x[:, 0])
            group = torch.where(group == 2, k + THIRDS - 2, group + (group == 1) * third)
            k = k - 1 + THIRDS
            roles, r = roles * THIRDS + _third(batch.edge_x[:, 6]), r * THIRDS
        groups, size = batch.batch * k + group, b * k
        mean = scatter(h, groups, 0, dim_size=size, reduce="mean")
        top = scatter(h, groups, 0, dim_size=size, reduce="max")
        roles = batch.batch[batch.edge_index[1]] * r + roles
        edges = scatter(e, roles, 0, dim_size=b * r, reduce="mean")
        pooled = [mean.view(b, -1), top.view(b, -1), edges.view(b, -1), batch.graph_x.to(dtype)]
        if self.paths:
            knots = self.path_normal.knots.dtype
            pooled.append(self.path_normal(batch.path_x.to(knots)).to(dtype))
        return torch.cat(pooled, dim=1)


def _conv(aggregate: str, hidden: int, roles: int) -> nn.Module:
    """One message-passing round of the ``aggregate`` kind."""
    if aggregate == "roles":
        return RoleConv(hidden, roles)
    if aggregate == "attention":  # HEADS heads, or the largest divisor of hidden below
        return AttentionConv(hidden, max(k for k in range(1, HEADS + 1) if hidden % k == 0))
    return EdgeNodeConv(hidden)


def _third(fraction: Tensor) -> Tensor:
    """``(n,)`` bucket 0, 1 or 2 of fractions in ``[0, 1]`` (1 falls in the last)."""
    return (fraction.double() * THIRDS).floor().long().clamp(0, THIRDS - 1)


_KEYS: dict[int, tuple[SymmetrySpec, str]] = {}


def spec_key(spec: SymmetrySpec) -> str:
    """The spec's JSON (memoized per spec object: it is immutable)."""
    got = _KEYS.get(id(spec))
    if got is None or got[0] is not spec:
        got = _KEYS[id(spec)] = (spec, spec.to_json())
    return got[1]


class ParkPredictor:
    """Predicts targets from state dicts of any architecture it knows (or is given).

    Attributes:
        net: the :class:`ParkNet`.
        specs: ``{signature key: spec}`` of the known architectures.
        config: hyperparameters, target names and scaling, training report.
        space: the :class:`~wsym.zoo.space.ArchitectureSpace` of the zoo's preset
            (bare state dicts of any of its architectures are accepted), or ``None``.
    """

    def __init__(self, net: ParkNet, specs: dict, config: dict, example_inputs=None, space=None):
        self.net, self.config, self.space = net, config, space
        if example_inputs is None and space is not None:
            example_inputs = space.example_inputs
        self.example_inputs = example_inputs
        self.schemas = {k: UniversalSchema.from_spec(s) for k, s in specs.items()}
        # module class, repr and tensors -> keys of the specs detected on such modules; one
        # is reused only where it verifies on the module at hand (:func:`holds`)
        self._detected: dict[tuple, list[str]] = {}
        self.net.eval()

    @property
    def specs(self) -> dict:  # noqa: D102
        return {k: s.spec for k, s in self.schemas.items()}

    def add_architecture(self, spec: SymmetrySpec) -> UniversalSchema:
        """Know ``spec``'s architecture (bare state dicts of it are then accepted)."""
        key = spec_key(spec)
        if key not in self.schemas:  # same tensors, other symmetries (activation): both kept
            self.schemas[key] = UniversalSchema.from_spec(spec)
        return self.schemas[key]

    def _schemas(self, member, i: int) -> tuple[list[UniversalSchema], dict]:
        """The schemas ``member`` may be of, and its state dict.

        Several for a bare state dict whose tensors two architectures share (e.g.
        MLPs that differ in the activation): with a :attr:`space` (the preset's
        architecture space, :class:`~wsym.zoo.space.ArchitectureSpace`), every
        architecture of it with those tensors, else every known one.
        """
        if isinstance(member, dict):
            if self.space is not None:
                found = self.space.specs_with(signature_of(member))
                if found:
                    return [self.add_architecture(spec) for _, spec in found], member
            return matching(self.schemas, member, i), member
        if not isinstance(member, (tuple, list)) or len(member) != 2:
            raise WsymInputError(
                f"member {i} is a {type(member).__name__}; pass (model, state_dict), "
                "(spec, state_dict) or a state dict"
            )
        head, sd = member
        if isinstance(head, SymmetrySpec):
            return [self.add_architecture(head)], sd
        if not isinstance(head, nn.Module):
            raise WsymInputError(
                f"member {i} pairs a {type(head).__name__} with its state dict; "
                "use an nn.Module or a SymmetrySpec"
            )
        x = self.example_inputs
        if x is None:
            raise WsymInputError(
                f"member {i}: a module ({type(head).__name__}) needs example_inputs to "
                "detect (or check) its symmetries; pass example_inputs= or (spec, state_dict)"
            )
        x = x(head) if callable(x) else x
        seen = self._detected.setdefault(_module_key(head, sd), [])
        key = next((k for k in seen if holds(self.schemas[k].spec, head, x)), None)
        if key is None:  # same class, repr and tensors, other forward (activation attribute)
            spec = detect(head, x)
            key = spec_key(spec)
            seen.append(key)
            self.add_architecture(spec)
        return [self.schemas[key]], sd

    def graph_of(self, schema: UniversalSchema, sd: dict, i: int, canonical: bool = True):
        """The universal graph of state dict number ``i`` as ``schema`` reads it (checked)."""
        try:
            schema.check(sd)
        except WsymInputError as err:
            raise WsymInputError(f"state dict {i}: {err}") from None
        check_finite(sd, f"state dict {i}")
        return schema.graph(invariant_form(sd, schema.spec) if canonical else _float64(sd))

    def graphs(self, members: list, canonical: bool = True) -> list:
        """Universal graphs of ``members`` (invariant forms unless ``canonical=False``).

        Raises:
            WsymInputError: unknown architecture, NaN weights, or a bare state dict
                that fits several known architectures (pass it with its model).
        """
        out = []
        for i, m in enumerate(members):
            schemas, sd = self._schemas(m, i)
            if len(schemas) > 1:
                raise WsymInputError(
                    f"state dict {i} fits {len(schemas)} known architectures (same tensors, "
                    "other symmetries); pass it as (model, state_dict)"
                )
            out.append(self.graph_of(schemas[0], sd, i, canonical))
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
        owner, graphs = [], []
        for i, m in enumerate([members] if single else list(members)):
            schemas, sd = self._schemas(m, i)
            owner += [i] * len(schemas)
            graphs += [self.graph_of(s, sd, i, True) for s in schemas]
        y = self.predict_graphs(graphs)
        if len(graphs) > len(set(owner)):  # ambiguous bare state dicts: the mean over candidates
            index = torch.tensor(owner)
            y = scatter(y, index, 0, dim_size=int(index.max()) + 1, reduce="mean")
        return y[0] if single else y

    def novelty(self, member) -> dict | None:
        """Whether ``member`` lies outside the training members' weight statistics.

        ``{"out_of_distribution": bool, "distance", "threshold"}``
        (:class:`~wsym.metanet.novelty.TrainingDistribution`; a bare state dict that
        several architectures read: the nearest reading), or ``None`` for a file
        written before wsym stored those statistics (unknown).
        """
        from wsym.metanet.graph import batch_graphs

        dist = TrainingDistribution.from_json(self.config.get("novelty"))
        if dist is None:
            return None
        schemas, sd = self._schemas(member, 0)
        checks = [dist.check(batch_graphs([self.graph_of(s, sd, 0)]).stat_x) for s in schemas]
        return min(checks, key=lambda c: c["distance"])

    def double(self) -> ParkPredictor:
        """Run the network in float64 (for invariance checks at round-off level)."""
        self.net.double()
        return self

    def save(self, path: str | os.PathLike) -> None:
        """One ``.safetensors`` file: tensors + the JSON config and every known spec."""
        texts = [spec_key(s.spec) for s in self.schemas.values()]  # each serialized once
        meta = {"format": PARK_FORMAT, "specs": texts, **self.config}
        if self.space is not None:
            index = {t: k for k, t in enumerate(texts)}
            meta["space"] = self.space.to_json(lambda spec: index.get(spec_key(spec)))
        write_file(path, self.net, meta)


def from_config(config: dict, tensors: dict) -> ParkPredictor:
    """A :class:`ParkPredictor` from a JSON config and tensors (:func:`wsym.metanet.load`)."""
    from wsym.zoo.space import ArchitectureSpace

    specs = [SymmetrySpec.from_json(s) for s in config.pop("specs")]
    config.pop("format", None)
    space = config.pop("space", None)
    space = None if space is None else ArchitectureSpace.from_json(space, specs)
    net = network_of(config, len(config["targets"]))
    net.load_state_dict(tensors)
    return ParkPredictor(net, {spec_key(s): s for s in specs}, config, space=space)


def network_of(config: dict, outputs: int) -> ParkNet:
    """A fresh :class:`ParkNet` sized by a predictor's config."""
    return ParkNet(
        config["hidden"],
        config["layers"],
        outputs,
        config["stat_hidden"],
        config["members"],
        config["branches"],
        config.get("trees", 0),
        config.get("combine", "blend"),
        config.get("stat_readout", False),
        config.get("paths", False),
        config.get("readout", "roles"),
        config.get("aggregate", "mean"),
        config.get("inputs", "standard"),
        joint_reads=config.get("joint_reads", "readout"),
        auxiliary=len(config.get("auxiliary", ())),
        virtual=config.get("virtual", False),
    )


def holds(spec: SymmetrySpec, model: nn.Module, example_inputs) -> bool:
    """Whether every group of ``spec`` verifies on ``model`` (group testing, float64).

    A spec detected on another module of the same class, repr and tensors may
    not hold: a forward that reads an attribute ``repr`` does not show (a plain
    ``self.act = torch.tanh``) computes another function.
    """
    try:
        failed = screen(spec, float64_probe(model, example_inputs))[1]
    except WsymInputError:
        return False
    return not failed


def _module_key(model: nn.Module, sd: dict) -> tuple:
    """What identifies an architecture for detection caching: the class, its repr, the shapes."""
    return (type(model).__qualname__, repr(model), tuple(sorted(signature_of(sd).items())))


def _float64(sd: dict) -> dict:
    return {k: v.detach().double() if v.is_floating_point() else v for k, v in sd.items()}
