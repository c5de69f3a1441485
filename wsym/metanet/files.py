"""Meta-network files: one ``.safetensors`` file of tensors, with a JSON config in its metadata.

Both kinds of predictor (one architecture, :mod:`wsym.metanet.predictor`; many,
:mod:`wsym.metanet.park`) are stored this way; the config's ``format`` tells them apart
(:func:`wsym.metanet.load`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, safe_open, save_file

from wsym.errors import WsymInputError
from wsym.io.atomic import atomic_path

#: The metadata key holding the JSON config.
META_KEY = "wsym.metanet"


def write_file(path: str | os.PathLike, net: torch.nn.Module, meta: dict) -> None:
    """``net``'s tensors (float32) and ``meta`` as JSON under :data:`META_KEY`, atomically."""
    path = Path(path)
    if path.suffix != ".safetensors":
        raise WsymInputError(f"meta-network files end in .safetensors, got {path.name}")
    tensors = {k: v.detach().float().contiguous() for k, v in net.state_dict().items()}
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata={META_KEY: json.dumps(meta)})


def read_file(path: str | os.PathLike) -> tuple[dict, dict[str, torch.Tensor]]:
    """``(config, tensors)`` of a file written by :func:`write_file`.

    Raises:
        WsymInputError: missing file, or not a wsym meta-network file.
    """
    path = Path(path)
    if not path.is_file():
        raise WsymInputError(f"meta-network file not found: {path}; check the path")
    try:
        with safe_open(str(path), "pt") as f:
            meta = (f.metadata() or {}).get(META_KEY)
        tensors = load_file(str(path))
    except (SafetensorError, OSError) as err:
        raise WsymInputError(f"cannot read meta-network {path}: {err}; re-save it") from None
    if meta is None:
        raise WsymInputError(
            f"{path} is a safetensors file but not a wsym meta-network (no {META_KEY!r} metadata)"
        )
    return json.loads(meta), tensors
