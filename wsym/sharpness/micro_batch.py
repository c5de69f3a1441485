r"""The loss of one batch, evaluated over micro-batches so that activations stay bounded.

A batch of ``n`` samples split into micro-batches of sizes :math:`n_c` has, for a loss
that is a mean over its batch,

.. math::
    \ell(\theta) = \sum_c \frac{n_c}{n}\, \ell_c(\theta), \qquad
    \nabla \ell(\theta) = \sum_c \frac{n_c}{n}\, \nabla \ell_c(\theta),

so :class:`BatchLoss` runs one forward (and backward) pass per micro-batch and
accumulates: activation memory is one micro-batch's, the gradient one parameter-sized
buffer. :func:`split` cuts every tensor of the inputs and targets whose first axis is the
batch (tensors, tuples and dicts of them, as :func:`wsym.sharpness.sharpness` takes);
other entries (a scalar flag) are passed to every micro-batch unchanged.

Example:
    >>> import torch
    >>> x, y = torch.arange(10.0).reshape(5, 2), torch.arange(5.0)
    >>> [(tuple(a.shape), tuple(b.shape)) for a, b in split(x, y, 2)]
    [((2, 2), (2,)), ((2, 2), (2,)), ((1, 2), (1,))]
    >>> loss = BatchLoss([lambda p, x=x, y=y: ((x.sum(1) * p["w"] - y) ** 2).mean()], [1.0])
    >>> float(loss({"w": torch.tensor(0.0)}))
    6.0
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from wsym.errors import WsymInputError
from wsym.sharpness.curvature.objective import batch_size


def check(micro_batch: int | None) -> None:
    """``micro_batch`` is None or a positive integer, else a one-line error."""
    if micro_batch is not None and (
        isinstance(micro_batch, bool) or not isinstance(micro_batch, int) or micro_batch < 1
    ):
        raise WsymInputError(
            f"micro_batch must be a positive integer or None, got {micro_batch!r}; "
            "pass e.g. micro_batch=8"
        )


def _cut(x: Any, n: int, lo: int, hi: int) -> Any:
    """Samples ``lo:hi`` of ``x`` (every tensor whose first axis has length ``n``)."""
    if isinstance(x, Tensor):
        return x[lo:hi] if x.dim() and x.shape[0] == n else x
    if isinstance(x, tuple | list):
        return type(x)(_cut(v, n, lo, hi) for v in x)
    if isinstance(x, dict):
        return {k: _cut(v, n, lo, hi) for k, v in x.items()}
    return x


def split(inputs: Any, targets: Any, size: int | None, n: int | None = None) -> list[tuple]:
    """``(inputs, targets)`` cut into micro-batches of ``size`` samples (the last may be short).

    ``n``: the batch size (default: the first axis of the first input tensor). ``size``
    None or at least ``n``: one micro-batch, the batch itself.
    """
    n = batch_size(inputs) if n is None else n
    if size is None or size >= n:
        return [(inputs, targets)]
    return [
        (_cut(inputs, n, lo, lo + size), _cut(targets, n, lo, lo + size))
        for lo in range(0, n, size)
    ]


class BatchLoss:
    """``params -> sum_c w_c loss_c(params)`` over micro-batches, and its gradient.

    Args:
        parts: one ``params -> loss`` callable per micro-batch.
        weights: ``n_c / n`` per micro-batch.

    Memory: one micro-batch's activations at a time; :meth:`value_and_grad` holds one
    accumulated gradient (the leaves' shapes and dtype).
    """

    def __init__(self, parts: Sequence[Callable], weights: Sequence[float]):
        self.parts, self.weights = list(parts), list(weights)

    @classmethod
    def of(cls, f: Callable) -> BatchLoss:
        """``f`` itself if it is a :class:`BatchLoss`, else ``f`` as one micro-batch."""
        return f if isinstance(f, BatchLoss) else cls([f], [1.0])

    def __call__(self, params: dict[str, Tensor]) -> Tensor:
        """The loss (0-dim); differentiable only with one micro-batch, else use the methods."""
        if len(self.parts) == 1:
            return self.parts[0](params)
        with torch.no_grad():
            return sum(w * f(params) for f, w in zip(self.parts, self.weights, strict=True))

    def value_and_grad(self, leaves: dict[str, Tensor]) -> tuple[float, list[Tensor]]:
        """The loss and its gradient with respect to ``leaves`` (tensors requiring grad).

        Gradients of leaves the loss does not reach are zero.
        """
        values = list(leaves.values())
        total, grads = 0.0, None
        for f, w in zip(self.parts, self.weights, strict=True):
            value = f(leaves)
            part = torch.autograd.grad(value, values, allow_unused=True)
            total += w * float(value.detach())
            if grads is None:
                grads = [
                    torch.zeros_like(x) if g is None else g
                    for x, g in zip(values, part, strict=True)
                ]
                if w != 1.0:
                    torch._foreach_mul_(grads, w)
                continue
            for acc, g in zip(grads, part, strict=True):
                if g is not None:
                    acc.add_(g, alpha=w)
        return total, grads
