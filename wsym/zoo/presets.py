"""Zoo presets: small JSON files naming a task, an architecture and hyperparameter priors.

A preset (``data/presets/NAME.json``, or any JSON file given by path) holds

* ``task``: ``"classification"`` (cross-entropy, accuracy) or ``"regression"`` (MSE);
* ``dataset``: ``{"name": ..., **options}``, see :mod:`wsym.zoo.tasks`;
* ``architecture``: ``{"name": ..., **kwargs}``, see :mod:`wsym.zoo.architectures`;
  a string value ``"$key"`` is replaced by the member's sampled hyperparameter ``key``
  (so a preset may sample width or activation per member), ``{"repeat": v, "times": n}``
  by the list ``[v] * n`` (both may be ``"$key"``); ``{"by": key, value: architecture,
  ...}`` picks the architecture by the sampled ``key`` (a preset of several families);
* ``dropout_sites``: submodule names whose outputs get (inverted) dropout;
* ``shard_size``: members per shard (the unit of work, storage and resumption);
* ``member_splits``: fractions of members in the ``train``/``val``/``test`` splits;
* ``hyperparameters``: ``{key: prior}``, sampled in file order, where a prior is a
  constant, ``{"choice": [...]}``, ``{"uniform": [a, b]}``, ``{"log_uniform": [a, b]}``,
  ``{"int_uniform": [a, b]}`` (both ends included), or
  ``{"by": other_key, value: prior, ...}`` (a prior that depends on an earlier key);
* ``architecture_blocks`` (optional): consecutive members share their architecture,
  and some architectures are held out whole, see :mod:`wsym.zoo.heldout`.

The training hyperparameters every preset must define are listed in :data:`REQUIRED`.

Example:
    >>> preset = load_preset("mnist1d-mlp")
    >>> hp = sample_hyperparameters(preset, member_seed(0, 7))
    >>> sorted(hp) == sorted(REQUIRED)
    True
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from wsym.errors import WsymInputError
from wsym.resources import PRESETS

#: Hyperparameters every preset samples (or fixes) for each member.
REQUIRED = (
    "optimizer",
    "lr",
    "weight_decay",
    "batch_size",
    "epochs",
    "init_scale",
    "dropout",
    "train_fraction",
    "label_noise",
)
OPTIMIZERS = ("sgd", "adam")
_KEYS = (
    "task",
    "dataset",
    "architecture",
    "dropout_sites",
    "shard_size",
    "member_splits",
    "hyperparameters",
)


def preset_names() -> list[str]:
    """Names of the bundled presets, sorted."""
    return sorted(p.stem for p in PRESETS.glob("*.json"))


def load_preset(name: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The preset ``name`` (a bundled name or a path to a JSON file), validated.

    Args:
        name: bundled preset name (see :func:`preset_names`) or ``path/to/preset.json``.
        overrides: top-level keys to replace; ``{"hyperparameters": {"epochs": 1}}``
            replaces single priors (nested dicts are merged one level deep).

    Returns:
        The preset as a dict, with ``"name"`` set.
    """
    path = Path(name) if name.endswith(".json") else PRESETS / f"{name}.json"
    if not path.is_file():
        raise WsymInputError(
            f"unknown zoo preset {name!r}; use one of {', '.join(preset_names())} "
            "or a path to a preset .json file"
        )
    try:
        preset = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise WsymInputError(f"cannot read zoo preset {path}: {err}; fix the JSON") from err
    for key, value in (overrides or {}).items():
        if isinstance(value, dict) and isinstance(preset.get(key), dict):
            preset[key] = {**preset[key], **copy.deepcopy(value)}
        else:
            preset[key] = copy.deepcopy(value)
    preset["name"] = path.stem
    _validate(preset, path)
    return preset


def member_seed(zoo_seed: int, member: int, stream: int = 0) -> int:
    """A 31-bit seed for ``member`` of the zoo seeded ``zoo_seed``, one per ``stream``.

    Derived with numpy's ``SeedSequence``, so seeds of different members (and
    streams) are statistically independent, and a member's seed does not
    depend on how many members the zoo has or how they are grouped.
    """
    state = np.random.SeedSequence([zoo_seed, member, stream]).generate_state(1)
    return int(state[0] >> 1)


