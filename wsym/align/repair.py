"""REPAIR (Jordan et al. 2023): renormalize an interpolated or merged model's activations.

Averaging aligned weights shrinks the variance of hidden units (their inputs
decorrelate), which is much of the loss barrier. REPAIR measures, on a few
batches, each unit's mean ``mu`` and standard deviation ``sigma`` in the
endpoints and in the merged model, and corrects the merged model so that
every unit has the interpolated statistics
``mu_t = sum_i w_i mu_i``, ``sigma_t = sum_i w_i sigma_i``:
``z -> sigma_t / sigma_m (z - mu_m) + mu_t``. The correction is folded into
the weights of the layer producing ``z``, so the architecture is unchanged:

* a ``Linear`` / ``Conv`` output ``z = W x + b``: its rows ``W -> c W``,
  ``b -> c (b - mu_m) + mu_t`` (``c = sigma_t / sigma_m``; without a bias only
  the scale is corrected);
* a ``LayerNorm`` / ``RMSNorm`` output ``y = gamma n (+ beta)``: per feature
  ``gamma -> c gamma`` (and ``beta -> c (beta - mu_m) + mu_t``; an RMSNorm, with
  no bias, gets its scale corrected only). In a transformer the residual
  stream feeds the norms: its writers (embedding, attention output, MLP
  output) are corrected per feature like any ``Linear``, and what each norm
  hands on is corrected again through its gain and bias, since the norm
  divides the stream's scale out per token;
* a layer feeding a ``BatchNorm`` is left alone: the BatchNorm's running
  statistics are recomputed on the batches instead (the usual protocol);
* the layer producing the model's output is left alone (the logits are what
  is being evaluated).

Correction points are found by running the model once with forward hooks
(modules called more than once are skipped), and corrected in the order they
run, each measured after the ones before it were corrected.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from wsym.align.batchnorm import reset_batchnorm_stats
from wsym.models.calling import model_inputs

CONV = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
NORMS = (nn.LayerNorm, *((nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ()))
BATCHNORM = nn.modules.batchnorm._BatchNorm


class Repair:
    """REPAIR for one set of endpoints: their statistics are measured once.

    Args:
        model: the module whose state dicts these are (not modified).
        endpoints: the endpoint state dicts (e.g. ``[sd_a, sd_b]``, aligned).
        batches: iterable of ``(inputs, targets)`` to measure statistics on.
        units: correct the units (else only BatchNorm statistics are recomputed).

    Example:
        >>> import torch
        >>> net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
        >>> sd = {k: v.double() for k, v in net.state_dict().items()}
        >>> shrunk = {**sd, "0.weight": 0.5 * sd["0.weight"], "0.bias": 0.5 * sd["0.bias"]}
        >>> fixed = Repair(net, [sd, sd], [(torch.randn(64, 3), None)])(shrunk, [0.5, 0.5])
        >>> torch.allclose(fixed["0.weight"], sd["0.weight"])
        True
    """

    def __init__(self, model: nn.Module, endpoints: list[dict], batches, units: bool = True):
        self.model = copy.deepcopy(model).double().eval()
        self.batches = list(batches)
        self.points = correction_points(self.model, self.batches[0][0]) if units else []
        self.stats = [self._statistics(sd, self.points) for sd in endpoints]

    def __call__(self, state_dict: dict, weights) -> dict:
        """``state_dict`` repaired towards ``sum_i weights[i] * statistics of endpoint i``."""
        work = {
            k: v.detach().double() if v.is_floating_point() else v for k, v in state_dict.items()
        }
        has_bn = any(isinstance(m, BATCHNORM) for m in self.model.modules())
        if has_bn:
            work = reset_batchnorm_stats(self.model, work, self.batches)
        for name in self.points:
            mu_m, sigma_m = self._statistics(work, [name])[name]
            mu_t = sum(w * s[name][0] for w, s in zip(weights, self.stats, strict=True))
            sigma_t = sum(w * s[name][1] for w, s in zip(weights, self.stats, strict=True))
            work = _correct(self.model, name, work, mu_m, sigma_m, mu_t, sigma_t)
        if has_bn:
            work = reset_batchnorm_stats(self.model, work, self.batches)
        return {k: v.to(state_dict[k].dtype) if k in state_dict else v for k, v in work.items()}

    def _statistics(self, state_dict: dict, names) -> dict:
        """``{name: (mean, std)}`` per unit of each point's output, over ``batches``."""
        return unit_statistics(self.model, state_dict, self.batches, names)


