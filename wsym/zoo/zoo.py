"""A zoo on disk, loaded: manifest, members table, architecture factory, state dicts.

Example:
    >>> import tempfile
    >>> from wsym.zoo import build
    >>> tiny = {"hyperparameters": {"epochs": 1, "train_fraction": 0.05}}
    >>> with tempfile.TemporaryDirectory() as out:
    ...     zoo = build("mnist1d-mlp", members=2, out=out, progress=False, overrides=tiny)
    ...     model = zoo.model(1)
    ...     _ = model.load_state_dict(zoo.state_dict(1))
    ...     print(len(zoo), model(zoo.example_inputs()).shape)
    2 torch.Size([8, 10])
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from wsym.data import Dataset
from wsym.errors import WsymInputError
from wsym.zoo import store
from wsym.zoo.architectures import build_architecture
from wsym.zoo.tasks import load_task

#: Member splits; ``test_arch`` (held-out architectures) only in zoos with architecture blocks.
SPLITS = ("train", "val", "test", "test_arch")


class Zoo:
    """A loaded zoo directory (see :mod:`wsym.zoo.store` for the format).

    Attributes:
        path: the zoo directory.
        manifest: the manifest dict (preset config, seed, versions, member splits).
        table: one dict per finished member, ordered by ``id``.
    """

    def __init__(self, path: Path, manifest: dict[str, Any], table: list[dict[str, Any]]):
        self.path, self.manifest, self.table = path, manifest, table
        self._rows = {row["id"]: row for row in table}
        self._shards: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
        self._data: Dataset | None = None
        self._key_order: dict[str, list[str]] = {}

    def __len__(self) -> int:
        return len(self.table)

    def __repr__(self) -> str:
        return f"Zoo({self.manifest['preset']!r}, members={len(self)}, path={str(self.path)!r})"

    @property
    def ids(self) -> list[int]:
        """Ids of the finished members, ascending."""
        return [row["id"] for row in self.table]

    def row(self, member: int) -> dict[str, Any]:
        """The table row of ``member``."""
        if member not in self._rows:
            raise WsymInputError(
                f"zoo {self.path} has no finished member {member}; it has {len(self)} members "
                f"(ids {self.ids[0] if self.ids else '-'}..{self.ids[-1] if self.ids else '-'})"
            )
        return self._rows[member]

    def model(self, member: int) -> nn.Module:
        """A fresh module of ``member``'s architecture (random weights; load its state dict)."""
        return build_architecture(self.row(member)["architecture"])

    def state_dict(self, member: int) -> dict[str, torch.Tensor]:
        """``member``'s trained weights and buffers (fresh tensors), keyed as its module's."""
        row = self.row(member)
        stored = self._shard(row["shard"], row["shard_sha256"])[member]
        return {k: stored[k].clone() for k in self._keys(row["architecture"])}

    def state_dicts(self, ids: list[int] | None = None) -> list[dict[str, torch.Tensor]]:
        """State dicts of ``ids`` (default: every finished member, in table order)."""
        return [self.state_dict(i) for i in (self.ids if ids is None else ids)]

    def split(self, name: str) -> list[int]:
        """Ids of the finished members in split ``name`` (one of :data:`SPLITS`)."""
        if name not in SPLITS:
            raise WsymInputError(f"unknown member split {name!r}; use one of {', '.join(SPLITS)}")
        return [row["id"] for row in self.table if row["split"] == name]

    def dataset(self) -> Dataset:
        """The dataset the members were trained on (regenerated offline, cached)."""
        if self._data is None:
            self._data = load_task(self.manifest["config"]["dataset"])
        return self._data

    def example_inputs(self, n: int = 8) -> torch.Tensor:
        """The first ``n`` test inputs of the zoo's dataset."""
        return self.dataset().x_test[:n].clone()

    def _keys(self, architecture: dict[str, Any]) -> list[str]:
        """State-dict keys of ``architecture``, in the module's order (safetensors sorts them)."""
        key = json.dumps(architecture, sort_keys=True)
        if key not in self._key_order:
            self._key_order[key] = list(build_architecture(architecture).state_dict())
        return self._key_order[key]

    def _shard(self, name: str, digest: str) -> dict[int, dict[str, torch.Tensor]]:
        if name not in self._shards:
            path = self.path / store.SHARDS / name
            try:
                data = path.read_bytes()
            except OSError as err:
                raise WsymInputError(
                    f"zoo shard {path} is missing ({err.strerror}); restore it or rebuild the zoo"
                ) from err
            if store.sha256(data) != digest:
                raise WsymInputError(
                    f"corrupt zoo shard {path}: its sha256 does not match members.csv; "
                    "restore it from a backup or delete it and its rows to retrain those members"
                )
            self._shards[name] = store.decode_shard(data, str(path))[0]
        return self._shards[name]


def load(path: str | Path) -> Zoo:
    """Load the zoo in directory ``path`` (shards are read lazily, checksummed)."""
    path = Path(path)
    manifest_path = path / store.MANIFEST
    if not manifest_path.is_file():
        raise WsymInputError(
            f"{path} is not a zoo directory (no {store.MANIFEST}); build one with wsym zoo build"
        )
    manifest = store.read_json(manifest_path)
    table_path = path / store.TABLE
    text = table_path.read_text() if table_path.is_file() else ""
    columns = manifest["columns"]
    rows = store.decode_table(text, columns, str(table_path)) if text else []
    return Zoo(path, manifest, sorted(rows, key=lambda r: r["id"]))
