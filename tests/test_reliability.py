"""Whatever happens to a run, it is where it was or further on, never damaged; every bad input is one line.

One section per guarantee: one writer per run, stop signals, kill -9 and periodic resume points,
runs that died early, failing saves, corpus fingerprints and device profiles, bounded values,
user text as data, hostile inputs.
"""

from __future__ import annotations

import errno
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from clock import BatchClock
from helpers import (
    TINY_DATA,
    TINY_MODEL,
    assert_one_line_error,
    invoke,
    plan_run,
    read_history,
    steps_per_epoch,
    subprocess_env,
    wait_for,
    wait_until,
    write_corpus,
)

from textgen.checkpoint import ResumeState, Run
from textgen.device import CPU
from textgen.durations import format_seconds
from textgen.errors import CheckpointError, CorpusError, TrainingDiverged
from textgen.rundirs import find_run
from textgen.runs import run_summaries
from textgen.settings import DataSettings, ModelSettings, TrainSettings
from textgen.training.loop import train

TINY_FLAGS = ["--device", "cpu", "--units", "32", "--embedding-dim", "8", "--batch-size", "4", "--seq-len", "16"]


def start_training(cwd: Path, *args: str) -> tuple[subprocess.Popen, Path]:
    """``textgen train`` in a subprocess, its output going to a file (read with ``wait_for``)."""
    out = cwd / f"out-{time.monotonic_ns()}.txt"
    with open(out, "w") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "textgen", "train", *args],
            cwd=cwd,
            env=subprocess_env(),
            stdout=fh,
            stderr=subprocess.STDOUT,
        )
    return proc, out


def assert_consistent(run: Run) -> ResumeState:
    """The run's committed state names files that exist; its history has one row per epoch, in order."""
    state = run.load_state()
    assert (run.path / state.last_weights).is_file() and (run.path / state.optimizer).is_file()
    rows = read_history(run.path) if run.history_path.exists() else []
    assert [int(r["epoch"]) for r in rows] == list(range(state.epoch)), "history rows duplicated or missing"
    assert [r["epoch"] for r in state.history or ()] == list(range(state.epoch))
    if rows:
        # The best weights may come from an epoch a kill cut before its commit: never worse than the history.
        assert state.best_val_loss <= min(r["val_loss"] for r in rows) + 1e-9
        assert run.best_weights_loss() <= state.best_val_loss + 1e-9  # saved before a commit that failed
    assert not [p.name for p in run.path.iterdir() if p.name.startswith(".") and p.name != ".lock"]
    return state


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    return write_corpus(tmp_path / "tiny.txt", 6000)  # ~27,000 characters: a few seconds an epoch


# --- 1. one writer per run ----------------------------------------------------------------------


def test_a_run_has_one_writer_and_any_number_of_readers(trained_run, tmp_path: Path) -> None:
    run = trained_run.copy_to(tmp_path / "ck")
    lock = run.lock()
    try:
        with pytest.raises(CheckpointError, match=f"being trained by process {os.getpid()}"):
            run.lock()
        with pytest.raises(CheckpointError, match=f"process {os.getpid()}"):
            plan_run(
                None,
                CPU,
                checkpoint_dir=tmp_path / "ck",
                run_name=run.name,
                resume=True,
                training=TrainSettings(epochs=9),
            )
        out = invoke("sample", "--checkpoint-dir", str(tmp_path / "ck"), "--length", "20", "--seed", "1")
        assert out.exit_code == 0, out.stderr  # reading is never blocked
        assert invoke("runs", "--checkpoint-dir", str(tmp_path / "ck")).exit_code == 0
    finally:
        lock.release()
    run.lock().release()  # free again


