"""Tracing modules into architecture graphs."""

from wsym.graph.networkx import to_networkx, write_graph
from wsym.graph.trace import Traced, eval_mode, split_inputs, trace

__all__ = ["Traced", "eval_mode", "split_inputs", "to_networkx", "trace", "write_graph"]
