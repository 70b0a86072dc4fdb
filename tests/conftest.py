"""Shared fixtures: tiny generated corpora and one tiny trained run per session."""

from __future__ import annotations

import shutil
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers import TINY_DATA, TINY_MODEL, plan_run, steps_per_epoch, write_corpus
from hypothesis import settings

from textgen.settings import DataSettings, ModelSettings, TrainSettings

# No per-example deadline: the machine is small and shared, and timing is not what these tests check.
settings.register_profile("textgen", deadline=None)
settings.load_profile("textgen")

# Tests send Ctrl-C (SIGINT) to the processes they start. A suite started in the background by a script (`cmd &`)
# has SIGINT ignored, which exec'd children inherit (and Python then leaves ignored): give them the default back.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def no_base_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An installation without the base model: commands given no run fail as they did before it shipped, rather
    than fall back to it (in this process only)."""
    from textgen import basemodel

    monkeypatch.setattr(basemodel, "base_dir", lambda: tmp_path / "no-base-model")


@pytest.fixture
def tiny_corpus(tmp_path: Path) -> Path:
    """About 13,700 characters of random words in tmp_path/tiny.txt."""
    return write_corpus(tmp_path / "tiny.txt", 3000)


@dataclass
class TrainedRun:
    """The session's tiny trained run and how it was made."""

    result: Any  # textgen.results.TrainResult
    plan: Any  # textgen.training.plan.TrainPlan
    checkpoint_dir: Path
    corpus: Path
    steps_per_epoch: int

    @property
    def run(self) -> Any:
        return self.plan.run

    def copy_to(self, dest_dir: Path, name: str | None = None) -> Any:
        """A copy of the run under ``dest_dir`` (to damage or resume without touching the original)."""
        from textgen.checkpoint import Run

        dest = Path(dest_dir) / (name or self.run.name)
        shutil.copytree(self.run.path, dest)
        return Run(dest)


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> TrainedRun:
    """A 4-epoch run of a tiny LSTM on a tiny corpus, trained once per session (a few seconds)."""
    from textgen.device import CPU, apply_profile

    apply_profile(CPU)
    from textgen.training.loop import train

    base = tmp_path_factory.mktemp("trained")
    corpus = write_corpus(base / "tiny.txt", 3000)
    checkpoint_dir = base / "checkpoints"
    plan = plan_run(
        str(corpus),
        CPU,
        checkpoint_dir=checkpoint_dir,
        run_name="tiny",
        data=DataSettings(**TINY_DATA),
        model=ModelSettings(**TINY_MODEL),
        training=TrainSettings(epochs=4, lr=1e-2),  # a tiny model learns fast enough to show in 4 epochs
    )
    result = train(plan)
    spe = steps_per_epoch(len(plan.splits.train), TINY_DATA["batch_size"], TINY_DATA["seq_len"])
    return TrainedRun(result, plan, checkpoint_dir, corpus, spe)
