r"""A cheap adversarial search for a counterexample to a claimed symmetry.

Random and rescaled inputs exercise every nonlinearity's range, but a false
group may move the outputs only in a small region. For small models the probe's
float inputs are pushed towards the largest relative output change under one
group element ``g`` by a few steps of signed gradient ascent:

.. math::

    x \leftarrow x + \eta\, \sigma(x)\, \mathrm{sign}\, \nabla_x
    \frac{\|f(g \cdot \theta, x) - f(\theta, x)\|^2}{\|f(\theta, x)\|^2}

(``eta = 0.5``, ``sigma`` the inputs' standard deviation). Verification then
tests the groups once more on those inputs.

Example:
    >>> import torch, wsym
    >>> from wsym.group.adversary import adversarial_inputs
    >>> from wsym.group.verify import Probe
    >>> mlp = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    >>> spec = wsym.detect(mlp, torch.randn(2, 3))
    >>> args, kwargs = adversarial_inputs(Probe(mlp, torch.randn(2, 3)), spec, [0])
    >>> args[0].shape
    torch.Size([2, 3])
"""

from __future__ import annotations

import torch
from torch.func import functional_call
from torch.utils._pytree import tree_flatten

from wsym.group.elements import act, sample
from wsym.models.calling import eval_mode

STEPS = 3
STEP = 0.5
MAX_PARAMETERS = 1_000_000  # "cheap": above this, the search is skipped


def adversarial_inputs(probe, spec, groups, seed: int = 0, scale=(0.1, 10.0), steps=STEPS):
    """``(args, kwargs)`` pushed towards the largest output change; None if not possible.

    Args:
        probe: a :class:`~wsym.group.verify.Probe` (its generic weights and float inputs are used).
        spec: the spec whose ``groups`` (indices) are tested.
        groups: indices of the groups acting together.
        seed: seed of the group element.
        scale: range of the element's scales.
        steps: number of ascent steps.
    """
    base = probe.generic
    moved = act(spec, sample(spec, seed=seed, scale=scale, groups=groups, moving=True), base)
    args = [a.detach().clone().requires_grad_(True) if _float(a) else a for a in probe.args]
    kwargs = {
        k: v.detach().clone().requires_grad_(True) if _float(v) else v
        for k, v in probe.kwargs.items()
    }
    leaves = [x for x in [*args, *kwargs.values()] if _float(x)]
    if not leaves:
        return None
    try:
        for _ in range(steps):
            y0, y1 = _outputs(probe, base, args, kwargs), _outputs(probe, moved, args, kwargs)
            loss = ((y1 - y0) ** 2).sum() / (y0**2).sum().clamp_min(1e-300)
            grads = torch.autograd.grad(loss, leaves, allow_unused=True)
            with torch.no_grad():
                for x, gr in zip(leaves, grads, strict=True):
                    if gr is not None:
                        x += STEP * x.std() * gr.sign()
    except RuntimeError:  # no backward for some op: keep the random inputs
        return None
    detach = {id(x): x.detach() for x in leaves}
    return (
        tuple(detach.get(id(a), a) for a in args),
        {k: detach.get(id(v), v) for k, v in kwargs.items()},
    )


def cheap(model: torch.nn.Module) -> bool:
    """Whether the search is cheap enough to run (at most :data:`MAX_PARAMETERS`)."""
    return sum(p.numel() for p in model.parameters()) <= MAX_PARAMETERS


def _float(x) -> bool:
    return torch.is_tensor(x) and x.is_floating_point()


def _outputs(probe, state, args, kwargs) -> torch.Tensor:
    with eval_mode(probe.model):
        out = functional_call(
            probe.model, {**probe.extra, **state}, tuple(args), kwargs, tie_weights=False
        )
    leaves = [x for x in tree_flatten(out)[0] if torch.is_tensor(x) and x.is_floating_point()]
    return torch.cat([x.reshape(-1).to(torch.float64) for x in leaves])
