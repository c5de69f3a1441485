r"""A model's own numerical floor: how far round-off alone moves its float64 outputs.

A true symmetry changes the outputs only by round-off; how much round-off a
model amplifies is a property of the model. The floor is measured as the
relative output deviation between two float64 evaluations that differ only by
round-off-sized changes:

* every floating-point weight moved by a few units in its last place
  (what acting with a group element does to the weights: one rounding each):
  its lowest :data:`BITS` significand bits flipped at random (:func:`perturbed`,
  in place and undone exactly, so no copy of the model is made: at most 7 units,
  about 2 on average), or multiplied by ``1 + r eps`` with ``|r| <= ULPS``
  (:func:`perturbed_state`, a copy) where a tensor cannot be flipped in place;
* every *float32 island* (an operation that computes in a lower precision than
  its float64 operands, such as Hugging Face's RMSNorm or rotary tables cast to
  float32) perturbed at its output by one unit in the last place of its dtype
  (what a reordered reduction inside the island does).

.. math::

    \mathrm{floor} = \frac{\max |f(\tilde\theta, x) - f(\theta, x)|}{\max |f(\theta, x)|}

Verification then rejects any group that moves outputs more than
:data:`FACTOR` times the floor, whatever its absolute size.

Example:
    >>> import torch
    >>> from wsym.group.floor import perturbed
    >>> sd = {"w": torch.ones(3, dtype=torch.float64)}
    >>> with perturbed(sd, torch.Generator().manual_seed(0)) as moved:
    ...     bool((moved["w"] - 1).abs().max() <= 7 * torch.finfo(torch.float64).eps)
    True
    >>> bool((sd["w"] == 1).all())  # undone exactly
    True
"""

from __future__ import annotations

import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

ULPS = 4  # relative weight noise of a perturbed copy, in units in the last place
BITS = 3  # significand bits flipped in place
_BITS_OF = {
    torch.float64: torch.int64,
    torch.float32: torch.int32,
    torch.float16: torch.int16,
    torch.bfloat16: torch.int16,
}
PERIOD = 65521  # the perturbations' table (a prime)
FACTOR = 1e3  # a group moving outputs more than FACTOR x the floor is false
EPS64 = torch.finfo(torch.float64).eps


def perturbed_state(state: dict, gen: torch.Generator) -> dict:
    """``state`` with every float entry multiplied by ``1 + r eps``, ``r ~ U(-ULPS, ULPS)``.

    ``eps`` is the entry's own machine epsilon (float32 probes get float32 noise).
    The draws come from one table of :data:`PERIOD` values, read from a random
    offset per tensor and repeated along it: drawing one number per weight cost
    as much as a forward pass on parameter-heavy models. The period is prime, so
    no row or channel of a weight repeats another's pattern unless it is
    ``PERIOD`` entries long.
    """
    tables = {}
    out = {}
    for k, v in state.items():
        if torch.is_tensor(v) and v.is_floating_point() and v.numel():
            if v.dtype not in tables:
                r = torch.empty(2 * PERIOD, dtype=v.dtype).uniform_(-ULPS, ULPS, generator=gen)
                tables[v.dtype] = r.mul_(torch.finfo(v.dtype).eps).add_(1)
            table = tables[v.dtype]
            start = int(torch.randint(PERIOD, (1,), generator=gen))
            flat = v.reshape(-1)
            n = flat.numel()
            whole = n // PERIOD * PERIOD
            moved = torch.empty_like(flat)
            torch.mul(
                flat[:whole].view(-1, PERIOD),
                table[start : start + PERIOD],
                out=moved[:whole].view(-1, PERIOD),
            )
            torch.mul(flat[whole:], table[start : start + n - whole], out=moved[whole:])
            v = moved.view(v.shape)
        out[k] = v
    return out


