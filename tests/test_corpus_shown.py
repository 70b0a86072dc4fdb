"""A corpus is shown as the user gave it (a link, a relative path), and read by its real path."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers import TINY_DATA, TINY_MODEL, plan_run, write_corpus
from rich.console import Console

from textgen.checkpoint import Run
from textgen.device import CPU
from textgen.runs import run_summary
from textgen.settings import DataSettings, ModelSettings
from textgen.trainview import TrainingDisplay


def _plan(corpus: str | None, checkpoints: Path, run_name: str | None = None, resume: bool = False):
    return plan_run(
        corpus, CPU, checkpoint_dir=checkpoints, run_name=run_name, resume=resume, data=DataSettings(**TINY_DATA),
        model=ModelSettings(**TINY_MODEL),
    )  # fmt: skip


def test_a_linked_corpus_is_shown_as_given_and_read_by_its_real_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = write_corpus(tmp_path / "library" / "pg1400.txt")
    work = tmp_path / "work"
    (work / "books").mkdir(parents=True)
    (work / "books" / "expectations.txt").symlink_to(real)
    monkeypatch.chdir(work)
    plan = _plan("books/expectations.txt", work / "checkpoints")
    plan.lock.release()
    console = Console(width=300, record=True)
    TrainingDisplay(console).start(plan, steps=1)
    assert "corpus    books/expectations.txt (utf-8): " in console.export_text()  # not .../library/pg1400.txt
    assert plan.run.name == "expectations" and run_summary(plan.run).corpus == "expectations.txt"
    data = json.loads(plan.run.config_path.read_text())["data"]
    assert (data["corpus"], data["files"]) == ("books/expectations.txt", [str(real.resolve())])
    # The run is read by the real path: it resumes from anywhere.
    monkeypatch.chdir(tmp_path)
    resumed = _plan(
        None, work / "checkpoints", "expectations", resume=True
    )  # never trained: it starts over, from its files
    resumed.lock.release()
    assert Run(resumed.run.path).load_config().data.paths == (str(real.resolve()),)
    assert os.path.samefile(resumed.config.data.paths[0], real)
