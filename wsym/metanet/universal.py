r"""Weight graphs whose features mean the same thing in every architecture.

:class:`~wsym.metanet.graph.GraphSchema` numbers node and edge *types* per
architecture (an MLP's second weight and a CNN's second kernel get unrelated
ids), so a network reading them is tied to one architecture. A
:class:`UniversalSchema` keeps that schema's nodes and edges (read off the spec)
but describes them by *roles* shared across architectures:

* node features: depth fraction (breadth-first distance from the input
  coordinates over the class graph, divided by the largest), unpermuted
  (input/output coordinate or position), source, sink, product node
  (head x feature), the coordinate's index fraction where unpermuted, the log
  class size; and, from the weights, the norms of the node's incoming and of its
  outgoing weights (kernels included) and its log in- and out-degree: what a
  unit receives and sends, which mean aggregation alone does not see;
* node attributes (biases, normalization gains, running statistics, kernels of
  single-input convolutions): fixed-size statistics of their values (:func:`kernel_statistics`:
  mean, rms, std, min, max on the signed log scale, log width) and the parameter's
  position in the forward order; role ``parameter`` / ``kernel`` / ``buffer``;
* edges: the same statistics of the edge's kernel (a linear weight is a kernel
  of width 1, so kernel sizes are edge features, any size), the position;
  role ``linear`` / ``conv`` / ``pooled`` and, for attention, ``qk`` / ``vo``:
  for every GL group (one per head) the GL-invariant products
  :math:`W_Q^{h\top} W_K^h` and :math:`W_O^h W_V^h`, summed (and squared-summed) over
  the heads, as extra edges between the model-width nodes;
* ``stat_x``: per-tensor statistics (:func:`~wsym.metanet.statistics.tensor_features`)
  averaged within fixed (role, depth third) buckets, those of the first and last
  :data:`ENDS` weight matrices one by one (depth aligned from both ends, where
  padding from the input alone would compare an MLP's output layer with a
  CNN's middle one), plus architecture
  descriptors (log parameter count, weight tensors, depth, mean width): one
  vector of :data:`STAT_WIDTH` numbers for every architecture;
* ``graph_x``: the descriptors alone;
* ``path_x`` (:data:`PATH_WIDTH`): cross-layer paths, which per-tensor statistics
  cannot see: for every two consecutive dense weights :math:`A` then :math:`B`
  (``B`` reads the nodes ``A`` writes; a kernel summed over its width), the
  features of :math:`BA` (asinh, averaged over the pairs), those of the product
  along the longest such chain (an MLP's end-to-end linear map), the log pair
  count and the chain length. :math:`B P^{-1} P A = BA` for a permutation or
  scaling ``P`` of the shared nodes, and the features are functions of multisets
  of entries, rows and singular values, so they are invariant too.

On :func:`~wsym.metanet.invariant_form` weights every feature is invariant to
the continuous groups and signs; a permutation of a class permutes nodes (and
heads, over which the products are summed), so a message-passing network with
mean/sum readouts is invariant to each member's whole group, with no
per-architecture parameter.

Shapes (one graph): ``node_x (N, NODE_WIDTH)``, ``attr_x (A, ATTR_WIDTH)``,
``attr_node (A,)``, ``attr_role (A,)``, ``edge_index (2, E)``,
``edge_x (E, EDGE_WIDTH)``, ``edge_role (E,)``, ``node_group (N,)``,
``stat_x (1, STAT_WIDTH)``, ``graph_x (1, DESCRIPTORS)``.

Example:
    >>> import torch, wsym
    >>> from wsym.models.networks import MLP
    >>> mlp = MLP(4, [5], 3)
    >>> u = UniversalSchema(wsym.detect(mlp, torch.randn(2, 4)))
    >>> d = u.graph(mlp.state_dict())
    >>> d.num_nodes, tuple(d.edge_x.shape), tuple(d.stat_x.shape) == (1, STAT_WIDTH)
    (12, (35, 8), True)
"""

from __future__ import annotations

import math
from collections import deque

import torch

from wsym.errors import WsymInputError
from wsym.group.kinds import GL, kind_of
from wsym.group.spec import Leaf, SymmetrySpec, leaves
from wsym.metanet.graph import GraphSchema, ParamPlan, WeightData
from wsym.metanet.statistics import statistic_width, tensor_features

