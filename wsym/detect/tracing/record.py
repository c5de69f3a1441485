"""Record the ATen ops of one real forward pass as an fx graph.

The model runs once under a ``TorchDispatchMode`` that writes every ATen call
into an fx graph: no fake tensors, no symbolic shapes, no functionalization
pass, so recording costs about one forward pass (``torch.export`` costs tens).
Control flow is specialized to the example inputs; the detected symmetries are
verified on the module itself, on other inputs. In-place writes are data flow
by tensor identity and version (the written tensor's later readers see the new
node). A write into a slice of a tensor is recorded as the write and a
``slice_scatter`` of its result into the tensor, which the tensor's later readers
see (Swin V2's query-key-value bias with the key's third zeroed in place).
Other reads after an in-place write into one of a tensor's views (or into the
base of a view) cannot be represented so and are refused, unless everything
involved is a constant (a mask built in place).

Node values (``meta['val']``) are shape-and-dtype-only tensors on the ``meta``
device, so the recorded graph does not keep the forward pass's activations alive.
"""

from __future__ import annotations

import operator

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.weak import WeakIdKeyDictionary

from wsym.detect.tracing.traced import Traced
from wsym.errors import WsymInputError

# fused inference kernels (nn.MultiheadAttention, nn.TransformerEncoderLayer without
# gradients) no rule reads: a recording holding one is traced by torch.export instead
FUSED = ("aten::_native_multi_head_attention", "aten::_transformer_encoder_layer_fwd")
# ops whose values do not depend on their tensor operand's (only its shape and dtype)
FACTORIES = {
    f"{n}{s}"
    for n in ("new_zeros", "new_ones", "new_empty", "new_full", "zeros_like", "ones_like", "zero")
    for s in ("", "_")
} | {"empty_like", "full_like"}
# ops through which a forward pass reads a tensor's value into Python (``if x.sum() > 0``,
# ``if torch.equal(a, b)``)
VALUE_READS = (
    "aten::_local_scalar_dense",
    "aten::item",
    "aten::is_nonzero",
    "aten::equal",
    "aten::allclose",
)
# Tensor methods that hand a tensor's values to Python without an ATen call
EXPORTS = (torch.Tensor.tolist, torch.Tensor.numpy, torch.Tensor.__array__)


def _shape_only(x):
    if not isinstance(x, torch.Tensor):
        return x
    try:
        return torch.empty_like(x, device="meta")
    except (RuntimeError, NotImplementedError):  # sparse or other layouts: keep the tensor
        return x


def _copy(x):
    return x.clone() if isinstance(x, torch.Tensor) else x


def _map(fn, x):
    """``tree_map(fn, x)`` for an ATen call's arguments and outputs, without pytree's overhead.

    Plain lists, tuples and dicts are walked here; any other container goes to pytree.
    """
    kind = type(x)
    if kind is list or kind is tuple:
        return kind(_map(fn, y) for y in x)
    if kind is dict:
        return {k: _map(fn, v) for k, v in x.items()}
    if isinstance(x, list | tuple | dict):  # a named tuple or another pytree node
        return tree_map(fn, x)
    return fn(x)


def _version(t: torch.Tensor) -> int:
    try:
        return t._version
    except RuntimeError:  # inference tensors keep no version counter
        return -1


