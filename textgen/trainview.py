"""Rendering of training for the CLI: the plan a run starts with, live progress, each epoch's line and the result.

Nothing here imports TensorFlow.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from textgen.checkpoint import Run, resume_hint
from textgen.durations import MORE_TIME, format_seconds
from textgen.results import EpochLog, StopReason, TrainResult, bits, epochs_done, lstm_shape
from textgen.runs import made_from
from textgen.training.preview import SAMPLE_CHARS, SAMPLE_SECONDS
from textgen.ui import describe, json_line
from textgen.vocab import for_display

if TYPE_CHECKING:
    from textgen.config import RunConfig, TrainConfig
    from textgen.idcache import EncodedCorpus
    from textgen.training.plan import TrainPlan


def describe_run(cfg: RunConfig, steps: int | None = None) -> list[tuple[str, str]]:
    """The settings of a run that matter, as labelled lines a person reads (every setting is in config.json and in
    ``--json``); ``steps``, the batches of an epoch, puts a warm-up in epochs."""
    model, data, training = cfg.model, cfg.data, cfg.training
    lstm = f"{lstm_shape(model.layers, model.units)}{' (layer-normalized)' if model.layer_norm else ''}"
    shifted = ", windows shifted each epoch" if data.shift_windows else ""
    dropout = f"dropout {model.dropout:g}"
    if model.locked_output_dropout is not None:
        dropout += f" on the inputs, {model.locked_output_dropout:g} locked on the output"
    if model.weight_drop:
        dropout += f", weight-drop {model.weight_drop:g}"
        if model.weight_drop_after:
            dropout += f" from epoch {model.weight_drop_after + 1}"
    accumulated = f", {training.accumulate} batches per update" if training.accumulate > 1 else ""
    limits = [f"{training.epochs} epoch{'s' if training.epochs > 1 else ''}"] if training.epochs else []
    if training.time_budget:
        limits.append(f"{format_seconds(training.time_budget)} (the time budget, start-up and validation included)")
    stops = f"after {' or '.join(limits)}{', whichever comes first' if len(limits) > 1 else ''}"
    if not cfg.prune:  # a pruned run's loss rises by design while it is pruned: it does not stop early
        stops += f", or after {training.patience} epochs without a better validation loss"
    return [
        (
            "model",
            f"{lstm}, embedding {model.embedding_dim}, {dropout} ({model.parameters:,} parameters)",
        ),
        ("batches", f"{data.batch_size} streams x {data.seq_len} characters{shifted}{accumulated}"),
        ("optimizer", f"{describe_optimizer(training, steps)}; clipped at global norm {training.clip_norm:g}"),
        ("stops", stops),
        ("saves", f"a resume point at each epoch end and every {format_seconds(training.save_every)} within one"),
        ("samples", describe_samples(training.sample_every)),
        *([("spread", f"tf.distribute: {training.strategy}")] if training.strategy != "none" else []),
    ]


def describe_samples(every: float) -> str:
    if not every:
        return "none (--sample-every 0)"
    cost = f"~{SAMPLE_SECONDS:g} s each"
    return f"{SAMPLE_CHARS} characters after each epoch and every {format_seconds(every)} within one ({cost})"


def describe_optimizer(training: TrainConfig, steps: int | None = None) -> str:
    """The optimizer with its own settings, and how the learning rate moves (a warm-up also in epochs, given
    ``steps``, the batches of one: on a small text it can be several, most of a short fine-tune)."""
    extra = f", weight decay {training.weight_decay:g}" if training.weight_decay else ""
    extra += f", momentum {training.momentum:g}" if training.momentum else ""
    schedule = {
        "hold": f"held, then annealed to 0 over the last {training.anneal:.0%} of the run",
        "cosine": "annealed to 0 along a cosine over the run",
        "plateau": f"x {training.lr_factor:g} whenever validation stalls for {training.lr_patience} epoch(s)",
    }[training.lr_schedule]
    warmup = ""
    if training.warmup:
        epochs = training.warmup * training.accumulate / steps if steps else None
        length = "" if epochs is None else f", {epochs:.1f} epochs" if epochs >= 1 else f", {epochs:.0%} of an epoch"
        warmup = f" (rising from 0 over the first {training.warmup:,} updates{length}: the warm-up)"
    return f"{training.optimizer}{extra}, learning rate {training.lr:g}{warmup} {schedule}"


def describe_documents(documents: int) -> str:
    return f"{documents:,} files, " if documents > 1 else ""


def describe_unknown(encoded: EncodedCorpus) -> str:
    """What ``--max-vocab`` left out, if anything."""
    if not encoded.unknown_distinct:
        return ""
    share = encoded.unknown / max(encoded.chars, 1)
    return (
        f"; --max-vocab maps {encoded.unknown_distinct:,} rarer characters ({encoded.unknown:,} occurrences, "
        f"{share:.3%} of the text) to the unknown id"
    )


def chars_per_second(batches: int, chars_per_batch: int, since: float) -> float:
    """Training speed over ``batches`` batches since the monotonic time ``since``."""
    return batches * chars_per_batch / max(time.monotonic() - since, 1e-9)


class TrainingDisplay:
    """A ``textgen.training.progress.TrainingProgress``: the plan, then on a terminal a live bar per epoch, elsewhere
    (a log file, CI, ``nohup``) a plain line every ``LOG_EVERY`` seconds; a line (or a JSON line) per epoch, what
    the model writes, and once the speed is known, how long the run should take."""

    LOG_EVERY = 60.0  # seconds between plain progress lines when the output is not a terminal
    EXPECT_AFTER = 10.0  # seconds of training before the run's expected duration is said
    WIDE = 130  # columns the whole bar needs; narrower, the bar, the elapsed time and bits/char are left out

    def __init__(self, console: Console, as_json: bool = False) -> None:
        self.console, self.as_json = console, as_json
        self.live = not as_json and console.is_terminal
        # In 80 or 100 columns every column would be cut to "…" (a new user's report): fewer columns instead.
        self.wide = console.width >= self.WIDE
        self.progress = Progress(
            TextColumn("[bold]epoch {task.fields[epoch]}"),
            *([BarColumn(bar_width=24)] if self.wide else []),
            MofNCompleteColumn(),
            TextColumn("{task.fields[measured]}"),  # empty until the epoch's first batch gives a number
            *([TimeElapsedColumn()] if self.wide else []),
            TextColumn("{task.description}"),
            TextColumn("{task.fields[eta]}"),
            console=console,
            transient=True,
            disable=not self.live,
        )
        self.epochs: int | None = None
        self.steps = self.chars_per_step = self.first_batch = self.epoch = 0
        self.budget: float | None = None
        self.task: Any = None
        self.started = self.before = self.epoch_started = self.logged_at = 0.0
        self.epoch_end_seconds = 0.0  # the last epoch end's validation and sample
        self.validating_since: float | None = None
        self.expected_said = False

    def start(self, plan: TrainPlan, steps: int) -> None:
        cfg, splits = plan.config, plan.splits
        self.epochs, self.steps, self.budget = cfg.training.epochs, steps, cfg.training.time_budget
        self.chars_per_step = cfg.train_streams * cfg.data.seq_len
        self.started = self.logged_at = time.monotonic()
        self.before = plan.resume_state.seconds if plan.resume_state else 0.0
        if not self.as_json:
            where = "new run"
            if plan.resume_state:
                budget = cfg.training.time_budget
                where = (
                    f"resuming at epoch {plan.resume_state.epoch + 1}, "
                    f"{format_seconds(plan.resume_state.seconds)} trained"
                    f"{f' of its {format_seconds(budget)}' if budget else ''}"
                )
            for line in (
                f"[bold]{escape(plan.run.name)}[/] ({where}) -> {escape(str(plan.run.path))}",
                f"corpus    {escape(cfg.data.corpus)} ({describe_documents(splits.encoded.documents)}{cfg.data.encoding}): "
                f"{len(splits.train):,} train / {len(splits.val):,} val / {len(splits.test):,} test chars, "
                f"{splits.vocab.size} ids{describe_unknown(splits.encoded)}",
                *(f"{label:<9} {escape(text)}" for label, text in describe_run(cfg, steps)),
                *([f"layout    {escape(plan.layout_note)}"] if plan.layout_note else []),
                *([f"hint      {escape(plan.base_hint)}"] if plan.base_hint else []),
                *([f"overfit   {escape(plan.fit_note)}"] if plan.fit_note else []),
                f"device    {cfg.profile.name}: {cfg.profile.notes}{' (the run keeps its profile)' if plan.resume_state else ''}",
                *_derived_from(cfg),
            ):
                self.console.print(line)
        self.progress.start()

    def _epoch_label(self, epoch: int) -> str:
        return f"{epoch + 1}/{self.epochs}" if self.epochs is not None else f"{epoch + 1}"

    def epoch_begin(self, epoch: int, first_batch: int) -> None:
        self.epoch, self.first_batch, self.epoch_started = epoch, first_batch, time.monotonic()
        self.task = self.progress.add_task(
            "", total=self.steps, completed=first_batch, epoch=self._epoch_label(epoch), measured="", eta=""
        )

    def batch_end(self, batch: int, loss: float) -> None:
        now = time.monotonic()
        rate = chars_per_second(batch + 1 - self.first_batch, self.chars_per_step, self.epoch_started)
        measured = f"{rate:>7,.0f} chars/s  loss {loss:.3f} ({bits(loss):.3f} bpc)"
        left = self.run_left(batch, now)
        run_eta = f"run {format_seconds(left)}" if left is not None and self.epochs != self.epoch + 1 else ""
        epoch_left = (self.steps - batch - 1) * (now - self.epoch_started) / (batch + 1 - self.first_batch)
        if left is not None and left < epoch_left:  # the budget ends the run inside this epoch
            epoch_left, run_eta = left, ""
        eta = f"eta {format_seconds(epoch_left)}{f', {run_eta}' if run_eta else ''}"
        shown = measured if self.wide else f"{rate:,.0f} chars/s  loss {loss:.3f}"
        self.progress.update(self.task, completed=batch + 1, measured=shown, eta=eta)
        if self.as_json:
            return
        if not self.expected_said and now - self.epoch_started >= self.EXPECT_AFTER:
            self.expected_said = True
            self.console.print(self.expectation(batch, rate, now), highlight=False, markup=False, soft_wrap=True)
        if not self.live and now - self.logged_at >= self.LOG_EVERY:
            self.logged_at = now
            self.console.print(
                f"epoch {self._epoch_label(self.epoch)}  batch {batch + 1}/{self.steps}  {measured.strip()}  "
                f"eta epoch {format_seconds(epoch_left)}{f', {run_eta}' if run_eta else ''}",
                highlight=False,
                markup=False,
                soft_wrap=True,  # a log's line is one line
            )

    def run_left(self, batch: int, now: float) -> float | None:
        """Seconds the run should still take, from this epoch's speed: by its epochs, or by its budget if that ends
        it sooner (None: neither bounds it... which cannot happen: a run has one or the other)."""
        per_batch = (now - self.epoch_started) / (batch + 1 - self.first_batch)
        by_epochs = None
        if self.epochs is not None:
            epochs_after = self.epochs - self.epoch - 1
            by_epochs = (self.steps - batch - 1) * per_batch + (epochs_after + 1) * self.epoch_end_seconds
            by_epochs += epochs_after * self.steps * per_batch
        by_budget = self.budget - self.before - (now - self.started) if self.budget is not None else None
        known = [t for t in (by_epochs, by_budget) if t is not None]
        return max(min(known), 0.0) if known else None

    def expectation(self, batch: int, rate: float, now: float) -> str:
        """How long the run should take, said once its speed is measured."""
        per_batch = (now - self.epoch_started) / (batch + 1 - self.first_batch)
        at = f"at {rate:,.0f} chars/s"
        if self.epochs is None:
            assert self.budget is not None
            return f"expected: the {format_seconds(self.budget)} time budget ends the run ({at}; no epoch cap)"
        epochs_left = self.epochs - self.epoch
        by_epochs = self.before + (now - self.started) + (epochs_left * self.steps - batch - 1) * per_batch
        took = f"{format_seconds(by_epochs)} for {self.epochs} epoch{'s' if self.epochs > 1 else ''} {at}"
        if self.budget is not None and self.budget < by_epochs:
            return (
                f"expected: the {format_seconds(self.budget)} time budget ends the run (its epochs would take {took})"
            )
        return f"expected: about {took}, validation not included; early stopping may end it sooner"

    def sample(self, text: str) -> None:
        if self.as_json:
            print(json.dumps({"event": "sample", "epoch": self.epoch + 1, "sample": text}), flush=True)
        else:
            self.console.print(sample_lines(text, self.console.width), highlight=False, markup=False, style="dim")

    def base_scored(self, val_loss: float) -> None:
        if not self.as_json:
            self.console.print(
                f"base      its weights score {val_loss:.4f} nats/char ({bits(val_loss):.3f} bits/char) on this "
                "text's validation split: the run keeps them unless an epoch beats them",
                highlight=False,
            )

    def validating(self) -> None:
        self.validating_since = time.monotonic()
        self.progress.update(self.task, description="validating")

    def epoch_end(self, log: EpochLog) -> None:
        if self.validating_since is not None:
            self.epoch_end_seconds = time.monotonic() - self.validating_since
        self.progress.remove_task(self.task)
        if self.as_json:
            print(json_line(log, event="epoch"), flush=True)
            return
        epochs = f"/{self.epochs}" if self.epochs is not None else ""
        self.console.print(
            f"epoch {log.epoch}{epochs}{' (partial)' if log.partial else ''}  "
            f"loss {log.loss:.4f} ({log.bpc:.3f} bpc)  "
            f"val {log.val_loss:.4f} ({log.val_bpc:.3f} bpc){'  [green]best[/]' if log.improved else ''}  "
            f"{log.chars_per_sec:,.0f} chars/s  lr {log.learning_rate:.2g}  {format_seconds(log.seconds)} total",
            highlight=False,
        )
        if log.sample is not None:
            self.sample(log.sample)

    def end(self) -> None:
        self.progress.stop()


def sample_lines(text: str, width: int, lines: int = 3) -> str:
    """A training sample as at most ``lines`` indented lines cut to ``width``, tabs and control characters shown
    as spaces (it is the model's text: data, never markup)."""
    shown = for_display(text).replace("\t", "    ")
    rows = ["".join(c if c.isprintable() else " " for c in row) for row in shown.split("\n")]
    rows = [row for row in rows if row.strip()][:lines] or [""]
    return "\n".join("  | " + row[: max(width - 4, 20)] for row in rows)


def show_train_result(console: Console, result: TrainResult, as_json: bool) -> None:
    if as_json:
        print(json_line(result, event="done"), flush=True)
        return
    if not result.chief:
        console.print(
            f"done ({result.stop_reason.label}) after {epochs_done(result.epochs, result.batches_into_epoch)}; "
            "the chief worker saved the run"
        )
        return
    run = Run(result.path)
    took = format_seconds(result.session_seconds)
    trained = (
        f"{format_seconds(result.seconds)} of training in all, this time {took}"
        if result.seconds > result.session_seconds + 1
        else took
    )
    console.print(
        f"done ({result.stop_reason.label}) after {epochs_done(result.epochs, result.batches_into_epoch)} in {trained}: "
        f"best validation {result.best_val_loss:.4f} nats/char ({result.best_val_bpc:.3f} bits/char){_against_start(result)}, "
        f"last epoch {result.chars_per_sec:,.0f} chars/s",
        highlight=False,
    )
    console.print(run.loss_curve_path.read_text(encoding="utf-8"), markup=False, end="")
    console.print(f"loss curves: {run.loss_svg_path}", markup=False)
    console.print(f"saved to {run.path}; {further(run, result)}", markup=False)


def _against_start(result: TrainResult) -> str:
    """A fine-tuned run's best against its base's weights as they were, scored on the same validation text."""
    start = result.start_val_loss
    if start is None:
        return ""
    if result.best_val_loss >= start:
        return " (the base's weights: no epoch beat them)"
    return f", {start - result.best_val_loss:.4f} better than the base's weights before fine-tuning ({start:.4f})"


def further(run: Run, result: TrainResult) -> str:
    """How to train ``run`` further, in words and as a command: both flags when the budget ran out in the last
    epoch."""
    more, what = [], []
    entered = result.epochs + (1 if result.batches_into_epoch else 0)  # the epoch it resumes in counts
    if result.max_epochs is not None and entered >= result.max_epochs:
        more.append(f" --epochs {entered + 10}")
        what.append("10 more epochs")
    if result.stop_reason is StopReason.TIME_BUDGET:
        more.append(f" --time-budget {MORE_TIME}")
        what.append(f"{MORE_TIME.removeprefix('+').removesuffix('m')} more minutes")
    return resume_hint(run, "".join(more), f"train {' and '.join(what)}" if what else "continue with")


def _derived_from(cfg: RunConfig) -> list[str]:
    """The plan's line for a run made from another: the teacher of a distilled run, the source of a pruned one, the
    base of a fine-tuned one and how good it was."""
    if cfg.distill:
        return [
            f"distill   {escape(describe({**dataclasses.asdict(cfg.distill), 'teacher': Path(cfg.distill.teacher).name}))}"
        ]
    if cfg.prune:
        return [
            f"prune     {escape(describe({**dataclasses.asdict(cfg.prune), 'source': Path(cfg.prune.source).name}))}"
        ]
    if cfg.init_from:
        init = cfg.init_from
        loss = (
            f"{init.val_loss:.4f} nats/char ({bits(init.val_loss):.3f} bits/char) on {init.corpus}"
            if init.val_loss is not None
            else "not recorded in an export"
        )
        return [f"base      {escape(made_from(cfg))}; its best validation loss {escape(loss)}"]
    return []