def test_a_reader_of_the_last_weights_follows_a_commit_made_while_it_opens_them(trained_run, tmp_path: Path) -> None:
    from textgen.model import build_model

    run = trained_run.copy_to(tmp_path / "ck")
    model = build_model(run.load_config().model, 1, stateful=False)
    load = model.load_weights
    committed = run.path / "last-e0099-b000000.weights.h5"

    def commit_then_load(path: Path) -> None:
        """The trainer commits a newer resume point after the reader read state.json, before it opens the file."""
        model.load_weights = load
        state = run.load_state()
        committed.write_bytes((run.path / state.last_weights).read_bytes())
        raw = json.loads(run.state_path.read_text())
        run.state_path.write_text(json.dumps({**raw, "last_weights": committed.name}))
        (run.path / state.last_weights).unlink()
        load(path)

    model.load_weights = commit_then_load
    run.load_weights(model, "last")  # not "corrupt or from another model"
    reference = build_model(run.load_config().model, 1, stateful=False)
    reference.load_weights(committed)
    assert all(np.array_equal(a, b) for a, b in zip(model.get_weights(), reference.get_weights(), strict=True))


def test_a_second_trainer_fails_at_once_naming_the_first(tmp_path: Path, corpus: Path) -> None:
    args = ["tiny.txt", *TINY_FLAGS, "--epochs", "50", "--checkpoint-dir", "ck", "--run", "r"]
    first, out = start_training(tmp_path, *args)
    try:
        wait_for(out, "epoch 1/50", first)
        second = subprocess.run(
            [
                sys.executable,
                "-m",
                "textgen",
                "train",
                "--resume",
                "--run",
                "r",
                "--checkpoint-dir",
                "ck",
                "--device",
                "cpu",
            ],
            cwd=tmp_path,
            env=subprocess_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert second.returncode == 1
        assert f"run 'r' is being trained by process {first.pid}" in second.stderr
        assert "Traceback" not in second.stderr
        assert first.poll() is None  # refused while the first still trains: it did not wait for it
        racer = invoke("train", str(corpus), *TINY_FLAGS, "--checkpoint-dir", str(tmp_path / "ck"), "--run", "r")
        assert_one_line_error(racer, f"run 'r' is being trained by process {first.pid}")
    finally:
        first.send_signal(signal.SIGINT)
        first.wait(timeout=60)


# --- 2. every stop signal saves ------------------------------------------------------------------


# 8 s each: SIGHUP, handled by the same code as SIGTERM, with -m slow.
@pytest.mark.parametrize("sig", [signal.SIGTERM, pytest.param(signal.SIGHUP, marks=pytest.mark.slow)])
def test_sigterm_and_sighup_save_like_ctrl_c(tmp_path: Path, corpus: Path, sig: signal.Signals) -> None:
    proc, out = start_training(
        tmp_path, "tiny.txt", *TINY_FLAGS, "--epochs", "50", "--checkpoint-dir", "ck", "--run", "r"
    )
    wait_for(out, "epoch 1/50", proc)
    proc.send_signal(sig)
    assert proc.wait(timeout=60) == 128 + sig
    text = out.read_text()
    assert f"({sig.name}); saved" in text and " -m textgen train --resume --run r" in text  # as it was started
    assert "Traceback" not in text
    state = assert_consistent(Run(tmp_path / "ck" / "r"))
    assert state.finished is None and state.epoch >= 1


# `textgen sample` that marks the first chunk it has generated, as the engine's spies do (test_engine.py).
SAMPLE_MARKING_ITS_FIRST_CHUNK = """
import sys
from pathlib import Path

from textgen.cli import main
from textgen.sampling import Generator

marker, generate_steps = Path(sys.argv.pop(1)), Generator.generate_steps


def marked(self, *args, **kwargs):
    result = generate_steps(self, *args, **kwargs)
    marker.touch()
    return result


Generator.generate_steps = marked
main()
"""


def test_ctrl_c_stops_a_long_generation_at_once(trained_run, tmp_path: Path) -> None:
    run = trained_run.copy_to(tmp_path / "ck")
    # 40 million characters: ~20 minutes of work on 2 busy cores, in chunks the interrupt lands between.
    args = ["sample", "--checkpoint-dir", str(run.path.parent), "--length", "5000000", "--num", "8", "--json"]
    marker = tmp_path / "generating"
    proc = subprocess.Popen(
        [sys.executable, "-c", SAMPLE_MARKING_ITS_FIRST_CHUNK, str(marker), *args],
        cwd=tmp_path,
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        wait_until(lambda: marker.exists() or proc.poll() is not None, "no chunk was generated", timeout=180)
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)  # a small part of what the generation would take
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130
    assert b"interrupted" in err and b"Traceback" not in err


# --- 3. kill -9 at any moment: resume points, history, best weights ----------------------------


def tiny_flags_steps_per_epoch(corpus: Path, tmp_path: Path) -> int:
    """Batches in an epoch of a run trained with ``TINY_FLAGS`` on ``corpus`` (planned aside, nothing trained)."""
    plan = plan_run(
        str(corpus),
        CPU,
        checkpoint_dir=tmp_path / "planned",
        run_name="p",
        data=DataSettings(batch_size=4, seq_len=16),
        model=ModelSettings(units=32, embedding_dim=8),
    )
    plan.lock.release()
    return steps_per_epoch(len(plan.splits.train), 4, 16)


def next_mid_epoch_commit(run: Run, proc: subprocess.Popen, after: tuple[int, int]) -> ResumeState | None:
    """Wait until ``run`` has committed a resume point inside an epoch past ``after`` (epoch, batch), and return it;
    None if ``proc`` ended first. state.json is replaced atomically: it can be read at any moment."""
    found: list[ResumeState] = []

    def committed() -> bool:
        if run.has_state():
            state = run.load_state()
            if state.batch > 0 and (state.epoch, state.batch) > after:
                found.append(state)
                return True
        return proc.poll() is not None

    wait_until(committed, f"no resume point past epoch {after[0] + 1}, batch {after[1]}", timeout=300)
    return found[0] if found else None


def kill_and_resume(tmp_path: Path, corpus: Path, seed: int, kills: int) -> None:
    """Kill -9 the training ``kills`` times, each once it has committed a mid-epoch resume point past the one it
    resumed from (``seed`` draws how many such points to wait for: 2 to 4, the first coming after the first batch,
    which compiles), then let it finish. Each resume starts from exactly the point committed last, and the run ends
    where an uninterrupted one would: 4 epochs of ``spe`` batches each, 4 x ``spe`` optimizer steps (a resume from
    the start of its epoch, or with a fresh optimizer, would not)."""
    rng = random.Random(seed)
    spe = tiny_flags_steps_per_epoch(corpus, tmp_path)
    args = ["tiny.txt", *TINY_FLAGS, "--epochs", "4", "--save-every", "1s", "--checkpoint-dir", "ck", "--run", "r"]
    run = Run(tmp_path / "ck" / "r")
    committed: ResumeState | None = None
    for attempt in range(kills + 1):
        proc, out = start_training(tmp_path, *args, *(["--resume"] if attempt else []))
        if committed is not None:
            wait_for(out, "device", proc)
            started = f"(resuming at epoch {committed.epoch + 1}, {format_seconds(committed.seconds)} trained)"
            assert started in out.read_text()
        if attempt == kills:
            break
        seen = (committed.epoch, committed.batch) if committed else (0, 0)
        for _ in range(rng.randint(2, 4)):
            state = next_mid_epoch_commit(run, proc, seen)
            if state is None:
                break
            seen = (state.epoch, state.batch)
        if proc.poll() is not None:  # it finished first (a later kill: few resume points were left)
            assert attempt > 0, f"the run ended before its first mid-epoch resume point:\n{out.read_text()}"
            break
        proc.kill()  # SIGKILL: no handler runs
        proc.wait(timeout=30)
        committed = run.load_state()
        # Killed as it commits, the run may have a history.csv one row short or a scratch file: the next writer's
        # first act (taking the lock) rewrites the one from state.json and removes the other.
        run.lock().release()
        assert assert_consistent(run) == committed
        assert (committed.epoch, committed.batch) >= seen, "a committed resume point was lost"
        assert committed.step == committed.epoch * spe + committed.batch
    assert proc.wait(timeout=300) == 0, out.read_text()
    state = assert_consistent(run)
    assert (state.epoch, state.finished, state.step) == (4, "epochs", 4 * spe)
    assert [int(row["batches"]) for row in read_history(run.path)] == [spe] * 4


def test_kill_9_then_resume_loses_nothing_committed(tmp_path: Path, corpus: Path) -> None:
    kill_and_resume(tmp_path, corpus, seed=1, kills=1)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [2, 3, 4])
