"""On-disk format of a zoo: manifest, members table and safetensors shards.

::

    DIR/manifest.json        preset (resolved config), seed, generator version,
                             dataset and member split seeds, the members' split,
                             the table's column types
    DIR/members.csv          one row per *finished* member, ordered by id
    DIR/shards/members-AAAAAA-BBBBBB.safetensors
                             state dicts of members AAAAAA..BBBBBB, keys "ID/param";
                             the header metadata holds those members' table rows

**Why CSV.** The table is small (one row per member, a few thousand at most),
is read whole, and must be readable without optional dependencies and diffable
in git. Its schema lives in the manifest (``columns``: name -> ``int`` |
``float`` | ``str`` | ``json``), so reading it back is typed and exact (floats are
written with ``repr``, which round-trips). Parquet would add ``pyarrow`` for no
gain at this size.

**Crash safety.** Every file is written (:mod:`wsym.io.atomic`) to a temporary name in the same
directory, flushed, fsynced and then moved into place with ``os.replace``
(atomic on POSIX): a reader or a resumed build sees the old file or the new
one, never half of one. A shard is written before the table rows that point to
it, and carries its rows in its own metadata, so a build killed between the two
recovers the rows from the shard. The table records only finished members;
each row holds the sha256 of its shard, checked before use.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load, save

from wsym.errors import WsymInputError

MANIFEST, TABLE, SHARDS = "manifest.json", "members.csv", "shards"
METRICS = {
    "train_loss": "float",
    "train_acc": "float",
    "test_loss": "float",
    "test_acc": "float",
    "gap": "float",
    "epoch": "int",
    "steps": "int",
}


def shard_name(ids: list[int]) -> str:
    """File name of the shard holding members ``ids`` (consecutive, ascending)."""
    return f"members-{ids[0]:06d}-{ids[-1]:06d}.safetensors"


def encode_shard(states: dict[int, dict[str, torch.Tensor]], rows: list[dict[str, Any]]) -> bytes:
    """Serialize members' state dicts (keys ``"ID/param"``) and their rows as metadata."""
    tensors = {f"{i}/{k}": v.contiguous() for i, sd in states.items() for k, v in sd.items()}
    return save(tensors, metadata={"rows": json.dumps(rows)})


def decode_shard(data: bytes, where: str) -> tuple[dict[int, dict[str, torch.Tensor]], list[dict]]:
    """Inverse of :func:`encode_shard`; a damaged file raises a one-line ``WsymInputError``."""
    try:
        tensors = load(data)
        rows = json.loads(_metadata(data)["rows"])
    except (SafetensorError, ValueError, KeyError, OSError) as err:
        raise WsymInputError(
            f"corrupt zoo shard {where} ({type(err).__name__}); restore it from a backup "
            "or delete it and its rows in members.csv to retrain those members"
        ) from err
    states: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        member, name = key.split("/", 1)
        states.setdefault(int(member), {})[name] = value
    return states, rows


def sha256(data: bytes) -> str:
    """Hex sha256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def encode_table(rows: list[dict[str, Any]], columns: dict[str, str]) -> bytes:
    """CSV text of ``rows`` with the given columns (floats via ``repr``, json as text)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow(_cell(row[name], kind) for name, kind in columns.items())
    return out.getvalue().encode()


def decode_table(text: str, columns: dict[str, str], where: str) -> list[dict[str, Any]]:
    """Typed rows of a members table written by :func:`encode_table`."""
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    if header != list(columns):
        raise WsymInputError(
            f"members table {where} has columns {header}, expected {list(columns)}; "
            "the zoo directory is damaged or from another wsym version"
        )
    rows = []
    for line in reader:
        try:
            rows.append({n: _parse(c, k) for (n, k), c in zip(columns.items(), line, strict=True)})
        except (ValueError, json.JSONDecodeError) as err:
            raise WsymInputError(f"members table {where} has a malformed row: {err}") from err
    return rows


def read_json(path: Path) -> dict[str, Any]:
    """A JSON file, or a one-line ``WsymInputError`` naming it."""
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise WsymInputError(f"cannot read {path}: {err}; the zoo directory is damaged") from err


def _metadata(data: bytes) -> dict[str, str]:
    n = int.from_bytes(data[:8], "little")
    return json.loads(data[8 : 8 + n])["__metadata__"]


def _cell(value: Any, kind: str) -> str:
    if kind == "json":
        return json.dumps(value, sort_keys=True)
    if kind == "float":
        return repr(float(value))
    return str(value)


def _parse(cell: str, kind: str) -> Any:
    if kind == "int":
        return int(cell)
    if kind == "float":
        return float(cell) if cell not in ("nan", "") else math.nan
    if kind == "json":
        return json.loads(cell)
    return cell
