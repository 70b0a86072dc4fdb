"""ui: JSON lines are strict and come from the result dataclasses; stop reasons have one label, used everywhere."""

from __future__ import annotations

import dataclasses
import io
import json
import math
from pathlib import Path

import pytest
from rich.console import Console

from textgen import trainview, tuneview, ui
from textgen.results import (
    EpochLog,
    RunSummary,
    StopReason,
    StudyResult,
    StudyStop,
    TrainResult,
    TrialStatus,
    TrialSummary,
)


def strict(line: str) -> dict:
    def refuse(name: str) -> None:
        raise ValueError(f"{name} is not JSON")

    return json.loads(line, parse_constant=refuse)


def test_json_lines_are_strict_json_even_for_a_diverged_run() -> None:
    log = EpochLog(1, math.nan, math.nan, math.inf, math.inf, 10.0, 1e-3, 5, 2.0, False, True)
    record = strict(ui.json_line(log, event="epoch"))
    assert record["event"] == "epoch" and record["epoch"] == 1
    assert record["loss"] is None and record["val_loss"] is None
    assert record["partial"] is True


def test_json_is_every_field_of_the_result(tmp_path: Path) -> None:
    result = TrainResult("r", tmp_path / "r", 3, 1.5, StopReason.TIME_BUDGET, 12.0, 900.0, 30)
    record = strict(ui.json_line(result, event="done"))
    assert record == {
        "event": "done",
        "run": "r",
        "path": str(tmp_path / "r"),
        "epochs": 3,
        "best_val_loss": 1.5,
        "stop_reason": "time_budget",
        "seconds": 12.0,
        "chars_per_sec": 900.0,
        "max_epochs": 30,
        "session_seconds": 0.0,
        "documents": 1,
        "unknown_chars": 0,
        "chief": True,
        "stop_requested": None,
        "batches_into_epoch": 0,
        "start_val_loss": None,
        "best_val_bpc": pytest.approx(1.5 / math.log(2)),
    }


def test_json_lines_carry_bytes_that_were_not_utf8_as_replacement_characters(tmp_path: Path) -> None:
    """A file name or --prime with a non-UTF-8 byte reaches Python as a lone surrogate, which no UTF-8 stream
    can carry: the line must still encode, and parse."""
    path = tmp_path / "b\udcffd.txt"
    result = TrainResult("r", path, 3, 1.5, StopReason.EPOCHS, 12.0, 900.0, 30)
    line = ui.json_line(result, prime="ab\udcffc", nested={"names": ["x\udc80", 1.0, math.nan]})
    record = strict(line.encode("utf-8").decode("utf-8"))
    assert record["prime"] == "ab\ufffdc" and record["path"] == str(tmp_path / "b\ufffdd.txt")
    assert record["nested"] == {"names": ["x\ufffd", 1.0, None]}


@pytest.mark.parametrize("reason", list(StopReason))
def test_train_and_runs_show_a_stop_reason_with_the_same_label(tmp_path: Path, reason: StopReason) -> None:
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "loss_curve.txt").write_text("chart\n")
    out = io.StringIO()
    console = Console(file=out, width=200)
    trainview.show_train_result(
        console, TrainResult("r", tmp_path / "r", 3, 1.5, reason, 12.0, 900.0, 30), as_json=False
    )
    assert f"done ({reason.label}) after 3 epochs" in out.getvalue()
    summary = RunSummary("r", "c.txt", "1x32", 3, 0, 30, 2.1, 60.0, reason, "cpu", {})
    ui.show_runs(console, [summary], tmp_path, as_json=False)
    assert out.getvalue().splitlines()[-1].rstrip().endswith(reason.label)
    assert len({r.label for r in StopReason}) == len(StopReason)