EDGE_ROLES = ("linear", "conv", "pooled", "qk", "vo")
ATTR_ROLES = ("parameter", "kernel", "buffer")
NODE_GROUPS = ("input", "hidden", "output")  # readout groups
NODE_WIDTH, ATTR_WIDTH, EDGE_WIDTH = 11, 7, 8
DESCRIPTORS = 5
PATH_WIDTH = 2 * 25 + 2
STAT_ROLES = (("linear", 25), ("conv", 25), ("qk", 25), ("vo", 25), ("vector", 9), ("buffer", 9))
ENDS = 2  # matrices read one by one from each end of the forward order
STAT_WIDTH = sum(3 * (w + 1) for _, w in STAT_ROLES) + 2 * ENDS * 25 + DESCRIPTORS


def kernel_statistics(values: torch.Tensor) -> torch.Tensor:
    """``(n, 6)``: asinh of mean, rms, std, min, max of each row of ``values (n, w)``; log w.

    Example:
        >>> kernel_statistics(torch.tensor([[1.0, -1.0]])).round(decimals=3).tolist()
        [[0.0, 0.881, 0.881, -0.881, 0.881, 0.693]]
    """
    v = values.to(torch.float64)
    w = v.shape[1]
    stats = torch.stack(
        [
            v.mean(1),
            v.pow(2).mean(1).sqrt(),
            v.std(1, unbiased=False) if w > 1 else v.new_zeros(len(v)),
            v.amin(1),
            v.amax(1),
        ],
        dim=1,
    )
    return torch.cat([torch.asinh(stats), v.new_full((len(v), 1), math.log(w))], dim=1)


def _depths(permuted_class: dict, edge_classes: list[tuple[int, int]]) -> dict[int, int]:
    """Breadth-first depth of every node class from the sources (permuted sources start at 1)."""
    classes = sorted(permuted_class)
    succ = {c: set() for c in classes}
    has_in = set()
    for src, dst in edge_classes:
        if src != dst:
            succ[src].add(dst)
            has_in.add(dst)
    depth = {c: (1 if permuted_class[c] else 0) for c in classes if c not in has_in}
    queue = deque(depth)
    while queue:
        c = queue.popleft()
        for d in succ[c]:
            if d not in depth:
                depth[d] = depth[c] + 1
                queue.append(d)
    return {c: depth.get(c, 0) for c in classes}


def _node_features(base: GraphSchema, class_permuted: dict, depth: dict):
    """``(node_x (N, 7), node_group (N,))``: the weight-free node features and readout groups."""
    atoms, cls, permuted = base.nodes, base.node_class, base.permuted
    top = max(depth.values(), default=0) or 1
    n = len(atoms)
    has_in, has_out = torch.zeros(n, dtype=torch.bool), torch.zeros(n, dtype=torch.bool)
    for ei in base._edges.values():
        has_out[ei[0]] = True
        has_in[ei[1]] = True
    unperm = torch.tensor([not class_permuted[int(c)] for c in cls])
    size = torch.bincount(cls).double()
    index = torch.tensor(
        [next((i for c, i in e if c not in permuted), 0) for e in atoms], dtype=torch.float64
    )
    node_x = torch.stack(
        [
            torch.tensor([depth[int(c)] / top for c in cls], dtype=torch.float64),
            unperm.double(),
            (~has_in).double(),
            (~has_out).double(),
            torch.tensor([float(len(e) > 1) for e in atoms], dtype=torch.float64),
            torch.where(unperm, index / (size[cls] - 1).clamp(min=1), torch.zeros(n)),
            torch.log(size[cls]) / math.log(1000.0),
        ],
        dim=1,
    )
    group = torch.where(unperm & ~has_in, 0, torch.where(unperm & ~has_out, 2, 1)).long()
    return node_x, group


