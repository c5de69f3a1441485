"""Trace a module into an ATen graph and describe it as a networkx DiGraph.

Detection reads the graph :func:`record_trace` records from one real forward
pass (:mod:`wsym.detect.tracing.record`; about one forward pass of cost), falling back to
:func:`trace` where recording fails. Both are specialized to the example inputs'
control flow; detection verifies on the module itself.

:func:`trace`: ``torch.export`` (non-strict) captures an ATen graph whose nodes carry shapes;
``run_decompositions({})`` functionalizes it so that in-place writes become data
flow. Where export fails (data-dependent control flow, say), the fallback records
the ATen calls of one forward pass (:mod:`wsym.detect.tracing.record`), and detection says so
in one line: the groups found on that specialized trace are verified on the
module itself. Shapes must be static for the example inputs.

torch's own reports of a failed export (graph dumps, guard logs) are kept off
stderr unless the ``wsym`` logger is at DEBUG level
(``logging.getLogger("wsym").setLevel(logging.DEBUG)``).
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings

import torch

from wsym.detect.tracing.record import dynamic_shape_error, record
from wsym.detect.tracing.traced import Traced
from wsym.errors import SymmetryWarning, WsymInputError
from wsym.models.arguments import check_runs
from wsym.models.calling import eval_mode, model_inputs

LOG = logging.getLogger("wsym.detect.tracing")
# loggers through which torch.export reports a failure (with FX graph dumps)
TORCH_LOGGERS = (
    "torch.fx.experimental.symbolic_shapes",
    "torch._dynamo",
    "torch.export",
    "torch._export",
    "torch._functorch",
    "torch._subclasses.fake_tensor",
)


@contextlib.contextmanager
def quiet_torch():
    """Keep torch's export diagnostics off stderr unless ``wsym`` logs at DEBUG level.

    torch logs guard failures and prints the partial FX graph of a failed export
    straight to ``sys.stderr``; both are captured and passed to the ``wsym.detect.tracing``
    logger at DEBUG level.
    """
    if logging.getLogger("wsym").isEnabledFor(logging.DEBUG):
        yield
        return
    loggers = [logging.getLogger(name) for name in TORCH_LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)
        if captured.getvalue():
            LOG.debug("torch.export wrote:\n%s", captured.getvalue())


def first_line(err: BaseException) -> str:
    """``"Type: first line of the message"`` (just the type if there is no message)."""
    text = str(err).strip()
    line = text.splitlines()[0].strip() if text else ""
    return f"{type(err).__name__}: {line[:160]}" if line else type(err).__name__


def _fallback(model, args, kwargs, export_error) -> Traced:
    LOG.debug("torch.export failed", exc_info=export_error)
    try:
        traced = record(model, args, kwargs)
    except Exception as err:  # noqa: BLE001
        LOG.debug("recording the ATen calls failed", exc_info=err)
        raise WsymInputError(
            f"neither torch.export ({first_line(export_error)}) nor the fallback recorder "
            f"({first_line(err)}) can trace this model; remove data-dependent control flow "
            "from forward or pass inputs it supports"
        ) from export_error
    warnings.warn(
        f"torch.export failed ({first_line(export_error)}); detected on a trace specialized "
        "to the example inputs' control flow and verified on the module itself",
        SymmetryWarning,
        stacklevel=4,
    )
    _require_static_shapes(traced.graph)
    return traced


def _require_static_shapes(graph: torch.fx.Graph) -> None:
    for node in graph.nodes:
        vals = node.meta.get("val")
        for v in vals if isinstance(vals, list | tuple) else [vals]:
            if hasattr(v, "shape") and not all(isinstance(s, int) for s in v.shape):
                raise dynamic_shape_error(node.target)


VIEW_OPS = {
    "aten::view",
    "aten::reshape",
    "aten::_unsafe_view",
    "aten::slice",
    "aten::narrow",
    "aten::select",
    "aten::transpose",
    "aten::permute",
    "aten::expand",
    "aten::unsqueeze",
    "aten::squeeze",
    "aten::t",
    "aten::as_strided",
    "aten::unflatten",
    "aten::flatten",
    "aten::split",
    "aten::chunk",
    "aten::unbind",
    "aten::diagonal",
    "aten::alias",
}


def _needs_functionalization(graph: torch.fx.Graph) -> bool:
    """In-place writes that a plain data-flow reading would get wrong.

    ``relu_(x)`` on a tensor nobody else reads is just ``relu(x)``; a write into
    a view, into a graph input, or into a tensor that is read elsewhere is not.
    """
    for node in graph.nodes:
        schema = getattr(node.target, "_schema", None)
        if node.op != "call_function" or schema is None or not schema.is_mutable:
            continue
        target = node.args[0] if node.args else None
        if not isinstance(target, torch.fx.Node) or target.op != "call_function":
            return True
        source = getattr(target.target, "_schema", None)
        if (source is not None and source.name in VIEW_OPS) or len(target.users) > 1:
            return True
    return False


def record_trace(model: torch.nn.Module, example_inputs) -> Traced:
    """Record the ATen calls of ``model`` (in eval mode) on ``example_inputs``.

    Where recording fails (an in-place write into a view), the model is exported
    with :func:`trace` instead. A forward pass that reads tensor values computed
    from its inputs or weights into Python (``if h.abs().max() > 10``) is
    data-dependent control flow: detection says so in one line.

    Raises:
        WsymInputError: if the model cannot be run or traced on these inputs.
    """
    args, kwargs = model_inputs(model, example_inputs)
    with eval_mode(model):
        try:
            traced = record(model, args, kwargs)
        except WsymInputError:
            raise
        except Exception as err:  # noqa: BLE001
            LOG.debug("recording the ATen calls failed", exc_info=err)
            check_runs(model, args, kwargs)
            return trace(model, example_inputs)
    if traced.value_reads:
        warnings.warn(
            f"the forward pass reads tensor values into Python ({len(traced.value_reads)} "
            f"times, first at {traced.value_reads[0]}): data-dependent control flow; detected "
            "on a trace specialized to the example inputs and verified on the module itself",
            stacklevel=3,
        )
    return traced


def trace(model: torch.nn.Module, example_inputs) -> Traced:
    """Export ``model`` (in eval mode) on ``example_inputs``.

    Raises:
        WsymInputError: if the model cannot be run or traced on these inputs.
    """
    args, kwargs = model_inputs(model, example_inputs)
    with eval_mode(model):
        try:
            with quiet_torch(), warnings.catch_warnings():
                # nn.RNN re-registers its flat weights during export: harmless, not the user's
                warnings.filterwarnings("ignore", message=r"The tensor attributes .*_flat_weights")
                ep = torch.export.export(model, args, kwargs, strict=False)
        except Exception as export_error:  # noqa: BLE001
            check_runs(model, args, kwargs)
            return _fallback(model, args, kwargs, export_error)
        if _needs_functionalization(ep.graph):
            ep = ep.run_decompositions({})
    _require_static_shapes(ep.graph)
    sig = ep.graph_signature
    return Traced(
        graph=ep.graph,
        parameters=dict(sig.inputs_to_parameters),
        buffers=dict(sig.inputs_to_buffers),
        inputs=tuple(sig.user_inputs),
        program=ep,
    )
