"""Where units of members train: in this process, in local worker processes, or on Ray.

A *unit* is a list of member ids of one shard. :func:`train_unit` trains one
unit from nothing but ``(preset config, zoo seed, ids)``, on one thread (see
:func:`~wsym.zoo.batched.train_members`), so every backend produces the same
members bit for bit. Backends yield
``(ids, results)`` as units finish, in any order; the caller writes them.

* ``local``, ``workers=1``: units run one after another in this process.
* ``local``, ``workers=K``: a pool of K spawned processes.
* ``ray``: one Ray task per unit (``ray.init(address=...)``, or the Ray instance
  already initialised). A task whose worker dies is retried by Ray
  (``max_retries``, default :data:`RAY_RETRIES`).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from typing import Any

from wsym.errors import WsymInputError
from wsym.zoo import finetune
from wsym.zoo.batched import Member, Trained, train_members
from wsym.zoo.heldout import block_hyperparameters
from wsym.zoo.presets import architecture_config, member_seed, sample_hyperparameters
from wsym.zoo.tasks import load_task

BACKENDS = ("local", "ray")
RAY_RETRIES = 3
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
    if backend not in BACKENDS:
        raise WsymInputError(f"unknown zoo backend {backend!r}; use one of {', '.join(BACKENDS)}")
    if workers < 1:
        raise WsymInputError(f"--workers must be positive, got {workers}")
    if backend == "ray":
        yield from _ray(units, config, zoo_seed, workers, address, unit_fn)
    elif workers == 1 or len(units) <= 1:
        for ids in units:
            yield ids, unit_fn(config, zoo_seed, ids)
    else:
        ctx = get_context("spawn")
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            futures = {pool.submit(unit_fn, config, zoo_seed, ids): ids for ids in units}
            for future in as_completed(futures):
                yield futures[future], future.result()


def _ray(units, config, zoo_seed, workers, address, unit_fn):
    try:
        import ray
    except ImportError as err:
        raise WsymInputError(
            "the ray backend needs Ray; install it with pip install 'wsym[ray]'"
        ) from err
    if not ray.is_initialized():
        ray.init(address=address, num_cpus=None if address else workers)
    task = ray.remote(num_cpus=1, max_retries=RAY_RETRIES)(unit_fn)
    pending = {task.remote(config, zoo_seed, ids): ids for ids in units}
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1)
        for ref in ready:
            yield pending.pop(ref), ray.get(ref)


@functools.lru_cache(maxsize=4)
def _dataset(config_json: str):
    return load_task(json.loads(config_json))