class UniversalSchema:
    """The role-featured graph layout of one architecture (data-free; from its spec).

    Attributes:
        spec, base: the spec and its :class:`~wsym.metanet.graph.GraphSchema`.
        signature: ``((name, shape), ...)`` of every tensor the graph reads.
        layout_signature: ``{name: shape}`` of every tensor of the spec (to match state dicts).
    """

    def __init__(self, spec: SymmetrySpec):
        base = GraphSchema.from_spec(spec)
        self.spec, self.base = spec, base
        self.signature = tuple((p.name, tuple(p.shape)) for p in base.plans)
        self.layout_signature = {n: tuple(t.size for t in dims) for n, dims in spec.layouts}
        class_permuted: dict[int, bool] = {}
        for entry, cls in zip(base.nodes, base.node_class.tolist(), strict=True):
            class_permuted.setdefault(cls, any(c in base.permuted for c, _ in entry))
        self.order = {p.name: k / max(len(base.plans) - 1, 1) for k, p in enumerate(base.plans)}
        self.products = _gl_products(spec, base, self.order)
        self.pairs, self.chain = _path_pairs(base)
        edge_classes = []
        for p in base.plans:
            if p.kind == "edge":
                src, dst = base._edges[p.name][:, :1]
                edge_classes.append((int(base.node_class[src]), int(base.node_class[dst])))
        depth = _depths(class_permuted, edge_classes)
        self.node_x, self.node_group = _node_features(base, class_permuted, depth)
        size = torch.bincount(base.node_class).double()
        widths = [size[c].item() for c in range(len(size)) if class_permuted.get(c)]
        params = sum(math.prod(p.shape) for p in base.plans if p.name not in spec.buffers)
        self.descriptors = torch.tensor(
            [
                math.log(max(params, 1)) / 10,
                sum(p.kind == "edge" for p in base.plans) / 10,
                (max(depth.values(), default=0) or 1) / 10,
                math.log(sum(widths) / len(widths) if widths else 1.0) / 5,
                len(self.products) / 4,
            ],
            dtype=torch.float64,
        )[None]

    @classmethod
    def from_spec(cls, spec: SymmetrySpec) -> UniversalSchema:
        """The universal schema of ``spec``'s architecture."""
        return cls(spec)

    def check(self, state_dict: dict) -> None:
        """Raise :class:`WsymInputError` naming the first entry that does not fit."""
        self.base.check(state_dict)

    def _role(self, plan: ParamPlan) -> str:
        if plan.kind == "edge":
            return "pooled" if plan.pooled_axes else ("conv" if plan.width > 1 else "linear")
        if plan.name in self.spec.buffers:
            return "buffer"
        return "kernel" if plan.width > 1 else "parameter"

    def graph(self, state_dict: dict) -> WeightData:
        """The role-featured graph of one state dict (invariant form expected; float64)."""
        base = self.base
        edges, ex, er, anode, ax, ar = [], [], [], [], [], []
        buckets: dict[tuple[str, int], list[torch.Tensor]] = {}
        matrices: list[torch.Tensor] = []
        n = len(self.node_x)
        flow = torch.zeros(n, 4, dtype=torch.float64)  # squared norms in / out, degrees in / out
        for p in base.plans:
            t = state_dict[p.name]
            f = base._features(p, t)
            pos = torch.tensor([[self.order[p.name]]], dtype=torch.float64)
            role = self._role(p)
            third = min(int(3 * self.order[p.name]), 2)
            if p.kind == "edge":
                ei = base._edges[p.name]
                edges.append(ei)
                sq = f.reshape(ei.shape[1], -1).pow(2).sum(1)
                flow[:, 0].index_add_(0, ei[1], sq)
                flow[:, 1].index_add_(0, ei[0], sq)
                flow[:, 2].index_add_(0, ei[1], torch.ones_like(sq))
                flow[:, 3].index_add_(0, ei[0], torch.ones_like(sq))
                k = kernel_statistics(f.reshape(ei.shape[1], -1))
                ex.append(torch.cat([k, pos.expand(len(k), 1), k.new_zeros(len(k), 1)], 1))
                er.append(torch.full((ei.shape[1],), EDGE_ROLES.index(role)))
                stat_role = "conv" if role == "conv" else "linear"
            elif p.kind == "node":
                ids = base.axis_nodes[(p.name, p.node_axes[0])]
                anode.append(ids)
                ax.append(
                    torch.cat(
                        [kernel_statistics(f.reshape(len(ids), -1)), pos.expand(len(ids), 1)], 1
                    )
                )
                ar.append(torch.full((len(ids),), ATTR_ROLES.index(role)))
                stat_role = {"buffer": "buffer", "kernel": "conv"}.get(role, "vector")
            else:
                stat_role = "buffer" if p.name in self.spec.buffers else "vector"
            if statistic_width(t.shape) > 9:  # a matrix: a matrix bucket
                stat_role = stat_role if stat_role in ("linear", "conv") else "linear"
            elif stat_role in ("linear", "conv"):
                stat_role = "vector"
            feats = tensor_features(t)
            if len(feats) > 9 and p.name not in self.spec.buffers:
                matrices.append(feats)
            buckets.setdefault((stat_role, third), []).append(feats)
        path_x = _path_features(self, state_dict)
        for prod in self.products:
            ei, feats, matrix, role, third = prod.edges(state_dict)
            edges.append(ei)
            ex.append(feats)
            er.append(torch.full((ei.shape[1],), EDGE_ROLES.index(role)))
            buckets.setdefault((role, third), []).append(tensor_features(matrix))
        return WeightData(
            num_nodes=n,
            node_x=torch.cat(
                [self.node_x, torch.asinh(flow[:, :2].sqrt()), torch.log1p(flow[:, 2:])], 1
            ),
            node_group=self.node_group,
            edge_index=torch.cat(edges, 1) if edges else torch.zeros(2, 0, dtype=torch.long),
            edge_x=torch.cat(ex) if ex else torch.zeros(0, EDGE_WIDTH, dtype=torch.float64),
            edge_role=torch.cat(er) if er else torch.zeros(0, dtype=torch.long),
            attr_node=torch.cat(anode) if anode else torch.zeros(0, dtype=torch.long),
            attr_x=torch.cat(ax) if ax else torch.zeros(0, ATTR_WIDTH, dtype=torch.float64),
            attr_role=torch.cat(ar) if ar else torch.zeros(0, dtype=torch.long),
            stat_x=torch.cat([_bucketed(buckets), _ends(matrices), self.descriptors], 1),
            graph_x=self.descriptors,
            path_x=path_x,
        )