class _Recorder(TorchDispatchMode):
    """Write each ATen call into ``graph``; ``nodes`` maps live tensors to ``(node, version)``.

    The version is the tensor's in-place version counter (shared with its views)
    right after its node was recorded. Reading a tensor whose counter moved since (a
    view's base after a write into the view, or a view after a write into its
    base) is refused, except where everything written and read is a constant
    (computed from neither inputs, weights nor buffers: a mask built in place).
    """

    def __init__(
        self, graph: torch.fx.Graph, nodes: WeakIdKeyDictionary, dependent: set, keep=frozenset()
    ):
        super().__init__()
        self.graph, self.nodes, self.constants = graph, nodes, 0
        self.keep, self.kept = keep, {}  # node names whose values to keep, and those values
        self.dependent = dependent  # names of nodes computed from inputs, weights or buffers
        self.tainted = WeakIdKeyDictionary()  # bases written (through a view) with such values
        self.slices = WeakIdKeyDictionary()  # view -> (base, slice arguments), one level deep
        self.guards: list = []  # (node name, outcome) of each boolean value read, in call order
        self.numbers: list = []  # nodes whose value the forward read as a number (``x.item()``)

    def _constant(self, x: torch.Tensor):
        node = self.graph.placeholder(f"constant_{self.constants}")
        node.meta["val"] = _shape_only(x)
        self.constants += 1
        self.nodes[x] = (node, _version(x))
        return node

    def _node(self, x):
        if not isinstance(x, torch.Tensor):
            return x
        if x not in self.nodes:  # a tensor made outside the graph: a constant input
            return self._constant(x)
        node, version = self.nodes[x]
        if version == _version(x):
            return node
        base = x._base if x._base is not None else x
        if node.name in self.dependent or base in self.tainted:
            raise RuntimeError(f"{node.name} is read after an in-place write into a view of it")
        return self._constant(x)  # its new value is a constant too

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        arg_nodes = _map(self._node, args), _map(self._node, kwargs)
        into = self._written_slice(func, args)
        if func._schema.name in FUSED:
            raise RuntimeError(f"fused inference kernel {func._schema.name}")
        if _dynamic_shape(func, args):
            raise dynamic_shape_error(func)
        out = func(*args, **kwargs)
        # named like torch.export's nodes (``relu``, ``relu_1``), not ``relu_default``
        name = func._schema.name.split("::")[-1]
        node = self.graph.create_node("call_function", func, *arg_nodes, name=name)
        node.meta["val"] = _map(_shape_only, out)
        if func._schema.name in VALUE_READS:
            if isinstance(out, bool):
                self.guards.append((node.name, out))  # ``if t:`` and ``bool(t)`` (guards.py)
            else:
                self.numbers.append(node.name)  # ``x.item() < 100``: no outcome to force
        if name not in FACTORIES and any(n.name in self.dependent for n in node.all_input_nodes):
            self.dependent.add(node.name)
            if func._schema.is_mutable:  # the written storage now holds such values
                for a in tree_flatten((args, kwargs))[0]:
                    if isinstance(a, torch.Tensor):
                        self.tainted[a._base if a._base is not None else a] = True
        versions = _versions_after(func, args, out)
        if func is torch.ops.aten.slice.Tensor and args[0]._base is None:
            self.slices[out] = (args[0], _slice_args(args, kwargs))
        if into is not None:  # the base's new value: the written slice put back
            self._scatter(node, *into, version=versions[0])
        if node.name in self.keep:  # a copy: a later in-place op (relu_) must not change it
            self.kept[node.name] = _map(_copy, out)
        if isinstance(out, torch.Tensor):
            self.nodes[out] = (node, versions[0])
        elif isinstance(out, list | tuple):
            for i, o in enumerate(out):
                if isinstance(o, torch.Tensor):
                    item = self.graph.call_function(operator.getitem, (node, i))
                    item.meta["val"] = _shape_only(o)
                    if node.name in self.dependent:
                        self.dependent.add(item.name)
                    self.nodes[o] = (item, versions[i] if i < len(versions) else _version(o))
                    if item.name in self.keep:
                        self.kept[item.name] = o.clone()
        return out

    def _written_slice(self, func, args):
        """``(base, its node, slice arguments)`` where ``func`` writes into a slice of a base.

        Only a slice taken directly of a base whose recorded node is current.
        """
        if not (func._schema.is_mutable and args and isinstance(args[0], torch.Tensor)):
            return None
        if args[0] not in self.slices:
            return None
        base, slice_args = self.slices[args[0]]
        if base not in self.nodes or self.nodes[base][1] != _version(base):
            return None
        return base, self.nodes[base][0], slice_args

    def _scatter(self, written, base, base_node, slice_args, version: int) -> None:
        """Record ``slice_scatter(base, written slice)`` as the base's current node.

        ``version``: the written view's counter after the call (the base shares it).
        """
        if not {base_node.name, written.name} & self.dependent:
            return  # constants: the base is read as a new constant (a mask built in place)
        node = self.graph.call_function(
            torch.ops.aten.slice_scatter.default, (base_node, written, *slice_args)
        )
        node.meta["val"] = _shape_only(base)
        self.dependent.add(node.name)
        self.nodes[base] = (node, version)


