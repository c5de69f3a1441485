r"""K-FAC: Kronecker-factored Fisher blocks of ``nn.Linear`` layers, and their damped inverse.

A linear layer :math:`s = W a + b` is handled as one block
:math:`\bar W = [W \mid b] \in \mathbb{R}^{d_{out} \times (d_{in}+1)}` acting on
:math:`\bar a = [a; 1]` (no ``1`` without bias). The per-sample gradient is
:math:`\nabla_{\bar W} \ell_n = \sum_t g_{n,t} \bar a_{n,t}^\top` with
:math:`g = \partial \ell_n / \partial s`, summed over the positions ``t`` that
share the weight (tokens; one position for ``(N, d)`` inputs). K-FAC ("expand"
flavour, Eschenhagen et al., NeurIPS 2023) approximates the Fisher block by

.. math::
    F_{\bar W}\, V \approx G\, V A, \qquad
    A = \frac{1}{N T} \sum_{n,t} \bar a_{n,t} \bar a_{n,t}^\top, \qquad
    G = \frac{1}{N S} \sum_{n,s,t} g_{n,t}(y_{n,s})\, g_{n,t}(y_{n,s})^\top,

i.e. :math:`F \approx A \otimes G` for the column-major vectorization, with labels
:math:`y_{n,s}` sampled from the model's softmax (as in :mod:`wsym.sharpness.curvature.fisher`,
same generator sequence). For ``T = 1`` and one sample it equals the exact
per-sample Fisher block. Damping is exact, not factored: with eigendecompositions
:math:`A = U_A \operatorname{diag}(\lambda_A) U_A^\top`,
:math:`G = U_G \operatorname{diag}(\lambda_G) U_G^\top`,

.. math::
    (A \otimes G + \delta I)^{-1} V
    = U_G \big[(U_G^\top V U_A) \oslash (\lambda_G \lambda_A^\top + \delta)\big] U_A^\top.

Inputs are read and output gradients taken with forward hooks that exist only
during the call: one plain forward records :math:`a` and the output shapes, then
``torch.func.vjp`` of the logits with respect to zero perturbations added to each
layer output gives :math:`g` for every sampled label from one forward.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.func import functional_call, vjp

from wsym.sharpness.curvature.fisher import Samples, label_weights
from wsym.sharpness.curvature.objective import (
    Batch,
    Params,
    as_args,
    batch_size,
    eval_mode,
    model_params,
)


@dataclass(frozen=True)
class KroneckerFactors:
    """The two factors of one linear layer's K-FAC block and the parameters they cover.

    Attributes:
        weight: name of the weight parameter, shape ``(d_out, d_in)``.
        bias: name of the bias parameter, or ``None``.
        A: input factor, ``(d_in + 1, d_in + 1)`` with bias (last row/column: the 1).
        G: output-gradient factor, ``(d_out, d_out)``.
    """

    weight: str
    bias: str | None
    A: Tensor
    G: Tensor

    def inverse_product(self, v_weight: Tensor, v_bias: Tensor | None, damping: float):
        r""":math:`(A \otimes G + \delta I)^{-1}` applied to ``(v_weight, v_bias)``.

        Shapes: ``v_weight`` ``(..., d_out, d_in)``, ``v_bias`` ``(..., d_out)``;
        returns tensors of the same shapes (leading axes are batched).
        """
        lam_a, u_a = torch.linalg.eigh(self.A)
        lam_g, u_g = torch.linalg.eigh(self.G)
        V = v_weight if v_bias is None else torch.cat([v_weight, v_bias.unsqueeze(-1)], -1)
        rotated = u_g.T @ V @ u_a
        out = u_g @ (rotated / (lam_g[:, None] * lam_a[None, :] + damping)) @ u_a.T
        if v_bias is None:
            return out, None
        return out[..., :-1], out[..., -1]


def linear_layers(model: nn.Module, params: Params) -> dict[str, tuple[str, str | None]]:
    """``{module name: (weight name, bias name or None)}`` for ``nn.Linear`` in ``params``."""
    layers = {}
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            prefix = f"{name}." if name else ""
            weight, bias = prefix + "weight", prefix + "bias"
            if weight in params:
                layers[name] = (weight, bias if bias in params else None)
    return layers


@contextmanager
def _hooked(model: nn.Module, names: Sequence[str], hook_factory) -> Iterator[None]:
    """Forward hooks ``hook_factory(name)`` on the named modules, removed on exit."""
    modules = dict(model.named_modules())
    handles = [modules[n].register_forward_hook(hook_factory(n)) for n in names]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def kfac_factors(
    model: nn.Module,
    batches: Sequence[Batch],
    samples: Samples = 1,
    seed: int = 0,
    params: Params | None = None,
) -> dict[str, KroneckerFactors]:
    """K-FAC factors of every ``nn.Linear`` layer, labels sampled from the model.

    Args:
        model: a classifier returning logits ``(N, C)``; evaluated in eval mode.
        batches: list of ``(inputs, targets)``; targets are ignored.
        samples: labels drawn per input (or ``"exact"``: expectation over classes).
        seed: seed of the CPU label generator; the same seed gives the same factors.
        params: ``{name: tensor}``; ``None`` takes the model's.

    Returns:
        ``{module name: KroneckerFactors}``. A layer called several times per forward
        (shared weights) contributes every call's positions.

    Example:
        >>> f = kfac_factors(nn.Linear(3, 2), [(torch.ones(4, 3), None)])
        >>> tuple(f[""].A.shape), tuple(f[""].G.shape)
        ((4, 4), (2, 2))
    """
    params = model_params(model) if params is None else params
    layers = linear_layers(model, params)
    a_sums: dict[str, Tensor] = {}
    g_sums: dict[str, Tensor] = {}
    rows: dict[str, int] = {}
    count = sum(batch_size(x) for x, _ in batches)
    gen = torch.Generator().manual_seed(seed)
    with eval_mode(model):
        for x, _ in batches:
            args = as_args(x)
            inputs, eps, logits = _record(model, params, args, list(layers))
            for m, calls in inputs.items():
                a = torch.cat([_homogeneous(i, layers[m][1] is not None) for i in calls])
                a_sums[m] = a_sums.get(m, 0) + a.T @ a
                rows[m] = rows.get(m, 0) + a.shape[0]
            labels, weights = label_weights(logits, samples, gen)  # (N, K) each
            pullback = _output_pullback(model, params, args, eps)
            probs = logits.detach().softmax(-1)
            for y, w in zip(labels.T, weights.T, strict=True):
                # d(-log p(y)) / d logits = p - onehot(y), per sample (a sum over the batch)
                (grads,) = pullback(probs - nn.functional.one_hot(y, probs.shape[-1]))
                for m, gs in grads.items():
                    g = torch.cat([gi.reshape(-1, gi.shape[-1]) for gi in gs])
                    g = g * _row_weights(w, gs).sqrt()[:, None]
                    g_sums[m] = g_sums.get(m, 0) + g.T @ g
    ref = next(iter(params.values()))
    return {  # layers never called in the forward have no factors
        m: KroneckerFactors(*layers[m], (a_sums[m] / rows[m]).to(ref), (g_sums[m] / count).to(ref))
        for m in a_sums
    }


def _record(model: nn.Module, params: Params, args: tuple, names: list[str]):
    """One plain forward: inputs per call, zero output perturbations per call, logits.

    Only layers called at least once appear in the two dicts.
    """
    inputs: dict[str, list[Tensor]] = {}
    eps: dict[str, list[Tensor]] = {}

    def record(name):
        def hook(mod, inp, out):
            inputs.setdefault(name, []).append(inp[0].detach())
            eps.setdefault(name, []).append(torch.zeros_like(out))

        return hook

    with torch.no_grad(), _hooked(model, names, record):
        logits = functional_call(model, params, args)
    if logits.ndim != 2:
        raise ValueError(f"expected classification logits (N, C), got shape {tuple(logits.shape)}")
    return inputs, eps, logits


def _output_pullback(model: nn.Module, params: Params, args: tuple, eps: dict):
    """VJP of ``eps -> logits``, where ``eps`` are added to the layer outputs per call.

    The pullback of a cotangent on the logits is the gradient with respect to every
    layer output, ``{name: [per call (N, ..., d_out)]}``.
    """

    def logits_of(eps: dict) -> Tensor:
        def add(name):
            calls = iter(eps[name])
            return lambda mod, inp, out: out + next(calls)

        with _hooked(model, list(eps), add):
            return functional_call(model, params, args)

    return vjp(logits_of, eps)[1]


def _homogeneous(a: Tensor, bias: bool) -> Tensor:
    """Rows of layer inputs ``(..., d_in)`` as ``(rows, d_in [+ 1])``."""
    a = a.reshape(-1, a.shape[-1])
    return torch.cat([a, torch.ones_like(a[:, :1])], -1) if bias else a


def _row_weights(weights: Tensor, gs: list[Tensor]) -> Tensor:
    """Per-row label weights, repeated over the positions of each call."""
    return torch.cat([weights.repeat_interleave(g[0].numel() // g.shape[-1]) for g in gs])
