"""All-or-nothing writes of several files into one folder."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import ExitStack
from pathlib import Path

from wsym.io.atomic import atomic_path


def write_files(directory: Path, writers: Mapping[str, Callable[[Path], None]]) -> None:
    """Write ``directory/name`` with ``writers[name](path)`` for every name, all or nothing.

    Each writer fills a temporary file (same suffix, same directory); only when
    all succeeded are they moved over their destinations (:mod:`wsym.io.atomic`). On
    failure the temporary files (and the directory, if this call created it) are
    removed.
    """
    created = not directory.exists()
    directory.mkdir(exist_ok=True)
    try:
        with ExitStack() as stack:
            temps = {name: stack.enter_context(atomic_path(directory / name)) for name in writers}
            for name, write in writers.items():
                write(temps[name])
    except BaseException:
        if created:
            try:
                directory.rmdir()
            except OSError:
                pass
        raise
