"""Tangent vectors kept flat: a list of tensors that are views of one flat buffer.

A tangent of :mod:`wsym.sharpness.perturbation` is a list of tensors, one per slot of
its layout (plain parameters, then each stack's ``G`` and ``H``). The ascent adds,
scales and projects tangents at every step; when each of them is a view of one flat
buffer (:class:`FlatTangent`), every such operation is one pass over that buffer
instead of a concatenation (and a split) of a hundred tensors. Plain lists stay valid
everywhere: :func:`flat` concatenates them.

Example:
    >>> import torch
    >>> t = FlatTangent.of(torch.arange(5.0), [torch.Size([2]), torch.Size([3])])
    >>> t[1], add(t, t, 2.0).flat
    (tensor([2., 3., 4.]), tensor([ 0.,  3.,  6.,  9., 12.]))
"""

from __future__ import annotations

import torch
from torch import Tensor


class FlatTangent(list):
    """A tangent vector whose tensors are consecutive views of :attr:`flat`.

    Attributes:
        flat: the buffer, 1-D, in the tangent layout's order.
        shapes: the shape of each tensor.
    """

    flat: Tensor
    shapes: list

    @classmethod
    def of(cls, flat: Tensor, shapes: list) -> FlatTangent:
        """Views of ``flat`` shaped ``shapes`` (their sizes must add up to its length)."""
        sizes = [s.numel() for s in shapes]
        out = cls(x.view(s) for x, s in zip(flat.split(sizes), shapes, strict=True))
        out.flat, out.shapes = flat, shapes
        return out

    def like(self, flat: Tensor) -> FlatTangent:
        """A tangent of the same layout over another buffer."""
        return FlatTangent.of(flat, self.shapes)


class Pool:
    """Flat buffers of one length, recycled.

    A fresh multi-megabyte buffer costs more than the arithmetic written into it (the
    allocator maps, and the kernel zeroes, new pages).

    :meth:`give` must only get buffers nothing else reads any more.

    Example:
        >>> pool = Pool(3, torch.zeros(0))
        >>> a = pool.take(); pool.give(FlatTangent.of(a, [torch.Size([3])]))
        >>> pool.take() is a
        True
    """

    KEEP = 8
    """Buffers kept at most."""

    def __init__(self, n: int, like: Tensor):
        self.n, self.dtype, self.device = n, like.dtype, like.device
        self.free: list[Tensor] = []

    def take(self) -> Tensor:
        """A buffer (recycled, contents undefined, or new)."""
        if self.free:
            return self.free.pop()
        return torch.empty(self.n, dtype=self.dtype, device=self.device)

    def give(self, xi: list[Tensor]) -> None:
        """Recycle the buffer of ``xi`` (a :class:`FlatTangent` of this length; else nothing)."""
        buffer = getattr(xi, "flat", None)
        if (
            buffer is not None
            and buffer.numel() == self.n
            and buffer.dtype == self.dtype
            and buffer.is_contiguous()
            and len(self.free) < self.KEEP
            and all(b.data_ptr() != buffer.data_ptr() for b in self.free)
        ):
            self.free.append(buffer)


def flat(xs: list[Tensor]) -> Tensor:
    """The tangent as one flat vector: its buffer (not a copy) or a concatenation."""
    buffer = getattr(xs, "flat", None)
    if buffer is not None:
        return buffer
    return torch.cat([x.reshape(-1) for x in xs]) if xs else torch.zeros(0, dtype=torch.float64)


def flat_copy(xs: list[Tensor]) -> Tensor:
    """The tangent as a new flat vector (free to modify in place)."""
    buffer = getattr(xs, "flat", None)
    return buffer.clone() if buffer is not None else flat(xs)


def _same_layout(a: list, b: list) -> bool:
    fa, fb = getattr(a, "flat", None), getattr(b, "flat", None)
    return fa is not None and fb is not None and fa.shape == fb.shape and a.shapes == b.shapes


def scale(xi: list[Tensor], c, out: list[Tensor] | None = None) -> list[Tensor]:
    """``c * xi``; ``out``: a flat tangent of the same layout to write it into (else new).

    Writing into a buffer that is already allocated matters: a new buffer of a few
    megabytes costs several times the product itself (the allocator maps fresh pages).
    ``out`` may be ``xi`` itself; it is ignored for plain lists.
    """
    if getattr(xi, "flat", None) is not None:
        if out is not None and _same_layout(xi, out):
            torch.mul(xi.flat, c, out=out.flat)
            return out
        return xi.like(xi.flat * c)
    return list(torch._foreach_mul(xi, c))


def add(a: list[Tensor], b: list[Tensor], c=1.0, out: list[Tensor] | None = None) -> list[Tensor]:
    """``a + c * b``; ``out`` as for :func:`scale` (it may be ``a`` or ``b``)."""
    if _same_layout(a, b):
        if out is not None and _same_layout(a, out):
            torch.add(a.flat, b.flat, alpha=c, out=out.flat)
            return out
        return a.like(torch.add(a.flat, b.flat, alpha=c))
    return list(torch._foreach_add(a, b, alpha=c))


def dot(a: list[Tensor], b: list[Tensor]) -> Tensor:
    """Euclidean inner product of two tangents (0-dim)."""
    if _same_layout(a, b):
        return torch.dot(a.flat, b.flat)
    total = sum(torch.dot(x.reshape(-1), y.reshape(-1)) for x, y in zip(a, b, strict=True))
    return torch.as_tensor(total)
