"""Rendering for the CLI: live training progress, and every command's result as text or as JSON lines.

JSON is built from the library's result dataclasses with ``asdict``, so the two forms cannot drift.
Nothing here imports TensorFlow.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from textgen.checkpoint import Run, resume_hint
from textgen.errors import TextgenError, TrainingInterrupted
from textgen.results import EpochLog, Evaluation, ExportResult, RunSummary, TrainResult, bits
from textgen.vocab import for_display

if TYPE_CHECKING:
    from textgen.config import RunConfig, SampleConfig
    from textgen.generation import Piece
    from textgen.idcache import EncodedCorpus
    from textgen.train import TrainPlan


def json_line(record: Any, **extra: Any) -> str:
    """One strict-JSON line: ``extra`` then the fields of the dataclass ``record``; paths as strings,
    and a loss that is NaN or infinite (a diverged run) as null, which strict JSON has instead."""
    return json.dumps(
        _finite({**extra, **dataclasses.asdict(record)}), default=str, ensure_ascii=False, allow_nan=False
    )


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    return value


def format_seconds(seconds: float) -> str:
    """``3h02m``, ``4m05s`` or ``12.3s``."""
    if seconds >= 3600:
        return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"
    if seconds >= 60:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{seconds:.1f}s"


def describe(values: dict[str, Any]) -> str:
    """``key=value`` pairs on one line."""
    return "  ".join(f"{k}={v}" for k, v in values.items())


# --- errors -------------------------------------------------------------------------------


def show_error(err_console: Console, exc: TextgenError) -> None:
    """A library error on one line: what is wrong and what to do (a stopped run: how to resume)."""
    message = escape(str(exc))  # messages hold paths and '.[gpu]', not console markup
    err_console.print(f"[yellow]{message}[/]" if isinstance(exc, TrainingInterrupted) else f"[red]error:[/] {message}")


def show_usage_error(err_console: Console, message: str, ctx: Any) -> None:
    """One of click's usage errors (a bad choice, an unknown option) on one line, with where to find help."""
    message = message.replace("Value error, ", "").rstrip(".")  # typer words choices as pydantic errors
    where = f"; see {ctx.command_path} --help" if ctx is not None else ""
    err_console.print(f"[red]error:[/] {escape(message[:1].lower() + message[1:])}{where}")


# --- train --------------------------------------------------------------------------------


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


class TrainingDisplay:
    """A ``textgen.train.TrainingProgress``: the plan, a live bar per epoch on a terminal, a line
    (or a JSON line) per epoch."""

    def __init__(self, console: Console, as_json: bool = False) -> None:
        self.console, self.as_json = console, as_json
        self.progress = Progress(
            TextColumn("[bold]epoch {task.fields[epoch]}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]:>7,.0f} chars/s"),
            TextColumn("loss {task.fields[loss]:.3f} ({task.fields[bpc]:.3f} bpc)"),
            TimeElapsedColumn(),
            TextColumn("{task.description}"),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=console,
            transient=True,
            disable=as_json or not console.is_terminal,
        )
        self.epochs = self.steps = self.chars_per_step = self.first_batch = 0
        self.task: Any = None
        self.epoch_started = 0.0

    def start(self, plan: TrainPlan, steps: int) -> None:
        cfg, splits = plan.config, plan.splits
        self.epochs, self.steps = cfg.training.epochs, steps
        self.chars_per_step = cfg.data.batch_size * cfg.training.accumulate * cfg.data.seq_len
        if not self.as_json:
            where = f"resuming at epoch {plan.resume_state['epoch'] + 1}" if plan.resume_state else "new run"
            training = {
                **dataclasses.asdict(cfg.training),
                "batch_size": cfg.data.batch_size,
                "seq_len": cfg.data.seq_len,
            }
            for line in (
                f"[bold]{escape(plan.run.name)}[/] ({where}) -> {escape(str(plan.run.path))}",
                f"corpus   {escape(cfg.data.corpus)} ({describe_documents(splits.encoded.documents)}{cfg.data.encoding}): "
                f"{len(splits.train):,} train / {len(splits.val):,} val / {len(splits.test):,} test chars, "
                f"{splits.vocab.size} ids{describe_unknown(splits.encoded)}",
                f"model    {describe(dataclasses.asdict(cfg.model))}",
                f"training {describe(training)}",
                f"device   {cfg.profile.name}: {cfg.profile.notes}{' (the run keeps its profile)' if plan.resume_state else ''}",
                *_derived_from(cfg),
            ):
                self.console.print(line)
        self.progress.start()

    def epoch_begin(self, epoch: int, first_batch: int) -> None:
        self.first_batch, self.epoch_started = first_batch, time.monotonic()
        self.task = self.progress.add_task(
            "",
            total=self.steps,
            completed=first_batch,
            epoch=f"{epoch + 1}/{self.epochs}",
            rate=0.0,
            loss=float("nan"),
            bpc=float("nan"),
        )

    def batch_end(self, batch: int, loss: float) -> None:
        done = batch + 1 - self.first_batch
        rate = done * self.chars_per_step / max(time.monotonic() - self.epoch_started, 1e-9)
        self.progress.update(self.task, completed=batch + 1, rate=rate, loss=loss, bpc=bits(loss))

    def validating(self) -> None:
        self.progress.update(self.task, description="validating")

    def epoch_end(self, log: EpochLog) -> None:
        self.progress.remove_task(self.task)
        if self.as_json:
            print(json_line(log, event="epoch"), flush=True)
            return
        self.console.print(
            f"epoch {log.epoch}/{self.epochs}{' (partial)' if log.partial else ''}  "
            f"loss {log.loss:.4f} ({log.bpc:.3f} bpc)  "
            f"val {log.val_loss:.4f} ({log.val_bpc:.3f} bpc){'  [green]best[/]' if log.improved else ''}  "
            f"{log.chars_per_sec:,.0f} chars/s  lr {log.learning_rate:.2g}  {format_seconds(log.seconds)} total",
            highlight=False,
        )

    def end(self) -> None:
        self.progress.stop()