def _path_pairs(base: GraphSchema):
    """``([(A, B, rows of A in B's column order)], chain)``: consecutive dense edge plans.

    ``B`` is the first plan after ``A`` (forward order) whose input nodes are ``A``'s
    output nodes; ``chain`` the longest run of such pairs (plan names, in order).
    """
    dense = [p for p in base.plans if p.kind == "edge" and not p.pooled_axes]
    ids = {
        p.name: (
            base.axis_nodes[(p.name, p.node_axes[0])],
            base.axis_nodes[(p.name, p.node_axes[1])],
        )
        for p in dense
    }
    pairs, after = [], {}
    for k, a in enumerate(dense):
        out_a = ids[a.name][0]
        for b in dense[k + 1 :]:
            in_b = ids[b.name][1]
            if len(in_b) == len(out_a) and set(in_b.tolist()) == set(out_a.tolist()):
                where = {int(n): i for i, n in enumerate(out_a.tolist())}
                rows = torch.tensor([where[int(n)] for n in in_b.tolist()], dtype=torch.long)
                pairs.append((a.name, b.name, rows))
                after[a.name] = (b.name, rows)
                break
    chain: list = []
    for p in dense:
        run, name = [(p.name, None)], p.name
        while name in after:
            name, rows = after[name]
            run.append((name, rows))
        chain = run if len(run) > len(chain) else chain
    return pairs, chain if len(chain) > 1 else []


def _dense(schema, sd: dict, name: str) -> torch.Tensor:
    """``(out, in)`` the plan's weight, a kernel summed over its width."""
    plan = next(p for p in schema.base.plans if p.name == name)
    f = schema.base._features(plan, sd[name])
    return f.reshape(*f.shape[:2], -1).sum(-1)


def _path_features(schema, sd: dict) -> torch.Tensor:
    """``(1, PATH_WIDTH)`` the cross-layer path features (see the module doc)."""

    def feats(m):
        f = tensor_features(m.clamp(-1e150, 1e150))
        f = torch.cat([f, f.new_zeros(25 - len(f))])  # a vector: no matrix features
        return torch.asinh(torch.nan_to_num(f, posinf=1e300, neginf=-1e300))

    mats: dict = {}

    def dense(name):
        if name not in mats:
            mats[name] = _dense(schema, sd, name)
        return mats[name]

    zero = torch.zeros(25, dtype=torch.float64)
    pair = (
        torch.stack([feats(dense(b) @ dense(a)[rows]) for a, b, rows in schema.pairs]).mean(0)
        if schema.pairs
        else zero
    )
    chain = zero
    if schema.chain:
        m = dense(schema.chain[0][0])
        for name, rows in schema.chain[1:]:
            m = dense(name) @ m[rows].clamp(-1e150, 1e150)
        chain = feats(m)
    counts = torch.tensor(
        [math.log1p(len(schema.pairs)), len(schema.chain) / 10], dtype=torch.float64
    )
    return torch.cat([pair, chain, counts])[None]


def _bucketed(buckets: dict) -> torch.Tensor:
    """``(1, STAT_WIDTH - DESCRIPTORS)``: mean features per (role, third) and the tensor count."""
    out = []
    for role, width in STAT_ROLES:
        for third in range(3):
            got = buckets.get((role, third), [])
            mean = torch.stack(got).mean(0) if got else torch.zeros(width, dtype=torch.float64)
            out += [mean, torch.tensor([len(got) / 4.0], dtype=torch.float64)]
    return torch.cat(out)[None]


def _ends(matrices: list[torch.Tensor]) -> torch.Tensor:
    """``(1, 2 * ENDS * 25)``: the first and the last ENDS matrices' features (zeros if fewer)."""
    pad = [torch.zeros(25, dtype=torch.float64)] * ENDS
    first = (matrices + pad)[:ENDS]
    last = (pad + matrices)[-ENDS:]
    return torch.cat(first + last)[None]


