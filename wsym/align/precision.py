"""The working precision of canonicalization, alignment and merging.

Every operation on checkpoints works on one copy of each input at one floating
dtype, the caller's choice (``dtype=``); by default float64 up to
:data:`FLOAT64_LIMIT` parameters (the zoo's models, where round-off never
decides a match and references are compared to 1e-9) and float32 above (a
BERT-base pair in float64 would hold 4x its float32 size before any work).
Outputs keep the inputs' dtypes.

The round-off a working dtype commits sets the thresholds that treat a number
as zero (:func:`round_off`): a gain of a matching step, a distance to the
reference.

Example:
    >>> import torch
    >>> working_dtype({"w": torch.zeros(3, dtype=torch.float32)})
    torch.float64
    >>> working_dtype({"w": torch.zeros(3)}, torch.float32)
    torch.float32
"""

from __future__ import annotations

import torch

from wsym.errors import WsymInputError

#: Parameters (floating entries of a state dict) up to which the default is float64.
FLOAT64_LIMIT = 2**24
DTYPES = (torch.float32, torch.float64)


def working_dtype(state_dict: dict, dtype: torch.dtype | None = None) -> torch.dtype:
    """``dtype`` checked, or the default for ``state_dict``'s size (see the module docstring).

    Raises:
        WsymInputError: ``dtype`` is not float32 or float64 (the SVDs and
            eigensolves have no half-precision CPU kernels).
    """
    if dtype is not None:
        if dtype not in DTYPES:
            raise WsymInputError(
                f"canonicalization and alignment run in float32 or float64, not {dtype}; "
                "pass dtype=torch.float32 (the outputs keep the inputs' dtypes)"
            )
        return dtype
    size = sum(v.numel() for v in state_dict.values() if v.is_floating_point())
    return torch.float64 if size <= FLOAT64_LIMIT else torch.float32


def working(state_dict: dict, dtype: torch.dtype) -> dict:
    """``state_dict`` with its floating tensors at ``dtype`` (the same tensors where they are)."""
    return {k: v.detach().to(dtype) if v.is_floating_point() else v for k, v in state_dict.items()}


def round_off(dtype: torch.dtype) -> float:
    """A relative size below which a difference is round-off at ``dtype``.

    ``1e-12`` in float64 (what the matching always used); ``1e-5`` (about 100
    machine epsilons) in float32.
    """
    return 1e-12 if dtype == torch.float64 else 1e-5


#: Relative distance to the reference below which a copy counts as recovered (nothing to fit).
RECOVERED = {torch.float64: 1e-8, torch.float32: 1e-5}
