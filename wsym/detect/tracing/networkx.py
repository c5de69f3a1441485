"""The architecture graph as a networkx DiGraph, with GraphML/JSON export."""

from __future__ import annotations

import json
from pathlib import Path

import networkx as nx

from wsym.detect.tracing.export import Traced
from wsym.errors import WsymInputError


def to_networkx(traced: Traced) -> nx.DiGraph:
    """Nodes are operations, parameters, buffers and inputs; edges are data flow.

    Node attributes: ``kind`` (parameter, buffer, input, op, output), ``op``
    (ATen name for ops), ``shape`` (string) and ``param`` (state-dict key).
    """
    g = nx.DiGraph()
    for node in traced.graph.nodes:
        val = node.meta.get("val")
        shp = "x".join(str(int(s)) for s in val.shape) if hasattr(val, "shape") else ""
        if node.op == "placeholder":
            if node.name in traced.parameters:
                g.add_node(
                    node.name, kind="parameter", param=traced.parameters[node.name], shape=shp
                )
            elif node.name in traced.buffers:
                g.add_node(node.name, kind="buffer", param=traced.buffers[node.name], shape=shp)
            else:
                g.add_node(node.name, kind="input", shape=shp)
        elif node.op == "output":
            g.add_node(node.name, kind="output", shape="")
        else:
            g.add_node(node.name, kind="op", op=str(node.target), shape=shp)
        for src in node.all_input_nodes:
            g.add_edge(src.name, node.name)
    return g


def write_graph(graph: nx.DiGraph, path: str | Path) -> None:
    """Write ``graph`` as GraphML (``.graphml``) or node-link JSON (``.json``)."""
    path = Path(path)
    if path.suffix == ".graphml":
        nx.write_graphml(graph, path)
    elif path.suffix == ".json":
        path.write_text(json.dumps(nx.node_link_data(graph, edges="edges"), indent=1))
    else:
        raise WsymInputError(f"graph file {path.name}: use a .graphml or .json suffix")
