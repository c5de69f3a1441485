"""Tracing modules into architecture graphs."""

from wsym.detect.tracing.export import Traced, trace
from wsym.detect.tracing.networkx import to_networkx, write_graph
from wsym.models.calling import eval_mode, split_inputs

__all__ = ["Traced", "eval_mode", "split_inputs", "to_networkx", "trace", "write_graph"]
