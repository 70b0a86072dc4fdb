"""Stop signals: Ctrl-C, SIGTERM and SIGHUP asking a long job (training, an export) to stop cleanly, a second one
at once."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@dataclass
class StopSignals:
    """The first stop signal received (the loop finishes its batch, saves and stops)."""

    requested: str | None = None  # e.g. "SIGTERM"
    exit_code: int = 130

    def handle(self, signum: int, frame: Any) -> None:
        if self.requested:  # a second signal: stop now (the last commit stays intact)
            raise KeyboardInterrupt
        self.requested, self.exit_code = signal.Signals(signum).name, 128 + signum


@contextlib.contextmanager
def stop_signals() -> Iterator[StopSignals]:
    """Ctrl-C, SIGTERM (``kill``, ``timeout``, a job scheduler) and SIGHUP (a closed terminal) all ask the
    loop to stop cleanly; a second one interrupts at once."""
    signals = StopSignals()
    if threading.current_thread() is not threading.main_thread():
        yield signals
        return
    previous = {signum: signal.signal(signum, signals.handle) for signum in STOP_SIGNALS}
    try:
        yield signals
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
