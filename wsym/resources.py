"""Where the artifacts that ship beside the package live (a source checkout's top level)."""

from __future__ import annotations

from pathlib import Path

#: The checkout's top level, holding ``data/`` and ``models/``.
ROOT = Path(__file__).resolve().parents[1]
#: Zoo presets (``data/presets/*.json``).
PRESETS = ROOT / "data" / "presets"
#: Shipped zoos (``data/zoos/<preset>/``).
ZOOS = ROOT / "data" / "zoos"
#: Shipped meta-networks (``models/metanet-<preset>.safetensors``).
MODELS = ROOT / "models"
