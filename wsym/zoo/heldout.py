"""Architecture blocks: consecutive members share an architecture, some architectures are held out.

A preset with an ``architecture_blocks`` entry (the park, ``mnist1d-park``)
draws the architecture once per *block* of ``size`` consecutive member ids
instead of once per member::

    "architecture_blocks": {
        "size": 6,                       # members per block
        "keys": ["family", "depth", ...],  # hyperparameters drawn per block
        "cycle": "family",               # block b takes choice b mod n of this key
        "heldout_every": 8,              # every 8th round of the cycle is held out
        "heldout": [{"family": "mlp", "depth": 3, ...}, ...]
    }

* Block ``b`` (members ``b*size .. b*size+size-1``) takes the ``(b mod n)``-th
  choice of the ``cycle`` key (so the families alternate and stay balanced) and
  draws the other ``keys`` from their priors with its own seed (stream
  :data:`BLOCK_STREAM` of ``(zoo seed, b)``); the members of a block then draw
  the rest of their hyperparameters (learning rate, steps, seed, ...) on their own.
  A block is one batched training group (:mod:`wsym.zoo.batched`).
* **Held-out architectures**: round ``r = b div n`` of the cycle with
  ``r mod heldout_every == heldout_every - 1`` holds out its blocks: each takes
  one of the ``heldout`` entries of its cycle value (drawn with its seed), and
  its members form the split :data:`HELDOUT_SPLIT`. Every other block redraws
  until its architecture is none of the held-out ones, so no member outside
  that split has a held-out architecture. The random member split
  (train / val / test) applies to the other members.

Example:
    >>> from wsym.zoo.presets import load_preset
    >>> park = load_preset("mnist1d-park")
    >>> [block_hyperparameters(park, 0, 6 * b)["family"] for b in range(4)]
    ['mlp', 'cnn', 'transformer', 'mlp']
    >>> heldout_block(park, 21), heldout_block(park, 20)
    (True, False)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from wsym.errors import WsymInputError
from wsym.zoo.presets import architecture_config, member_seed, sample_keys

#: Seed stream of a block's architecture draw.
BLOCK_STREAM = 11
#: Member split of the blocks whose architecture is held out.
HELDOUT_SPLIT = "test_arch"
_TRIES = 1000


def blocks(config: dict[str, Any]) -> dict[str, Any] | None:
    """The preset's ``architecture_blocks`` entry, or ``None``."""
    return config.get("architecture_blocks")


def _cycle(config: dict[str, Any]) -> tuple[str, list[Any]]:
    entry = config["architecture_blocks"]
    key = entry["cycle"]
    prior = config["hyperparameters"].get(key)
    if not isinstance(prior, dict) or "choice" not in prior:
        raise WsymInputError(
            f"zoo preset {config.get('name')}: architecture_blocks.cycle {key!r} needs a "
            "choice prior in hyperparameters"
        )
    return key, list(prior["choice"])


def heldout_block(config: dict[str, Any], block: int) -> bool:
    """Whether block ``block`` holds out its architecture (see the module docstring)."""
    entry = blocks(config)
    if entry is None:
        return False
    every = int(entry["heldout_every"])
    return (block // len(_cycle(config)[1])) % every == every - 1


def heldout_architectures(config: dict[str, Any]) -> list[dict[str, Any]]:
    """Architecture configs of the preset's held-out entries, in file order."""
    entry = blocks(config)
    if entry is None:
        return []
    return [architecture_config(config, _complete(config, h)) for h in entry["heldout"]]


def is_heldout(config: dict[str, Any], member: int) -> bool:
    """Whether ``member`` belongs to a held-out architecture's block."""
    entry = blocks(config)
    return entry is not None and heldout_block(config, member // int(entry["size"]))


def block_hyperparameters(config: dict[str, Any], zoo_seed: int, member: int) -> dict[str, Any]:
    """The hyperparameters ``member`` takes from its block (``{}`` without blocks)."""
    entry = blocks(config)
    if entry is None:
        return {}
    block = member // int(entry["size"])
    key, choices = _cycle(config)
    value = choices[block % len(choices)]
    rng = np.random.default_rng(member_seed(zoo_seed, block, BLOCK_STREAM))
    if heldout_block(config, block):
        options = [h for h in entry["heldout"] if h.get(key) == value]
        if not options:
            raise WsymInputError(
                f"zoo preset {config.get('name')}: architecture_blocks.heldout has no entry "
                f"with {key}={value}; add one"
            )
        return _complete(config, options[int(rng.integers(len(options)))], rng)
    banned = heldout_architectures(config)
    for _ in range(_TRIES):
        values = sample_keys(config, rng, list(entry["keys"]), {key: value})
        if architecture_config(config, values) not in banned:
            return values
    raise WsymInputError(
        f"zoo preset {config.get('name')}: every architecture with {key}={value} is held "
        "out; shorten architecture_blocks.heldout"
    )


def _complete(
    config: dict[str, Any], entry: dict[str, Any], rng: np.random.Generator | None = None
) -> dict[str, Any]:
    """A held-out entry with its block's remaining keys drawn (constants need no ``rng``)."""
    keys = list(config["architecture_blocks"]["keys"])
    rng = rng if rng is not None else np.random.default_rng(0)
    return sample_keys(config, rng, keys, entry)
