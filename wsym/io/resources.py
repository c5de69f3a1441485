"""Where the artifacts that ship with wsym live: presets, zoos, meta-networks.

In a source checkout they sit at the top level (``data/``, ``models/``), where
``wsym zoo build`` and the benchmarks write them; an installed wheel carries copies
inside the package (``wsym/_shipped/``, copied by ``setup.py`` at build time). The
checkout wins when both exist.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parents[1]
_CHECKOUT = _PACKAGE.parent
_IN_CHECKOUT = (_CHECKOUT / "data" / "presets").is_dir() and (
    _CHECKOUT / "pyproject.toml"
).is_file()
#: The directory holding ``data/`` and ``models/``.
ROOT = _CHECKOUT if _IN_CHECKOUT else _PACKAGE / "_shipped"
#: Zoo presets (``data/presets/*.json``).
PRESETS = ROOT / "data" / "presets"
#: Shipped zoos (``data/zoos/<preset>/``).
ZOOS = ROOT / "data" / "zoos"
#: Shipped meta-networks (``models/metanet-<preset>.safetensors``).
MODELS = ROOT / "models"
