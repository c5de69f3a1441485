"""Weights as graphs: the nodes are units, the edges carry weights, all read off the spec.

A :class:`GraphSchema` is derived from a :class:`~wsym.group.spec.SymmetrySpec` alone
(no weights). Every entry of a parameter axis is a tuple of atoms
``((class, index), ...)`` (one per factor of a product axis); distinct tuples are
the *nodes* -- hidden neurons, conv channels, (head, feature) pairs, input and
output coordinates. Each parameter picks its *node axes*: the axes a permutation
acts on, topped up with its leading axes (PyTorch's ``(out, in, *kernel)``
convention) to at most two. Then

* two node axes -> one edge per pair, from the second axis' node to the first
  (``W[out, in]``: input unit -> output unit), the remaining axes flattened into
  the edge features (conv kernels);
* one node axis -> a node attribute (biases, normalization weights and
  running statistics);
* none -> a graph attribute (scalars).

Every graph also carries ``stat_attr``: the per-tensor statistics of
:func:`~wsym.metanet.statistics.tensor_features` (StatNN's mean, variance and
quantiles, plus norms, singular values, row and column norms) of every planned
entry. They are functions of multisets of entries, rows and singular values, so
permutation invariant; on :func:`~wsym.metanet.invariant_form` weights they are
invariant to the whole spec, and they feed the meta-network's global branch.

A permutation of a class permutes its nodes and nothing else, so any function
of the graph that message passing computes is invariant. Atoms of classes that
no permutation acts on carry their index in the node *type* (a positional
encoding); atoms of permuted classes carry only their class.

Shapes (one graph, ``N`` nodes, ``E`` edges, ``A`` node attributes):
    ``node_type (N,)``, ``node_class (N,)``, ``edge_index (2, E)``, ``edge_type (E,)``,
    ``edge_attr (E, F_e)``, ``attr_node (A,)``, ``attr_type (A,)``, ``attr_val (A, F_a)``,
    ``graph_attr (1, F_g)``, ``stat_attr (1, F_s)``.

Example:
    >>> import torch, wsym
    >>> from wsym.models.networks import MLP
    >>> mlp = MLP(4, [5], 3)
    >>> schema = GraphSchema.from_spec(wsym.detect(mlp, torch.randn(2, 4)))
    >>> data = schema.graph(mlp.state_dict())
    >>> data.num_nodes, data.edge_index.shape[1], tuple(data.edge_attr.shape)
    (12, 35, (35, 1))
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
from torch_geometric.data import Batch, Data

from wsym.errors import WsymInputError
from wsym.group.kinds import kind_of
from wsym.group.kinds.modules import refuse_modules
from wsym.group.layout import refuse_relabeled
from wsym.group.spec import Leaf, SymmetrySpec, leaves
from wsym.metanet.statistics import statistic_width, tensor_features


def axis_entries(tree) -> list[tuple[tuple[int, int], ...]]:
    """The atoms ``((class, index), ...)`` of every entry of one axis, in storage order.

    Products are row-major (as :func:`torch.reshape`), concatenations in order.
    """
    if isinstance(tree, Leaf):
        return [((tree.cls, i),) for i in range(tree.size)]
    parts = [axis_entries(c) for c in tree.children]
    if tree.mode == "cat":
        return [e for p in parts for e in p]
    return [tuple(a for x in combo for a in x) for combo in itertools.product(*parts)]


@dataclass(frozen=True)
class ParamPlan:
    """How one state-dict entry enters the graph."""

    name: str
    shape: tuple[int, ...]
    node_axes: tuple[int, ...]  # 0, 1 or 2 axes; order (out, in)
    pooled_axes: tuple[int, ...]  # extra permuted axes, summed out (invariant)
    kind: str  # "edge" | "node" | "graph"
    type_id: int  # edge type, node-attribute type or graph-attribute offset
    width: int  # features per edge / node attribute / graph scalar count


class GraphSchema:
    """The graph layout of one architecture, derived from its spec (data-free).

    Attributes:
        nodes: the atom tuple of every node.
        node_type: ``(N,)`` type id of every node (class, plus index where unpermuted).
        node_class: ``(N,)`` id of the first permuted class of the node (or its first class).
        plans: one :class:`ParamPlan` per graph-carrying state-dict entry.
        edge_width, attr_width, graph_width: feature sizes (padded with zeros).
    """

    def __init__(self, spec: SymmetrySpec):
        refuse_relabeled(spec, "the meta-network's weight graph")
        refuse_modules(spec, "the meta-network's weight graph")
        permuted = {g.cls for g in spec.groups if kind_of(g).permutes}
        aliases = {a for a, _ in spec.aliases}
        self.spec = spec
        self.permuted = permuted
        node_of: dict[tuple, int] = {}
        types: dict[tuple, int] = {}
        classes: dict[int, int] = {}
        node_type, node_class = [], []
        self.axis_nodes: dict[tuple[str, int], torch.Tensor] = {}
        plans = []
        counts = {"edge": 0, "node": 0, "graph": 0}
        for name, dims in spec.layouts:
            if name in aliases:
                continue
            shape = tuple(t.size for t in dims)
            if 0 in shape:
                continue
            perm_axes = [d for d, t in enumerate(dims) if any(a.cls in permuted for a in leaves(t))]
            axes = perm_axes[:2]
            for d in range(min(2, len(dims))):  # leading axes with atoms (not size-1 axes)
                if len(axes) < 2 and d not in axes and leaves(dims[d]):
                    axes.append(d)
            axes = sorted(axes)
            for d in axes:
                ids = []
                for entry in axis_entries(dims[d]):
                    if entry not in node_of:
                        node_of[entry] = len(node_type)
                        key = tuple((c, -1 if c in permuted else i) for c, i in entry)
                        node_type.append(types.setdefault(key, len(types)))
                        main = next((c for c, _ in entry if c in permuted), entry[0][0])
                        node_class.append(classes.setdefault(main, len(classes)))
                    ids.append(node_of[entry])
                self.axis_nodes[(name, d)] = torch.tensor(ids, dtype=torch.long)
            pooled = tuple(d for d in perm_axes[2:])
            rest = [s for d, s in enumerate(shape) if d not in axes and d not in pooled]
            width = int(torch.tensor(rest, dtype=torch.long).prod()) if rest else 1
            width *= 2 if pooled else 1
            kind = {2: "edge", 1: "node", 0: "graph"}[len(axes)]
            if kind == "graph":
                width = int(torch.tensor(shape, dtype=torch.long).prod()) if shape else 1
            plans.append(ParamPlan(name, shape, tuple(axes), pooled, kind, counts[kind], width))
            counts[kind] += width if kind == "graph" else 1
        self.plans = tuple(plans)
        self.nodes = tuple(node_of)  # insertion order: node ids
        self.node_type = torch.tensor(node_type, dtype=torch.long)
        self.node_class = torch.tensor(node_class, dtype=torch.long)
        self.num_node_types, self.num_classes = len(types), len(classes)
        self.num_edge_types, self.num_attr_types = counts["edge"], counts["node"]
        self.graph_width = counts["graph"]
        self.stat_width = sum(statistic_width(p.shape) for p in plans)
        self.edge_width = max([p.width for p in plans if p.kind == "edge"], default=1)
        self.attr_width = max([p.width for p in plans if p.kind == "node"], default=1)
        self._edges = {p.name: self._edge_index(p) for p in plans if p.kind == "edge"}

    @classmethod
    def from_spec(cls, spec: SymmetrySpec) -> GraphSchema:
        """The schema of ``spec``'s architecture."""
        return cls(spec)

    def signature(self) -> list[list]:
        """``[name, shape]`` of every graph-carrying entry (to check checkpoints against)."""
        return [[p.name, list(p.shape)] for p in self.plans]

    def _edge_index(self, plan: ParamPlan) -> torch.Tensor:
        out_ids = self.axis_nodes[(plan.name, plan.node_axes[0])]
        in_ids = self.axis_nodes[(plan.name, plan.node_axes[1])]
        dst = out_ids.repeat_interleave(len(in_ids))
        src = in_ids.repeat(len(out_ids))
        return torch.stack([src, dst])

    def check(self, state_dict: dict) -> None:
        """Raise :class:`WsymInputError` naming the first entry that does not fit."""
        for p in self.plans:
            if p.name not in state_dict:
                raise WsymInputError(
                    f"checkpoint has no entry {p.name!r} of the architecture this was built "
                    "for; use a checkpoint of the same architecture (or retrain the meta-network)"
                )
            got = tuple(state_dict[p.name].shape)
            if got != p.shape:
                raise WsymInputError(
                    f"checkpoint entry {p.name!r} has shape {list(got)}, expected {list(p.shape)}; "
                    "the meta-network was trained for a different architecture"
                )

    def _features(self, plan: ParamPlan, t: torch.Tensor) -> torch.Tensor:
        """``(*node axes, width)`` features of one entry."""
        t = t.detach().to(torch.float64)
        if plan.pooled_axes:  # permuted beyond two axes: invariant sums over the extra ones
            t = torch.stack([t.sum(plan.pooled_axes), (t * t).sum(plan.pooled_axes)], dim=-1)
        kept = [d for d in range(len(plan.shape)) if d not in plan.pooled_axes]
        order = [kept.index(d) for d in plan.node_axes]
        order += [i for i in range(t.ndim) if i not in order]
        t = t.permute(order)
        return t.reshape(*t.shape[: len(plan.node_axes)], -1)

    def graph(self, state_dict: dict) -> Data:
        """The weight graph of one state dict (float64 features)."""
        self.check(state_dict)
        edges, etypes, eattr = [], [], []
        anode, atype, aval = [], [], []
        gattr = torch.zeros(1, max(self.graph_width, 1), dtype=torch.float64)
        for p in self.plans:
            f = self._features(p, state_dict[p.name])
            if p.kind == "edge":
                ei = self._edges[p.name]
                edges.append(ei)
                etypes.append(torch.full((ei.shape[1],), p.type_id, dtype=torch.long))
                eattr.append(_pad(f.reshape(ei.shape[1], -1), self.edge_width))
            elif p.kind == "node":
                ids = self.axis_nodes[(p.name, p.node_axes[0])]
                anode.append(ids)
                atype.append(torch.full((len(ids),), p.type_id, dtype=torch.long))
                aval.append(_pad(f.reshape(len(ids), -1), self.attr_width))
            else:
                gattr[0, p.type_id : p.type_id + p.width] = f.reshape(-1)
        empty = torch.zeros(0, dtype=torch.long)
        stats = [tensor_features(state_dict[p.name]) for p in self.plans]
        return WeightData(
            num_nodes=len(self.node_type),
            node_type=self.node_type,
            node_class=self.node_class,
            edge_index=torch.cat(edges, 1) if edges else torch.zeros(2, 0, dtype=torch.long),
            edge_type=torch.cat(etypes) if etypes else empty,
            edge_attr=torch.cat(eattr) if eattr else torch.zeros(0, self.edge_width),
            attr_node=torch.cat(anode) if anode else empty,
            attr_type=torch.cat(atype) if atype else empty,
            attr_val=torch.cat(aval) if aval else torch.zeros(0, self.attr_width),
            graph_attr=gattr,
            stat_attr=torch.cat(stats)[None] if stats else torch.zeros(1, 0, dtype=torch.float64),
        )


def _pad(x: torch.Tensor, width: int) -> torch.Tensor:
    if x.shape[1] == width:
        return x
    return torch.cat([x, x.new_zeros(x.shape[0], width - x.shape[1])], dim=1)


def batch_graphs(graphs: list[Data]) -> Batch:
    """One :class:`~torch_geometric.data.Batch`; ``attr_node`` indices are shifted per graph."""
    return Batch.from_data_list(graphs)


class WeightData(Data):
    """A weight graph whose ``attr_node`` indexes nodes (incremented when batched)."""

    def __inc__(self, key, value, *args, **kwargs):
        if key == "attr_node":
            return self.num_nodes
        return super().__inc__(key, value, *args, **kwargs)
