"""Atomic writes: a reader never sees a partly written file, a failed write leaves nothing.

Every file wsym writes goes through :func:`atomic_path`: the content is written to a
temporary file beside the destination, given the permissions a new file would get
under the umask, flushed to disk (``fsync``) and moved over the destination with
:func:`os.replace`; on any failure the temporary file is removed.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary path to write instead of ``path``; moved over it when the block succeeds.

    Example:
        >>> import tempfile
        >>> target = Path(tempfile.mkdtemp()) / "note.txt"
        >>> with atomic_path(target) as tmp:
        ...     _ = tmp.write_text("done")
        >>> target.read_text()
        'done'
    """
    path = Path(path)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=path.suffix)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.chmod(tmp, new_file_mode())  # mkstemp's 0600, not what the umask gives
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (:func:`atomic_path`)."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def new_file_mode() -> int:
    """Permissions of a newly created file under the current umask (``0o644`` for umask 022)."""
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask
