"""A fake training clock: time budgets, the cosine schedule and --save-every as exact batch counts."""

from __future__ import annotations

import types

import pytest

import textgen.training.loop
import textgen.training.resume_point
import textgen.training.stopping
from textgen.training.progress import NoProgress


class BatchClock(NoProgress):
    """Progress that is also the training loop's clock: the time advances ``seconds_per_batch`` at each batch's end
    and nowhere else (building, validating and saving take no time), so a run's timing does not depend on how fast
    this machine trains. Pick a power of two for exact sums."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, seconds_per_batch: float) -> None:
        self.batches, self.seconds_per_batch = 0, seconds_per_batch
        fake = types.SimpleNamespace(monotonic=self.now)
        for module in (textgen.training.loop, textgen.training.resume_point, textgen.training.stopping):
            monkeypatch.setattr(module, "time", fake)
        # Nothing but batches takes time here: a budget holds nothing back for the run's end.
        for constant in ("VALIDATION_TRACE_SECONDS", "SAMPLE_SECONDS", "EXIT_SECONDS"):
            monkeypatch.setattr(textgen.training.loop, constant, 0.0)
        monkeypatch.setattr(textgen.training.loop, "VALIDATION_SPEEDUP", float("inf"))

    def now(self) -> float:
        return self.batches * self.seconds_per_batch

    def batch_end(self, batch: int, loss: float) -> None:
        self.batches += 1
