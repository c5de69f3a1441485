"""All-or-nothing writes of several files into one folder."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

from wsym.io.checkpoint import new_file_mode


def write_files(directory: Path, writers: Mapping[str, Callable[[Path], None]]) -> None:
    """Write ``directory/name`` with ``writers[name](path)`` for every name, all or nothing.

    Each writer fills a temporary file (same suffix, same directory); only when
    all succeeded are they renamed over their destinations. On failure the
    temporary files (and the directory, if this call created it) are removed.
    """
    created = not directory.exists()
    directory.mkdir(exist_ok=True)
    temps: dict[str, Path] = {}
    try:
        for name, write in writers.items():
            fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{name}.", suffix=Path(name).suffix)
            os.close(fd)
            temps[name] = Path(tmp)
            write(temps[name])
            os.chmod(tmp, new_file_mode())  # mkstemp's 0600, not what the umask gives
            with open(tmp, "rb+") as handle:
                os.fsync(handle.fileno())
        for name, tmp in temps.items():
            os.replace(tmp, directory / name)
    except BaseException:
        for tmp in temps.values():
            tmp.unlink(missing_ok=True)
        if created:
            try:
                directory.rmdir()
            except OSError:
                pass
        raise
