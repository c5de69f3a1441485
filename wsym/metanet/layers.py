r"""Message passing over weight graphs: edge updates, node updates, class-wise readout.

One :class:`EdgeNodeConv` layer (PyG :class:`~torch_geometric.nn.MessagePassing`)
updates every edge from its two end nodes, then every node from the mean of the
messages along its incoming edges and, separately, along its outgoing ones:

.. math::
    e_{ij} \leftarrow e_{ij} + \phi_e([h_i, h_j, e_{ij}]), \qquad
    h_j \leftarrow h_j + \phi_h\big([h_j,\ \mathrm{mean}_{i \to j} \psi_f([h_i, e_{ij}]),\
    \mathrm{mean}_{j \to k} \psi_b([h_k, e_{jk}])]\big).

:class:`WeightGraphNet` has two additive branches. The *graph branch* encodes
raw features per type (standardized with type-wise statistics, then a shared
linear map modulated per type), stacks layers, and reads out the per-class mean
of the nodes and the per-type mean of the edges. The *statistics branch*
(:class:`~wsym.metanet.statistics.StatisticsEnsemble`) reads the per-tensor
statistics ``stat_attr``. Every operation is a function of node and edge
*types* and of sums/means over sets, so the output is invariant to any
permutation of the nodes of a class.

Shapes:
    input: a :class:`~torch_geometric.data.Batch` of ``B`` weight graphs
    (:mod:`wsym.metanet.graph`); output ``(B, outputs)``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch_geometric.nn import MessagePassing
from torch_geometric.utils import scatter, softmax

from wsym.metanet.statistics import StatisticsEnsemble


def mlp(d_in: int, d_hidden: int, d_out: int) -> nn.Sequential:
    """Two-layer perceptron with a SiLU in between."""
    return nn.Sequential(nn.Linear(d_in, d_hidden), nn.SiLU(), nn.Linear(d_hidden, d_out))


class EdgeNodeConv(MessagePassing):
    """One round of edge and node updates (both directions of every edge).

    Example:
        >>> conv = EdgeNodeConv(8)
        >>> h, e = torch.randn(4, 8), torch.randn(3, 8)
        >>> ei = torch.tensor([[0, 1, 2], [3, 3, 0]])
        >>> [t.shape for t in conv(h, ei, e)]
        [torch.Size([4, 8]), torch.Size([3, 8])]
    """

    def __init__(self, hidden: int):
        super().__init__(aggr="mean")
        self.edge = mlp(3 * hidden, hidden, hidden)
        self.forward_msg = mlp(2 * hidden, hidden, hidden)
        self.backward_msg = mlp(2 * hidden, hidden, hidden)
        self.node = mlp(3 * hidden, hidden, hidden)
        self.norm_h, self.norm_e = nn.LayerNorm(hidden), nn.LayerNorm(hidden)

    def forward(self, h: Tensor, edge_index: Tensor, e: Tensor) -> tuple[Tensor, Tensor]:
        """Updated ``(h (N, H), e (E, H))``."""
        src, dst = edge_index
        e = self.norm_e(e + self.edge(torch.cat([h[src], h[dst], e], dim=-1)))
        fwd = self.propagate(edge_index, x=h, e=e, mlp=self.forward_msg, size=(len(h), len(h)))
        bwd = self.propagate(
            edge_index.flip(0), x=h, e=e, mlp=self.backward_msg, size=(len(h), len(h))
        )
        h = self.norm_h(h + self.node(torch.cat([h, fwd, bwd], dim=-1)))
        return h, e

    def message(self, x_j: Tensor, e: Tensor, mlp: nn.Module) -> Tensor:  # noqa: D102
        return mlp(torch.cat([x_j, e], dim=-1))


class RoleConv(nn.Module):
    r"""One round of edge and node updates whose messages are averaged *per edge role*.

    :class:`EdgeNodeConv` averages all messages into a node: where one role has many
    more edges than another (a transformer's residual-stream unit receives the
    weights of every block and the attention products), the mean is that role's.
    Here each direction's messages are averaged within each of ``roles`` roles and
    the per-role means concatenated (an absent role gives zeros):

    .. math::
        h_j \leftarrow h_j + \phi_h\big([h_j,\ (\mathrm{mean}_{i \to j,\ r_{ij} = r}
        \psi_f([h_i, e_{ij}]))_{r},\ (\mathrm{mean}_{j \to k,\ r_{jk} = r}
        \psi_b([h_k, e_{jk}]))_{r}]\big).

    Roles are invariant labels of edges, so the layer is as permutation equivariant
    as :class:`EdgeNodeConv`.

    Example:
        >>> conv = RoleConv(8, roles=2)
        >>> h, e = torch.randn(4, 8), torch.randn(3, 8)
        >>> ei, role = torch.tensor([[0, 1, 2], [3, 3, 0]]), torch.tensor([0, 1, 1])
        >>> [t.shape for t in conv(h, ei, e, role)]
        [torch.Size([4, 8]), torch.Size([3, 8])]
    """

    def __init__(self, hidden: int, roles: int):
        super().__init__()
        self.roles = roles
        self.edge = mlp(3 * hidden, hidden, hidden)
        self.forward_msg = mlp(2 * hidden, hidden, hidden)
        self.backward_msg = mlp(2 * hidden, hidden, hidden)
        self.node = mlp((1 + 2 * roles) * hidden, hidden, hidden)
        self.norm_h, self.norm_e = nn.LayerNorm(hidden), nn.LayerNorm(hidden)

    def forward(self, h: Tensor, edge_index: Tensor, e: Tensor, role: Tensor):
        """Updated ``(h (N, H), e (E, H))``; ``role (E,)`` in ``[0, roles)``."""
        src, dst = edge_index
        n, r = len(h), self.roles
        e = self.norm_e(e + self.edge(torch.cat([h[src], h[dst], e], dim=-1)))
        fwd = self.forward_msg(torch.cat([h[src], e], dim=-1))
        bwd = self.backward_msg(torch.cat([h[dst], e], dim=-1))
        fwd = scatter(fwd, dst * r + role, 0, dim_size=n * r, reduce="mean").view(n, -1)
        bwd = scatter(bwd, src * r + role, 0, dim_size=n * r, reduce="mean").view(n, -1)
        h = self.norm_h(h + self.node(torch.cat([h, fwd, bwd], dim=-1)))
        return h, e


class AttentionConv(nn.Module):
    r"""One round of edge updates and node updates by multi-head attention (NG-T style).

    The edge update is :class:`EdgeNodeConv`'s. Each node then attends, with
    ``heads`` heads, separately over its incoming and its outgoing edges: the query
    is read from the node, the key and value from the neighbour and the edge between
    them, and the weights are a softmax over that node's edges of one direction:

    .. math::
        a_{ij} = \operatorname{softmax}_{i \to j}
        \frac{q(h_j) \cdot k_f([h_i, e_{ij}])}{\sqrt{d}}, \qquad
        h_j \leftarrow h_j + \phi_h\big([h_j,\ \textstyle\sum_{i \to j} a_{ij}\,
        v_f([h_i, e_{ij}]),\ \sum_{j \to k} b_{jk}\, v_b([h_k, e_{jk}])]\big).

    A softmax over a set and a weighted sum are permutation equivariant, so the
    layer is as equivariant as :class:`EdgeNodeConv` (a node without edges of a
    direction receives zeros).

    Example:
        >>> conv = AttentionConv(8, heads=2)
        >>> h, e = torch.randn(4, 8), torch.randn(3, 8)
        >>> ei = torch.tensor([[0, 1, 2], [3, 3, 0]])
        >>> [t.shape for t in conv(h, ei, e)]
        [torch.Size([4, 8]), torch.Size([3, 8])]
    """

    def __init__(self, hidden: int, heads: int = 4):
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden ({hidden}) must be a multiple of heads ({heads})")
        self.heads = heads
        self.edge = mlp(3 * hidden, hidden, hidden)
        self.query = nn.Linear(hidden, 2 * hidden)  # forward and backward queries
        self.forward_kv = nn.Linear(2 * hidden, 2 * hidden)
        self.backward_kv = nn.Linear(2 * hidden, 2 * hidden)
        self.node = mlp(3 * hidden, hidden, hidden)
        self.norm_h, self.norm_e = nn.LayerNorm(hidden), nn.LayerNorm(hidden)

    def forward(self, h: Tensor, edge_index: Tensor, e: Tensor) -> tuple[Tensor, Tensor]:
        """Updated ``(h (N, H), e (E, H))``."""
        src, dst = edge_index
        e = self.norm_e(e + self.edge(torch.cat([h[src], h[dst], e], dim=-1)))
        q_f, q_b = self.query(h).chunk(2, dim=-1)
        fwd = self._attend(q_f[dst], self.forward_kv(torch.cat([h[src], e], -1)), dst, len(h))
        bwd = self._attend(q_b[src], self.backward_kv(torch.cat([h[dst], e], -1)), src, len(h))
        h = self.norm_h(h + self.node(torch.cat([h, fwd, bwd], dim=-1)))
        return h, e

    def _attend(self, q: Tensor, kv: Tensor, index: Tensor, n: int) -> Tensor:
        """``(n, H)``: per node ``index``, the attention-weighted sum of its edges' values."""
        k, v = kv.chunk(2, dim=-1)
        heads = self.heads
        q, k, v = (t.reshape(len(t), heads, -1) for t in (q, k, v))
        score = (q * k).sum(-1) / q.shape[-1] ** 0.5  # (E, heads)
        a = softmax(score, index, num_nodes=n)
        return scatter(a[..., None] * v, index, 0, dim_size=n, reduce="sum").reshape(n, -1)