@contextlib.contextmanager
def perturbed(state: dict, gen: torch.Generator):
    """``state`` with every float entry moved by a few units in its last place, in place.

    The lowest :data:`BITS` bits of each entry's significand are XORed with random
    bits (a change of at most ``2**BITS - 1`` units in the last place, never of the
    sign or exponent; an exact zero becomes a subnormal of that many units), read
    from one table of :data:`PERIOD` values at a random offset per tensor as
    :func:`perturbed_state` does. On exit the same XOR undoes it exactly. Copying the
    weights (several times a forward pass of page faults on a model of 30M
    parameters) is left to tensors that cannot be flipped alone: non-contiguous
    ones, and distinct tensors sharing storage (their entries get
    :func:`perturbed_state`'s copies). A tensor held under several keys is moved once.
    """
    out, undo, copies, tables = dict(state), [], {}, {}
    floats = {id(v): v for v in state.values() if _movable(v)}
    storages: dict = {}
    for v in floats.values():
        ptr = v.untyped_storage().data_ptr()
        storages[ptr] = storages.get(ptr, 0) + 1
    try:
        for ident, v in floats.items():
            if (
                v.is_contiguous()
                and v.dtype in _BITS_OF
                and storages[v.untyped_storage().data_ptr()] == 1
            ):
                bits = _BITS_OF[v.dtype]
                if bits not in tables:
                    tables[bits] = torch.randint(
                        0, 2**BITS, (2 * PERIOD,), generator=gen, dtype=bits
                    )
                start = int(torch.randint(PERIOD, (1,), generator=gen))
                flat = v.view(bits).view(-1)
                _flip(flat, tables[bits], start)
                undo.append((flat, tables[bits], start))
            else:
                copies[ident] = perturbed_state({"v": v}, gen)["v"]
        for k, v in state.items():
            if id(v) in copies:
                out[k] = copies[id(v)]
        yield out
    finally:
        for flat, table, start in reversed(undo):
            _flip(flat, table, start)


def _movable(v) -> bool:
    return torch.is_tensor(v) and v.is_floating_point() and v.numel() > 0


def _flip(flat: torch.Tensor, table: torch.Tensor, start: int) -> None:
    """XOR ``flat`` (an integer view) with ``table`` from ``start``, repeated along it."""
    n = flat.numel()
    whole = n // PERIOD * PERIOD
    flat[:whole].view(-1, PERIOD).bitwise_xor_(table[start : start + PERIOD])
    flat[whole:].bitwise_xor_(table[start : start + n - whole])


class Islands(TorchDispatchMode):
    """Record (and optionally perturb) operations that compute below float64.

    An operation is an island where a floating-point output has a lower precision
    than one of its floating-point tensor operands (a down-cast, or an op that
    upcasts internally and returns float32). With ``perturb``, each such output
    is moved by up to one unit in its last place.

    Attributes:
        eps: the largest machine epsilon among island outputs (float64's if none).
    """

    def __init__(self, perturb: bool = False, gen: torch.Generator | None = None):
        super().__init__()
        self.perturb, self.gen, self.eps = perturb, gen, EPS64

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and (
            out.dtype == torch.float64 or not out.is_floating_point()
        ):
            return out  # no operand is finer than float64: not an island, nothing to read
        eps = [torch.finfo(t.dtype).eps for t in _tensors((args, kwargs)) if t.is_floating_point()]
        if not eps:
            return out
        finest = min(eps)
        if isinstance(out, torch.Tensor):  # the common case, without pytree's overhead
            return self._visit(out, finest)
        return tree_map(lambda t: self._visit(t, finest), out)

    def _visit(self, t, finest: float):
        if not (torch.is_tensor(t) and t.is_floating_point()):
            return t
        eps = torch.finfo(t.dtype).eps
        if eps <= finest:
            return t
        self.eps = max(self.eps, eps)
        if not self.perturb:
            return t
        r = torch.empty(t.shape, dtype=torch.float64).uniform_(-1, 1, generator=self.gen)
        return (t.to(torch.float64) * (1 + r * eps)).to(t.dtype)


def _tensors(x):
    """The tensors among an ATen call's arguments (plain lists, tuples and dicts walked)."""
    if isinstance(x, torch.Tensor):
        yield x
    elif type(x) in (list, tuple):
        for y in x:
            yield from _tensors(y)
    elif type(x) is dict:
        for y in x.values():
            yield from _tensors(y)
    elif isinstance(x, list | tuple | dict):  # a named tuple or another pytree node
        yield from (t for t in tree_flatten(x)[0] if isinstance(t, torch.Tensor))


def relative(y1: torch.Tensor, y0: torch.Tensor) -> float:
    """``max |y1 - y0| / max |y0|`` (0 for empty outputs)."""
    if y0.numel() == 0:
        return 0.0
    return float((y1 - y0).abs().max() / y0.abs().max().clamp_min(1e-300))
