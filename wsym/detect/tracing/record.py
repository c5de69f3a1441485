"""Fallback tracer: record the ATen ops of one real forward pass.

``torch.export`` refuses data-dependent control flow (``if x.sum() > 0``). This
tracer simply runs the model under a ``TorchDispatchMode`` and writes every
ATen call into an fx graph, so control flow is specialized to the example
inputs (the detected symmetries are then verified on those inputs). In-place
writes into views cannot be represented as data flow here and are refused.
"""

from __future__ import annotations

import operator

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from wsym.detect.tracing.traced import Traced


class _Recorder(TorchDispatchMode):
    def __init__(self, graph: torch.fx.Graph, nodes: dict):
        super().__init__()
        self.graph, self.nodes, self.constants = graph, nodes, 0

    def _node(self, x):
        if not isinstance(x, torch.Tensor):
            return x
        if id(x) not in self.nodes:  # a tensor made outside the graph: a constant input
            node = self.graph.placeholder(f"constant_{self.constants}")
            node.meta["val"] = x
            self.constants += 1
            self.nodes[id(x)] = (x, node)
        return self.nodes[id(x)][1]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func._schema.is_mutable and any(
            isinstance(a, torch.Tensor) and a._base is not None
            for a in tree_flatten((args, kwargs))[0]
        ):
            raise RuntimeError(f"in-place {func} on a view cannot be recorded")
        out = func(*args, **kwargs)
        node = self.graph.call_function(
            func, tree_map(self._node, args), tree_map(self._node, kwargs)
        )
        node.meta["val"] = out
        if isinstance(out, torch.Tensor):
            self.nodes[id(out)] = (out, node)
        elif isinstance(out, list | tuple):
            for i, o in enumerate(out):
                if isinstance(o, torch.Tensor):
                    item = self.graph.call_function(operator.getitem, (node, i))
                    item.meta["val"] = o
                    self.nodes[id(o)] = (o, item)
        return out


def record(model: torch.nn.Module, args: tuple, kwargs: dict) -> Traced:
    """Trace ``model(*args, **kwargs)`` by recording its ATen calls."""
    graph = torch.fx.Graph()
    nodes: dict = {}
    parameters, buffers = {}, {}
    for kind, named, table in (
        ("p", model.named_parameters(), parameters),
        ("b", model.named_buffers(), buffers),
    ):
        for name, t in named:
            node = graph.placeholder(f"{kind}_{name.replace('.', '_')}")
            node.meta["val"] = t
            nodes[id(t)] = (t, node)
            table[node.name] = name
    inputs = []
    for i, t in enumerate(tree_flatten((args, kwargs))[0]):
        if isinstance(t, torch.Tensor):
            node = graph.placeholder(f"input_{i}")
            node.meta["val"] = t
            nodes[id(t)] = (t, node)
            inputs.append(node.name)
    recorder = _Recorder(graph, nodes)
    with torch.no_grad(), recorder:
        out = model(*args, **kwargs)
    leaves = [recorder._node(x) for x in tree_flatten(out)[0] if isinstance(x, torch.Tensor)]
    graph.output(tuple(leaves))
    graph.eliminate_dead_code()
    return Traced(graph=graph, parameters=parameters, buffers=buffers, inputs=tuple(inputs))