def test_kill_9_many_times(tmp_path: Path, corpus: Path, seed: int) -> None:
    kill_and_resume(tmp_path, corpus, seed=seed, kills=3)


def test_save_every_writes_mid_epoch_resume_points(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--save-every 4 batches' time in a 32-batch budget: a resume point every 4 batches, then the budget's."""
    corpus = write_corpus(tmp_path / "longer.txt", 20_000)
    clock = BatchClock(monkeypatch, 1 / 64)
    plan = plan_run(
        str(corpus),
        CPU,
        checkpoint_dir=tmp_path / "ck",
        run_name="r",
        data=DataSettings(**TINY_DATA),
        model=ModelSettings(**TINY_MODEL),
        training=TrainSettings(epochs=1, save_every=4 / 64, time_budget=0.5),
    )
    saves: list[tuple[int, int]] = []
    original = plan.run.save_resume_point

    def record(model, optimizer, state, *streams):
        saves.append((state.epoch, state.batch))
        original(model, optimizer, state, *streams)

    plan.run.save_resume_point = record
    train(plan, clock)
    # Saved after batches 5, 9, ... (the save is due once 4 batches' time has passed since the last one), then
    # at batch 32 twice: the training, committed before validating, and the epoch, committed with its validation.
    assert saves == [(0, b) for b in (5, 9, 13, 17, 21, 25, 29, 32, 32)]


# --- 4. a run that died early is not a trap --------------------------------------------------------


def test_runs_lists_incomplete_and_damaged_runs_beside_the_others(trained_run, tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    trained_run.copy_to(ck, "good")
    incomplete = trained_run.copy_to(ck, "incomplete")
    for name in ("state.json", "best.weights.h5"):
        (incomplete.path / name).unlink()
    damaged = trained_run.copy_to(ck, "damaged")
    damaged.config_path.write_text("{ not json")
    summaries = {s.run: s for s in run_summaries(ck)}
    assert {k: s.status for k, s in summaries.items()} == {
        "good": "all epochs done",
        "incomplete": "incomplete",
        "damaged": "damaged",
    }
    assert "config.json is corrupt" in (summaries["damaged"].problem or "")
    assert find_run(ck).name == "good"  # the latest usable, though the others are newer
    out = invoke("runs", "--checkpoint-dir", str(ck), "--json")
    assert out.exit_code == 0, out.stderr
    assert {json.loads(line)["run"] for line in out.stdout.splitlines()} == {"good", "incomplete", "damaged"}


# --- 5. saves fail loudly and safely -------------------------------------------------------------


def test_a_failing_save_is_one_line_and_keeps_the_last_resume_point(
    trained_run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = trained_run.copy_to(tmp_path / "ck")
    before = run.state_path.read_bytes()
    plan = plan_run(
        None, CPU, checkpoint_dir=tmp_path / "ck", run_name=run.name, resume=True, training=TrainSettings(epochs=6)
    )

    def disk_full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(np, "savez", disk_full)  # the optimizer file of the next resume point
    with pytest.raises(CheckpointError) as info:
        train(plan)
    message = str(info.value)
    assert "could not save a resume point" in message and "No space left on device" in message
    assert "the last resume point is intact" in message and "--resume" in message
    assert run.state_path.read_bytes() == before
    monkeypatch.undo()
    assert_consistent(run)
    run.lock().release()  # the failed process let go of the run
    result = train(
        plan_run(
            None, CPU, checkpoint_dir=tmp_path / "ck", run_name=run.name, resume=True, training=TrainSettings(epochs=5)
        )
    )
    assert result.epochs == 5


def test_a_failed_write_the_library_does_not_check_is_one_line(
    trained_run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import textgen.api as api

    def disk_full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "ck" / "r" / "loss_curve.txt"))

    monkeypatch.setattr(api, "train", disk_full)
    out = invoke("train", str(trained_run.corpus), *TINY_FLAGS, "--checkpoint-dir", str(tmp_path / "ck"))
    assert_one_line_error(out, "loss_curve.txt: No space left on device")
    assert out.exit_code == 1
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    out = invoke("tune", str(trained_run.corpus), "--checkpoint-dir", str(blocked / "studies"), "--trials", "1")
    assert_one_line_error(out, "cannot write to", "--checkpoint-dir")


def test_leftovers_of_an_interrupted_save_are_removed_by_the_next_writer(trained_run, tmp_path: Path) -> None:
    run = trained_run.copy_to(tmp_path / "ck")
    leftovers = [
        ".state.json.123-0123abcd",
        ".last-e0009-b000001.weights.h5.9-deadbeef.weights.h5",
        "last-e0009-b000001.weights.h5",
    ]
    for name in leftovers:
        (run.path / name).write_bytes(b"partial")
    run.lock().release()
    assert not [name for name in leftovers if (run.path / name).exists()]
    assert_consistent(run)


# --- 6. a run knows its corpus and its profile ---------------------------------------------------


def test_a_changed_corpus_is_refused_for_resume_and_split_evaluation(tmp_path: Path, corpus: Path) -> None:
    plan = plan_run(
        str(corpus),
        CPU,
        checkpoint_dir=tmp_path / "ck",
        run_name="r",
        data=DataSettings(**TINY_DATA),
        model=ModelSettings(**TINY_MODEL),
        training=TrainSettings(epochs=1),
    )
    train(plan)
    with open(corpus, "a", encoding="utf-8") as fh:
        fh.write("one more line\n")
    with pytest.raises(CorpusError, match=r"changed since run 'r' started"):
        plan_run(None, CPU, checkpoint_dir=tmp_path / "ck", run_name="r", resume=True, training=TrainSettings(epochs=2))
    out = invoke("evaluate", "--checkpoint-dir", str(tmp_path / "ck"), "--split", "val")
    assert_one_line_error(out, "changed since run 'r' started", "Restore the original text")
    assert invoke("evaluate", str(corpus), "--checkpoint-dir", str(tmp_path / "ck")).exit_code == 0  # any file is fine


def test_resume_keeps_the_saved_device_profile(trained_run) -> None:
    out = invoke(
        "train", "--resume", "--run", "tiny", "--device", "gpu", "--checkpoint-dir", str(trained_run.checkpoint_dir)
    )
    assert_one_line_error(out, "trained with the cpu profile", "--device cpu")


# --- 7. every value is bounded -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--lr", "nan"], "--lr must be a positive number"),
        (["--lr", "inf"], "--lr must be a positive number"),
        (["--clip-norm", "inf"], "--clip-norm must be a positive number"),
        (["--dropout", "nan"], "--dropout must be in [0, 1)"),
        (["--units", str(2**40)], "--units must be a positive integer up to 2,147,483,647"),
        (["--batch-size", str(2**31)], "--batch-size must be a positive integer"),
        (["--seq-len", str(2**40)], "--seq-len must be a positive integer"),
        (["--embedding-dim", str(2**40)], "--embedding-dim must be a positive integer"),
        (["--layers", str(2**40)], "--layers must be a positive integer"),
        (["--dropout", "-inf"], "--dropout must be in [0, 1)"),
        (["--time-budget", "inf"], "--time-budget must be a duration"),
        (["--epochs", str(2**63)], "--epochs must be a positive integer"),
        (["--seed", str(2**31)], "--seed must be an integer in [0, 2147483647]"),
        (["--units", "100000", "--layers", "8"], "more than this machine's"),
        (["--save-every", "0"], "--save-every must be positive"),
        (["--save-every", "soon"], "--save-every must be a duration"),
    ],
)
def test_bad_training_values(tmp_path: Path, flags: list[str], fragment: str) -> None:
    assert_one_line_error(invoke("train", "x.txt", "--checkpoint-dir", str(tmp_path / "ck"), *flags), fragment)


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--temp", "nan"], "--temp must be 0 (greedy) or between 0.001 and 1000"),
        (["--temp", "inf"], "--temp must be 0 (greedy) or between 0.001 and 1000"),
        (["--temp", "1e-30"], "--temp must be 0 (greedy) or between 0.001 and 1000"),
        (["--top-p", "nan"], "--top-p must be in (0, 1]"),
        (["--top-k", str(2**40)], "--top-k must be 0 (off) or a positive integer"),
        (["--length", str(2**40)], "--length must be a positive integer"),
        (["--length", str(2**30), "--num", "64"], "--length must be such that --length x --num is at most"),
        (["--length", "10", "--num", "5000000"], "--num must be at most 4,096"),  # 5M batch rows of states
        (["--seed", str(2**40)], "--seed must be an integer in [0, 2**31)"),
    ],
)
def test_bad_sampling_values(tmp_path: Path, no_base_model: None, flags: list[str], fragment: str) -> None:
    assert_one_line_error(invoke("sample", "--checkpoint-dir", str(tmp_path / "none"), *flags), fragment)


@pytest.mark.parametrize(
    "line",
    [
        ":temp nan",
        ":temp inf",
        ":temp -inf",
        ":topp nan",
        ":topp inf",
        ":topk 99999999999",
        ":len 99999999999999",
        ":len 2000000000",  # an int32, but more text than this machine's memory cap allows
        ":num 99999999999",
        ":num 5000",
        ":seed 99999999999",
    ],
)
def test_bad_repl_values_warn_and_keep_the_setting(line: str) -> None:
    from test_repl import make_session

    session, _, warnings = make_session()
    before = session.settings
    assert session.handle(line) is True
    assert len(warnings) == 1 and "must be" in warnings[0]
    assert session.settings == before


def test_a_diverging_loss_stops_the_run_and_keeps_the_last_resume_point(
    trained_run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import textgen.training.loop as training

    run = trained_run.copy_to(tmp_path / "ck")
    before, best_before = run.state_path.read_bytes(), run.best_weights_path.read_bytes()
    build = training.build_trainer

    def diverging(*args: object, **kwargs: object) -> training.Trainer:
        trainer = build(*args, **kwargs)
        trainer.train_step = lambda x, y: float("nan")
        return trainer

    monkeypatch.setattr(training, "build_trainer", diverging)
    plan = plan_run(
        None, CPU, checkpoint_dir=tmp_path / "ck", run_name=run.name, resume=True, training=TrainSettings(epochs=6)
    )
    with pytest.raises(TrainingDiverged, match="the loss became nan at epoch 5, batch 1"):
        train(plan)
    assert run.state_path.read_bytes() == before and run.best_weights_path.read_bytes() == best_before


def test_an_error_mid_epoch_leaves_the_weights_where_training_got(
    trained_run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lost worker's save commits the model's weights after the error has ended the callbacks: ending them
    must not have put the best epoch's weights back under that save."""
    import keras
    import tensorflow as tf

    import textgen.training.loop as training

    run = trained_run.copy_to(tmp_path / "ck")
    build = training.build_trainer
    trainers: list[training.Trainer] = []
    at_error: list[list[np.ndarray]] = []

    def failing_after_two_batches(*args: object, **kwargs: object) -> training.Trainer:
        trainer = build(*args, **kwargs)
        step, calls = trainer.train_step, []

        def train_step(x: object, y: object) -> object:
            if len(calls) == 2:
                at_error.append(trainer.model.get_weights())
                raise tf.errors.UnavailableError(None, None, "a peer is gone")
            calls.append(1)
            return step(x, y)

        trainer.train_step = train_step
        trainers.append(trainer)
        return trainer

    monkeypatch.setattr(training, "build_trainer", failing_after_two_batches)
    plan = plan_run(
        None, CPU, checkpoint_dir=tmp_path / "ck", run_name=run.name, resume=True, training=TrainSettings(epochs=6)
    )
    with pytest.raises(tf.errors.UnavailableError):
        train(plan)
    after = trainers[0].model.get_weights()
    assert all(np.array_equal(a, b) for a, b in zip(at_error[0], after, strict=True))
    best = keras.models.clone_model(trainers[0].model)  # not the trainer's: the file holds the optimizer too
    run.load_weights(best, "best")
    assert not all(np.array_equal(a, b) for a, b in zip(best.get_weights(), after, strict=True))


# --- 8. user text is data ------------------------------------------------------------------------


def test_markup_in_prompts_and_file_names_is_printed_as_it_is(trained_run, tmp_path: Path) -> None:
    run = trained_run.copy_to(tmp_path / "ck")
    out = invoke("sample", "--checkpoint-dir", str(run.path.parent), "--prime", "[bold red]the[/] ", "--length", "10")
    assert out.exit_code == 0, out.stderr
    assert out.stdout.startswith("[bold red]the[/] ")
    assert "'['" in out.stderr  # the unknown characters are named, not taken for markup
    book = tmp_path / "[bold]book.txt"
    book.write_text(trained_run.corpus.read_text(encoding="utf-8"), encoding="utf-8")
    out = invoke("train", str(book), *TINY_FLAGS, "--epochs", "1", "--checkpoint-dir", str(tmp_path / "ck2"))
    assert out.exit_code == 0, out.stderr
    assert "[bold]book.txt" in out.stdout


def test_run_names_that_cannot_be_directories_are_refused(tmp_path: Path, corpus: Path) -> None:
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "taken").write_text("a file")
    for name, fragment in (("x" * 300, "--run must be"), ("taken", "exists and is not a run directory")):
        out = invoke("train", str(corpus), *TINY_FLAGS, "--checkpoint-dir", str(tmp_path / "ck"), "--run", name)
        assert_one_line_error(out, fragment)