def test_piped_runs_are_a_header_and_a_line_per_run_and_a_table_on_a_terminal() -> None:
    runs = [
        RunSummary(
            "wp-pruned80", "/a/long/path/to/the/corpora/2600-0.txt", "1x512", 3, 0, 30, 2.1, 60.0,
            StopReason.TIME_BUDGET, True, "cpu", {}, "pruned to 80% from wp",
        ),
        RunSummary("broken", problem="config.json is not JSON"),
    ]  # fmt: skip
    piped = io.StringIO()
    ui.show_runs(Console(file=piped, width=80), runs, Path("ck"), as_json=False)
    lines = piped.getvalue().splitlines()
    assert lines[0].split() == ["run", "corpus", "model", "epochs", "best_val_bpc", "trained", "status", "note"]
    assert len(lines) == 3 and len(lines[1]) > 80  # one line per run, however long: not wrapped at 80 columns
    assert lines[1].startswith("wp-pruned80  /a/long/path") and lines[1].endswith("  pruned to 80% from wp")
    assert lines[0].index("status") == lines[1].index("time budget spent") == lines[2].index("damaged")
    assert lines[2].startswith("broken ") and lines[2].endswith("  config.json is not JSON")
    assert not set("─━│┃┏┡") & set(piped.getvalue())

    terminal = io.StringIO()
    ui.show_runs(Console(file=terminal, width=80, force_terminal=True), runs, Path("ck"), as_json=False)
    assert "─" in terminal.getvalue() and "wp-pruned80: pruned to 80% from wp" in terminal.getvalue()


@pytest.mark.parametrize(
    ("epochs", "reason", "flags"),
    [
        (30, StopReason.EPOCHS, "train 10 more epochs: * --epochs 40"),
        (12, StopReason.TIME_BUDGET, "train 30 more minutes: * --time-budget +30m"),
        # both limits reached in the last epoch
        (30, StopReason.TIME_BUDGET, "train 10 more epochs and 30 more minutes: * --epochs 40 --time-budget +30m"),
        (12, StopReason.EARLY_STOPPING, "continue with: * "),
    ],
)
def test_a_finished_run_is_told_every_flag_it_needs_to_train_further(
    tmp_path: Path, epochs: int, reason: StopReason, flags: str
) -> None:
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "loss_curve.txt").write_text("chart\n")
    out = io.StringIO()
    result = TrainResult("r", tmp_path / "r", epochs, 1.5, reason, 12.0, 900.0, 30)
    trainview.show_train_result(Console(file=out, width=300), result, as_json=False)
    words, flags = flags.split(" * ")
    command = f"textgen train --resume --run r --checkpoint-dir {tmp_path}"
    assert out.getvalue().rstrip().endswith(f"{words} {command}{' ' + flags if flags else ''}")


def test_emoji_codes_in_user_text_are_printed_as_they_are() -> None:
    from textgen.cli import console, err_console

    with console.capture() as out:
        ui.stream_sample(console, ":fire: Moscow", iter([]))
    with err_console.capture() as err:
        ui.warn(err_console, "skipping ':smile:'")
    assert out.get().startswith(":fire: Moscow") and ":smile:" in err.get()


def test_the_live_tune_table_shows_the_latest_trials_that_fit_and_the_whole_table_at_the_end(tmp_path: Path) -> None:
    """A study with more trials than the terminal has rows: the live view keeps the newest rows and the running
    trial's line on screen (the best trial starred even when it has scrolled off); the end prints every trial."""
    recipe = {"units": 64, "layers": 1, "embedding_dim": 16, "dropout": 0.1, "optimizer": "adam", "lr": 0.002}
    trials = [
        TrialSummary(
            n,
            TrialStatus.COMPLETE if n % 3 else TrialStatus.PRUNED,
            recipe,
            1.5 - (0.1 if n == 2 else 0.0),
            60.0,
            f"t{n}",
        )
        for n in range(30)
    ]
    out = io.StringIO()
    console = Console(file=out, width=120, height=12, force_terminal=True, color_system=None)
    display = tuneview.TuneDisplay(console)
    display.trials = trials
    display.running = TrialSummary(30, TrialStatus.RUNNING, recipe, None, 0.0, "t30")
    display.status = "trial 30: epoch 1, batch 3/40"
    with console.capture() as live:
        console.print(display._render())
    lines = live.get().splitlines()
    assert len(lines) == 12 - 1  # the cursor's line left free
    assert lines[0].startswith("... 23 earlier trials") and lines[-1] == "trial 30: epoch 1, batch 3/40"
    assert [line.split()[0] for line in lines[2:-1]] == [str(n) for n in range(23, 31)]
    assert "*" not in live.get()  # the best, trial 2, has scrolled off: no row is starred

    # Stopped by Ctrl-C (no result is shown after it): the live view gives way to every trial.
    stopped = StudyResult(
        "s", tmp_path, ["c.txt"], 60.0, 3600.0, 1800.0, trials, trials[2], None, StudyStop.INTERRUPTED
    )
    display.begin(stopped)
    display.end(stopped)
    after_the_live_view = out.getvalue().rsplit("\x1b[2K", 1)[1]  # what follows its last erased line
    rows = after_the_live_view.splitlines()
    assert [line.split()[0] for line in rows] == ["#", "0", "1", "2*", *map(str, range(3, 30))]


