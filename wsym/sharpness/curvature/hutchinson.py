r"""Hutchinson estimators of the Hessian trace and diagonal.

For probes :math:`v` with :math:`\mathbb{E}[v v^\top] = I` (Rademacher: entries
:math:`\pm 1` with probability 1/2),

.. math::
    \operatorname{Tr} H = \mathbb{E}[v^\top H v], \qquad
    \operatorname{diag} H = \mathbb{E}[v \odot H v],

estimated by the mean over ``probes`` draws. With ``probes="exact"`` the probes are
the standard basis vectors :math:`e_1, \dots, e_P` and the sums (not means) are
exact: :math:`\sum_i e_i \odot H e_i = \operatorname{diag} H` -- one HVP per
parameter, for tiny models and tests. The trace estimate is the sum of the diagonal
estimate with the same probes, so the two always agree.

Probes are drawn one at a time from a CPU generator seeded with ``seed`` and then
moved to the parameters' device and dtype: the same seed gives the same probes,
whatever ``chunk_size`` and device.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Literal

import torch
from torch import Tensor, nn

from wsym.sharpness.curvature.objective import (
    Batch,
    HvpMode,
    LossFn,
    Params,
    hvp_many,
    model_params,
)

Probes = int | Literal["exact"]


def probe_chunks(params: Params, probes: Probes, seed: int, chunk_size: int) -> Iterator[Params]:
    """Stacks of probes ``{name: (m, *shape)}``, ``m <= chunk_size``, in a fixed order.

    Args:
        params: ``{name: tensor}`` giving shapes, dtype and device.
        probes: number of Rademacher probes, or ``"exact"`` for the basis vectors.
        seed: seed of the CPU generator (ignored for ``"exact"``).
        chunk_size: probes per stack.

    Yields:
        ``{name: tensor of shape (m, *param.shape)}``.
    """
    first = next(iter(params.values()))
    size = sum(p.numel() for p in params.values())
    count = size if probes == "exact" else int(probes)
    if count < 1:
        raise ValueError(f"probes must be >= 1 or 'exact', got {probes!r}")
    gen = torch.Generator().manual_seed(seed)
    for start in range(0, count, chunk_size):
        m = min(chunk_size, count - start)
        if probes == "exact":
            flat = torch.zeros(m, size, dtype=first.dtype, device=first.device)
            flat[torch.arange(m), torch.arange(start, start + m)] = 1.0
        else:
            rows = [torch.randint(0, 2, (size,), generator=gen) for _ in range(m)]
            flat = (2.0 * torch.stack(rows) - 1.0).to(first.device, first.dtype)
        yield split_rows(flat, params)


def split_rows(flat: Tensor, like: Params) -> Params:
    """Split an ``(m, P)`` stack of flat vectors into ``{name: (m, *shape)}``."""
    out, i = {}, 0
    for n, p in like.items():
        out[n] = flat[:, i : i + p.numel()].reshape(flat.shape[0], *p.shape)
        i += p.numel()
    return out


def probe_scale(probes: Probes) -> float:
    """``1`` for basis probes (exact sums), ``1 / probes`` for Monte Carlo means."""
    return 1.0 if probes == "exact" else 1.0 / int(probes)


def hessian_probe_products(
    model: nn.Module,
    params: Params,
    batches: Sequence[Batch],
    loss_fn: LossFn,
    probes: Probes,
    seed: int,
    chunk_size: int,
    mode: HvpMode = "reverse",
    scale: Params | None = None,
) -> Iterator[tuple[Params, Params]]:
    r"""Pairs ``(V, HV)`` of stacked probes and their Hessian-vector products.

    With ``scale`` :math:`s`, the products are :math:`H (s \odot V)` instead.
    """
    for vs in probe_chunks(params, probes, seed, chunk_size):
        ws = vs if scale is None else {n: v * scale[n] for n, v in vs.items()}
        yield vs, hvp_many(model, params, batches, loss_fn, ws, chunk_size=chunk_size, mode=mode)


def diagonal_hessian(
    model: nn.Module,
    batches: Sequence[Batch],
    loss_fn: LossFn,
    probes: Probes = 100,
    seed: int = 0,
    params: Params | None = None,
    chunk_size: int = 16,
    mode: HvpMode = "reverse",
    scale: Params | None = None,
) -> Params:
    r"""Hutchinson's diagonal estimator :math:`\frac1m \sum_j v_j \odot H v_j`.

    With ``scale`` :math:`s` the probes are :math:`s \odot v_j` and the estimate
    :math:`\frac1m \sum_j v_j \odot H (s \odot v_j) / s` (still unbiased). Taking
    :math:`s = \theta` makes it equivariant, probe by probe, to elementwise
    rescalings and sign flips :math:`\theta \mapsto D \theta`: the estimate maps
    to :math:`D^{-2}` times itself exactly, as the true diagonal does (entries
    with :math:`s_i = 0` use :math:`s_i = 1`).

    Args:
        model: the network, evaluated in eval mode (see :mod:`wsym.sharpness.curvature.objective`).
        batches: list of ``(inputs, targets)``.
        loss_fn: ``loss_fn(outputs, targets)``, a mean over the batch.
        probes: number of Rademacher probes, or ``"exact"`` (basis vectors: exact).
        seed: probe seed; the same seed gives the same value.
        params: ``{name: tensor}``; ``None`` takes the model's.
        chunk_size: probes per vectorized HVP call.
        mode: HVP mode, ``"forward"`` or ``"reverse"`` (see :func:`~wsym.sharpness.curvature.hvp`).
        scale: ``{name: tensor}`` probe scales (``None``: all ones).

    Returns:
        ``{name: tensor}`` with the shapes of ``params``.

    Example:
        >>> model = nn.Linear(2, 1, bias=False)
        >>> x = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
        >>> loss = lambda out, y: ((out - y) ** 2).mean()  # H = x^T x = diag(1, 4)
        >>> diagonal_hessian(model, [(x, torch.zeros(2, 1))], loss, probes="exact")
        {'weight': tensor([[1., 4.]])}
    """
    params = model_params(model) if params is None else params
    if scale is not None:
        scale = {n: torch.where(t == 0, torch.ones_like(t), t) for n, t in scale.items()}
    diag = {n: torch.zeros_like(p) for n, p in params.items()}
    for vs, hvs in hessian_probe_products(
        model, params, batches, loss_fn, probes, seed, chunk_size, mode, scale
    ):
        for n in diag:
            diag[n] += (vs[n] * hvs[n]).sum(0)
    if scale is not None:
        diag = {n: d / scale[n] for n, d in diag.items()}
    return {n: d * probe_scale(probes) for n, d in diag.items()}


def hessian_trace(
    model: nn.Module,
    batches: Sequence[Batch],
    loss_fn: LossFn,
    probes: Probes = 100,
    seed: int = 0,
    params: Params | None = None,
    chunk_size: int = 16,
    mode: HvpMode = "reverse",
) -> float:
    r"""Hutchinson's trace estimator :math:`\frac1m \sum_j v_j^\top H v_j`.

    The sum of :func:`diagonal_hessian` with the same arguments; ``probes="exact"``
    gives the exact trace.

    Args:
        model: the network, evaluated in eval mode.
        batches: list of ``(inputs, targets)``.
        loss_fn: ``loss_fn(outputs, targets)``, a mean over the batch.
        probes: number of Rademacher probes, or ``"exact"``.
        seed: probe seed; the same seed gives the same value.
        params: ``{name: tensor}``; ``None`` takes the model's.
        chunk_size: probes per vectorized HVP call.
        mode: HVP mode, ``"forward"`` or ``"reverse"`` (see :func:`~wsym.sharpness.curvature.hvp`).

    Returns:
        The estimate as a Python float.

    Example:
        >>> model = nn.Linear(2, 1, bias=False)
        >>> x = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
        >>> loss = lambda out, y: ((out - y) ** 2).mean()
        >>> hessian_trace(model, [(x, torch.zeros(2, 1))], loss, probes=10)  # Rademacher: exact
        5.0
    """
    diag = diagonal_hessian(model, batches, loss_fn, probes, seed, params, chunk_size, mode)
    return float(sum(d.sum() for d in diag.values()))