def _slice_args(args, kwargs) -> tuple:
    """``(dim, start, end, step)`` of an ``aten.slice.Tensor`` call, defaults filled in."""
    names = ("dim", "start", "end", "step")
    given = dict(zip(names, args[1:], strict=False)) | {k: kwargs[k] for k in names if k in kwargs}
    return given.get("dim", 0), given.get("start"), given.get("end"), given.get("step", 1)


def _dynamic_shape(func, args) -> bool:
    """Whether the op's output shape depends on its operands' values (``x[x > 0]``)."""
    if torch.Tag.dynamic_output_shape not in func.tags:
        return False
    if func is torch.ops.aten.index.Tensor:  # integer indices give a static shape
        indices = args[1] if len(args) > 1 else []
        return any(
            isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices
        )
    return True


def dynamic_shape_error(target) -> WsymInputError:
    """The one-line error for an operation whose output shape depends on values."""
    return WsymInputError(
        f"operation {target} has a data-dependent output shape; wsym needs static shapes: "
        "replace boolean-mask indexing or nonzero() with a fixed-shape op (torch.where)"
    )


def _versions_after(func, args, out) -> list[int]:
    """The version counter of each output once the call has returned.

    Autograd's in-place and view layer (above this mode) bumps a written
    tensor's counter and gives a view its base's counter only after
    ``__torch_dispatch__`` returns, so both are read off the schema: an output
    aliasing an input has that input's version (plus one if written). A list of views
    (``split``, ``unbind``: ``Tensor(a -> *) self -> Tensor(a)[]``, whose schema
    keeps the alias on the list's elements, out of reach) has the viewed input's.
    """
    inputs, spread = {}, None
    for a, spec in zip(args, func._schema.arguments, strict=False):
        if isinstance(a, torch.Tensor) and spec.alias_info is not None:
            for name in spec.alias_info.before_set:
                inputs[name] = (a, spec.alias_info.is_write)
            if "*" in spec.alias_info.after_set and not spec.alias_info.is_write:
                spread = a
    outs = list(out) if isinstance(out, list | tuple) else [out]
    returns = func._schema.returns
    if spread is not None and len(returns) == 1 and str(returns[0].type) == "List[Tensor]":
        return [_version(spread)] * len(outs)
    versions = []
    for i, o in enumerate(outs):
        ret = returns[i] if i < len(returns) else None
        alias = ret.alias_info if ret is not None else None
        source = next((inputs[n] for n in alias.before_set if n in inputs), None) if alias else None
        if source is not None:
            versions.append(_version(source[0]) + int(source[1]))
        else:
            versions.append(_version(o) if isinstance(o, torch.Tensor) else -1)
    return versions


class _Exports(TorchFunctionMode):
    """Note the tensors whose values the forward hands to Python (``x.tolist()``, numpy)."""

    def __init__(self, recorder: _Recorder):
        super().__init__()
        self.recorder = recorder

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in EXPORTS and args and args[0] in self.recorder.nodes:
            self.recorder.numbers.append(self.recorder.nodes[args[0]][0].name)
        return func(*args, **(kwargs or {}))