def show_train_result(console: Console, result: TrainResult, as_json: bool) -> None:
    if as_json:
        print(json_line(result, event="done"), flush=True)
        return
    if not result.chief:
        console.print(f"done ({result.stop_reason.label}) after {result.epochs} epochs; the chief worker saved the run")
        return
    run = Run(result.path)
    console.print(
        f"done ({result.stop_reason.label}) after {result.epochs} epochs in {format_seconds(result.seconds)}: "
        f"best validation {result.best_val_loss:.4f} nats/char ({result.best_val_bpc:.3f} bits/char), "
        f"last epoch {result.chars_per_sec:,.0f} chars/s",
        highlight=False,
    )
    console.print(run.loss_curve_path.read_text(encoding="utf-8"), markup=False, end="")
    console.print(f"saved to {run.path}; {resume_hint(run)}", markup=False)


# --- sample, repl ---------------------------------------------------------------------------


def warn_unknown(err_console: Console, unknown: list[str]) -> None:
    if unknown:
        chars = " ".join(repr(c) for c in unknown)
        err_console.print(f"[yellow]warning:[/] skipping prime characters the model has never seen: {escape(chars)}")


def stream_sample(console: Console, prime: str, pieces: Iterator[Piece]) -> None:
    """One sample as it is generated: the prime in bold, then each piece as it arrives."""
    console.print(prime, style="bold", end="", markup=False)
    for piece in pieces:
        console.out(for_display(piece.texts[0]), end="", highlight=False)
    console.out("")


def show_samples(
    console: Console, texts: Iterable[str], prime: str, settings: SampleConfig, as_json: bool, **record: Any
) -> None:
    """Finished samples: plain text (numbered when there are several), or one JSON line each."""
    for i, text in enumerate(texts):
        if as_json:
            print(json_line(settings, **record, index=i, prime=prime, text=text))
        else:
            if settings.num > 1:
                console.out(f"{chr(10) if i else ''}--- sample {i + 1}/{settings.num} (seed {settings.seed}) ---")
            console.out(prime + for_display(text), highlight=False)


# --- evaluate, runs ----------------------------------------------------------------------------


def show_evaluation(console: Console, err_console: Console, result: Evaluation, as_json: bool) -> None:
    if as_json:
        print(json_line(result))
        return
    console.print(
        f"{result.run} on the {result.source}: {result.nats_per_char:.4f} nats/char, "
        f"{result.bits_per_char:.4f} bits/char, perplexity {result.perplexity:.3f} "
        f"({result.chars:,} characters scored as {result.streams} contiguous streams of "
        f"{result.seq_len}-character batches, state carried throughout, as in training's validation)",
        markup=False,
        highlight=False,
    )
    if result.unknown_chars:
        err_console.print(
            f"[yellow]warning:[/] {result.unknown_chars:,} characters are not in the run's vocabulary; "
            "they were scored as unknown"
        )


def _derived_from(cfg: RunConfig) -> list[str]:
    """The plan's line for a run made from another: the teacher of a distilled run, the source of a pruned one."""
    if cfg.distill:
        return [
            f"distill  {escape(describe({**dataclasses.asdict(cfg.distill), 'teacher': Path(cfg.distill.teacher).name}))}"
        ]
    if cfg.prune:
        return [
            f"prune    {escape(describe({**dataclasses.asdict(cfg.prune), 'source': Path(cfg.prune.source).name}))}"
        ]
    return []


def show_export(console: Console, result: ExportResult, as_json: bool) -> None:
    if as_json:
        print(json_line(result))
        return
    quantized = "" if result.quantize == "none" else f", {result.quantize} weights"
    console.print(
        f"exported {result.run} as {result.format}{quantized}: {result.path} ({_size(result.bytes)}); "
        f"try: textgen sample --model {result.path}",
        markup=False,
        highlight=False,
    )


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n / 1e3:.0f} kB"


def show_runs(console: Console, runs: list[RunSummary], checkpoint_dir: Path, as_json: bool) -> None:
    if as_json:
        for summary in runs:
            print(json_line(summary))
        return
    if not runs:
        console.print(f"no runs in {checkpoint_dir}/; train one: textgen train 2600-0.txt --device cpu", markup=False)
        return
    table = Table(
        "run",
        "corpus",
        "model",
        "epochs",
        "best val\nbits/char",
        "trained",
        "status",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
    )
    for r in runs:
        table.add_row(
            escape(r.run),
            escape(r.corpus),
            r.model,
            epochs_cell(r.epochs, r.batches_into_epoch, r.steps),
            f"{r.best_val_bpc:.3f}" if r.best_val_bpc is not None else "-",
            f"{r.seconds / 60:.1f} min",
            r.status,
        )
    console.print(table)
    for r in runs:
        if r.problem:
            console.print(f"{r.run}: {r.problem}", markup=False, highlight=False)


def epochs_cell(epochs: int, batches_into_epoch: int, steps: int) -> str:
    """Epochs trained, with the fraction of one cut short (e.g. 5.2); "0 + 89 batches" before the first ends."""
    if not batches_into_epoch:
        return str(epochs)
    if not epochs:
        return f"0 + {batches_into_epoch} batches"
    return f"{epochs + batches_into_epoch / ((steps - batches_into_epoch) / epochs):.1f}"
