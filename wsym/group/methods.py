"""The spec's action methods: ``spec.sample``, ``spec.act``, ``spec.conserved``, ``spec.verify``.

:class:`~wsym.group.spec.SymmetrySpec` is a value that imports nothing above it; the
functions that act with it live in the modules that read it (:mod:`wsym.group.elements`,
:mod:`wsym.group.conserved`, :mod:`wsym.group.verify`). Importing :mod:`wsym.group`
binds them here as methods, so that ``spec.act(g, sd)`` is ``wsym.group.act(spec, g, sd)``
after the same checks.

Example:
    >>> import torch, wsym
    >>> net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    >>> spec = wsym.detect(net, torch.randn(5, 3))
    >>> moved = spec.act(spec.sample(seed=0), net.state_dict())
    >>> x = torch.randn(2, 3)
    >>> torch.allclose(torch.func.functional_call(net, moved, (x,)), net(x), atol=1e-5)
    True
"""

from __future__ import annotations

from wsym.errors import WsymInputError
from wsym.group import conserved as _conserved
from wsym.group import elements
from wsym.group import verify as _verify
from wsym.group.fits import check_element, check_fits
from wsym.group.spec import SymmetrySpec
from wsym.models.arguments import check_module


def sample(self: SymmetrySpec, seed: int = 0, scale=(1e-2, 1e2), kinds=None):
    """A random element of the product group (or of the listed ``kinds`` only)."""
    if not (
        isinstance(scale, tuple | list)
        and len(scale) == 2
        and all(isinstance(v, int | float) and 0 < v < float("inf") for v in scale)
    ):
        raise WsymInputError(
            f"scale must be a pair (low, high) of positive numbers, got {scale!r}; "
            "pass e.g. scale=(0.1, 10)"
        )
    return elements.sample(self, seed=seed, scale=scale, kinds=kinds)


def act(self: SymmetrySpec, g, state_dict):
    """The state dict ``g . state_dict``; computes the same function.

    Raises:
        WsymInputError: a state dict that does not fit the spec, or non-finite values.
    """
    check_element(g, "SymmetrySpec.act")
    check_fits(self, state_dict, "SymmetrySpec.act")
    return elements.act(self, g, state_dict)


def conserved(self: SymmetrySpec, state_dict) -> list:
    """Per continuous group, its conserved quantity of gradient flow at ``state_dict``.

    See :func:`wsym.group.conserved.conserved`.
    """
    check_fits(self, state_dict, "SymmetrySpec.conserved")
    return _conserved.conserved(self, state_dict)


def verify(self: SymmetrySpec, model, example_inputs, **kwargs):
    """Per-group largest relative output deviation under random elements."""
    check_module(model, "SymmetrySpec.verify")
    return _verify.verify(self, model, example_inputs, **kwargs)


for _method in (sample, act, conserved, verify):
    setattr(SymmetrySpec, _method.__name__, _method)
