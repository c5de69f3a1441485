"""Build (or resume) a zoo: plan the shards, train what is missing, write crash-safely.

Member ``i`` of the zoo ``(preset, seed)`` is a function of those two and ``i``
alone: its seed is derived from ``(seed, i)``, its hyperparameters and
architecture are drawn from that seed, its split (train/val/test of the
*members*) from ``(seed, i)`` as well. Members are trained in shards of the
preset's ``shard_size`` consecutive ids; a finished shard is written atomically
and then recorded in the table (:mod:`wsym.zoo.store`). Building again into the
same directory resumes: recorded shards are checked (sha256) and kept, shards
written but not yet recorded are recovered, the rest is trained. Asking for
more members than the directory holds extends the zoo; a directory holding a
different zoo (preset, its config, seed or generator version) is refused.
A preset with a ``pretrain`` entry first trains (or, resuming, reads) its
upstream model (:mod:`wsym.zoo.finetune`), which every member starts from.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from filelock import FileLock, Timeout

import wsym
from wsym.errors import WsymInputError
from wsym.io.atomic import write_atomic
from wsym.io.progress import Progress
from wsym.zoo import finetune, heldout, pretrain, store
from wsym.zoo.backends import plan_member, run_units
from wsym.zoo.presets import load_preset, member_seed
from wsym.zoo.zoo import Zoo, load

#: Bump when a change to training or sampling changes the members a preset and seed produce.
GENERATOR_VERSION = 2
_SPLIT_STREAM = 7


def build(
    preset: str,
    members: int = 100,
    out: str | Path = "zoo",
    seed: int = 0,
    backend: str = "local",
    workers: int = 1,
    progress: bool = True,
    overrides: dict[str, Any] | None = None,
    address: str | None = None,
) -> Zoo:
    """Build the zoo ``preset`` with ``members`` members in ``out``, or resume it there.

    Args:
        preset: bundled preset name (``wsym.zoo.preset_names()``) or a preset JSON path.
        members: number of members (ids ``0..members-1``).
        out: zoo directory; created if missing, resumed if it holds this zoo.
        seed: zoo seed; with the preset it fixes every member bit for bit.
        backend: ``"local"`` or ``"ray"``.
        workers: local worker processes, or Ray CPUs when starting a local Ray.
        progress: draw a progress bar on stderr.
        overrides: preset entries to replace (see :func:`wsym.zoo.presets.load_preset`);
            part of the zoo's identity.
        address: Ray cluster address (``ray.init(address=...)``); ``None`` starts a local one.

    Returns:
        The loaded :class:`~wsym.zoo.Zoo`.
    """
    if members < 1:
        raise WsymInputError(f"--members must be positive, got {members}")
    config = load_preset(preset, overrides)
    out = Path(out)
    with _build_lock(out):
        return _build(out, config, members, seed, backend, workers, progress, address)


@contextmanager
def _build_lock(out: Path) -> Iterator[None]:
    """An exclusive lock on building into ``out``: a second build fails at once, clearly.

    The lock file sits beside the zoo (``.<name>.build.lock``), not inside it, so the
    zoo's own files are untouched.
    """
    if not out.parent.is_dir():
        raise WsymInputError(f"cannot build into {out}: directory {out.parent} does not exist")
    lock = FileLock(out.parent / f".{out.name}.build.lock")
    try:
        lock.acquire(timeout=0)
    except Timeout as err:
        raise WsymInputError(
            f"another `wsym zoo build` is writing to {out} (lock {lock.lock_file}); wait for "
            "it to finish, or build into another --out"
        ) from err
    try:
        yield
    finally:
        lock.release()


def _build(out, config, members, seed, backend, workers, progress, address) -> Zoo:
    manifest = _open(out, config, seed, members)
    upstream = None
    if "pretrain" in config:  # a fine-tune zoo: its upstream model, trained once, stored
        upstream = pretrain.pretrained(out, config, manifest)
        write_atomic(out / store.MANIFEST, json.dumps(manifest, indent=1).encode())
    done = _recover(out, manifest)
    size = int(config["shard_size"])
    units = []
    for start in range(0, members, size):
        ids = [i for i in range(start, min(start + size, members)) if i not in done]
        if ids:
            units.append(ids)
    bar = Progress(
        members, config["name"], done=len(done), unit="members", enabled=progress, interval=0
    )
    unit_config = finetune.unit_config(config, upstream)
    for ids, results in run_units(units, unit_config, seed, backend, workers, address):
        rows = [_row(manifest, config, seed, r) for r in results]
        data = store.encode_shard({r.id: r.state_dict for r in results}, rows)
        name = store.shard_name(ids)
        write_atomic(out / store.SHARDS / name, data)
        digest = store.sha256(data)
        for row in rows:
            done[row["id"]] = {**row, "shard": name, "shard_sha256": digest}
        _write_table(out, manifest, done)
        bar.update(len(ids))
    bar.close()
    return load(out)


def _open(out: Path, config: dict[str, Any], seed: int, members: int) -> dict[str, Any]:
    identity = {
        "format": "wsym-zoo",
        "generator_version": GENERATOR_VERSION,
        "preset": config["name"],
        "seed": seed,
        "config": config,
    }
    path = out / store.MANIFEST
    if path.is_file():
        manifest = store.read_json(path)
        wanted = json.loads(json.dumps(identity))
        differ = [k for k in identity if manifest.get(k) != wanted[k]]
        if differ:
            raise WsymInputError(
                f"{out} holds a different zoo (preset {manifest.get('preset')!r}, seed "
                f"{manifest.get('seed')}; differs in {', '.join(differ)}); "
                "choose another --out, or the same preset, config and seed to resume"
            )
        if members <= manifest["members"]:
            return manifest
    elif out.exists() and any(out.iterdir()):
        raise WsymInputError(
            f"{out} exists, is not empty and holds no zoo; choose an empty or new --out"
        )
    else:
        manifest = {**identity, "columns": _columns(config, seed)}
    manifest.update(_description(config, seed, members))
    (out / store.SHARDS).mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(manifest, indent=1).encode())
    return manifest


def _description(config: dict[str, Any], seed: int, members: int) -> dict[str, Any]:
    fractions = config["member_splits"]
    splits: dict[str, list[int]] = {"train": [], "val": [], "test": []}
    if heldout.blocks(config) is not None:
        splits[heldout.HELDOUT_SPLIT] = []
    for i in range(members):
        splits[member_split(config, seed, i)].append(i)
    regression = config["task"] == "regression"
    architectures = {}
    if heldout.blocks(config) is not None:
        architectures = {"heldout_architectures": heldout.heldout_architectures(config)}
    return {
        "members": members,
        "architecture": config["architecture"],
        "dataset": config["dataset"],
        "task": config["task"],
        "gap": "test_loss - train_loss" if regression else "train_acc - test_acc",
        "split_seeds": {"dataset": config["dataset"].get("seed", 0), "members": seed},
        "member_splits": {"fractions": fractions, **splits},
        **architectures,
        "versions": {"wsym": wsym.__version__, "torch": torch.__version__},
    }


def member_split(config: dict[str, Any], seed: int, member: int) -> str:
    """The split of ``member`` in the zoo ``(config, seed)``.

    A held-out architecture's member is in :data:`~wsym.zoo.heldout.HELDOUT_SPLIT`; the
    others in ``train`` / ``val`` / ``test``, drawn from ``(seed, member)`` by the fractions.
    """
    if heldout.is_heldout(config, member):
        return heldout.HELDOUT_SPLIT
    fractions = config["member_splits"]
    u = member_seed(seed, member, _SPLIT_STREAM) / 2**31
    if u < fractions["train"]:
        return "train"
    return "val" if u < fractions["train"] + fractions["val"] else "test"


def _columns(config: dict[str, Any], seed: int) -> dict[str, str]:
    samples = [plan_member(config, seed, i).hyperparameters for i in range(32)]
    columns = {"id": "int", "split": "str", "seed": "int"}
    for key in config["hyperparameters"]:
        values = [s[key] for s in samples]
        if all(isinstance(v, str) for v in values):
            columns[key] = "str"
        elif all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            columns[key] = "int"
        elif all(isinstance(v, int | float) for v in values):
            columns[key] = "float"
        else:
            columns[key] = "json"
    return {
        **columns,
        "architecture": "json",
        **store.METRICS,
        "shard": "str",
        "shard_sha256": "str",
    }


def _row(manifest: dict[str, Any], config: dict[str, Any], seed: int, result) -> dict[str, Any]:
    plan = plan_member(config, seed, result.id)
    split = member_split(config, seed, result.id)
    row = {"id": result.id, "split": split, "seed": plan.seed, **plan.hyperparameters}
    return {**row, "architecture": plan.architecture, **result.metrics}


def _recover(out: Path, manifest: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """Rows of finished members: the table's, checked, plus those of unrecorded shards."""
    zoo = load(out)
    done = {row["id"]: row for row in zoo.table}
    for name in sorted({row["shard"] for row in zoo.table}):
        path = out / store.SHARDS / name
        if not path.is_file() or store.sha256(path.read_bytes()) != next(
            r["shard_sha256"] for r in zoo.table if r["shard"] == name
        ):
            raise WsymInputError(
                f"corrupt or missing zoo shard {path}: it does not match members.csv; restore "
                "it, or delete it and its rows in members.csv to retrain those members"
            )
    recorded = {row["shard"] for row in zoo.table}
    recovered = False
    for path in sorted((out / store.SHARDS).glob("members-*.safetensors")):
        if path.name in recorded:
            continue
        data = path.read_bytes()
        try:
            _, rows = store.decode_shard(data, str(path))
        except WsymInputError:
            path.unlink()  # never recorded, so no finished member is lost: retrain it
            continue
        for row in rows:
            done[row["id"]] = {**row, "shard": path.name, "shard_sha256": store.sha256(data)}
        recovered = True
    for tmp in (out / store.SHARDS).glob(".*.tmp-*"):
        tmp.unlink()
    if recovered:
        _write_table(out, manifest, done)
    return done


def _write_table(out: Path, manifest: dict[str, Any], done: dict[int, dict[str, Any]]) -> None:
    rows = [done[i] for i in sorted(done)]
    write_atomic(out / store.TABLE, store.encode_table(rows, manifest["columns"]))
