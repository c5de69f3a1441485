r"""Sharpness of every member of a zoo, and its Kendall tau with the gap, on any backend.

:func:`measure_sharpness` measures each finished member of a zoo directory with
:func:`wsym.sharpness` (each measure at its radius), then Kendall's
:math:`\tau_b` of every measure against the members' gap
(:func:`wsym.sharpness.correlation.kendall`). A member is one task of
:mod:`wsym.zoo.dispatch` (``local``, a process pool, or one Ray task per member,
as ``wsym zoo build``): the task gets the zoo's path and the member id, loads
that member from its safetensors shard (checksummed), detects its symmetries,
measures it in float64 and returns a few floats; whole models never travel
through the driver. The driver alone writes, atomically, one JSON file per
finished member under ``OUT/members/``; run again with the same settings and
the finished members are read, not recomputed. ``OUT/run.json`` holds the
settings and the zoo's identity; ``OUT/tau.json`` the statistics.

Data: the first ``batch`` examples of the zoo's training split, one batch, the
members' training loss (cross-entropy, or the mean squared error of a regression
zoo). A member with ``train_fraction < 1`` trained on a subset of that split.

Memory: a task holds one member in float64 (two copies while measuring) and the
activations of one batch; the driver holds the per-member floats only.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from wsym.detect import detect
from wsym.errors import WsymInputError
from wsym.io.atomic import write_atomic
from wsym.io.progress import Progress
from wsym.sharpness import MEASURES, sharpness
from wsym.sharpness.correlation import Tau, kendall
from wsym.zoo.dispatch import check_backend, run_tasks
from wsym.zoo.zoo import Zoo, load

RUN, TAU, MEMBERS = "run.json", "tau.json", "members"


@dataclass(frozen=True)
class ZooSharpness:
    """Per-member sharpness of a zoo and each measure's Kendall tau with the gap.

    Attributes:
        rows: per member, ascending id: ``id``, ``gap`` and one value per measure.
        tau: per measure, its :class:`~wsym.sharpness.correlation.Tau` with the gap
            (``None`` with fewer than 3 members of finite gap).
    """

    rows: list[dict[str, float]]
    tau: dict[str, Tau | None]


def regression_loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean squared error of a regression zoo's scalar outputs."""
    return ((outputs.squeeze(-1) - targets) ** 2).mean()


#: The members' training loss per zoo task (``manifest["task"]``).
LOSSES = {"classification": nn.functional.cross_entropy, "regression": regression_loss}


def measure_sharpness(
    zoo: str | Path,
    out: str | Path,
    measures: Sequence[str] = ("adaptive", "geodesic-mix"),
    rho: float | Mapping[str, float] = 0.05,
    batch: int = 256,
    steps: int = 10,
    boot: int = 1000,
    backend: str = "local",
    workers: int = 1,
    address: str | None = None,
    progress: bool = True,
) -> ZooSharpness:
    """Measure every finished member of the zoo in ``zoo`` into ``out`` (or resume there).

    Args:
        zoo: zoo directory (:func:`wsym.zoo.build`); on a cluster, a path every node reads.
        out: results directory; created if missing, resumed if it holds this run.
        measures: names from :data:`wsym.sharpness.MEASURES`.
        rho: the radius of every measure, or one per measure (curvature measures ignore it).
        batch: the first ``batch`` training examples, one batch.
        steps: ascent steps of the worst-case measures.
        boot: bootstrap resamples of the tau intervals.
        backend: ``"local"`` or ``"ray"`` (:mod:`wsym.zoo.dispatch`).
        workers: local worker processes, or Ray CPUs when starting a local Ray.
        address: Ray cluster address (``ray.init(address=...)``); ``None`` starts a local one.
        progress: draw a progress bar on stderr.

    Returns:
        A :class:`ZooSharpness`.

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from wsym.zoo import build
        >>> tiny = {"hyperparameters": {"epochs": 30}, "shard_size": 2}
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     zoo = build("diagonal", 4, Path(tmp) / "zoo", progress=False, overrides=tiny)
        ...     run = measure_sharpness(zoo.path, Path(tmp) / "run", ["adaptive"], batch=40,
        ...                             steps=3, boot=20, progress=False)
        >>> [r["id"] for r in run.rows], -1 <= run.tau["adaptive"].tau <= 1
        ([0, 1, 2, 3], True)
    """
    check_backend(backend, workers)
    loaded = load(zoo)
    job = _job(loaded, measures, rho, batch, steps)
    out = Path(out)
    done = _open(out, job)
    todo = [(job, i) for i in loaded.ids if i not in done]
    bar = Progress(len(loaded), "zoo sharpness", done=len(done), unit="members", enabled=progress)
    for (_, member), row in run_tasks(measure_member, todo, backend, workers, address):
        write_atomic(_member_path(out, member), json.dumps(row).encode())
        done[member] = row
        bar.update(1)
    bar.close()
    rows = [done[i] for i in sorted(done)]
    tau = correlate(rows, list(job["rhos"]), boot)
    text = {m: None if t is None else vars(t) for m, t in tau.items()}
    write_atomic(out / TAU, json.dumps({"members": len(rows), "tau": text}, indent=1).encode())
    return ZooSharpness(rows, tau)


