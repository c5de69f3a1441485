r"""Diagonal Fisher information with labels sampled from the model's own predictions.

For a classifier with logits :math:`z_n = f(x_n; \theta) \in \mathbb{R}^C` and
predictive distribution :math:`p_n = \operatorname{softmax}(z_n)`, the Fisher is

.. math::
    F(\theta) = \frac1N \sum_n \mathbb{E}_{y \sim p_n}
    \big[\nabla_\theta \ell_n(y)\, \nabla_\theta \ell_n(y)^\top\big],
    \qquad \ell_n(y) = -\log p_n(y),

(for cross-entropy it equals the generalized Gauss-Newton matrix). It is *not* the
"empirical Fisher", which would use the data labels. Estimated with ``samples``
labels :math:`y_{n,s} \sim p_n` per input,

.. math::
    \hat F_{ii} = \frac{1}{N S} \sum_{n,s} \big(\partial_i \ell_n(y_{n,s})\big)^2,

from per-sample gradients (``vmap`` of ``grad`` over the batch axis, each sample
run as a batch of one). ``samples="exact"`` takes the expectation over all classes,
weighting :math:`y = c` by :math:`p_n(c)`. Batches count by their size, as in
:mod:`wsym.sharpness.curvature.objective`; the data targets are ignored. The model runs in
eval mode, so samples are independent (BatchNorm uses running statistics).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from wsym.sharpness.curvature.objective import (
    Batch,
    Params,
    as_args,
    batch_size,
    eval_mode,
    model_params,
)

Samples = int | Literal["exact"]


def sample_labels(logits: Tensor, samples: int, generator: torch.Generator) -> Tensor:
    """Labels drawn from ``softmax(logits)``, shape ``(N, samples)``.

    Sampling runs on the CPU ``generator`` (the labels are then moved to the logits'
    device), so a seeded generator reproduces them on any device.

    Example:
        >>> logits = torch.tensor([[0.0, 50.0], [50.0, 0.0]])
        >>> sample_labels(logits, 3, torch.Generator().manual_seed(0))
        tensor([[1, 1, 1],
                [0, 0, 0]])
    """
    if logits.ndim != 2:
        raise ValueError(f"expected classification logits (N, C), got shape {tuple(logits.shape)}")
    probs = logits.detach().double().softmax(-1).cpu()
    return torch.multinomial(probs, samples, replacement=True, generator=generator).to(
        logits.device
    )


def label_weights(
    logits: Tensor, samples: Samples, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """Labels and weights ``(N, K)`` whose weighted sum over ``K`` is the expectation over y.

    ``samples`` draws give ``K = samples`` columns of weight ``1 / samples``;
    ``"exact"`` gives one column per class ``c`` with weights :math:`p_n(c)`.
    """
    probs = logits.detach().softmax(-1)
    if samples == "exact":
        labels = torch.arange(probs.shape[-1], device=probs.device).expand(probs.shape)
        return labels, probs
    if int(samples) < 1:
        raise ValueError(f"samples must be >= 1 or 'exact', got {samples!r}")
    labels = sample_labels(logits, int(samples), generator)
    return labels, torch.full(
        labels.shape, 1.0 / int(samples), dtype=probs.dtype, device=probs.device
    )


def per_sample_nll(model: nn.Module) -> Callable[[Params, Any, Tensor], Tensor]:
    """``(params, one_input, label) -> -log softmax(f(input))[label]`` for one sample."""

    def nll(params: Params, args: Any, label: Tensor) -> Tensor:
        batched = tuple(a.unsqueeze(0) for a in args)
        logits = functional_call(model, params, batched)[0]
        return -logits.log_softmax(-1).gather(-1, label.reshape(1))[0]

    return nll


def diagonal_fisher(
    model: nn.Module,
    batches: Sequence[Batch],
    samples: Samples = 1,
    seed: int = 0,
    params: Params | None = None,
    chunk_size: int | None = 64,
) -> Params:
    r"""Diagonal of the Fisher with labels sampled from the model's softmax.

    Args:
        model: a classifier returning logits ``(N, C)``; evaluated in eval mode.
        batches: list of ``(inputs, targets)``; targets are ignored.
        samples: labels drawn per input, or ``"exact"`` (expectation over classes).
        seed: seed of the CPU generator that draws the labels, batch after batch;
            the same seed gives the same value.
        params: ``{name: tensor}``; ``None`` takes the model's.
        chunk_size: per-sample gradients held at once (one vectorized call each);
            ``None``: all of a batch.

    Returns:
        ``{name: tensor}`` :math:`\hat F_{ii}` with the shapes of ``params``.

    Example:
        >>> model = nn.Linear(1, 2, bias=False)
        >>> _ = nn.init.zeros_(model.weight)  # p = (1/2, 1/2): grad of -log p(y) is +-x/2
        >>> diagonal_fisher(model, [(torch.ones(3, 1), None)], samples=2)
        {'weight': tensor([[0.2500],
                [0.2500]])}
    """
    params = model_params(model) if params is None else params
    total = {n: torch.zeros_like(p) for n, p in params.items()}
    count = sum(batch_size(x) for x, _ in batches)
    gen = torch.Generator().manual_seed(seed)
    per_sample_grad = vmap(grad(per_sample_nll(model)), in_dims=(None, 0, 0))
    with eval_mode(model), torch.no_grad():
        for x, _ in batches:
            args = as_args(x)
            logits = functional_call(model, params, args)
            labels, weights = label_weights(logits, samples, gen)  # (N, K) each
            rows = torch.arange(labels.shape[0], device=labels.device).repeat_interleave(
                labels.shape[1]
            )
            labels, weights = labels.reshape(-1), weights.reshape(-1)
            step = chunk_size or len(rows)
            for i in range(0, len(rows), step):  # memory: step per-sample gradients
                chunk = rows[i : i + step]
                g = per_sample_grad(params, tuple(a[chunk] for a in args), labels[i : i + step])
                for n in total:
                    w = weights[i : i + step].reshape(-1, *([1] * (g[n].ndim - 1)))
                    total[n] += (w * g[n] ** 2).sum(0)
    return {n: t / count for n, t in total.items()}
