"""Atomic writes: a reader never sees a partly written file, a failed write leaves nothing.

Every file wsym writes goes through :func:`atomic_path`: the content is written to a
temporary file beside the destination, given the permissions a new file would get
under the umask, flushed to disk (``fsync``) and moved over the destination with
:func:`os.replace`; on any failure the temporary file is removed.
"""

from __future__ import annotations

import ctypes
import os
import shutil
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


@contextmanager
def directory_beside(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A new empty directory beside ``path``, removed if the block fails (or is interrupted).

    Fill it, then move it over ``path`` with :func:`replace_directory` inside the block.
    """
    path = Path(path)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}."))
    try:
        yield tmp
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def replace_directory(new: str | os.PathLike[str], path: str | os.PathLike[str]) -> None:
    """Move the directory ``new`` to ``path``, replacing what is there in one step.

    Where ``path`` exists, the two are swapped by one ``renameat2(RENAME_EXCHANGE)``
    (Linux; elsewhere two renames, with a moment in which ``path`` is missing) and
    the old one is then removed: a reader sees the old directory or the new one,
    never a mixture.

    Example:
        >>> import tempfile
        >>> root = Path(tempfile.mkdtemp())
        >>> (root / "out").mkdir(); _ = (root / "out" / "old.txt").write_text("old")
        >>> (root / "new").mkdir(); _ = (root / "new" / "new.txt").write_text("new")
        >>> replace_directory(root / "new", root / "out")
        >>> sorted(p.name for p in (root / "out").iterdir()), (root / "new").exists()
        (['new.txt'], False)
    """
    new, path = Path(new), Path(path)
    for item in new.iterdir():
        if item.is_file():
            os.chmod(item, new_file_mode())
    os.chmod(new, 0o777 & ~_umask())
    if not path.exists():
        os.replace(new, path)
        return
    if path.is_file() or path.is_symlink():
        raise IsADirectoryError(f"{path} is a file; cannot replace it with a directory")
    if _exchange(new, path):
        shutil.rmtree(new)
        return
    old = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.old."))
    os.replace(path, old / path.name)
    os.replace(new, path)
    shutil.rmtree(old)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically with Linux's ``renameat2``; False where unavailable."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, exchange = -100, 2
    result = renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), exchange)
    return result == 0


def _umask() -> int:
    umask = os.umask(0o022)
    os.umask(umask)
    return umask