class _Product:
    """``A^T B`` per head of a GL pair (``A`` acted on by g, ``B`` by g^-T), summed over heads."""

    def __init__(self, a, b, heads, role, position, out_ids, in_ids):
        self.a, self.b, self.heads, self.role = a, b, heads, role
        self.position, self.third = position, min(int(3 * position), 2)
        self.out_ids, self.in_ids = out_ids, in_ids

    def edges(self, sd: dict):
        """Edge index, features ``(E, EDGE_WIDTH)``, the summed matrix, role and third."""
        (na, ga), (nb, gb) = self.a, self.b
        a = sd[na].double().movedim(ga, 0)  # (heads * d, X)
        b = sd[nb].double().movedim(gb, 0)  # (heads * d, Y)
        a = a.reshape(self.heads, -1, a.shape[-1])
        b = b.reshape(self.heads, -1, b.shape[-1])
        m = torch.einsum("hdx,hdy->hxy", a, b)  # per head, (X, Y)
        total = m.sum(0)
        if self.role == "vo":  # O V maps inputs (V's other axis) to outputs (O's other axis)
            m, total = m.transpose(1, 2), total.T
        # edge in -> out: out index = rows of the (out, in) matrix
        dst = self.out_ids.repeat_interleave(len(self.in_ids))
        src = self.in_ids.repeat(len(self.out_ids))
        flat = m.reshape(self.heads, -1).T  # (E, heads)
        k = kernel_statistics(flat)
        k[:, 0] = torch.asinh(flat.sum(1))  # the summed product, not the mean
        pos = torch.full((len(k), 1), self.position, dtype=torch.float64)
        feats = torch.cat([k, pos, torch.asinh(flat.pow(2).sum(1))[:, None]], 1)
        return torch.stack([src, dst]), feats, total, self.role, self.third


def _gl_axis(tree, cls: int, count: int):
    """The parity of the GL leaf of class ``cls`` if ``tree`` is (heads x) that leaf, else None.

    The products need the head index to be the slow one: ``(count * size,)`` entries,
    the GL leaf last in a product.
    """
    lv = leaves(tree)
    if not lv or not isinstance(lv[-1], Leaf) or lv[-1].cls != cls:
        return None
    if any(x.cls == cls for x in lv[:-1]) or math.prod(x.size for x in lv) != count * lv[-1].size:
        return None
    return lv[-1].parity


def _gl_products(spec: SymmetrySpec, base: GraphSchema, order: dict) -> list[_Product]:
    """The GL-invariant products of every GL group acting on two two-axis weights."""
    layout = spec.layout
    out = []
    for g in spec.groups:
        if type(kind_of(g)) is not GL:
            continue
        sides = {0: [], 1: []}
        for name in g.params:
            dims = layout[name]
            if len(dims) != 2 or name in spec.buffers:
                continue
            for d in range(2):
                parity = _gl_axis(dims[d], g.cls, g.count)
                if parity is not None and (name, 1 - d) in base.axis_nodes:
                    sides[parity].append((name, d))
        for a in sides[0]:
            for b in sides[1]:
                other_a, other_b = (a[0], 1 - a[1]), (b[0], 1 - b[1])
                ids_a, ids_b = base.axis_nodes[other_a], base.axis_nodes[other_b]
                role = "qk" if a[1] == b[1] else "vo"
                # qk: bilinear form between the query side (out) and key side (in);
                # vo: O V maps V's input side to O's output side
                out_ids, in_ids = (ids_a, ids_b) if role == "qk" else (ids_b, ids_a)
                out.append(_Product(a, b, g.count, role, order[a[0]], out_ids, in_ids))
    return out


def matching(schemas: dict, state_dict: dict, i: int) -> list:
    """The known schemas ``state_dict`` fits (names and shapes), or a one-line error."""
    sig = signature_of(state_dict)
    found = [s for s in schemas.values() if s.layout_signature == sig]
    if not found:
        raise WsymInputError(
            f"state dict {i} is of an architecture this meta-network does not know "
            f"({len(sig)} floating tensors, first {next(iter(sig), '-')!r}); pass it with its "
            "model, (model, state_dict), or retrain the meta-network with that architecture"
        )
    return found


def signature_of(state_dict: dict) -> dict:
    """``{name: shape}`` of the floating tensors of ``state_dict``."""
    return {
        k: tuple(v.shape)
        for k, v in state_dict.items()
        if torch.is_tensor(v) and v.is_floating_point()
    }
