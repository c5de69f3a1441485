"""Architecture factories of zoo members: a config dict -> a fresh ``nn.Module``.

``{"name": "mlp", "widths": [32, 32], ...}`` builds :class:`wsym.reference.MLP`
with the remaining keys as keyword arguments; likewise ``cnn1d``
(:class:`~wsym.reference.CNN1d`), ``residual_cnn``
(:class:`~wsym.reference.ResidualCNN`, 2-D, with BatchNorm), ``transformer``
(:class:`~wsym.reference.TinyTransformer`), ``diagonal``
(:class:`~wsym.reference.DiagonalLinear`), and the park's ``park_cnn1d``
(:class:`~wsym.zoo.park.ParkCNN1d`) and ``patch_transformer``
(:class:`~wsym.zoo.park.PatchTransformer`). A member's stored state dict has
exactly the keys of the module built here, so ``model.load_state_dict(sd)`` works.

Example:
    >>> build_architecture({"name": "mlp", "d_in": 4, "widths": [8], "d_out": 2})
    MLP(
      (0): Linear(in_features=4, out_features=8, bias=True)
      (1): ReLU()
      (2): Linear(in_features=8, out_features=2, bias=True)
    )
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from wsym import reference
from wsym.errors import WsymInputError
from wsym.zoo import park

ARCHITECTURES: dict[str, Callable[..., nn.Module]] = {
    "mlp": reference.MLP,
    "cnn1d": reference.CNN1d,
    "residual_cnn": reference.ResidualCNN,
    "transformer": reference.TinyTransformer,
    "diagonal": reference.DiagonalLinear,
    "park_cnn1d": park.ParkCNN1d,
    "patch_transformer": park.PatchTransformer,
}
_NORMS = (nn.modules.batchnorm._NormBase, nn.LayerNorm, nn.GroupNorm)


def build_architecture(config: dict[str, Any]) -> nn.Module:
    """A fresh module (PyTorch's default initialisation, global RNG) from ``config``."""
    kwargs = dict(config)
    name = kwargs.pop("name", None)
    if name not in ARCHITECTURES:
        raise WsymInputError(
            f"unknown zoo architecture {name!r}; use one of {', '.join(sorted(ARCHITECTURES))}"
        )
    if "widths" in kwargs:
        kwargs["widths"] = tuple(kwargs["widths"])
    return ARCHITECTURES[name](**kwargs)


def initialise(config: dict[str, Any], seed: int, init_scale: float = 1.0) -> nn.Module:
    """Build ``config`` with torch's global RNG seeded ``seed`` (restored after).

    Every parameter except those of normalization layers (BatchNorm, LayerNorm,
    GroupNorm) is then multiplied by ``init_scale``.
    """
    with torch.random.fork_rng(devices=[]):
        # the CPU generator only: torch.manual_seed would also queue a CUDA seeding,
        # recording a stack trace each time (~3 ms), for the same CPU stream
        torch.default_generator.manual_seed(seed)
        model = build_architecture(config)
    if init_scale != 1.0:
        with torch.no_grad():
            for module in model.modules():
                if isinstance(module, _NORMS):
                    continue
                for param in module.parameters(recurse=False):
                    param.mul_(init_scale)
    return model