def record(model: torch.nn.Module, args: tuple, kwargs: dict) -> Traced:
    """Trace ``model(*args, **kwargs)`` by recording its ATen calls (under ``no_grad``)."""
    return _record(model, args, kwargs)[0]


def recorded_values(model: torch.nn.Module, args: tuple, kwargs: dict, names) -> dict:
    """The values of the recorded nodes named ``names`` in one forward pass.

    Names as :func:`record` gives them: the same model on inputs of the same
    shapes gives the same names.
    """
    return _record(model, args, kwargs, frozenset(names))[1]


def _record(model, args, kwargs, keep=frozenset()) -> tuple[Traced, dict]:
    graph = torch.fx.Graph()
    nodes = WeakIdKeyDictionary()
    parameters, buffers = {}, {}
    for kind, named, table in (
        ("p", model.named_parameters(remove_duplicate=False), parameters),
        ("b", model.named_buffers(remove_duplicate=False), buffers),
    ):
        for name, t in named:
            node = graph.placeholder(f"{kind}_{name.replace('.', '_')}")
            node.meta["val"] = _shape_only(t)
            nodes[t] = (node, _version(t))
            table[node.name] = name
    inputs = []
    for i, t in enumerate(tree_flatten((args, kwargs))[0]):
        if isinstance(t, torch.Tensor):
            node = graph.placeholder(f"input_{i}")
            node.meta["val"] = _shape_only(t)
            nodes[t] = (node, _version(t))
            inputs.append(node.name)
    recorder = _Recorder(graph, nodes, {*parameters, *buffers, *inputs}, keep)
    with torch.no_grad(), recorder, _Exports(recorder):
        out = model(*args, **kwargs)
    leaves = [recorder._node(x) for x in tree_flatten(out)[0] if isinstance(x, torch.Tensor)]
    graph.output(tuple(leaves))
    reads = _value_reads(graph, set(inputs) | set(parameters))
    floats = {n.name for n in graph.nodes if n.op == "placeholder" and _is_float(n)}
    sources = floats - {n for n in floats if n.startswith("constant_")}
    valued = set(_value_reads(graph, sources))
    guards = tuple((i, out) for i, (name, out) in enumerate(recorder.guards) if name in valued)
    numbers = _reaching(graph, recorder.numbers, sources)
    graph.eliminate_dead_code()
    traced = Traced(
        graph=graph,
        parameters=parameters,
        buffers=buffers,
        inputs=tuple(inputs),
        value_reads=tuple(reads),
        guards=guards,
        numbers=numbers,
    )
    return traced, recorder.kept


def _is_float(node: torch.fx.Node) -> bool:
    val = node.meta.get("val")
    return isinstance(val, torch.Tensor) and val.is_floating_point()


def _reaching(graph: torch.fx.Graph, names, sources: set) -> tuple[str, ...]:
    """The nodes of ``names`` (in order, once each) computed from a node of ``sources``."""
    by_name = {n.name: n for n in graph.nodes}
    return tuple(n for n in dict.fromkeys(names) if _computed_from([by_name[n]], sources))


def _computed_from(nodes, sources: set) -> bool:
    """Whether one of ``nodes`` or a node they are computed from is named in ``sources``."""
    stack, seen = list(nodes), set()
    while stack:
        n = stack.pop()
        if n.name in sources:
            return True
        if n.name not in seen:
            seen.add(n.name)
            stack.extend(n.all_input_nodes)
    return False


def _value_reads(graph: torch.fx.Graph, sources: set) -> list[str]:
    """Nodes where the forward pass read a value computed from its inputs or weights.

    Such a read (``bool(t)``, ``t.item()``) is data-dependent control flow: the
    recorded graph holds only the branch the example inputs took.
    """
    found = []
    for node in graph.nodes:
        schema = getattr(node.target, "_schema", None)
        if node.op != "call_function" or schema is None or schema.name not in VALUE_READS:
            continue
        if _computed_from(node.all_input_nodes, sources):
            found.append(node.name)
    return found
