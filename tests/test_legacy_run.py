"""A run directory written by the release before the typed resume state (tests/fixtures/legacy-run, made with a
mid-epoch resume point) resumes, samples and evaluates with today's code."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers import invoke, read_history, write_corpus

from textgen.checkpoint import EpochProgress, Run
from textgen.results import StopReason

FIXTURE = Path(__file__).parent / "fixtures" / "legacy-run"


@pytest.fixture
def legacy_run(tmp_path: Path) -> Run:
    """A copy of the fixture, its corpus written again (the same generated text) and its config pointed at it."""
    corpus = write_corpus(tmp_path / "legacy.txt", 1500, seed=7)
    run = Run(tmp_path / "ck" / "legacy")
    shutil.copytree(FIXTURE, run.path)
    config = json.loads(run.config_path.read_text())
    config["data"]["corpus"] = str(corpus)
    run.config_path.write_text(json.dumps(config))
    return run


def test_its_state_reads_as_a_typed_resume_point(legacy_run: Run) -> None:
    state = legacy_run.load_state()
    assert (state.epoch, state.batch, state.finished) == (1, 54, StopReason.TIME_BUDGET)
    assert state.epoch_progress == EpochProgress(batch=54, loss_sum=pytest.approx(77.92477595806122), batches=54)
    assert state.stream_states == "states-e0001-b000054.npz" and legacy_run.load_stream_states() is not None
    assert state.history is not None and [row["epoch"] for row in state.history] == [0, 1]
    assert state.callbacks["early_stopping"]["best"] == pytest.approx(1.3261779308319093)


def test_it_resumes_mid_epoch_samples_and_evaluates(legacy_run: Run) -> None:
    where = ["--checkpoint-dir", str(legacy_run.path.parent), "--run", "legacy"]
    trained = invoke("train", "--resume", *where, "--time-budget", "30m", "--json")
    assert trained.exit_code == 0, trained.output
    done = json.loads(trained.stdout.splitlines()[-1])
    assert (done["epochs"], done["stop_reason"]) == (4, "epochs")
    rows = read_history(legacy_run.path)
    assert [int(row["epoch"]) for row in rows] == [0, 1, 2, 3]
    assert rows[1]["batches"] == rows[0]["batches"]  # the resumed epoch's row covers all of it
    state = legacy_run.load_state()
    assert (state.epoch, state.batch, state.finished) == (4, 0, StopReason.EPOCHS)

    sampled = invoke("sample", *where, "--length", "40", "--seed", "1", "--json")
    assert sampled.exit_code == 0, sampled.output
    assert len(json.loads(sampled.stdout.splitlines()[-1])["text"]) == 40
    evaluated = invoke("evaluate", *where, "--split", "val", "--json")
    assert evaluated.exit_code == 0, evaluated.output
    assert 0 < json.loads(evaluated.stdout)["nats_per_char"] < 3.4  # below uniform over its 29 characters
