"""Rendering for ``textgen tune``: the live table of a study's trials with the running trial's progress under it,
and a study's results as text or as JSON lines. Nothing here imports TensorFlow."""

from __future__ import annotations

import math
import shlex
import time
from typing import TYPE_CHECKING, Any

from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from textgen.commands import checkpoint_dir_flag, command
from textgen.durations import format_seconds
from textgen.results import EpochLog, StudyResult, StudyStop, TrialStatus, TrialSummary, bits, lstm_shape
from textgen.trainview import chars_per_second
from textgen.ui import json_line

if TYPE_CHECKING:
    from textgen.training.plan import TrainPlan


def one_line(text: str) -> Text:
    """A dim line that is cut, not wrapped, on a narrow terminal (the live view counts its lines)."""
    return Text(text, style="dim", no_wrap=True, overflow="ellipsis")


LIVE_LINES_BESIDE_ROWS = 4  # the table's header, the earlier-trials line, the running trial's line, the cursor's


class TuneDisplay:
    """A ``textgen.tune.TuneProgress``: on a terminal, a live table of the study's trials with the running trial's
    progress under it; otherwise a line (or a JSON line) per trial."""

    def __init__(self, console: Console, as_json: bool = False) -> None:
        self.console, self.as_json = console, as_json
        self.trials: list[TrialSummary] = []
        self.running: TrialSummary | None = None
        self.status = ""
        live = console.is_terminal and not as_json
        # Transient: the whole table is printed once the study stops, however it stops; while it runs, only the
        # latest rows that fit the terminal are drawn (taller, Rich would cut off the newest rows and the running
        # trial's line).
        self.live = (
            Live(console=console, get_renderable=self._render, refresh_per_second=2, transient=True) if live else None
        )

    def _render(self) -> Group:
        rows = self.trials + ([self.running] if self.running else [])
        room = max(self.console.size.height - LIVE_LINES_BESIDE_ROWS, 1)
        hidden = max(len(rows) - room, 0)
        earlier = [one_line(f"... {hidden} earlier trials (textgen tune --show lists them all)")]
        return Group(*(earlier if hidden else []), trials_table(rows, first=hidden), one_line(self.status))

    def begin(self, study: StudyResult) -> None:
        self.trials = [t for t in study.trials if t.state is not TrialStatus.WAITING]
        if self.live:
            self.live.start()
        elif not self.as_json:
            self.console.print(f"study {study.study}: {len(self.trials)} trials so far -> {study.path}", markup=False)

    def trial_begin(self, trial: TrialSummary, budget: float) -> TrialLine:
        self.running = trial
        return TrialLine(self, trial, budget)

    def trial_end(self, trial: TrialSummary) -> None:
        self.running, self.status = None, ""
        self.trials = [t for t in self.trials if t.number != trial.number] + [trial]
        if self.as_json:
            print(json_line(trial, event="trial"), flush=True)
        elif not self.live:
            value = f"{trial.val_bpc:.4f} bits/char" if trial.val_bpc is not None else "-"
            self.console.print(
                f"trial {trial.number} {trial.state.value}: {value} in {format_seconds(trial.seconds)}  "
                f"{describe_recipe(trial.recipe)}{'  (' + trial.note + ')' if trial.note else ''}",
                markup=False,
                highlight=False,
            )

    def end(self, result: StudyResult) -> None:
        if self.live:
            self.live.stop()
            self.console.print(trials_table([t for t in result.trials if t.state is not TrialStatus.WAITING]))


class TrialLine:
    """A ``textgen.training.progress.TrainingProgress`` for the running trial: one status line under the table."""

    def __init__(self, display: TuneDisplay, trial: TrialSummary, budget: float) -> None:
        self.display, self.trial, self.budget = display, trial, budget
        self.steps = self.chars_per_step = self.epoch = 0
        self.started = time.monotonic()
        self.before = 0.0  # seconds the trial's run had trained before (a resumed trial)
        self.rate = 0.0
        # The batch the rate counts from, and when it began; None after a validation until the next batch ends.
        self.window: tuple[int, float] | None = None

    def start(self, plan: TrainPlan, steps: int) -> None:
        cfg = plan.config
        self.steps, self.chars_per_step = steps, cfg.train_streams * cfg.data.seq_len
        self.before = plan.resume_state.seconds if plan.resume_state else 0.0

    def epoch_begin(self, epoch: int, first_batch: int) -> None:
        self.epoch, self.window = epoch, (first_batch, time.monotonic())

    def batch_end(self, batch: int, loss: float) -> None:
        if self.window is None:  # the first batch after a mid-epoch validation, whose time is mostly the validation's
            self.window = (batch + 1, time.monotonic())
        else:
            self.rate = chars_per_second(batch + 1 - self.window[0], self.chars_per_step, self.window[1])
        self._show(
            f"epoch {self.epoch + 1}, batch {batch + 1}/{self.steps}, loss {bits(loss):.3f} bits/char, "
            f"{self.rate:,.0f} chars/s"
        )

    def sample(self, text: str) -> None: ...  # trials do not sample
    def base_scored(self, val_loss: float) -> None: ...  # a trial's line shows its epochs

    def validating(self) -> None:
        self.window = None  # the rate counts training only: it starts again after the validation
        self._show(f"epoch {self.epoch + 1}: validating")

    def epoch_end(self, log: EpochLog) -> None:
        self._show(f"epoch {log.epoch}: val {log.val_bpc:.4f} bits/char")

    def end(self) -> None: ...

    def _show(self, what: str) -> None:
        trained = self.before + time.monotonic() - self.started
        self.display.status = (
            f"trial {self.trial.number}: {what}  [{format_seconds(trained)} of {format_seconds(self.budget)}]"
        )


