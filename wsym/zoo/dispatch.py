"""Run independent tasks in this process, in local worker processes, or as Ray tasks.

The one piece every zoo job shares (building members, measuring them): a list of
argument tuples, a function of one tuple, and a backend. Results are yielded as
``(args, result)`` as tasks finish, in any order; the caller writes them, so
only the driver touches the output directory.

* ``local``, ``workers=1``: tasks run one after another in this process.
* ``local``, ``workers=K``: a pool of K spawned processes.
* ``ray``: one Ray task per argument tuple (``ray.init(address=...)``, or the Ray
  instance already initialised), one CPU each. A task whose worker dies is
  retried by Ray (``max_retries``, :data:`RAY_RETRIES`).

Arguments travel to the workers (pickled): keep them small (a zoo path and ids,
never whole models); workers read what they need from disk.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from typing import Any

from wsym.errors import WsymInputError

BACKENDS = ("local", "ray")
RAY_RETRIES = 3


def check_backend(backend: str, workers: int) -> None:
    """Refuse an unknown ``backend`` or a non-positive ``workers`` (one line each)."""
    if backend not in BACKENDS:
        raise WsymInputError(f"unknown zoo backend {backend!r}; use one of {', '.join(BACKENDS)}")
    if workers < 1:
        raise WsymInputError(f"--workers must be positive, got {workers}")


def run_tasks(
    fn: Callable[..., Any],
    tasks: Sequence[tuple],
    backend: str = "local",
    workers: int = 1,
    address: str | None = None,
) -> Iterator[tuple[tuple, Any]]:
    """``fn(*args)`` for every ``args`` in ``tasks`` on ``backend``; yields ``(args, result)``."""
    check_backend(backend, workers)
    if backend == "ray":
        yield from _ray(fn, tasks, workers, address)
    elif workers == 1 or len(tasks) <= 1:
        for args in tasks:
            yield args, fn(*args)
    else:
        ctx = get_context("spawn")
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            futures = {pool.submit(fn, *args): args for args in tasks}
            for future in as_completed(futures):
                yield futures[future], future.result()


def _ray(fn, tasks, workers, address):
    try:
        import ray
    except ImportError as err:
        raise WsymInputError(
            "the ray backend needs Ray; install it with pip install 'wsym[ray]'"
        ) from err
    if not ray.is_initialized():
        ray.init(address=address, num_cpus=None if address else workers)
    task = ray.remote(num_cpus=1, max_retries=RAY_RETRIES)(fn)
    pending = {task.remote(*args): args for args in tasks}
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1)
        for ref in ready:
            yield pending.pop(ref), ray.get(ref)