def measure_member(job: dict[str, Any], member: int) -> dict[str, float]:
    """One task: load ``member`` of ``job["zoo"]`` from disk, measure it (float64)."""
    zoo = _zoo(job["zoo"])
    model = zoo.model(member).double()
    model.load_state_dict(zoo.state_dict(member))
    model.eval()
    data = zoo.dataset()
    x, y = data.x_train[: job["batch"]], data.y_train[: job["batch"]]
    if x.is_floating_point():
        x = x.double()
    if y.is_floating_point():
        y = y.double()
    spec = detect(model, x[:8])
    loss = LOSSES[zoo.manifest["task"]]
    row = {"id": member, "gap": float(zoo.row(member)["gap"])}
    for m, rho in job["rhos"].items():
        value = sharpness(model, [(x, y)], loss, spec=spec, measure=m, rho=rho, steps=job["steps"])
        row[m] = float(value)
    return row


def correlate(rows: list[dict[str, float]], measures: Sequence[str], boot: int) -> dict:
    """Each measure's Kendall tau with the gap over ``rows`` of finite gap and value."""
    out: dict[str, Tau | None] = {}
    for m in measures:
        pairs = [(r[m], r["gap"]) for r in rows if math.isfinite(r[m]) and math.isfinite(r["gap"])]
        values, gaps = zip(*pairs, strict=True) if pairs else ((), ())
        out[m] = kendall(values, gaps, boot) if len(pairs) >= 3 else None
    return out


def _job(zoo: Zoo, measures, rho, batch: int, steps: int) -> dict[str, Any]:
    unknown = [m for m in measures if m not in MEASURES]
    if unknown or not measures:
        raise WsymInputError(
            f"unknown sharpness measure {', '.join(unknown) or '(none)'}; "
            f"use some of {', '.join(MEASURES)}"
        )
    rhos = dict(rho) if isinstance(rho, Mapping) else {m: float(rho) for m in measures}
    if set(rhos) != set(measures) or not all(r > 0 and math.isfinite(r) for r in rhos.values()):
        raise WsymInputError(
            f"rho must be one positive radius, or one per measure of {', '.join(measures)}; "
            f"got {rho!r}"
        )
    if batch < 1 or steps < 1:
        raise WsymInputError(f"--batch and --steps must be positive, got {batch} and {steps}")
    if zoo.manifest.get("task") not in LOSSES:
        raise WsymInputError(
            f"zoo {zoo.path} has task {zoo.manifest.get('task')!r}; "
            f"sharpness over a zoo needs one of {', '.join(LOSSES)}"
        )
    identity = {k: zoo.manifest[k] for k in ("preset", "seed", "generator_version")}
    return {
        "format": "wsym-zoo-sharpness",
        "zoo": str(Path(zoo.path).resolve()),
        "zoo_identity": identity,
        "rhos": {m: float(rhos[m]) for m in measures},
        "batch": batch,
        "steps": steps,
    }


def _open(out: Path, job: dict[str, Any]) -> dict[int, dict[str, float]]:
    """The finished members of the run in ``out``; creates ``out`` for a new run."""
    path = out / RUN
    if path.is_file():
        old = json.loads(path.read_text())
        same = {k: v for k, v in old.items() if k != "zoo"} == {
            k: v for k, v in job.items() if k != "zoo"
        }
        if not same:
            raise WsymInputError(
                f"{out} holds sharpness of another zoo or other settings ({path}); choose "
                "another --out, or the same zoo, measures, rho, batch and steps to resume"
            )
    elif out.exists() and any(out.iterdir()):
        raise WsymInputError(f"{out} exists, is not empty and holds no run; choose a new --out")
    elif not out.parent.is_dir():
        raise WsymInputError(f"cannot write into {out}: directory {out.parent} does not exist")
    (out / MEMBERS).mkdir(parents=True, exist_ok=True)
    if not path.is_file():
        write_atomic(path, json.dumps(job, indent=1).encode())
    for tmp in (out / MEMBERS).glob(".*"):
        tmp.unlink()  # an interrupted atomic write's leftover
    done = {}
    for p in sorted((out / MEMBERS).glob("member-*.json")):
        row = json.loads(p.read_text())
        done[int(row["id"])] = row
    return done


def _member_path(out: Path, member: int) -> Path:
    return out / MEMBERS / f"member-{member:06d}.json"


@functools.lru_cache(maxsize=2)
def _zoo(path: str) -> Zoo:
    """The zoo in ``path``, loaded once per worker process (shards are read lazily)."""
    return load(path)
