"""textgen.training: planning, a tiny real training run, resuming, time budget and Ctrl-C."""

from __future__ import annotations

import json
import signal
import types
from pathlib import Path

import numpy as np
import pytest
from clock import BatchClock
from helpers import TINY_DATA, TINY_MODEL, plan_run, read_history, steps_per_epoch, write_corpus

from textgen.checkpoint import Run, resume_hint
from textgen.config import Weights
from textgen.device import CPU
from textgen.errors import CheckpointError, ConfigError, TrainingInterrupted
from textgen.model import build_model
from textgen.results import EpochLog, StopReason
from textgen.runs import run_summary
from textgen.settings import DataSettings, ModelSettings, TrainSettings
from textgen.startstate import start_path
from textgen.training.loop import train
from textgen.training.plan import TrainPlan
from textgen.training.progress import NoProgress
from textgen.training.schedules import EarlyStoppingAfterHold, cosine_lr


def new_plan(tmp_path: Path, corpus: Path, **training):
    return plan_run(
        str(corpus),
        CPU,
        checkpoint_dir=tmp_path / "checkpoints",
        run_name="r",
        data=DataSettings(**TINY_DATA),
        model=ModelSettings(**TINY_MODEL),
        training=TrainSettings(**training),
    )


def resume_plan(tmp_path: Path, **training):
    return plan_run(
        None,
        CPU,
        checkpoint_dir=tmp_path / "checkpoints",
        run_name="r",
        resume=True,
        training=TrainSettings(**training),
    )


def test_validation_loss_falls(trained_run) -> None:
    history = read_history(trained_run.run.path)
    assert [row["epoch"] for row in history] == [0, 1, 2, 3]
    first, last = history[0]["val_loss"], history[-1]["val_loss"]
    assert last < 0.85 * first, f"validation loss went from {first:.3f} to {last:.3f}"
    assert history[-1]["loss"] < history[0]["loss"]
    # the best loss reported is the lowest validation loss of any epoch
    assert trained_run.result.best_val_loss == pytest.approx(min(row["val_loss"] for row in history))
    assert trained_run.result.best_val_bpc == pytest.approx(trained_run.result.best_val_loss / np.log(2))


def test_result_and_state(trained_run) -> None:
    result, spe = trained_run.result, trained_run.steps_per_epoch
    assert result.epochs == 4
    assert result.stop_reason == "epochs"
    assert result.chars_per_sec > 0
    state = trained_run.run.load_state()
    assert state.epoch == 4 and state.batch == 0
    assert state.step == 4 * spe
    assert state.finished == "epochs"
    assert all(row["batches"] == spe for row in read_history(trained_run.run.path))


def test_run_directory_contents(trained_run) -> None:
    path = trained_run.run.path
    state = json.loads((path / "state.json").read_text())
    # What sampling the session's run in other tests may have cached beside it (derived, checksummed, rebuilt).
    caches = {start_path(trained_run.run, which).name for which in Weights}
    names = {p.name for p in path.iterdir()} - caches
    expected = {
        "config.json",
        "vocab.json",
        "best.weights.h5",
        "state.json",
        "history.csv",
        "batch_losses.csv",
        "loss_curve.txt",
        "loss_curve.svg",
        "tensorboard",
        ".lock",
    }
    assert expected | {state["last_weights"], state["optimizer"]} == names  # and no stale or temporary files
    assert state["last_weights"].startswith("last-") and state["last_weights"].endswith(".weights.h5")
    assert state["optimizer"].startswith("optimizer-") and state["optimizer"].endswith(".npz")
    assert (path / "tensorboard").is_dir() and any((path / "tensorboard").rglob("*"))
    config = json.loads((path / "config.json").read_text())
    assert config["model"]["units"] == TINY_MODEL["units"]
    assert config["data"]["batch_size"] == TINY_DATA["batch_size"]
    assert config["data"]["corpus"] == str(trained_run.corpus)  # as given; read by its real path
    assert config["data"]["files"] == [str(trained_run.corpus.resolve())]
    assert config["profile"]["name"] == "cpu"


def test_optimizer_file_holds_the_step_count(trained_run) -> None:
    state = trained_run.run.load_state()
    with np.load(trained_run.run.path / state.optimizer) as saved:
        assert int(saved["arr_0"]) == state.step  # Adam's iteration counter comes first


def test_resume_continues_where_it_stopped(tmp_path: Path, tiny_corpus: Path) -> None:
    # The plateau schedule leaves a steady learning rate alone, so the marked rate below shows
    # whether the optimizer state was restored (the cosine schedule would overwrite it each batch).
    first = train(new_plan(tmp_path, tiny_corpus, epochs=2, lr_schedule="plateau"))
    run = Run(first.path)
    assert first.epochs == 2
    state = run.load_state()
    step_after_first_part = state.step
    assert step_after_first_part > 0 and state.epoch == 2

    # Mark the saved optimizer state: a resumed run must continue with it, not with a fresh optimizer.
    opt_path = run.path / state.optimizer
    with np.load(opt_path) as saved:
        values = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    assert values[1] == pytest.approx(2e-3)  # Adam's learning rate follows the iteration counter
    values[1] = np.asarray(1e-4, dtype=values[1].dtype)
    with open(opt_path, "wb") as fh:
        np.savez(fh, *values)

    plan = resume_plan(tmp_path, epochs=4)
    assert plan.resume_state.epoch == 2
    assert plan.config.training.epochs == 4
    second = train(plan)
    assert second.epochs == 4
    assert second.stop_reason == "epochs"

    history = read_history(run.path)
    assert [row["epoch"] for row in history] == [0, 1, 2, 3]
    assert run.history_path.read_text().count("epoch,") == 1  # one header: the history was appended to
    assert all(row["learning_rate"] == pytest.approx(2e-3) for row in history[:2])
    assert all(row["learning_rate"] <= 1e-4 * 1.0001 for row in history[2:])  # restored, maybe cut further
    state = run.load_state()
    assert state.step == 2 * step_after_first_part  # the optimizer's step counter continued
    assert state.epoch == 4 and state.finished == "epochs"
    assert second.best_val_loss <= first.best_val_loss


def test_resume_keeps_the_optimizer_state_when_the_best_epoch_is_older(tmp_path: Path, tiny_corpus: Path) -> None:
    """best.weights.h5 from an earlier epoch than the resume point (validation got worse since)."""
    first = train(new_plan(tmp_path, tiny_corpus, epochs=1))
    run = Run(first.path)
    older_best = run.best_weights_path.read_bytes()
    spe = run.load_state().step
    train(resume_plan(tmp_path, epochs=2))
    assert run.load_state().step == 2 * spe
    run.best_weights_path.write_bytes(older_best)  # as if epoch 2 had not improved

    train(resume_plan(tmp_path, epochs=3))
    state = run.load_state()
    assert state.step == 3 * spe  # not rolled back to the best epoch's optimizer step
    assert [row["epoch"] for row in read_history(run.path)] == [0, 1, 2]