class VirtualNode(nn.Module):
    r"""A per-graph global node that every node writes to (mean) and reads from.

    .. math::
        g_b = \operatorname{mean}_{j \in b} h_j, \qquad
        h_j \leftarrow h_j + \phi([h_j, g_{b(j)}]),

    so two rounds of message passing see the whole graph. A mean over a graph's
    nodes is permutation invariant, so the update is equivariant.

    Example:
        >>> node = VirtualNode(8)
        >>> node(torch.randn(5, 8), torch.tensor([0, 0, 0, 1, 1])).shape
        torch.Size([5, 8])
    """

    def __init__(self, hidden: int):
        super().__init__()
        self.update = mlp(2 * hidden, hidden, hidden)
        self.norm = nn.LayerNorm(hidden)

    def forward(self, h: Tensor, graph: Tensor) -> Tensor:
        """``(N, H)`` updated node features; ``graph (N,)``: each node's graph."""
        g = scatter(h, graph, 0, reduce="mean")
        return self.norm(h + self.update(torch.cat([h, g[graph]], dim=-1)))


class TypedEncoder(nn.Module):
    r"""Standardize features per type, then ``Linear(x) * (1 + gamma[type]) + beta[type]``.

    With ``squash``, the standardized features pass through :math:`\operatorname{asinh}`
    first: linear within a standard deviation, logarithmic beyond, so a family whose
    features sit tens of deviations out (a transformer's canonical weights against the
    MLPs' that dominate the role's statistics) does not saturate the network.
    """

    def __init__(self, types: int, width: int, hidden: int, squash: bool = False):
        super().__init__()
        self.squash = squash
        self.lin = nn.Linear(width, hidden)
        self.gamma, self.beta = nn.Embedding(types, hidden), nn.Embedding(types, hidden)
        nn.init.zeros_(self.gamma.weight)
        self.register_buffer("mean", torch.zeros(types, width))
        self.register_buffer("std", torch.ones(types, width))

    def fit(self, x: Tensor, types: Tensor) -> None:
        """Set the per-type mean and standard deviation from training features."""
        n = len(self.mean)
        count = scatter(torch.ones_like(types, dtype=x.dtype), types, 0, dim_size=n).clamp(min=1)
        mean = scatter(x, types, 0, dim_size=n, reduce="sum") / count[:, None]
        var = scatter((x - mean[types]) ** 2, types, 0, dim_size=n, reduce="sum") / count[:, None]
        self.mean.copy_(mean)
        self.std.copy_(var.sqrt().clamp(min=1e-8))

    def forward(self, x: Tensor, types: Tensor) -> Tensor:  # noqa: D102
        z = (x - self.mean[types]) / self.std[types]
        z = self.lin(torch.asinh(z) if self.squash else z)
        return z * (1 + self.gamma(types)) + self.beta(types)


