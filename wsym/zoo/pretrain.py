"""The upstream run of a fine-tune zoo: trained once, stored beside the members, reused.

A preset's ``pretrain`` entry (:mod:`wsym.zoo.finetune`) names the upstream task,
architecture, hyperparameters and seed; :func:`pretrained` trains that one model
deterministically, stores it as ``pretrained.safetensors`` in the zoo directory and
reads it back when a build resumes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from wsym.errors import WsymInputError
from wsym.io.atomic import write_atomic
from wsym.zoo import store
from wsym.zoo.batched import Member, train_members
from wsym.zoo.tasks import load_task

#: The file a fine-tune zoo's pretrained model is stored in.
PRETRAINED = "pretrained.safetensors"
_PRETRAIN_KEYS = ("dataset", "architecture", "hyperparameters", "seed")


def pretrain_config(config: dict[str, Any]) -> dict[str, Any]:
    """The preset's ``pretrain`` entry, checked (one-line errors naming what to add)."""
    entry = config.get("pretrain")
    if not isinstance(entry, dict):
        raise WsymInputError(f"zoo preset {config['name']!r} has no pretrain entry")
    missing = [k for k in _PRETRAIN_KEYS if k not in entry]
    if missing:
        raise WsymInputError(f"zoo preset {config['name']!r}: pretrain lacks {', '.join(missing)}")
    return entry


def pretrain(config: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """Train the preset's upstream model once: its state dict and upstream metrics."""
    entry = pretrain_config(config)
    architecture = {**config["architecture"], **entry["architecture"]}
    member = Member(-1, int(entry["seed"]), dict(entry["hyperparameters"]), architecture)
    upstream = {"task": "classification", "dropout_sites": []}
    (trained,) = train_members(upstream, load_task(entry["dataset"]), [member])
    return trained.state_dict, trained.metrics


def pretrained(out: Path, config: dict[str, Any], manifest: dict[str, Any]):
    """The zoo's pretrained state dict: read from ``out`` if stored, else trained and stored.

    Its upstream metrics and the file's sha256 go into ``manifest["pretrained"]``;
    a stored file whose sha256 differs from the manifest's is trained again.
    """
    path = out / PRETRAINED
    recorded = manifest.get("pretrained", {})
    if path.is_file() and store.sha256(path.read_bytes()) == recorded.get("sha256"):
        state, _ = store.decode_shard(path.read_bytes(), str(path))
        return state[-1]
    state, metrics = pretrain(config)
    data = store.encode_shard({-1: state}, [{"id": -1, **metrics}])
    write_atomic(path, data)
    manifest["pretrained"] = {**metrics, "sha256": store.sha256(data)}
    return state