def describe_recipe(recipe: dict[str, Any]) -> str:
    """A trial's recipe on one line: ``1 × 512 LSTM e64  dropout 0.1  batch 64x100  adam lr 0.002  clip 5``
    (``1 × 512 LSTM e64 LN`` when layer-normalized)."""
    model, dropout, batch, optimizer, lr, decay, clip = _recipe_cells(recipe)
    decay = f" weight decay {decay}" if decay != "-" else ""
    return f"{model}  dropout {dropout}  batch {batch}  {optimizer} lr {lr}{decay}  clip {clip}"


def _recipe_cells(recipe: dict[str, Any]) -> list[str]:
    """Model (layers × units, embedding, LN if layer-normalized), dropout, batch, optimizer, learning rate, weight
    decay, clip norm."""
    get = recipe.get
    decay = get("weight_decay") or 0.0
    return [
        f"{lstm_shape(get('layers', '?'), get('units', '?'))} e{get('embedding_dim', '?')}"
        + (" LN" if get("layer_norm") else ""),
        f"{get('dropout', 0):g}",
        f"{get('batch_size', '?')}x{get('seq_len', '?')}",
        str(get("optimizer", "?")),
        f"{get('lr', get('sgd_lr', 0)):.2g}",
        f"{decay:.2g}" if decay else "-",
        f"{get('clip_norm', 0):.2g}",
    ]


def trials_table(trials: list[TrialSummary], first: int = 0) -> Table:
    """A study's trials from the ``first``, one line each (80 columns hold them); the best complete one of all the
    trials is starred."""
    table = Table(box=None, pad_edge=False, collapse_padding=True, header_style="bold")
    for header in ("#", "state", "val bpc", "time", "model", "drop", "batch", "opt", "lr", "decay", "clip"):
        table.add_column(header, no_wrap=True, justify="right" if header in ("lr", "decay", "clip") else "left")
    complete = [t for t in trials if t.state is TrialStatus.COMPLETE and t.val_bpc is not None]
    best = min(complete, key=lambda t: t.val_bpc or math.inf).number if complete else None
    for t in trials[first:]:
        dim = t.state in (TrialStatus.PRUNED, TrialStatus.FAILED)
        table.add_row(
            f"{t.number}{'*' if t.number == best else ''}",
            t.state.label,
            f"{t.val_bpc:.4f}" if t.val_bpc is not None else "-",
            format_seconds(t.seconds) if t.seconds else "-",
            *(escape(cell) for cell in _recipe_cells(t.recipe)),
            style="bold green" if t.number == best else ("dim" if dim else None),
        )
    return table


def show_study(console: Console, result: StudyResult, as_json: bool, shown_live: bool = False) -> None:
    """A study's table (unless the live view has just printed it), its best recipe and how to train it, or one
    JSON line."""
    if as_json:
        print(json_line(result, event="study"), flush=True)
        return
    trials = [t for t in result.trials if t.state is not TrialStatus.WAITING]
    if not shown_live:
        console.print(trials_table(trials))
    counted = (TrialStatus.COMPLETE, TrialStatus.PRUNED, TrialStatus.FAILED, TrialStatus.INTERRUPTED)
    states = {state: sum(t.state is state for t in trials) for state in counted}
    counts = ", ".join(f"{n} {state.value}" for state, n in states.items() if n)
    budget = f" of {format_seconds(result.time_budget)}" if result.time_budget else ""
    console.print(
        f"study {result.study}: {len(trials)} trials ({counts or 'none finished'}) in "
        f"{format_seconds(result.seconds)}{budget}, {format_seconds(result.trial_budget)} each",
        markup=False,
        highlight=False,
    )
    for t in trials:
        if t.note and t.state in (TrialStatus.FAILED, TrialStatus.INTERRUPTED):
            console.print(f"trial {t.number}: {t.note}", markup=False, highlight=False)
    if result.stop_reason is StudyStop.TIME_BUDGET:
        console.print(
            f"the budget has no room for another {format_seconds(result.trial_budget)} trial; "
            "give a larger --time-budget to continue the study",
            markup=False,
        )
    if result.best is None or result.best_recipe is None:
        return
    where = checkpoint_dir_flag(result.path.parent.parent)  # the study's directory is CHECKPOINT_DIR/studies/STUDY
    corpus = shlex.join(result.corpus) if len(result.corpus) <= 3 else "CORPUS"
    console.print(
        f"best: trial {result.best.number}, {result.best.val_loss:.4f} nats/char ({result.best.val_bpc:.4f} bits/char) "
        f"on validation: {describe_recipe(result.best.recipe)}\n"
        f"recipe saved to {result.best_recipe}; train it: {command('train')} {corpus} --from-study {result.study}{where} "
        "--time-budget 1h",
        markup=False,
        highlight=False,
    )
