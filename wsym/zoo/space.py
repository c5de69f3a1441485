"""The architecture space of a preset: every architecture its priors can draw.

A preset's ``architecture`` template reads sampled hyperparameters (``"$width"``,
``{"by": "family", ...}``). Where every prior those keys depend on is discrete
(a constant, ``choice``, ``int_uniform``, or ``by`` an earlier key), the space is
finite and :func:`architecture_space` lists it: the park preset's 226
architectures (64 MLPs, 126 CNNs, 36 transformers), held-out ones included.

:func:`architectures_with` finds the architectures whose state dicts have given
tensor names and shapes, so a reader of the preset's checkpoints (the park
meta-network) can accept a bare state dict of an architecture it never saw;
:class:`ArchitectureSpace` detects those architectures' symmetries on demand.

Example:
    >>> from wsym.zoo.presets import load_preset
    >>> len(architecture_space(load_preset("mnist1d-park")))
    226
    >>> architecture_space(load_preset("mnist1d-mlp"))[0]["widths"]
    [32, 32]
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import torch

from wsym.detect import detect
from wsym.errors import WsymInputError
from wsym.group.spec import SymmetrySpec
from wsym.zoo.architectures import build_architecture
from wsym.zoo.presets import architecture_config

_SIGNATURES: dict[str, dict[tuple, list[dict[str, Any]]]] = {}


def architecture_space(preset: dict[str, Any]) -> list[dict[str, Any]]:
    """Every architecture config ``preset`` can draw, each once, in prior order.

    Raises:
        WsymInputError: an architecture key has a continuous prior (the space is
            not finite).
    """
    priors = preset["hyperparameters"]
    needed = _keys_needed(preset["architecture"], priors)
    assignments: list[dict[str, Any]] = [{}]
    for key, prior in priors.items():
        if key in needed:
            assignments = [{**a, key: v} for a in assignments for v in _values(prior, a, key)]
    out, seen = [], set()
    for a in assignments:
        config = architecture_config(preset, a)
        text = _text(config)
        if text not in seen:
            seen.add(text)
            out.append(config)
    return out


def architectures_with(preset: dict[str, Any], signature: dict[str, tuple]) -> list[dict]:
    """The architectures of ``preset``'s space whose floating tensors are ``signature``.

    ``signature``: ``{name: shape}`` of a state dict's floating tensors. Several
    architectures may share one (MLPs that differ only in the activation). The
    index of the space is built once per preset and process.
    """
    text = _text({k: preset[k] for k in ("architecture", "hyperparameters")})
    index = _SIGNATURES.get(text)
    if index is None:
        index = _SIGNATURES[text] = {}
        for config in architecture_space(preset):
            sd = build_architecture(config).state_dict()
            key = _key({k: tuple(v.shape) for k, v in sd.items() if v.is_floating_point()})
            index.setdefault(key, []).append(config)
    return index.get(_key(signature), [])


def _key(signature: dict[str, tuple]) -> tuple:
    return tuple(sorted((k, tuple(v)) for k, v in signature.items()))


def _keys_needed(template: Any, priors: dict[str, Any]) -> set[str]:
    """Hyperparameters the template reads, and those their priors are ``by``."""
    found: set[str] = set()

    def walk(value):
        if isinstance(value, str) and value.startswith("$"):
            found.add(value[1:])
        elif isinstance(value, list):
            for v in value:
                walk(v)
        elif isinstance(value, dict):
            if "by" in value:
                found.add(value["by"])
            for k, v in value.items():
                if k != "by":
                    walk(v)

    walk(template)
    todo = list(found)
    while todo:
        prior = priors.get(todo.pop())
        for by in _by_keys(prior):
            if by not in found:
                found.add(by)
                todo.append(by)
    return found


def _by_keys(prior: Any) -> set[str]:
    if not isinstance(prior, dict) or "by" not in prior:
        return set()
    out = {prior["by"]}
    for k, v in prior.items():
        if k != "by":
            out |= _by_keys(v)
    return out


def _values(prior: Any, assigned: dict[str, Any], key: str) -> list[Any]:
    """The values ``prior`` can take given the earlier keys ``assigned``."""
    if not isinstance(prior, dict):
        return [prior]
    if "by" in prior:
        return _values(prior[str(assigned[prior["by"]])], assigned, key)
    (kind, arg), *_ = prior.items()
    if kind == "choice":
        return list(dict.fromkeys(arg))
    if kind == "int_uniform":
        return list(range(int(arg[0]), int(arg[1]) + 1))
    raise WsymInputError(
        f"hyperparameter {key!r} shapes the architecture but has a continuous prior "
        f"({kind}); the preset's architecture space is not finite"
    )


class ArchitectureSpace:
    """A preset's architecture space, with each architecture's symmetries detected once.

    Args:
        preset: the preset (its ``architecture`` and ``hyperparameters`` are read).
        example_inputs: inputs the architectures' symmetries are detected on.

    Example:
        >>> import torch
        >>> from wsym.zoo.presets import load_preset
        >>> space = ArchitectureSpace(load_preset("mnist1d-mlp"), torch.randn(4, 40))
        >>> sig = {"0.weight": (32, 40), "0.bias": (32,), "2.weight": (32, 32),
        ...        "2.bias": (32,), "4.weight": (10, 32), "4.bias": (10,)}
        >>> [config["widths"] for config, _ in space.specs_with(sig)]
        [[32, 32]]
    """

    def __init__(self, preset: dict[str, Any], example_inputs: torch.Tensor):
        self.preset = {k: preset[k] for k in ("architecture", "hyperparameters")}
        self.example_inputs = example_inputs
        self._specs: dict[str, SymmetrySpec] = {}  # architecture JSON -> spec

    def know(self, config: dict[str, Any], spec: SymmetrySpec) -> None:
        """Record ``config``'s spec (detected elsewhere), so it is not detected again."""
        self._specs[_text(config)] = spec

    def specs_with(self, signature: dict[str, tuple]) -> list[tuple[dict, SymmetrySpec]]:
        """``(config, spec)`` of every architecture whose state dicts have ``signature``."""
        out = []
        for config in architectures_with(self.preset, signature):
            text = _text(config)
            if text not in self._specs:
                self._specs[text] = detect(build_architecture(config), self.example_inputs)
            out.append((config, self._specs[text]))
        return out

    def to_json(self, index_of: Callable[[SymmetrySpec], int | None]) -> dict[str, Any]:
        """JSON of the space; known specs as indices (``index_of``: spec -> index or ``None``).

        Specs without an index are left out (detected again when needed).
        """
        known = [(t, index_of(s)) for t, s in self._specs.items()]
        return {
            **self.preset,
            "example_inputs": self.example_inputs.tolist(),
            "known": [[json.loads(t), k] for t, k in known if k is not None],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], specs: list[SymmetrySpec]) -> ArchitectureSpace:
        """Inverse of :meth:`to_json` (``specs``: the list the indices point into)."""
        space = cls(data, torch.tensor(data["example_inputs"]))
        for config, index in data.get("known", []):
            space.know(config, specs[index])
        return space


def _text(config: dict[str, Any]) -> str:
    return json.dumps(config, sort_keys=True)