class WeightGraphNet(nn.Module):
    """Invariant meta-network: a graph branch plus a statistics branch, added.

    The graph branch: typed encoders, ``layers`` x :class:`EdgeNodeConv`, pooled readout.

    Args:
        num_node_types, num_classes, num_edge_types, num_attr_types: from the schema.
        edge_width, attr_width, graph_width, stat_width: raw feature sizes (from the schema).
        hidden: feature size; layers: message-passing rounds; outputs: predicted targets.
        stat_hidden, members: width and ensemble size of the statistics branch.
        trees, tree_depth: its boosted trees (0: none).
    """

    def __init__(
        self,
        num_node_types: int,
        num_classes: int,
        num_edge_types: int,
        num_attr_types: int,
        edge_width: int,
        attr_width: int,
        graph_width: int,
        stat_width: int = 0,
        hidden: int = 64,
        layers: int = 3,
        outputs: int = 1,
        stat_hidden: int = 64,
        members: int = 5,
        trees: int = 0,
        tree_depth: int = 3,
    ):
        super().__init__()
        self.num_classes, self.num_edge_types = num_classes, max(num_edge_types, 1)
        self.node_embed = nn.Embedding(num_node_types, hidden)
        self.edge_enc = TypedEncoder(self.num_edge_types, edge_width, hidden)
        self.attr_enc = TypedEncoder(max(num_attr_types, 1), attr_width, hidden)
        self.graph_enc = nn.Linear(max(graph_width, 1), hidden)
        self.stats = StatisticsEnsemble(
            max(stat_width, 1), stat_hidden, members, outputs, trees=trees, tree_depth=tree_depth
        )
        self.convs = nn.ModuleList(EdgeNodeConv(hidden) for _ in range(layers))
        pooled = (self.num_classes + self.num_edge_types + 1) * hidden
        self.head = mlp(pooled, hidden, outputs)

    def forward(self, batch) -> Tensor:
        """``(B, outputs)`` predictions: graph branch + statistics branch."""
        return self.graph_branch(batch) + self.stats(stat_input(batch))

    def graph_branch(self, batch) -> Tensor:
        """``(B, outputs)`` the message-passing branch alone."""
        dtype = self.node_embed.weight.dtype
        n, b = batch.num_nodes, batch.num_graphs
        h = self.node_embed(batch.node_type)
        a = self.attr_enc(log_beyond(batch.attr_val).to(dtype), batch.attr_type)
        h = h + scatter(a, batch.attr_node, 0, dim_size=n, reduce="sum")
        e = self.edge_enc(log_beyond(batch.edge_attr).to(dtype), batch.edge_type)
        for conv in self.convs:
            h, e = conv(h, batch.edge_index, e)
        node_graph = batch.batch
        nodes = scatter(
            h,
            node_graph * self.num_classes + batch.node_class,
            0,
            dim_size=b * self.num_classes,
            reduce="mean",
        )
        edge_graph = node_graph[batch.edge_index[1]]
        edges = scatter(
            e,
            edge_graph * self.num_edge_types + batch.edge_type,
            0,
            dim_size=b * self.num_edge_types,
            reduce="mean",
        )
        g = self.graph_enc(log_beyond(batch.graph_attr).to(dtype))
        pooled = torch.cat([nodes.view(b, -1), edges.view(b, -1), g], dim=1)
        return self.head(pooled)


def log_beyond(x: Tensor, t: float = 1e4) -> Tensor:
    r"""Float64 :math:`x` where :math:`|x| \le t`, else :math:`\mathrm{sign}(x)(t + \log(|x|/t))`.

    Continuous and monotone; keeps the graph branch's inputs finite in float32:
    canonical forms of networks with dead units (weights decayed to ~1e-40,
    balanced by huge scales) reach 1e83 on the mnist1d-cnn zoo.

    Example:
        >>> log_beyond(torch.tensor([-1e83, 0.5, 2e4], dtype=torch.float64)).round().tolist()
        [-10182.0, 0.0, 10001.0]
    """
    x = x.double()
    big = x.abs() > t
    return torch.where(big, x.sign() * (t + torch.log(x.abs().clamp(min=t) / t)), x)


def stat_input(batch) -> Tensor:
    """``(B, max(F_s, 1))`` float64 per-tensor statistics (a zero column when there are none)."""
    x = batch.stat_attr.double()
    return x if x.shape[1] else x.new_zeros(x.shape[0], 1)
