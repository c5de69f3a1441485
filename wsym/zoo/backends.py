"""Where units of members train: in this process, in local worker processes, or on Ray.

A *unit* is a list of member ids of one shard. :func:`train_unit` trains one
unit from nothing but ``(preset config, zoo seed, ids)``, on one thread (see
:func:`~wsym.zoo.batched.train_members`), so every backend produces the same
members bit for bit. :func:`run_units` yields ``(ids, results)`` as units finish,
in any order; the caller writes them. The backends themselves (``local``, a
process pool, one Ray task per unit, retried where a worker dies) are
:mod:`wsym.zoo.dispatch`'s.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator
from typing import Any

from wsym.zoo import finetune
from wsym.zoo.batched import Member, Trained, train_members
from wsym.zoo.dispatch import BACKENDS, RAY_RETRIES, run_tasks
from wsym.zoo.heldout import block_hyperparameters
from wsym.zoo.presets import architecture_config, member_seed, sample_hyperparameters
from wsym.zoo.tasks import load_task

__all__ = ["BACKENDS", "RAY_RETRIES", "plan_member", "run_units", "train_unit"]
UnitFn = Callable[[dict[str, Any], int, list[int]], list[Trained]]


def plan_member(config: dict[str, Any], zoo_seed: int, member: int) -> Member:
    """Member ``member`` of the zoo: its seed, hyperparameters and architecture.

    In a preset with architecture blocks, the block's keys come from the block
    (:func:`wsym.zoo.heldout.block_hyperparameters`).
    """
    seed = member_seed(zoo_seed, member)
    hp = sample_hyperparameters(config, seed, block_hyperparameters(config, zoo_seed, member))
    return Member(member, seed, hp, architecture_config(config, hp))


def train_unit(config: dict[str, Any], zoo_seed: int, ids: list[int]) -> list[Trained]:
    """Train members ``ids`` of the zoo ``(config, zoo_seed)`` (single-threaded).

    A fine-tune zoo's config carries the pretrained state dict
    (:func:`wsym.zoo.finetune.unit_config`), which its members start from.
    """
    config = dict(config)
    start = config.pop(finetune.STATE_KEY, None)
    data = _dataset(json.dumps(config["dataset"], sort_keys=True))
    members = [plan_member(config, zoo_seed, i) for i in ids]
    return train_members(config, data, members, start)


def run_units(
    units: list[list[int]],
    config: dict[str, Any],
    zoo_seed: int,
    backend: str = "local",
    workers: int = 1,
    address: str | None = None,
    unit_fn: UnitFn = train_unit,
) -> Iterator[tuple[list[int], list[Trained]]]:
    """Train ``units`` on ``backend``; yields ``(ids, results)`` as each unit finishes."""
    tasks = [(config, zoo_seed, ids) for ids in units]
    for (_, _, ids), results in run_tasks(unit_fn, tasks, backend, workers, address):
        yield ids, results


@functools.lru_cache(maxsize=4)
def _dataset(config_json: str):
    return load_task(json.loads(config_json))
