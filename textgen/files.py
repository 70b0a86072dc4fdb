"""Atomic file writes (write to a temporary name in the same directory, then rename), and reading a JSON file
that may be damaged."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any


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


MAX_JSON_BYTES = 2**20  # textgen's settings files are a few kB: far more is damage, or not a textgen file


def read_json_object(path: Path, max_bytes: int = MAX_JSON_BYTES) -> dict[str, Any]:
    """The JSON object in ``path``. A file that is not one (more than ``max_bytes``, not UTF-8, not JSON, nested
    too deep, another JSON value) raises ``ValueError`` saying why; one that cannot be read, ``OSError``."""
    with open(path, "rb") as fh:
        raw = fh.read(max_bytes + 1)  # never more: a huge file is refused without filling the memory
    if len(raw) > max_bytes:
        raise ValueError(f"bigger than {max_bytes / 2**20:g} MB")
    return parse_json_object(raw.decode("utf-8-sig"))  # a hand edit may have added a byte order mark


def parse_json_object(text: str) -> dict[str, Any]:
    """The JSON object in ``text``, or ``ValueError`` saying why it is not one."""
    try:
        data = json.loads(text)
    except RecursionError:  # json's parser recurses once per nested list or object
        raise ValueError("nested too deeply") from None
    if not isinstance(data, dict):
        raise ValueError(f"a JSON {_JSON_NAMES.get(type(data), type(data).__name__)}, not an object")
    return data


_JSON_NAMES = {list: "array", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}
