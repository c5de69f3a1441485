"""Ship the presets, zoos and meta-networks of ``data/`` and ``models/`` inside the wheel.

They live at the checkout's top level (where ``wsym zoo build`` and the benchmarks write
them); a built wheel carries copies under ``wsym/_shipped/`` so that an installed wsym
finds them (:mod:`wsym.io.resources`). Everything else is configured in pyproject.toml.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

SHIPPED = ("data", "models")


class BuildWithShipped(build_py):
    """``build_py`` that also copies ``data/`` and ``models/`` into ``wsym/_shipped/``."""

    def run(self):  # noqa: D102
        super().run()
        root = Path(__file__).resolve().parent
        for name in SHIPPED:
            target = Path(self.build_lib) / "wsym" / "_shipped" / name
            shutil.copytree(root / name, target, dirs_exist_ok=True)


setup(cmdclass={"build_py": BuildWithShipped})