def test_piped_tune_output_is_a_plain_line_per_trial_with_user_text_as_it_is() -> None:
    from textgen.cli import console

    recipe = {"units": 64, "layers": 1, "embedding_dim": 16, "dropout": 0.1, "optimizer": "adam", "lr": 0.002}
    display = tuneview.TuneDisplay(console)  # piped under pytest: no live view
    assert display.live is None
    with console.capture() as out:
        display.trial_end(
            TrialSummary(3, TrialStatus.FAILED, recipe, None, 12.0, "t3", "ValueError: [bold]no[/bold] :fire:")
        )
        display.trial_end(TrialSummary(4, TrialStatus.COMPLETE, recipe, math.log(2), 65.0, "t4"))
    lines = out.get().splitlines()
    assert lines[0].startswith("trial 3 failed: - in 12") and lines[0].endswith("(ValueError: [bold]no[/bold] :fire:)")
    assert lines[1].startswith("trial 4 complete: 1.0000 bits/char in 1m") and "1 × 64 LSTM" in lines[1]
    assert "\x1b" not in out.get()


def test_the_running_trials_chars_per_second_leaves_out_a_mid_epoch_validation(monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches of 1,000 characters a second apart, then a 30-second validation (tune's, for its pruner) and more of
    the same batches: the line says 1,000 chars/s throughout, not the rate with the validation's time in it."""
    from textgen.cli import console

    now = [100.0]
    monkeypatch.setattr(trainview.time, "monotonic", lambda: now[0])
    recipe = {"units": 64, "layers": 1, "embedding_dim": 16, "dropout": 0.1, "optimizer": "adam", "lr": 0.002}
    display = tuneview.TuneDisplay(console)
    line = display.trial_begin(TrialSummary(0, TrialStatus.RUNNING, recipe, None, 0.0, "t0"), budget=600.0)
    line.steps, line.chars_per_step = 10, 1000
    line.epoch_begin(0, first_batch=0)

    def batches(first: int, last: int) -> list[str]:
        shown = []
        for batch in range(first, last):
            now[0] += 1.0
            line.batch_end(batch, loss=1.0)
            shown.append(display.status)
        return shown

    before = batches(0, 3)
    line.validating()
    now[0] += 30.0
    after = batches(3, 6)
    assert all("1,000 chars/s" in status for status in before + after), after
    assert after[-1].startswith("trial 0: epoch 1, batch 6/10") and after[-1].endswith("[36.0s of 10m00s]")


def test_the_live_bar_shows_no_numbers_before_the_first_batch() -> None:
    """Not "loss nan (nan bpc)": the rate and the loss appear with the epoch's first batch."""
    display = trainview.TrainingDisplay(Console(file=io.StringIO(), force_terminal=True, width=200))
    display.epochs, display.steps, display.chars_per_step = 3, 10, 6400
    display.epoch_begin(0, 0)

    def frame() -> str:
        out = io.StringIO()
        Console(file=out, width=200, color_system=None).print(display.progress.get_renderable())
        return out.getvalue()

    assert "epoch 1/3" in frame() and "nan" not in frame() and "loss" not in frame()
    display.batch_end(0, 2.0)
    assert "loss 2.000 (2.885 bpc)" in frame() and "chars/s" in frame()


@pytest.mark.parametrize("width", [80, 100, 140])
def test_the_live_bar_fits_the_terminal_and_its_eta_ends_with_the_budget(width: int) -> None:
    """In 80 columns nothing is cut to "…" (the bar and the elapsed time are left out below 130); an epoch the
    budget ends early shows the run's time left, not the whole epoch's."""
    display = trainview.TrainingDisplay(Console(file=io.StringIO(), force_terminal=True, width=width))
    display.epochs, display.steps, display.chars_per_step, display.budget = None, 400, 6400, 300.5
    display.epoch_begin(0, 0)
    display.started = display.epoch_started = display.epoch_started - 100.0  # 100 batches in 100 s
    display.batch_end(99, 2.0)
    out = io.StringIO()
    Console(file=out, width=width, color_system=None).print(display.progress.get_renderable())
    frame = out.getvalue()
    assert "…" not in frame and len(frame.splitlines()) == 1, frame
    assert "100/400" in frame and "6,400 chars/s  loss 2.000" in frame
    assert ("━" in frame) == (width >= trainview.TrainingDisplay.WIDE)
    assert "eta 3m20s" in frame and "run" not in frame  # 300 batches left (5m00s), but 200 s of the budget


def test_the_start_up_summary_is_a_readable_block() -> None:
    """The settings that matter as labelled lines, not a line of every key=value (those are in config.json)."""
    from textgen.config import DataConfig, ModelConfig, PruneConfig, RunConfig, TrainConfig
    from textgen.device import CPU

    data, model = DataConfig(corpus="c.txt"), ModelConfig(vocab_size=100)
    lines = dict(trainview.describe_run(RunConfig(data, model, TrainConfig(time_budget=600.0), CPU)))
    assert list(lines) == ["model", "batches", "optimizer", "stops", "saves", "samples"]
    # 100 x 64 embedding + 4 x 512 x (64 + 512 + 1) LSTM + (512 + 1) x 100 output
    assert lines["model"] == "1 × 512 LSTM, embedding 64, dropout 0.1 (1,239,396 parameters)"
    regularized = dataclasses.replace(model, weight_drop=0.25, locked_output_dropout=0.2)
    assert dict(trainview.describe_run(RunConfig(data, regularized, TrainConfig(), CPU)))["model"] == (
        "1 × 512 LSTM, embedding 64, dropout 0.1 on the inputs, 0.2 locked on the output, weight-drop 0.25 "
        "(1,239,396 parameters)"
    )
    assert lines["batches"] == "64 streams x 100 characters, windows shifted each epoch"
    assert lines["optimizer"] == (
        "adam, learning rate 0.002 held, then annealed to 0 over the last 20% of the run; clipped at global norm 5"
    )
    assert lines["stops"] == (
        "after 30 epochs or 10m00s (the time budget, start-up and validation included), whichever comes first, "
        "or after 3 epochs without a better validation loss"
    )
    assert lines["saves"] == "a resume point at each epoch end and every 5m00s within one"
    assert lines["samples"] == "160 characters after each epoch and every 5m00s within one (~0.9 s each)"
    # Given a budget and no --epochs, the budget ends the run: no default epoch cap.
    budget_only = dict(
        trainview.describe_run(RunConfig(data, model, TrainConfig.of(time_budget=600.0, sample_every=0), CPU))
    )
    assert budget_only["stops"].startswith("after 10m00s (the time budget, start-up and validation included), or after")
    assert budget_only["samples"] == "none (--sample-every 0)"

    training = TrainConfig.of(optimizer="sgd", lr_schedule="plateau", accumulate=2, epochs=1)
    pruned = dict(trainview.describe_run(RunConfig(data, model, training, CPU, prune=PruneConfig(source="r"))))
    assert pruned["optimizer"].startswith("sgd, momentum 0.9, learning rate 0.1 x 0.5 whenever validation stalls")
    assert pruned["batches"].endswith(", 2 batches per update")
    assert pruned["stops"] == "after 1 epoch"  # a pruned run does not stop early

    fine_tune = RunConfig(data, model, TrainConfig.of(warmup=100, accumulate=2), CPU)
    assert "first 100 updates: the warm-up)" in dict(trainview.describe_run(fine_tune))["optimizer"]
    small_text = dict(trainview.describe_run(fine_tune, steps=40))["optimizer"]  # 20 updates an epoch
    assert "(rising from 0 over the first 100 updates, 5.0 epochs: the warm-up)" in small_text
    big_text = dict(trainview.describe_run(fine_tune, steps=1000))["optimizer"]
    assert "(rising from 0 over the first 100 updates, 20% of an epoch: the warm-up)" in big_text


def piped_display(
    monkeypatch: pytest.MonkeyPatch, as_json: bool = False
) -> tuple[trainview.TrainingDisplay, io.StringIO, list]:
    """A display writing to a pipe (not a terminal), on a fake clock: 30 epochs of 100 batches of 6,400 chars."""
    now = [0.0]
    monkeypatch.setattr(trainview, "time", type("FakeTime", (), {"monotonic": staticmethod(lambda: now[0])}))
    out = io.StringIO()
    display = trainview.TrainingDisplay(Console(file=out, width=100), as_json=as_json)
    display.epochs, display.steps, display.chars_per_step = 30, 100, 6400
    return display, out, now


def test_piped_training_prints_a_plain_progress_line_every_minute_and_the_expected_duration(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    display, out, now = piped_display(monkeypatch)
    display.epoch_begin(0, 0)
    for batch in range(100):  # 1 s per batch: 6,400 chars/s
        now[0] += 1.0
        display.batch_end(batch, 1.5)
    lines = out.getvalue().splitlines()
    assert (
        lines[0]
        == "expected: about 50m00s for 30 epochs at 6,400 chars/s, validation not included; early stopping may end it sooner"
    )
    progress = [line for line in lines if line.startswith("epoch 1/30  batch")]
    assert [line.split()[3] for line in progress] == ["60/100"]  # one a minute, not one a batch
    assert "6,400 chars/s  loss 1.500 (2.164 bpc)  eta epoch 40.0s, run 49m00s" in progress[0]


def test_a_budget_that_ends_the_run_first_is_what_the_expectation_says(monkeypatch: pytest.MonkeyPatch) -> None:
    display, out, now = piped_display(monkeypatch)
    display.budget = 600.0
    display.epoch_begin(0, 0)
    for batch in range(11):
        now[0] += 1.0
        display.batch_end(batch, 1.5)
    assert out.getvalue().startswith("expected: the 10m00s time budget ends the run (its epochs would take 50m00s for")
    display.epochs = None  # a budget and no --epochs
    display.expected_said = False
    now[0] += 1.0
    display.batch_end(11, 1.5)
    assert "expected: the 10m00s time budget ends the run (at 6,400 chars/s; no epoch cap)" in out.getvalue()


def test_a_training_sample_is_shown_as_text_never_markup_and_carried_in_json(monkeypatch: pytest.MonkeyPatch) -> None:
    display, out, _ = piped_display(monkeypatch)
    display.epoch_begin(0, 0)
    display.sample("[bold red]Prince[/] Andrew\tsaid\n\nnothing\x07 at all\nthird\nfourth")
    assert out.getvalue().splitlines() == ["  | [bold red]Prince[/] Andrew    said", "  | nothing  at all", "  | third"]

    display, _, _ = piped_display(monkeypatch, as_json=True)
    display.epoch_begin(0, 0)
    printed = io.StringIO()
    monkeypatch.setattr("sys.stdout", printed)
    display.sample("a [b] sample")
    log = EpochLog(1, 1.0, 1.4, 1.1, 1.6, 900.0, 1e-3, 10, 12.0, True, False, sample="after the epoch")
    display.epoch_end(log)
    records = [strict(line) for line in printed.getvalue().splitlines()]
    assert records[0] == {"event": "sample", "epoch": 1, "sample": "a [b] sample"}
    assert records[1]["event"] == "epoch" and records[1]["sample"] == "after the epoch"