def repair(model: nn.Module, state_dict: dict, endpoints: list[dict], weights, batches) -> dict:
    """``state_dict`` with REPAIR applied (see :class:`Repair`); ``weights`` one per endpoint."""
    return Repair(model, endpoints, batches)(state_dict, weights)


def correction_points(model: nn.Module, inputs) -> list[str]:
    """Names of the modules REPAIR corrects, in the order they run."""
    calls: dict[str, int] = {}
    order: list[str] = []
    outputs: dict[str, torch.Tensor] = {}  # kept alive: identity is compared, not ids
    bn_inputs: list[torch.Tensor] = []
    modules = dict(model.named_modules())
    handles = []

    def hook(name):
        def fn(module, args, out):
            calls[name] = calls.get(name, 0) + 1
            if calls[name] == 1:
                order.append(name)
            outputs[name] = out

        return fn

    def bn_hook(module, args):
        bn_inputs.append(args[0])

    for name, m in modules.items():
        if isinstance(m, (nn.Linear, *CONV)) or (isinstance(m, NORMS) and _affine(m)):
            handles.append(m.register_forward_hook(hook(name)))
        elif isinstance(m, BATCHNORM):
            handles.append(m.register_forward_pre_hook(bn_hook))
    try:
        with torch.no_grad():
            out = _run(model, inputs)
    finally:
        for h in handles:
            h.remove()
    return [
        n
        for n in order
        if calls[n] == 1 and outputs[n] is not out and not any(outputs[n] is x for x in bn_inputs)
    ]


def unit_statistics(model: nn.Module, state_dict: dict, batches, names) -> dict:
    """``{name: (mean, std)}``: per output unit of each named module, float64.

    Units are a ``Linear``'s or norm's last axis and a convolution's channel
    axis; every other axis counts as samples.
    """
    net = copy.deepcopy(model).double().eval()
    net.load_state_dict(
        {k: v.double() if v.is_floating_point() else v for k, v in state_dict.items()}
    )
    modules = dict(net.named_modules())
    sums: dict[str, list] = {n: [0, 0, 0] for n in names}

    def hook(name):
        def fn(module, args, out):
            x = out.movedim(1, -1) if isinstance(module, CONV) else out
            x = x.reshape(-1, x.shape[-1]).double()
            acc = sums[name]
            acc[0] += x.shape[0]
            acc[1] = acc[1] + x.sum(0)
            acc[2] = acc[2] + (x * x).sum(0)

        return fn

    handles = [modules[n].register_forward_hook(hook(n)) for n in names]
    try:
        with torch.no_grad():
            for inputs, _ in batches:
                _run(net, inputs)
    finally:
        for h in handles:
            h.remove()
    out = {}
    for n, (count, s, sq) in sums.items():
        mean = s / count
        out[n] = (mean, (sq / count - mean * mean).clamp_min(0).sqrt())
    return out


def _correct(model, name, sd, mu_m, sigma_m, mu_t, sigma_t) -> dict:
    """``sd`` with module ``name``'s output mapped by ``c (z - mu_m) + mu_t`` per unit."""
    module = dict(model.named_modules())[name]
    live = sigma_m > 1e-12 * sigma_m.abs().max().clamp_min(1e-300)
    c = torch.where(live, sigma_t / sigma_m.clamp_min(1e-300), torch.ones_like(sigma_m))
    w_key, b_key = f"{name}.weight", f"{name}.bias"
    out = dict(sd)
    shape = (-1,) + (1,) * (sd[w_key].ndim - 1) if not isinstance(module, NORMS) else (-1,)
    out[w_key] = sd[w_key] * c.reshape(shape)
    if b_key in sd and sd[b_key] is not None:
        shift = torch.where(live, mu_t - c * mu_m, torch.zeros_like(mu_m))
        out[b_key] = c * sd[b_key] + shift
    return out


def _affine(norm) -> bool:
    return getattr(norm, "weight", None) is not None and norm.weight.dim() == 1


def _run(net: nn.Module, inputs):
    args, kwargs = model_inputs(net, inputs)
    dtype = next((p.dtype for p in net.parameters() if p.is_floating_point()), torch.float64)
    args = tuple(a.to(dtype) if torch.is_tensor(a) and a.is_floating_point() else a for a in args)
    return net(*args, **kwargs)
