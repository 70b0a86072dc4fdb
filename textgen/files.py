"""Atomic file writes: write to a temporary name in the same directory, then rename."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield a temporary path to write; on success it replaces ``path`` in one rename.

    The temporary name keeps ``path``'s suffixes (Keras insists on ``.weights.h5``).
    """
    path = Path(path)
    tmp = path.parent / f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}{''.join(path.suffixes)}"
    # Created like open() creates files (0o666 minus the umask): mkstemp's 0o600 would stay on the result.
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    try:
        yield tmp
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        fsync_path(path.parent)  # the rename itself survives a power cut only once the directory is synced
    finally:
        tmp.unlink(missing_ok=True)


def fsync_path(path: Path) -> None:
    """Sync a file, or a directory's entries (a rename in it survives a power cut only once it is synced)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(path: Path) -> None:
    """Sync every file and directory under ``path`` (and ``path``): before a rename publishes the tree, so a
    power cut cannot leave it published with empty files."""
    for item in [*path.rglob("*"), path]:
        fsync_path(item)


TEMPORARY = re.compile(r"^\..+\.\d+-[0-9a-f]{8}(\.[^/]*)?$")  # the names atomic_path writes to


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