def test_interrupt_saves_a_resume_point_mid_epoch(tmp_path: Path, tiny_corpus: Path) -> None:
    class CtrlCAtBatch3(NoProgress):
        ended = False

        def batch_end(self, batch: int, loss: float) -> None:
            if batch == 3:
                signal.raise_signal(signal.SIGINT)  # what Ctrl-C does

        def end(self) -> None:
            self.ended = True  # a live display stops here (and gives the terminal its cursor back)

    plan = new_plan(tmp_path, tiny_corpus, epochs=2)
    spe = steps_per_epoch(len(plan.splits.train), TINY_DATA["batch_size"], TINY_DATA["seq_len"])
    handler_before = signal.getsignal(signal.SIGINT)
    ctrl_c = CtrlCAtBatch3()
    with pytest.raises(TrainingInterrupted) as info:
        train(plan, ctrl_c)
    assert ctrl_c.ended, "the progress display was not told that training ended"
    assert info.value.exit_code == 130
    message = str(info.value)
    assert "stopped at epoch 1, batch 4/" in message
    assert "--resume" in message, f"the message should say how to continue: {message!r}"
    assert f"textgen train --resume --run r --checkpoint-dir {tmp_path / 'checkpoints'}" in message
    assert signal.getsignal(signal.SIGINT) is handler_before  # the training handler was removed

    run = plan.run
    state = run.load_state()
    assert (state.epoch, state.batch, state.step) == (0, 4, 4)
    assert not run.history_path.exists() or read_history(run.path) == []

    resumed = resume_plan(tmp_path)
    assert (resumed.resume_state.epoch, resumed.resume_state.batch) == (0, 4)
    result = train(resumed)
    assert result.epochs == 2
    rows = read_history(run.path)
    assert [row["epoch"] for row in rows] == [0, 1]
    assert rows[0]["batches"] == spe  # the row covers the whole epoch: the 4 batches before Ctrl-C were saved with it
    assert run.load_state().step == 2 * spe


