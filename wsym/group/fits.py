"""Whether a state dict fits a spec: checked in one line at the public entry points."""

from __future__ import annotations

import torch

from wsym.errors import WsymInputError, check_finite
from wsym.models.arguments import check_state_dict


def check_spec(spec, who: str) -> None:
    """Raise a one-line :class:`~wsym.errors.WsymInputError` unless ``spec`` is a SymmetrySpec."""
    if not hasattr(spec, "layouts") or not hasattr(spec, "groups"):  # not a SymmetrySpec
        raise WsymInputError(
            f"{who} needs a SymmetrySpec, got {type(spec).__name__}; "
            "pass spec=wsym.detect(model, inputs) (or SymmetrySpec.from_json(text))"
        )


def check_element(g, who: str) -> None:
    """Raise a one-line :class:`~wsym.errors.WsymInputError` unless ``g`` is a group element."""
    if not hasattr(g, "components") or not hasattr(g, "parts"):
        raise WsymInputError(
            f"{who} needs a GroupElement, got {type(g).__name__}; "
            "pass spec.sample(seed=...) (or a GroupElement of the spec's groups)"
        )


def check_fits(spec, state_dict, who: str) -> None:
    """Raise a one-line :class:`~wsym.errors.WsymInputError` unless ``state_dict`` fits ``spec``.

    It must be a dict holding every entry the spec was detected on, each a
    tensor of the detected shape, with finite values.

    Example:
        >>> import torch, wsym
        >>> mlp = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
        >>> spec = wsym.detect(mlp, torch.randn(2, 3))
        >>> sd = mlp.state_dict()
        >>> del sd["2.bias"]
        >>> check_fits(spec, sd, "wsym.canonicalize")
        Traceback (most recent call last):
        ...
        wsym.errors.WsymInputError: the state dict passed to wsym.canonicalize has no entry ...
    """
    check_spec(spec, who)
    check_state_dict(state_dict, who)
    for key, dims in spec.layouts:
        if key not in state_dict:
            raise WsymInputError(
                f"the state dict passed to {who} has no entry {key!r} of the architecture the "
                "spec was detected on; pass the whole state dict (model.state_dict())"
            )
        t, expected = state_dict[key], tuple(d.size for d in dims)
        if not torch.is_tensor(t) or tuple(t.shape) != expected:
            got = tuple(t.shape) if torch.is_tensor(t) else type(t).__name__
            raise WsymInputError(
                f"{key} has shape {got} in the state dict passed to {who}, the spec expects "
                f"{expected}; pass a state dict of the architecture the spec was detected on"
            )
    check_finite(state_dict, f"the state dict passed to {who}")


__all__ = ["check_element", "check_fits", "check_spec"]
