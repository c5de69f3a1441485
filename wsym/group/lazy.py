r"""State dicts computed one tensor at a time: verification beyond a float64 copy of the model.

Verifying a group evaluates the model at generic weights ``theta`` and at ``g . theta``
in float64 (:mod:`wsym.group.verify`). Held whole, that is two float64 copies of the
weights (four times the float32 model) besides the model itself. A
:class:`LazyState` holds none: it is a recipe, and :meth:`LazyState.tensor` computes
one entry when asked,

.. math::

    \big(\mathrm{cast} \circ \mathrm{perturb} \circ g \circ \mathrm{generic}\big)(\mathrm{key}),

each stage one small class (:class:`GenericState`, :class:`ActedState`,
:class:`CastState`, :class:`PerturbedState`). A forward pass on such a state
(:func:`call_arguments`) hands the module one :class:`LazyTensor` per entry, a
shape-and-dtype stand-in that computes its value for each ATen operation that
reads it and drops it after: at any moment one weight tensor is held in float64,
whatever reads it (its own module, a parent reading a child's weight, a tied
weight read twice). The values are those the whole state dict would hold, bit for
bit, so the outputs are too (``tests/test_verify_lazy.py``).

Memory: the largest tensor in float64 (plus the float32 draw it is made from), and
the activations of the forward pass. Cost per forward pass: one draw of every
generic weight and the action of ``g`` on the tensors it moves (about a float32
forward pass of arithmetic on a Llama-shaped model at a few tokens).

A :class:`LazyState` is also a read-only ``Mapping``: code that reads it as a dict
gets each tensor computed in full (the whole copy, as before).

Example:
    >>> import torch
    >>> from wsym.group.lazy import CastState, GenericState
    >>> own = {"w": torch.ones(2, 3), "b": torch.zeros(3)}
    >>> gen = GenericState(own, torch.Generator().manual_seed(0), torch.float64)
    >>> torch.equal(gen["w"], gen["w"])  # drawn again, the same each time
    True
    >>> CastState(gen, torch.float32)["w"].dtype
    torch.float32
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from wsym.group.floor import BITS, PERIOD


class LazyState(Mapping):
    """A state dict whose float entries are computed on demand (subclasses say how).

    Attributes:
        shapes: key -> shape of every float entry.
        dtype: the dtype of the float entries.
        fixed: the entries kept as tensors (integer buffers, aliases' targets excluded).
        aliases: alias key -> the key whose tensor it shares.
    """

    def __init__(self, shapes: dict, dtype, fixed: dict, aliases: dict):
        self.shapes, self.dtype, self.fixed, self.aliases = shapes, dtype, fixed, aliases

    def tensor(self, key: str) -> Tensor:
        """The float entry ``key`` (an alias reads its target), computed now."""
        raise NotImplementedError

    def __getitem__(self, key: str) -> Tensor:
        if key in self.fixed:
            return self.fixed[key]
        if key not in self.shapes and key not in self.aliases:
            raise KeyError(key)
        return self.tensor(self.aliases.get(key, key))

    def __iter__(self):
        return iter([*self.shapes, *self.fixed])

    def __len__(self) -> int:
        return len(self.shapes) + len(self.fixed)

    def like(self, dtype=None) -> dict:
        """The same layout for a derived state (``dtype`` for a cast)."""
        return {
            "shapes": self.shapes,
            "dtype": dtype or self.dtype,
            "fixed": self.fixed,
            "aliases": self.aliases,
        }

    def canonical(self) -> list[str]:
        """The float keys that are not aliases, in order (each tensor once)."""
        return [k for k in self.shapes if k not in self.aliases]


class GenericState(LazyState):
    """Random weights of the shapes and rough scale of ``own`` (``_generic_state``'s draws).

    The generator's state before each tensor is kept (a few kB per tensor), so each
    entry is drawn again, equal to the whole draw's, whenever it is asked for. Made
    in one pass over ``own`` that draws (and drops) each tensor once.
    """

    def __init__(self, own: dict, gen: torch.Generator, dtype, aliases=None):
        shapes, fixed, self.plan = {}, {}, {}
        for key, full in own.items():
            full = full.detach()
            if not full.is_floating_point():
                fixed[key] = full
                continue
            shapes[key] = tuple(full.shape)
            a, shift = scale_of(key, full)
            if key not in (aliases or {}):  # an alias is drawn too (and dropped), as before
                self.plan[key] = (gen.get_state(), a, shift)
            torch.empty(full.shape, dtype=torch.float32).uniform_(-a, a, generator=gen)
        super().__init__(shapes, dtype, fixed, dict(aliases or {}))

    def tensor(self, key: str) -> Tensor:
        """Entry ``key``, computed now."""
        state, a, shift = self.plan[key]
        gen = torch.Generator().set_state(state)
        r = torch.empty(self.shapes[key], dtype=torch.float32).uniform_(-a, a, generator=gen)
        r = r.to(self.dtype)
        return r if shift is None else r.abs_().add_(torch.tensor(shift, dtype=self.dtype))


def scale_of(key: str, full: Tensor) -> tuple[float, float | None]:
    """``(a, shift)`` of a generic draw ``U(-a, a)`` (then ``|r| + shift`` where set).

    Shared with ``wsym.group.verify._generic_state``: the weights' standard deviation (fan-in
    scale for constant matrices, 0.5 for other constants); running variances and
    positive vectors stay positive.
    """
    sample = full.reshape(-1)[: 2**16]
    std = sample.std().item() if sample.numel() > 1 else abs(sample.sum().item())
    if std <= 1e-3:
        std = 1.0 / max(1, full[0].numel()) ** 0.5 if full.ndim > 1 else 0.5
    shift = None
    if key.endswith("running_var"):
        shift = 0.5
    elif full.ndim == 1 and (full > 0).all():
        shift = full.mean().item()
    return std * 3**0.5, shift


class OwnState(LazyState):
    """The module's own weights, cast to ``dtype`` entry by entry."""

    def __init__(self, own: dict, dtype, aliases=None):
        self.own = {k: v.detach() for k, v in own.items()}
        floats = {k: tuple(v.shape) for k, v in self.own.items() if v.is_floating_point()}
        fixed = {k: v for k, v in self.own.items() if not v.is_floating_point()}
        super().__init__(floats, dtype, fixed, dict(aliases or {}))

    def tensor(self, key: str) -> Tensor:
        """Entry ``key``, computed now."""
        return self.own[key].to(self.dtype)


class CastState(LazyState):
    """``source`` with every float entry cast to ``dtype``.

    An alias is cast on its own, a tensor of its own (as casting a dict does).
    """

    def __init__(self, source: LazyState, dtype):
        self.source = source
        super().__init__(**(source.like(dtype) | {"aliases": {}}))

    def tensor(self, key: str) -> Tensor:
        """Entry ``key``, computed now."""
        return self.source[key].to(self.dtype)


class PerturbedState(LazyState):
    """``source`` with its lowest :data:`~wsym.group.floor.BITS` significand bits flipped.

    What :func:`~wsym.group.floor.perturbed` does in place, with the same draws: one
    table of :data:`~wsym.group.floor.PERIOD` values, then one offset per tensor, in
    order.
    """

    BITS_OF = {
        torch.float64: torch.int64,
        torch.float32: torch.int32,
        torch.float16: torch.int16,
        torch.bfloat16: torch.int16,
    }

    def __init__(self, source: LazyState, gen: torch.Generator):
        self.source = source
        bits = self.BITS_OF[source.dtype]
        self.starts, self.table = {}, None
        for key in source.canonical():
            if 0 in source.shapes[key]:
                continue
            if self.table is None:
                self.table = torch.randint(0, 2**BITS, (2 * PERIOD,), generator=gen, dtype=bits)
            self.starts[key] = int(torch.randint(PERIOD, (1,), generator=gen))
        self.bits = bits
        super().__init__(**source.like())

    def tensor(self, key: str) -> Tensor:
        """Entry ``key``, computed now."""
        t = self.source.tensor(key)
        if key not in self.starts:
            return t
        flat = t.contiguous().view(self.bits).view(-1)
        n, start = flat.numel(), self.starts[key]
        whole = n // PERIOD * PERIOD
        out = torch.empty_like(flat)  # never written into ``t``: it may be the module's own
        torch.bitwise_xor(
            flat[:whole].view(-1, PERIOD),
            self.table[start : start + PERIOD],
            out=out[:whole].view(-1, PERIOD),
        )
        torch.bitwise_xor(flat[whole:], self.table[start : start + n - whole], out=out[whole:])
        return out.view(t.dtype).view(t.shape)


class LazyTensor(torch.Tensor):
    """A stand-in for ``state[key]``: computed for each operation that reads it, then dropped.

    It has the entry's shape and dtype (on the CPU) and no storage; every ATen
    operation taking it receives the computed tensor instead (and returns plain
    tensors).
    """

    @staticmethod
    def __new__(cls, state: LazyState, key: str):  # noqa: D102
        shape = state.shapes[state.aliases.get(key, key)]
        return torch.Tensor._make_wrapper_subclass(cls, shape, dtype=state.dtype, device="cpu")

    def __init__(self, state: LazyState, key: str):
        self.state, self.key = state, key

    def __repr__(self) -> str:
        return f"LazyTensor({self.key}, shape={tuple(self.shape)}, dtype={self.dtype})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return func(*_computed(args), **_computed(kwargs or {}))


def _computed(x):
    if isinstance(x, LazyTensor):
        return x.state[x.key]
    if type(x) in (list, tuple):
        return type(x)(_computed(y) for y in x)
    if type(x) is dict:
        return {k: _computed(v) for k, v in x.items()}
    return x


def call_arguments(state: LazyState) -> dict:
    """``{key: LazyTensor}`` per float entry, and the fixed tensors (for ``functional_call``)."""
    return {**state.fixed, **{k: LazyTensor(state, k) for k in state.shapes}}