def assert_same_last_weights(first: Run, second: Run) -> None:
    """The two runs' last weights, the same up to float32 rounding."""
    weights = []
    for run in (first, second):
        model = build_model(run.load_config().model, 1)
        run.load_weights(model, "last")
        weights.append(model.get_weights())
    for a, b in zip(*weights, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


# ~12-17 s each. By default: the default settings (windows shifted each epoch); accumulation with the windows fixed,
# and fixed windows alone, with -m slow (test_shifted_windows_move_each_epoch_by_the_runs_seed is the shift's own).
@pytest.mark.parametrize(
    ("accumulate", "shift_windows"),
    [(1, True), pytest.param(2, False, marks=pytest.mark.slow), pytest.param(1, False, marks=pytest.mark.slow)],
)
def test_a_run_stopped_mid_epoch_and_resumed_ends_where_an_uninterrupted_one_does(
    tmp_path: Path, tiny_corpus: Path, accumulate: int, shift_windows: bool
) -> None:
    """The streams' LSTM states go on from where they were at the stop (each accumulation group's too), as the
    weights, the optimizer, the schedule, the dropout masks and the epoch's shift of the windows do: the same
    updates as without the stop."""
    import keras

    class CtrlCAtBatch5(NoProgress):
        def batch_end(self, batch: int, loss: float) -> None:
            if batch == 5:
                signal.raise_signal(signal.SIGINT)

    data = {"batch_size": 4, "seq_len": 16, "shift_windows": shift_windows}
    training = {"epochs": 2, "accumulate": accumulate, "lr_schedule": "cosine"}
    model = {**TINY_MODEL, "dropout": 0.1}
    runs = {}
    for name, stops in (("straight", False), ("stopped", True)):
        plan = plan_run(str(tiny_corpus), CPU, checkpoint_dir=tmp_path / name, run_name="r", data=DataSettings(**data),
                             model=ModelSettings(**model), training=TrainSettings(**training))  # fmt: skip
        keras.utils.set_random_seed(0)
        if stops:
            with pytest.raises(TrainingInterrupted, match="stopped at epoch 1, batch 6/"):
                train(plan, CtrlCAtBatch5())
            plan = plan_run(None, CPU, checkpoint_dir=tmp_path / name, run_name="r", resume=True)
        train(plan)
        runs[name] = plan.run
    assert_same_last_weights(*runs.values())


# ~13-17 s each; two accumulation groups with -m slow (resuming mid-epoch tests putting their states back).
@pytest.mark.parametrize("accumulate", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_validating_mid_epoch_leaves_training_as_it_was(tmp_path: Path, tiny_corpus: Path, accumulate: int) -> None:
    """An interim validation (tune's, for its pruner) runs the streams through the validation split; the training
    streams' states (each accumulation group's too) are put back, so the run makes the same updates as without
    it. It is never asked for after an epoch's last batch, where the epoch's own validation follows."""
    import keras

    class EveryTenthBatch:
        def __init__(self) -> None:
            self.asked: list[float] = []
            self.reports: list[tuple[float, float]] = []

        def due(self, seconds: float) -> bool:
            self.asked.append(seconds)
            return len(self.asked) % 10 == 0

        def should_stop(self, seconds: float, val_loss: float) -> bool:
            self.reports.append((seconds, val_loss))
            return False

    data = {"batch_size": 4, "seq_len": 16}
    training = {"epochs": 2, "accumulate": accumulate, "lr_schedule": "cosine"}
    model = {**TINY_MODEL, "dropout": 0.1}
    runs, interim = {}, EveryTenthBatch()
    for name, validating in (("straight", None), ("validating", interim)):
        plan = plan_run(str(tiny_corpus), CPU, checkpoint_dir=tmp_path / name, run_name="r", data=DataSettings(**data),
                             model=ModelSettings(**model), training=TrainSettings(**training))  # fmt: skip
        keras.utils.set_random_seed(0)
        train(plan, judge=validating)
        runs[name] = plan.run
    spe = runs["straight"].load_state().step // 2
    assert len(interim.asked) == 2 * (spe - 1)  # after every batch but each epoch's last
    # The judge is told every validation: the interim ones, and each epoch's own.
    assert len(interim.reports) == 2 * (spe - 1) // 10 + 2 and all(np.isfinite(v) for _, v in interim.reports)
    assert_same_last_weights(*runs.values())
    losses = [[row["loss"] for row in read_history(run.path)] for run in runs.values()]
    assert losses[1] == pytest.approx(losses[0], rel=1e-6)


def test_a_judge_may_end_training_but_a_stop_signal_that_came_first_wins(tmp_path: Path, tiny_corpus: Path) -> None:
    class Ends(NoProgress):
        ended = False

        def end(self) -> None:
            self.ended = True

    class Judge:
        def __init__(self, prune: bool) -> None:
            self.prune, self.reports = prune, 0

        def due(self, seconds: float) -> bool:
            return True

        def should_stop(self, seconds: float, val_loss: float) -> bool:
            self.reports += 1
            return self.prune

    # Ended mid-epoch by the interim report: the display is closed, the lock released, the run resumable.
    plan, progress = new_plan(tmp_path, tiny_corpus, epochs=2), Ends()
    result = train(plan, progress, judge=Judge(prune=True))
    assert (result.stop_reason, result.epochs) == (StopReason.PRUNED, 0) and progress.ended
    state = plan.run.load_state()
    assert (state.epoch, state.batch, state.finished) == (0, 1, StopReason.PRUNED)
    train(resume_plan(tmp_path))

    class CtrlCWhileValidating(NoProgress):
        def validating(self) -> None:
            signal.raise_signal(signal.SIGINT)

    # Ctrl-C during an interim validation: the stop is answered, with no report (that could end the run instead).
    judge = Judge(prune=True)
    with pytest.raises(TrainingInterrupted, match="stopped at epoch 1, batch 1/"):
        train(new_plan(tmp_path / "2", tiny_corpus, epochs=2), CtrlCWhileValidating(), judge=judge)
    assert judge.reports == 0

    # Ctrl-C during an epoch's validation, then the judge ends training at the epoch's end: the stop wins.
    class NoInterim(Judge):
        def due(self, seconds: float) -> bool:
            return False

    with pytest.raises(TrainingInterrupted, match="stopped after epoch 1"):
        train(new_plan(tmp_path / "3", tiny_corpus, epochs=2), CtrlCWhileValidating(), judge=NoInterim(prune=True))


def test_interrupt_in_the_last_batch_of_an_epoch_finishes_the_epoch(tmp_path: Path, tiny_corpus: Path) -> None:
    """Stopping after the epoch's last batch validates and saves the epoch, instead of a resume point that
    would make the resumed run train an empty epoch."""
    plan = new_plan(tmp_path, tiny_corpus, epochs=3)
    spe = steps_per_epoch(len(plan.splits.train), TINY_DATA["batch_size"], TINY_DATA["seq_len"])

    class CtrlCAtTheLastBatch(NoProgress):
        def batch_end(self, batch: int, loss: float) -> None:
            if batch == spe - 1:
                signal.raise_signal(signal.SIGINT)

    with pytest.raises(TrainingInterrupted, match=r"stopped after epoch 1 \(SIGINT\);"):
        train(plan, CtrlCAtTheLastBatch())
    state = plan.run.load_state()
    assert (state.epoch, state.batch, state.step) == (1, 0, spe)
    rows = read_history(plan.run.path)
    assert [row["batches"] for row in rows] == [spe]
    assert rows[0]["loss"] > 0


def test_a_stop_during_the_last_validation_finishes_the_run_and_says_so(tmp_path: Path, tiny_corpus: Path) -> None:
    """The last epoch just ends (its validation runs, the run is finished), and the result carries the stop, so that
    a caller running more than this run (textgen tune) stops too."""

    class CtrlCWhileValidating(NoProgress):
        def validating(self) -> None:
            signal.raise_signal(signal.SIGINT)

    plan = new_plan(tmp_path, tiny_corpus, epochs=1)
    result = train(plan, CtrlCWhileValidating())
    assert (result.stop_requested, result.epochs) == ("SIGINT", 1)
    assert plan.run.load_state().finished == "epochs"
    assert train(new_plan(tmp_path / "quiet", tiny_corpus, epochs=1)).stop_requested is None


def test_resume_hint() -> None:
    assert resume_hint(Run(Path("checkpoints") / "wp")) == "continue with: textgen train --resume --run wp"
    assert resume_hint(Run(Path("/tmp/ck") / "wp")).endswith("--run wp --checkpoint-dir /tmp/ck")


def test_a_resume_reads_the_runs_config_once(tmp_path: Path, trained_run, monkeypatch: pytest.MonkeyPatch) -> None:
    """Checked, planned and trained, a resumed run's config.json is read once (and written once, extended)."""
    from textgen.checkpoint import Run

    copy = trained_run.copy_to(tmp_path)
    reads: list[Path] = []
    load_config = Run.load_config

    def counted(run: Run):
        reads.append(run.path)
        return load_config(run)

    monkeypatch.setattr(Run, "load_config", counted)
    result = train(
        plan_run(None, CPU, checkpoint_dir=tmp_path, run_name=copy.name, resume=True, training=TrainSettings(epochs=5))
    )
    assert result.epochs == 5
    assert reads == [copy.path]
    monkeypatch.undo()
    assert copy.load_config().training.epochs == 5  # kept for a plain --resume


def test_resume_of_a_finished_run_asks_for_more_epochs(trained_run) -> None:
    with pytest.raises(ConfigError, match="--epochs"):
        plan_run(None, CPU, checkpoint_dir=trained_run.checkpoint_dir, run_name="tiny", resume=True)


def test_a_plan_with_no_epochs_left_trains_nothing(tmp_path: Path, trained_run) -> None:
    copy = trained_run.copy_to(tmp_path)
    before, step = read_history(copy.path), copy.load_state().step
    plan = TrainPlan(copy, copy.load_config(), trained_run.plan.splits, copy.load_state())  # at epoch 4 of 4
    result = train(plan)
    assert result.epochs == 4
    assert read_history(copy.path) == before
    assert copy.load_state().step == step


@pytest.mark.parametrize(
    ("changes", "flag"),
    [
        ({"model": ModelSettings(units=64)}, "--units"),
        ({"model": ModelSettings(layers=2)}, "--layers"),
        ({"data": DataSettings(seq_len=16)}, "--seq-len"),
        ({"data": DataSettings(batch_size=4)}, "--batch-size"),
        ({"training": TrainSettings(lr=0.1)}, "--lr"),
    ],
)
def test_resume_rejects_changed_settings(trained_run, changes: dict, flag: str) -> None:
    with pytest.raises(ConfigError) as info:
        plan_run(None, CPU, checkpoint_dir=trained_run.checkpoint_dir, run_name="tiny", resume=True, **changes)
    message = str(info.value)
    assert flag in message
    assert "cannot change when resuming run 'tiny'" in message
    part, settings = next(iter(changes.items()))
    [field] = settings.given()
    assert f"(it has {flag} {getattr(getattr(trained_run.plan.config, part), field)})" in message


def test_resume_accepts_the_command_that_started_the_run(trained_run) -> None:
    """Rerunning the original command with --resume added repeats the saved settings, which is no change."""
    plan = plan_run(
        str(trained_run.corpus),
        CPU,
        checkpoint_dir=trained_run.checkpoint_dir,
        run_name="tiny",
        resume=True,
        data=DataSettings(**TINY_DATA),
        model=ModelSettings(**TINY_MODEL),
        training=TrainSettings(epochs=9, lr=1e-2),
    )
    assert plan.config.model == trained_run.plan.config.model
    assert plan.config.training.epochs == 9


def test_resume_rejects_another_corpus(trained_run, tmp_path: Path) -> None:
    other = write_corpus(tmp_path / "other.txt", 3000)
    with pytest.raises(ConfigError, match=r"run 'tiny' trains on .*tiny\.txt, not .*other\.txt; drop the corpus"):
        plan_run(str(other), CPU, checkpoint_dir=trained_run.checkpoint_dir, run_name="tiny", resume=True)


def test_resume_accepts_new_epochs_and_time_budget(trained_run) -> None:
    plan = plan_run(
        None,
        CPU,
        checkpoint_dir=trained_run.checkpoint_dir,
        run_name="tiny",
        resume=True,
        model=ModelSettings(units=None),  # flags the user did not give
        training=TrainSettings(epochs=9, time_budget=3600.0),  # more than the run has trained
    )
    assert plan.config.training.epochs == 9
    assert plan.config.training.time_budget == 3600.0
    assert plan.config.model == trained_run.plan.config.model
    assert plan.splits.vocab == trained_run.plan.splits.vocab
    np.testing.assert_array_equal(plan.splits.train, trained_run.plan.splits.train)


def test_the_epochs_and_budget_a_resume_gives_are_saved_with_the_run(trained_run, tmp_path: Path) -> None:
    """A run extended with --epochs (or --time-budget) and stopped again resumes with a plain --resume on the
    extended schedule; how that invocation ran (--save-every, --strategy) is not kept."""
    copy = trained_run.copy_to(tmp_path)
    saved = copy.load_config().training
    extend = {"epochs": 5, "time_budget": 3600.0, "save_every": 7.0}
    train(
        plan_run(None, CPU, checkpoint_dir=tmp_path, run_name=copy.name, resume=True, training=TrainSettings(**extend))
    )
    kept = copy.load_config().training
    assert (kept.epochs, kept.time_budget, kept.save_every) == (5, 3600.0, saved.save_every)
    with pytest.raises(ConfigError, match=r"has done all 5 epochs; add --epochs 15 \(or more\)"):
        plan_run(None, CPU, checkpoint_dir=tmp_path, run_name=copy.name, resume=True)


def test_resume_without_any_run(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="train one first"):
        plan_run(None, CPU, checkpoint_dir=tmp_path / "checkpoints", resume=True)
    with pytest.raises(CheckpointError, match=r"no run 'r' in .*\(runs: none\)"):
        resume_plan(tmp_path)


def test_resume_without_a_name_picks_the_latest_run(trained_run) -> None:
    plan = plan_run(None, CPU, checkpoint_dir=trained_run.checkpoint_dir, resume=True, training=TrainSettings(epochs=5))
    assert plan.run.path == trained_run.run.path


def test_resume_of_a_run_without_a_resume_point_starts_it_cleanly(tmp_path: Path, tiny_corpus: Path) -> None:
    plan = new_plan(tmp_path, tiny_corpus, epochs=1)  # creates the run directory, trains nothing
    plan.lock.release()  # as if the process had died before its first save
    (plan.run.path / "best.weights.h5").write_bytes(b"left by the dead attempt")
    with pytest.raises(CheckpointError, match=r"never saved a resume point.*--resume --run r --checkpoint-dir "):
        plan_run(None, CPU, checkpoint_dir=tmp_path / "checkpoints", resume=True)  # never "the latest"
    resumed = resume_plan(tmp_path)
    assert resumed.resume_state is None and not (plan.run.path / "best.weights.h5").exists()
    assert train(resumed).epochs == 1
    assert plan.run.is_usable()


def test_new_run_with_an_existing_name(trained_run) -> None:
    with pytest.raises(ConfigError) as info:
        plan_run(
            str(trained_run.corpus),
            CPU,
            checkpoint_dir=trained_run.checkpoint_dir,
            run_name="tiny",
            data=DataSettings(**TINY_DATA),
        )
    message = str(info.value)
    assert "run 'tiny' already exists" in message
    assert "--resume" in message


def test_new_run_names_come_from_the_corpus(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "my book.txt", 600)
    kwargs = {"checkpoint_dir": tmp_path / "ck", "data": DataSettings(batch_size=4, seq_len=16)}
    first = plan_run(str(corpus), CPU, **kwargs)
    second = plan_run(str(corpus), CPU, **kwargs)
    assert (first.run.name, second.run.name) == ("my-book", "my-book-2")
    assert first.config.data.batch_size == 4
    assert first.config.model.vocab_size == first.splits.vocab.size


def test_batch_size_defaults_to_the_profile(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "c.txt", 5000)
    plan = plan_run(str(corpus), CPU, checkpoint_dir=tmp_path / "ck", data=DataSettings(seq_len=4))
    assert plan.config.data.batch_size == CPU.batch_size


def test_no_corpus_for_a_new_run(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="give a corpus"):
        plan_run(None, CPU, checkpoint_dir=tmp_path)


def test_time_budget_stops_mid_epoch(tmp_path: Path, tiny_corpus: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = BatchClock(monkeypatch, 1 / 64)
    plan = new_plan(tmp_path, tiny_corpus, time_budget=0.5, epochs=50)  # 32 batches of the first epoch's 48
    assert steps_per_epoch(len(plan.splits.train), TINY_DATA["batch_size"], TINY_DATA["seq_len"]) > 32
    result = train(plan, clock)
    assert (result.stop_reason, result.epochs, result.batches_into_epoch, clock.batches) == ("time_budget", 0, 32, 32)
    assert len(read_history(Run(result.path).path)) == 1
    state = Run(result.path).load_state()
    assert state.finished == "time_budget"
    assert (state.epoch, state.batch, state.seconds) == (0, 32, 0.5)  # one commit: where training stopped
    assert state.epoch_progress is not None and state.epoch_progress.batches == state.batch
    assert Run(result.path).best_weights_path.is_file()


def test_cosine_lr() -> None:
    assert cosine_lr(2e-3, 0.0) == pytest.approx(2e-3)
    assert cosine_lr(2e-3, 0.5) == pytest.approx(1e-3)
    assert cosine_lr(2e-3, 1.0) == pytest.approx(0.0)
    assert cosine_lr(2e-3, 1.7) == pytest.approx(0.0)  # past the horizon it stays at zero
    assert cosine_lr(2e-3, -0.1) == pytest.approx(2e-3)
    # held, then annealed over the last fifth
    assert cosine_lr(2e-3, 0.0, 0.2) == cosine_lr(2e-3, 0.8, 0.2) == pytest.approx(2e-3)
    assert cosine_lr(2e-3, 0.9, 0.2) == pytest.approx(1e-3)
    assert cosine_lr(2e-3, 1.0, 0.2) == pytest.approx(0.0)


@pytest.mark.parametrize("hold_epochs", [0, 4])
def test_early_stopping_does_not_count_the_epochs_before_the_anneal(hold_epochs: int) -> None:
    """Validation best at epoch 1, then stalled: with patience 2, plain early stopping stops at epoch 3; after a
    hold of 4 epochs it stops 2 epochs into the anneal, at epoch 5 (counting from 0), the best still epoch 1's."""
    requested: list[StopReason] = []
    stopping = EarlyStoppingAfterHold(2, holding=lambda epoch: epoch < hold_epochs, request=requested.append)
    model = types.SimpleNamespace(stop_training=False)
    stopping.set_model(model)
    stopping.on_train_begin()
    for epoch, loss in enumerate([2.0, 1.5, 1.6, 1.55, 1.7, 1.6, 1.65, 1.58, 1.59]):
        stopping.on_epoch_end(epoch, {"val_loss": loss})
        if requested:
            break
    assert requested == [StopReason.EARLY_STOPPING] and not model.stop_training  # one channel: the loop's
    assert epoch == (3 if hold_epochs == 0 else 5)
    assert stopping.best == 1.5


# A budget the epochs end long before: with -m slow (6 s; the budget schedules are tested below).
@pytest.mark.parametrize("time_budget", [None, pytest.param(3600.0, marks=pytest.mark.slow)])
def test_cosine_schedule_anneals_over_the_epochs_when_they_end_first(
    tmp_path: Path, tiny_corpus: Path, time_budget: float | None
) -> None:
    plan = new_plan(tmp_path, tiny_corpus, epochs=3, lr_schedule="cosine", patience=5, time_budget=time_budget)
    result = train(plan)
    steps = steps_per_epoch(len(plan.splits.train), TINY_DATA["batch_size"], TINY_DATA["seq_len"])
    history = read_history(Run(result.path).path)
    # The rate logged at an epoch's end is the one its last batch used.
    expected = [cosine_lr(2e-3, ((epoch + 1) * steps - 1) / (3 * steps)) for epoch in range(3)]
    assert [row["learning_rate"] for row in history] == pytest.approx(expected, rel=1e-5)
    assert "lr_schedule" not in Run(result.path).load_state().callbacks  # no plateau cuts on top


# 12-13 s each. By default: each schedule, and --anneal given; the defaults with -m slow (the suite ~10 min).
@pytest.mark.parametrize(
    ("schedule", "given", "anneal"),
    [
        pytest.param("cosine", {}, 1.0, marks=pytest.mark.slow),
        pytest.param("hold", {}, 0.2, marks=pytest.mark.slow),
        ("hold", {"anneal": 0.5}, 0.5),
        ("cosine", {"anneal": 0.5}, 1.0),
    ],
)
def test_a_schedule_with_a_budget_anneals_to_zero_by_the_deadline(
    tmp_path: Path,
    tiny_corpus: Path,
    monkeypatch: pytest.MonkeyPatch,
    schedule: str,
    given: dict[str, float],
    anneal: float,
) -> None:
    """Batch k of the run (counting from 0) uses the rate k / 160 of the way through the schedule, 160 batches being
    the 2.5 s budget: the time budget, not the 50 epochs, sets the schedule, and the last batch runs near zero.
    hold anneals over the run's last --anneal (a fifth unless given); cosine over all of it."""
    clock = BatchClock(monkeypatch, 1 / 64)
    plan = new_plan(tmp_path, tiny_corpus, time_budget=2.5, epochs=50, lr_schedule=schedule, patience=50, **given)
    result = train(plan, clock)
    assert result.stop_reason == "time_budget" and clock.batches == 160
    history = read_history(Run(result.path).path)
    ends = np.cumsum([row["batches"] for row in history])  # each epoch's last batch is batch end - 1
    assert ends[-1] == 160 and len(ends) == 160 // steps_per_epoch(len(plan.splits.train), 8, 32) + 1
    expected = [cosine_lr(2e-3, (end - 1) / 160, anneal) for end in ends]
    assert [row["learning_rate"] for row in history] == pytest.approx(expected, rel=1e-5)
    held = [row["learning_rate"] for row, end in zip(history, ends, strict=True) if end <= (1 - anneal) * 160]
    assert held == pytest.approx([2e-3] * len(held)) and (schedule == "cosine") == (len(held) == 0)


def test_a_run_cut_in_its_first_epoch_is_counted_alike_everywhere(
    tmp_path: Path, tiny_corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A budget that ends the first epoch half-way: the end of training, its loss chart, textgen runs and
    history.csv all count 0 epochs and the batches trained (the chart once said "1 epoch" under "0 epochs")."""
    from rich.console import Console

    from textgen.trainview import show_train_result

    clock = BatchClock(monkeypatch, 1 / 64)  # before the plan, which starts by it
    plan = new_plan(tmp_path, tiny_corpus, time_budget=8 / 64, sample_every=0.0)
    result = train(plan, clock)
    assert result.stop_reason == "time_budget" and steps_per_epoch(len(plan.splits.train), 8, 32) > 8
    console = Console(width=200)
    with console.capture() as shown:
        show_train_result(console, result, as_json=False)
    said = [line for line in shown.get().splitlines() if "0 epochs and 8 batches" in line]
    assert [line.split()[0] for line in said] == ["done", "best"]  # the result's line, and the chart's
    assert "1 epoch" not in shown.get()
    summary = run_summary(plan.run)
    assert (summary.epochs, summary.batches_into_epoch) == (result.epochs, result.batches_into_epoch) == (0, 8)
    (row,) = read_history(plan.run.path)
    assert (row["epoch"], row["batches"], row["partial"]) == (0, 8, 1)  # the first epoch, 8 batches, cut short


def test_the_time_budget_is_the_runs_and_a_resumed_run_trains_for_what_is_left(
    tmp_path: Path, tiny_corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--time-budget counts the run's training across invocations, as --epochs counts its epochs: a run stopped
    and resumed ends when the run has trained that long, its cosine rate going on down (a budget per
    invocation would train another whole budget, annealing over it from a higher rate)."""

    class CtrlCAfterAnEpoch(BatchClock):
        epochs = 0

        def epoch_end(self, log: EpochLog) -> None:
            self.epochs += 1

        def batch_end(self, batch: int, loss: float) -> None:
            super().batch_end(batch, loss)
            if self.epochs:
                signal.raise_signal(signal.SIGINT)

    clock = CtrlCAfterAnEpoch(monkeypatch, 1 / 64)  # before the plan, which starts by it
    plan = new_plan(tmp_path, tiny_corpus, time_budget=600.0, epochs=50, lr_schedule="cosine", patience=50)
    with pytest.raises(TrainingInterrupted):
        train(plan, clock)
    before = plan.run.load_state().seconds
    spe = steps_per_epoch(len(plan.splits.train), TINY_DATA["batch_size"], TINY_DATA["seq_len"])
    assert before == (spe + 1) / 64  # an epoch and the batch Ctrl-C came in
    assert len(read_history(plan.run.path)) == 1
    assert resume_plan(tmp_path).config.training.time_budget == 600.0  # without the flag: the run's budget
    assert resume_plan(tmp_path, more_time=60.0).config.training.time_budget == before + 60.0  # +1m
    config_before = plan.run.config_path.read_text()
    with pytest.raises(
        ConfigError, match=r"has done [\dhms.]+ of training, more than the --time-budget [\dhms.]+ given; add"
    ):
        resume_plan(tmp_path, time_budget=before / 2)  # a budget the run has already spent
    assert plan.run.config_path.read_text() == config_before

    budget = before + 1.0  # the run's new total: 64 batches more
    clock = BatchClock(monkeypatch, 1 / 64)
    result = train(resume_plan(tmp_path, time_budget=budget), clock)
    assert result.stop_reason == "time_budget"
    assert (clock.batches, plan.run.load_state().seconds) == (64, budget)  # not another `before`
    # The epochs it reports are counted as textgen runs and the page count them: complete ones, and batches.
    state, summary = plan.run.load_state(), run_summary(plan.run)
    assert (result.epochs, result.batches_into_epoch) == (summary.epochs, summary.batches_into_epoch)
    assert (result.epochs, result.batches_into_epoch) == (state.epoch, state.batch) == divmod(spe + 1 + 64, spe)
    rates = [row["learning_rate"] for row in read_history(plan.run.path)]
    assert len(rates) > 1 and rates == sorted(rates, reverse=True)
    last = spe + 1 + 64 - 1  # the run's last batch: annealed to zero by the run's deadline
    assert rates[-1] == pytest.approx(cosine_lr(2e-3, last / (budget * 64)), rel=1e-5)

    config_before = plan.run.config_path.read_text()
    with pytest.raises(
        ConfigError,
        match=r"has done [\dhms.]+ of training, its --time-budget [\dhms.]+; add --time-budget \+30m \(that much more\)",
    ):
        resume_plan(tmp_path)
    assert plan.run.config_path.read_text() == config_before  # a refused resume changes nothing
    assert resume_plan(tmp_path, more_time=1800.0).config.training.time_budget == budget + 1800.0  # as suggested


def test_a_run_killed_past_its_budget_before_validating_resumes_only_to_validate(tmp_path: Path) -> None:
    """A kill during the last validation leaves a run that has spent its budget but not validated its last
    (partial) epoch: --resume validates it and finishes, without another update."""
    import dataclasses

    corpus = write_corpus(tmp_path / "longer.txt", 20_000)

    class CtrlCMidEpoch(NoProgress):
        def batch_end(self, batch: int, loss: float) -> None:
            if batch == 2:
                signal.raise_signal(signal.SIGINT)

    plan = new_plan(tmp_path, corpus, time_budget=600.0, epochs=5, lr_schedule="plateau")
    with pytest.raises(TrainingInterrupted):
        train(plan, CtrlCMidEpoch())
    state = plan.run.load_state()
    assert state.finished is None and state.batch == 3
    saved = plan.run.load_config()  # as if the budget had run out at that batch
    plan.run.save_config(
        dataclasses.replace(saved, training=dataclasses.replace(saved.training, time_budget=state.seconds))
    )

    result = train(resume_plan(tmp_path))
    assert result.stop_reason == "time_budget"
    after = plan.run.load_state()
    assert after.step == state.step  # validated, not trained: the plateau schedule's rate would have moved it
    assert after.finished == "time_budget"
    assert [row["epoch"] for row in read_history(plan.run.path)] == [0]


def test_plateau_schedule_cuts_the_rate_when_validation_stalls(tmp_path: Path, tiny_corpus: Path) -> None:
    # A learning rate of 1e-9 leaves the weights, and so the validation loss, where they are:
    # it stalls by construction, and the plateau rule must halve the rate.
    result = train(new_plan(tmp_path, tiny_corpus, epochs=3, lr=1e-9, lr_schedule="plateau", patience=5))
    rates = [row["learning_rate"] for row in read_history(Run(result.path).path)]
    assert rates[0] == pytest.approx(1e-9)
    assert rates[-1] == pytest.approx(0.5e-9)
    assert "lr_schedule" in Run(result.path).load_state().callbacks


# --- gradient accumulation ------------------------------------------------------------------


def first_steps(tmp_path: Path, corpus: Path, name: str, batch_size: int, accumulate: int, steps: int):
    """Losses and weights after ``steps`` updates from the same initial weights."""
    import keras

    from textgen.data import distributed_batches
    from textgen.training.plan import training_layout
    from textgen.training.step import build_trainer

    plan = new_plan_with(tmp_path, corpus, name, {"batch_size": batch_size, "seq_len": 16}, accumulate=accumulate)
    plan.lock.release()
    keras.utils.set_random_seed(0)
    trainer = build_trainer(plan.config)
    layout = training_layout(plan, 0)
    losses = []
    for x, y in distributed_batches(trainer.strategy, plan.splits.train, layout):
        losses.append(float(trainer.train_step(x, y)))
        if len(losses) == steps:
            break
    return layout, losses, trainer.model.get_weights()


def new_plan_with(tmp_path: Path, corpus: Path, name: str, data: dict, **training):
    return plan_run(
        str(corpus),
        CPU,
        checkpoint_dir=tmp_path / "ck",
        run_name=name,
        data=DataSettings(**data),
        model=ModelSettings(**TINY_MODEL),
        training=TrainSettings(**training),
    )


def test_accumulating_two_groups_of_32_streams_is_one_update_of_64(tmp_path: Path) -> None:
    """--batch-size 32 --accumulate 2 reads the same 64 streams as --batch-size 64, each group of 32 carrying its
    own LSTM states across steps, and makes the same updates (the states show from the second step on)."""
    corpus = write_corpus(tmp_path / "c.txt", 6000)
    layout64, losses64, weights64 = first_steps(tmp_path, corpus, "one", 64, 1, steps=6)
    layout32, losses32, weights32 = first_steps(tmp_path, corpus, "two", 32, 2, steps=6)
    assert layout64 == layout32 and layout32.streams == 64
    np.testing.assert_allclose(losses32, losses64, rtol=1e-5)
    for a, b in zip(weights32, weights64, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    assert losses64[-1] < losses64[0]  # and it trains


@pytest.mark.parametrize("accumulate", [1, 2])
def test_shifted_windows_move_each_epoch_by_the_runs_seed(tmp_path: Path, accumulate: int) -> None:
    """--shift-windows: each epoch's layout begins elsewhere in the first window, drawn from the run's seed and the
    epoch (so a resumed epoch, or another worker, lays it out the same), with as many batches every epoch; without
    it, every epoch is the same layout."""
    from textgen.training.plan import training_layout

    corpus = write_corpus(tmp_path / "c.txt", 6000)

    def plan(name: str, shift_windows: bool, seed: int = 0) -> TrainPlan:
        data = {"batch_size": 8, "seq_len": 16, "shift_windows": shift_windows}
        made = new_plan_with(tmp_path, corpus, name, data, accumulate=accumulate, seed=seed)
        made.lock.release()
        return made

    shifted, again, other_seed, fixed = plan("s", True), plan("t", True), plan("u", True, seed=1), plan("f", False)
    layouts = [training_layout(shifted, epoch) for epoch in range(20)]
    assert {layout.streams for layout in layouts} == {8 * accumulate}
    assert len({layout.batches for layout in layouts}) == 1
    assert len({layout.first for layout in layouts}) > 5 and all(0 <= layout.first < 16 for layout in layouts)
    assert layouts == [training_layout(again, epoch) for epoch in range(20)]
    assert layouts != [training_layout(other_seed, epoch) for epoch in range(20)]
    assert {training_layout(fixed, epoch).first for epoch in range(20)} == {0}


def test_resume_with_accumulation_continues_at_an_update_boundary(tmp_path: Path, tiny_corpus: Path) -> None:
    """A stop lands between updates: every resume point holds whole updates (the step counter counts updates)."""

    class CtrlCAtBatch2(NoProgress):
        def batch_end(self, batch: int, loss: float) -> None:
            if batch == 2:
                signal.raise_signal(signal.SIGINT)

    data = {"batch_size": 4, "seq_len": 16}
    plan = new_plan_with(tmp_path, tiny_corpus, "r", data, accumulate=2, epochs=1)
    with pytest.raises(TrainingInterrupted):
        train(plan, CtrlCAtBatch2())
    state = plan.run.load_state()
    assert (state.epoch, state.batch, state.step) == (0, 3, 3)
    result = train(plan_run(None, CPU, checkpoint_dir=tmp_path / "ck", run_name="r", resume=True))
    spe = steps_per_epoch(len(plan.splits.train), 8, 16)
    assert result.epochs == 1 and plan.run.load_state().step == spe


def test_the_stopper_gives_one_reason_in_each_places_order() -> None:
    """Within an epoch a stop signal wins over the judge and the judge over a spent budget; at an epoch's end the
    run's own ends win over a signal, and early stopping over the budget and the last epoch."""
    from textgen.signals import StopSignals
    from textgen.training.stopping import EPOCH_END, MID_EPOCH, Clock, Stopper

    def stopper(trained: float) -> Stopper:
        clock = Clock(before=trained, budget=10.0, agree=lambda stop, seconds: (stop, 0.0))
        return Stopper(clock, StopSignals())

    going = stopper(trained=0.0)
    assert going.check(MID_EPOCH) is None and going.check(EPOCH_END) is None
    spent = stopper(trained=10.0)
    assert spent.check(MID_EPOCH) is StopReason.TIME_BUDGET
    spent.request(StopReason.PRUNED)
    assert spent.check(MID_EPOCH) is StopReason.PRUNED
    spent.signals.requested = "SIGTERM"
    assert spent.check(MID_EPOCH) is StopReason.INTERRUPTED
    assert spent.check(EPOCH_END) is StopReason.TIME_BUDGET and spent.signal_name == "SIGTERM"
    spent.request(StopReason.EARLY_STOPPING)
    assert spent.check(EPOCH_END) is StopReason.EARLY_STOPPING
    last = stopper(trained=0.0)
    last.signals.requested = "SIGINT"
    assert last.check(EPOCH_END) is StopReason.INTERRUPTED
    last.request(StopReason.EPOCHS)
    assert last.check(EPOCH_END) is StopReason.EPOCHS


def test_a_small_text_gets_a_layout_that_fits_it_said_and_saved(tmp_path: Path) -> None:
    from helpers import make_text

    from textgen.errors import CorpusError

    (tmp_path / "book.txt").write_text(make_text(6000)[:19_566], encoding="utf-8")
    plan = plan_run(str(tmp_path / "book.txt"), CPU, checkpoint_dir=tmp_path / "ck")  # 64 x 100 by default
    assert (plan.config.data.batch_size, plan.config.data.seq_len) == (8, 100)
    assert plan.layout_note and "8 streams x 100 characters, not 64 x 100" in plan.layout_note
    assert plan.run.load_config().data.batch_size == 8  # saved: a resume reads the same layout
    plan.lock.release()

    (tmp_path / "scrap.txt").write_text(make_text(100)[:400], encoding="utf-8")
    with pytest.raises(CorpusError, match=r"give a text of at least ([\d,]+) characters") as refused:
        plan_run(str(tmp_path / "scrap.txt"), CPU, checkpoint_dir=tmp_path / "ck")
    least = int(refused.value.args[0].rsplit("at least ", 1)[1].split()[0].replace(",", ""))
    (tmp_path / "enough.txt").write_text(make_text(2 * least)[:least], encoding="utf-8")
    enough = plan_run(str(tmp_path / "enough.txt"), CPU, checkpoint_dir=tmp_path / "ck")  # the size said works
    assert (enough.config.data.batch_size, enough.config.data.seq_len) == (4, 32)
    enough.lock.release()

    given = plan_run(str(tmp_path / "book.txt"), CPU, checkpoint_dir=tmp_path / "ck", data=DataSettings(batch_size=16))
    assert (given.config.data.batch_size, given.config.data.seq_len) == (16, 50)  # a given --batch-size stays
    given.lock.release()


class Recorder(NoProgress):
    def __init__(self) -> None:
        self.logs: list[EpochLog] = []
        self.samples: list[str] = []

    def epoch_end(self, log: EpochLog) -> None:
        self.logs.append(log)

    def sample(self, text: str) -> None:
        self.samples.append(text)


def test_each_epoch_shows_what_the_model_writes_with_its_weights_and_seed(tmp_path: Path, tiny_corpus: Path) -> None:
    from textgen.genconfig import SampleConfig
    from textgen.sampling import Generator
    from textgen.training.preview import SAMPLE_CHARS

    recorder = Recorder()
    result = train(new_plan(tmp_path, tiny_corpus, epochs=2, lr=1e-2, seed=3), recorder)
    assert [len(log.sample or "") for log in recorder.logs] == [SAMPLE_CHARS, SAMPLE_CHARS]
    assert recorder.samples == []  # nothing within so short an epoch
    # The last epoch improved, so the best weights are the ones it sampled: the same text, as textgen sample gives it.
    assert recorder.logs[-1].improved
    again = Generator.from_run(Run(result.path)).generate([""], SampleConfig(length=SAMPLE_CHARS, seed=3))[0]
    assert recorder.logs[-1].sample == again


def test_samples_within_an_epoch_come_every_sample_every_and_none_with_0(
    tmp_path: Path, tiny_corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Clocked(BatchClock, Recorder):
        def __init__(self) -> None:
            Recorder.__init__(self)
            BatchClock.__init__(self, monkeypatch, 1 / 64)

    clock = Clocked()  # before the plan, which starts by it
    plan = new_plan(tmp_path, tiny_corpus, epochs=1, sample_every=8 / 64)  # every 8 batches
    spe = steps_per_epoch(len(plan.splits.train), TINY_DATA["batch_size"], TINY_DATA["seq_len"])
    train(plan, clock)
    assert len(clock.samples) == (spe - 1) // 8  # within the epoch: not after its last batch (the epoch's own)
    assert clock.logs[0].sample

    quiet = Clocked()
    train(new_plan(tmp_path / "quiet", tiny_corpus, epochs=1, sample_every=0), quiet)
    assert quiet.samples == [] and quiet.logs[0].sample is None


def test_a_budget_holds_back_what_the_runs_end_takes(
    tmp_path: Path, tiny_corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The budget is wall-clock: once an epoch end has measured what validating, sampling and saving take, the run
    stops training early enough that its last validation ends by the budget, not a validation later."""

    class SlowValidation(BatchClock):
        def validating(self) -> None:
            self.batches += 40  # each validation takes as long as 40 batches

    clock = SlowValidation(monkeypatch, 1 / 64)
    plan = new_plan(tmp_path, tiny_corpus, time_budget=3.0, epochs=50, patience=50)  # 192 batches' time
    spe = steps_per_epoch(len(plan.splits.train), TINY_DATA["batch_size"], TINY_DATA["seq_len"])
    assert spe + 40 < 192 < 3 * (spe + 40)  # the budget ends within a later epoch
    result = train(plan, clock)
    assert result.stop_reason == "time_budget"
    assert clock.now() <= 3.0  # the last validation included
    assert clock.now() > 3.0 - 40 / 64 - 1 / 64  # and no more held back than it takes


def test_a_budget_without_epochs_has_no_epoch_cap(tmp_path: Path, tiny_corpus: Path) -> None:
    from textgen.config import TrainConfig

    assert TrainConfig.of(time_budget=60.0).epochs is None  # the budget decides
    assert TrainConfig.of(time_budget=60.0, epochs=5).epochs == 5
    assert TrainConfig.of().epochs == 30  # no budget: the default cap
    with pytest.raises(ConfigError, match="--epochs must be a positive integer"):
        TrainConfig(epochs=None)  # neither: a run that would never end


def test_weight_drop_after_without_a_rate_is_refused_not_ignored(tmp_path: Path) -> None:
    corpus = str(write_corpus(tmp_path / "c.txt", 3000))
    with pytest.raises(ConfigError, match=r"--weight-drop-after 2 delays weight-drop, .* add --weight-drop RATE"):
        plan_run(corpus, CPU, checkpoint_dir=tmp_path / "ck", model=ModelSettings(weight_drop_after=2))
    assert not (tmp_path / "ck").exists()  # refused before a run is made
    plan = plan_run(corpus, CPU, checkpoint_dir=tmp_path / "ck", data=DataSettings(**TINY_DATA),
                    model=ModelSettings(**TINY_MODEL, weight_drop=0.0, weight_drop_after=2))  # fmt: skip
    assert plan.config.model.weight_drop_after == 2  # a rate given, 0 included (as a tuning trial gives it)


def test_weight_drop_starts_after_its_epochs_and_a_resume_keeps_the_schedule(tmp_path: Path) -> None:
    """--weight-drop-after N: the first N epochs are the plain run's update for update, the next ones are not; a
    run resumed across the start trains as the uninterrupted one does (the plateau schedule: a rate that does not
    depend on how many epochs a run plans)."""
    corpus = write_corpus(tmp_path / "c.txt", 3000)

    def history(name: str, epochs: int, **model: float) -> list[dict]:
        model_settings = ModelSettings(**TINY_MODEL, **model)
        training = TrainSettings(epochs=epochs, lr_schedule="plateau")
        plan = plan_run(str(corpus), CPU, checkpoint_dir=tmp_path / "ck", run_name=name, data=DataSettings(**TINY_DATA),
                        model=model_settings, training=training)  # fmt: skip
        return read_history(train(plan).path)

    def losses(rows: list[dict]) -> list[tuple[float, float]]:
        return [(row["loss"], row["val_loss"]) for row in rows]

    plain, from_start = history("plain", 2), history("start", 2, weight_drop=0.5)
    delayed = history("delayed", 2, weight_drop=0.5, weight_drop_after=1)
    assert losses(delayed)[0] == losses(plain)[0] != losses(from_start)[0]
    assert losses(delayed)[1] != losses(plain)[1]
    history("resumed", 1, weight_drop=0.5, weight_drop_after=1)
    resumed = plan_run(None, CPU, checkpoint_dir=tmp_path / "ck", run_name="resumed", resume=True,
                       training=TrainSettings(epochs=2))  # fmt: skip
    np.testing.assert_allclose(losses(read_history(train(resumed).path)), losses(delayed), rtol=1e-6)
