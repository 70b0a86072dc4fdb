"""A fake training clock: time budgets, the cosine schedule and --save-every as exact batch counts."""

from __future__ import annotations

import types

import pytest

import textgen.train
from textgen.train import NoProgress


class BatchClock(NoProgress):
    """Progress that is also textgen.train's clock: the time advances ``seconds_per_batch`` at each batch's end
    and nowhere else (building, validating and saving take no time), so a run's timing does not depend on how fast
    this machine trains. Pick a power of two for exact sums."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, seconds_per_batch: float) -> None:
        self.batches, self.seconds_per_batch = 0, seconds_per_batch
        monkeypatch.setattr(textgen.train, "time", types.SimpleNamespace(monotonic=self.now))

    def now(self) -> float:
        return self.batches * self.seconds_per_batch

    def batch_end(self, batch: int, loss: float) -> None:
        self.batches += 1
