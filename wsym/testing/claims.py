"""Whether each reported group holds: float64 outputs before and after acting, per group.

Independent of :mod:`wsym.group.verify` (which detection itself uses): a float64
copy of the model in eval mode, every group acted on alone with random moving
elements (``scale=(0.1, 10)``), outputs compared on the example inputs and on
fresh Gaussian inputs at each of ``scales`` (large scales saturate tanh, sigmoid
and softmax, where a false scaling claim shows).

Example:
    >>> import torch, wsym
    >>> _ = torch.manual_seed(0)
    >>> mlp = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    >>> spec = wsym.detect(mlp, torch.randn(2, 3))
    >>> max(group_deviations(mlp, torch.randn(2, 3), spec)) < 1e-12
    True
"""

from __future__ import annotations

import copy

import torch
from torch.func import functional_call

from wsym.group.elements import sample
from wsym.group.spec import SymmetrySpec

SCALES = (1.0, 20.0, 1000.0)


def _outputs(model, state, x) -> torch.Tensor:
    with torch.no_grad():
        out = functional_call(model, state, (x,), tie_weights=False)
    return out.reshape(-1)


def group_deviations(
    model: torch.nn.Module, inputs: torch.Tensor, spec: SymmetrySpec, *, scales=SCALES, seeds=(0, 1)
) -> list[float]:
    """Per group of ``spec``, the largest relative output change (max-abs over max-abs).

    ``inputs`` is one float tensor (the model's only positional input). Holds a
    float64 copy of the model and one acted state dict at a time.
    """
    m64 = copy.deepcopy(model).double().eval()
    sd = m64.state_dict()
    gen = torch.Generator().manual_seed(12345)
    sets = [inputs.double()]
    sets += [s * torch.randn(inputs.shape, generator=gen, dtype=torch.float64) for s in scales]
    refs = [_outputs(m64, sd, x) for x in sets]
    worst = []
    for i in range(len(spec.groups)):
        dev = 0.0
        for seed in seeds:
            g = sample(spec, seed=seed, scale=(0.1, 10), groups=[i], moving=True)
            moved = spec.act(g, sd)
            for x, y0 in zip(sets, refs, strict=True):
                y1 = _outputs(m64, moved, x)
                dev = max(dev, float((y1 - y0).abs().max() / y0.abs().max().clamp_min(1e-300)))
        worst.append(dev)
    return worst


__all__ = ["SCALES", "group_deviations"]
