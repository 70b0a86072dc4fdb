"""Long work told as it goes: a ``Track`` hears what is being done, how many characters of it are done, and of how
many. The library calls one where work can take minutes (a long prompt read, dynamic evaluation); the CLI's shows a
progress bar on a terminal (``ui.tracker``)."""

from __future__ import annotations

from collections.abc import Callable

Track = Callable[[str, int, int], None]  # (what, characters done, of how many)


def untracked(what: str, done: int, total: int) -> None:
    """A ``Track`` that tells no one."""