def sample_hyperparameters(
    preset: dict[str, Any], seed: int, fixed: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Draw one member's hyperparameters from the preset's priors, in file order.

    Keys in ``fixed`` take its values instead (priors ``"by"`` them see those).
    """
    return sample_keys(preset, np.random.default_rng(seed), list(preset["hyperparameters"]), fixed)


def sample_keys(
    preset: dict[str, Any],
    rng: np.random.Generator,
    keys: list[str],
    fixed: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Draw the hyperparameters ``keys`` (in file order) with ``rng``; ``fixed`` ones given."""
    fixed = fixed or {}
    values: dict[str, Any] = {}
    for key, prior in preset["hyperparameters"].items():
        if key in fixed:
            values[key] = fixed[key]
        elif key in keys:
            values[key] = _draw(prior, rng, values, key)
    return values


def architecture_config(preset: dict[str, Any], hyperparameters: dict[str, Any]) -> dict[str, Any]:
    """The preset's architecture with ``"$key"`` strings replaced by sampled values."""

    def resolve(value):
        if isinstance(value, str) and value.startswith("$"):
            return hyperparameters[value[1:]]
        if isinstance(value, list):
            return [resolve(v) for v in value]
        if isinstance(value, dict) and set(value) == {"repeat", "times"}:
            return [resolve(value["repeat"])] * int(resolve(value["times"]))
        return value

    architecture = preset["architecture"]
    if "by" in architecture:
        chosen = str(hyperparameters[architecture["by"]])
        if chosen not in architecture:
            raise WsymInputError(
                f"zoo preset {preset.get('name')}: architecture has no entry for "
                f"{architecture['by']}={chosen}; add one"
            )
        architecture = architecture[chosen]
    return {key: resolve(value) for key, value in architecture.items()}


def _draw(prior: Any, rng: np.random.Generator, values: dict[str, Any], key: str) -> Any:
    if not isinstance(prior, dict):
        return prior
    if "by" in prior:
        chosen = values[prior["by"]]
        return _draw(prior[str(chosen)], rng, values, key)
    (kind, arg), *_ = prior.items()
    if kind == "choice":
        value = arg[int(rng.integers(len(arg)))]
        return value
    if kind == "uniform":
        return float(rng.uniform(arg[0], arg[1]))
    if kind == "log_uniform":
        return float(math.exp(rng.uniform(math.log(arg[0]), math.log(arg[1]))))
    if kind == "int_uniform":
        return int(rng.integers(arg[0], arg[1] + 1))
    raise WsymInputError(f"hyperparameter {key!r}: unknown prior {kind!r}")


def _validate(preset: dict[str, Any], path: Path) -> None:
    missing = [k for k in _KEYS if k not in preset]
    missing += [f"hyperparameters.{k}" for k in REQUIRED if k not in preset["hyperparameters"]]
    if missing:
        raise WsymInputError(f"zoo preset {path} lacks {', '.join(missing)}; add them")
    if preset["task"] not in ("classification", "regression"):
        raise WsymInputError(f"zoo preset {path}: task must be classification or regression")
    splits = preset["member_splits"]
    if set(splits) != {"train", "val", "test"} or abs(sum(splits.values()) - 1) > 1e-9:
        raise WsymInputError(
            f"zoo preset {path}: member_splits needs train, val, test fractions summing to 1"
        )
    if int(preset["shard_size"]) < 1:
        raise WsymInputError(f"zoo preset {path}: shard_size must be positive")
    for key, prior in preset["hyperparameters"].items():
        if isinstance(prior, dict) and "by" not in prior:
            kind = next(iter(prior), None)
            if kind not in ("choice", "uniform", "log_uniform", "int_uniform"):
                raise WsymInputError(f"zoo preset {path}: {key} has unknown prior {kind!r}")