# --- 9. hostile inputs -----------------------------------------------------------------------------


def test_another_keras_backend_in_the_environment_does_not_break_textgen(trained_run, tmp_path: Path) -> None:
    run = trained_run.copy_to(tmp_path / "ck")
    proc = subprocess.run(
        [sys.executable, "-m", "textgen", "sample", "--checkpoint-dir", str(run.path.parent), "--length", "10"],
        env=subprocess_env(KERAS_BACKEND="jax"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr


def test_run_files_that_disagree_name_the_file(trained_run, tmp_path: Path) -> None:
    run = trained_run.copy_to(tmp_path / "ck")
    run.vocab_path.write_text(json.dumps({"chars": "abc"}), encoding="utf-8")
    out = invoke("sample", "--checkpoint-dir", str(run.path.parent), "--run", run.name)
    assert_one_line_error(out, "vocab.json has 4 ids but config.json's model has")
    assert_one_line_error(invoke("sample", "--checkpoint-dir", str(run.path.parent)), "vocab.json has 4 ids")


def test_a_reader_that_stops_early_and_bytes_the_locale_cannot_decode_are_no_tracebacks(trained_run) -> None:
    repl = [sys.executable, "-m", "textgen", "repl", "--checkpoint-dir", str(trained_run.run.path.parent)]
    proc = subprocess.Popen(
        [*repl, "--length", "5000"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=subprocess_env(),
    )  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    proc.stdin.write(b"the\n" * 50)  # 250 KB of answers: more than the pipe holds
    proc.stdin.close()
    proc.stdout.read(10)  # then stop reading, as `| head -c 10` does
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 1 and not err.strip(), err  # click's exit code for a closed pipe, and quiet
    decoded = subprocess.run(
        [*repl, "--length", "5"],
        input=b"ab\xff\n",
        capture_output=True,
        env=subprocess_env(PYTHONIOENCODING="utf-8:strict"),  # the default under many locales
        timeout=120,
    )
    assert decoded.returncode == 0 and b"Traceback" not in decoded.stderr, decoded.stderr
    assert "'\ufffd'".encode() in decoded.stderr  # the byte is an unknown character, named


# --- 10. legacy encodings are read, and the run remembers which -------------------------------------


def test_a_windows_1252_book_trains_and_the_run_keeps_its_encoding(tmp_path: Path) -> None:
    text = write_corpus(tmp_path / "utf8.txt", 1500).read_text(encoding="utf-8")
    book = tmp_path / "old.txt"
    book.write_bytes(("\u201cQuoted,\u201d she said \u2014 " + text).encode("cp1252"))
    out = invoke(
        "train", str(book), *TINY_FLAGS, "--epochs", "1", "--checkpoint-dir", str(tmp_path / "ck"), "--run", "w"
    )
    assert out.exit_code == 0, out.stderr
    assert f"{book} (cp1252)" in out.stdout
    run = Run(tmp_path / "ck" / "w")
    assert run.load_config().data.encoding == "cp1252"
    assert "\u201c" in run.load_vocab().chars and "\u2014" in run.load_vocab().chars
    forced = invoke("train", str(book), *TINY_FLAGS, "--encoding", "utf-8", "--checkpoint-dir", str(tmp_path / "ck"))
    assert_one_line_error(forced, "is not valid UTF-8", "--encoding auto")


def test_tidying_up_never_deletes_what_a_readable_state_names(trained_run, tmp_path: Path) -> None:
    run = trained_run.copy_to(tmp_path / "ck")
    state = run.load_state()
    run.vocab_path.write_text("{ damaged")  # the run is unusable, but its resume point is still there
    run.lock().release()
    assert (run.path / state.last_weights).is_file() and (run.path / state.optimizer).is_file()
    run.state_path.write_text("{ damaged")
    run.lock().release()
    assert (run.path / state.last_weights).is_file()


# --- found by review: damaged runs, half-written histories, runs without best weights yet -------------


def test_resuming_a_run_with_a_damaged_state_reports_it_and_deletes_nothing(trained_run, tmp_path: Path) -> None:
    run = trained_run.copy_to(tmp_path / "ck")
    best = run.best_weights_path.read_bytes()
    run.state_path.write_text('{"epoch": 4')  # cut short by hand (textgen's own writes are atomic)
    out = invoke("train", "--resume", "--run", run.name, "--device", "cpu", "--checkpoint-dir", str(tmp_path / "ck"))
    assert_one_line_error(out, "state.json is corrupt")
    assert run.best_weights_path.read_bytes() == best and run.history_path.exists()


def test_a_history_one_row_short_is_rewritten_from_the_committed_state(trained_run, tmp_path: Path) -> None:
    run = trained_run.copy_to(tmp_path / "ck")
    lines = run.history_path.read_text().splitlines()
    run.history_path.write_text("\n".join(lines[:-1]) + "\n")  # killed between state.json and history.csv
    run.lock().release()
    assert run.history_path.read_text().splitlines() == lines


def test_sample_skips_a_run_that_has_no_best_weights_yet(trained_run, tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    trained_run.copy_to(ck, "older")
    newer = trained_run.copy_to(ck, "newer")
    newer.best_weights_path.unlink()  # a first mid-epoch resume point, before the first validation
    os.utime(newer.state_path)
    assert find_run(ck).name == "newer"  # usable for --resume and --last
    assert find_run(ck, weights="best").name == "older"
    assert invoke("sample", "--checkpoint-dir", str(ck), "--length", "5").exit_code == 0


def test_resume_accepts_the_same_encoding_spelled_another_way(tmp_path: Path) -> None:
    book = tmp_path / "latin.txt"
    book.write_bytes(write_corpus(tmp_path / "u.txt", 1500).read_text(encoding="utf-8").encode("latin-1"))
    kwargs = {
        "checkpoint_dir": tmp_path / "ck",
        "run_name": "r",
        "data": DataSettings(**TINY_DATA),
        "model": ModelSettings(**TINY_MODEL),
    }
    train(plan_run(str(book), CPU, encoding="latin1", training=TrainSettings(epochs=1), **kwargs))
    plan = plan_run(None, CPU, resume=True, encoding="ISO-8859-1", training=TrainSettings(epochs=2), **kwargs)
    assert plan.config.data.encoding == "iso8859-1"
    plan.lock.release()


def test_a_saved_config_too_big_for_this_machine_still_loads() -> None:
    from textgen.config import ModelConfig, check_fits_in_memory
    from textgen.errors import ConfigError

    big = ModelConfig(vocab_size=100, units=100_000, layers=8)  # a run copied from a bigger machine
    with pytest.raises(ConfigError, match="more than this machine's"):
        check_fits_in_memory(big)
