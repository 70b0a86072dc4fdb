"""Rendering for the CLI: live training progress, and every command's result as text or as JSON lines.

JSON is built from the library's result dataclasses with ``asdict``, so the two forms cannot drift.
Nothing here imports TensorFlow.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shlex
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from textgen.checkpoint import Run, checkpoint_dir_flag, resume_hint
from textgen.commands import QUICK_START_TRAIN, command
from textgen.durations import MORE_TIME, format_seconds
from textgen.errors import TextgenError, TrainingInterrupted
from textgen.generation import bias_row
from textgen.results import (
    DynamicEvaluation,
    EpochLog,
    Evaluation,
    ExportResult,
    ModelSource,
    RunSummary,
    StopReason,
    TrainResult,
    bits,
    epochs_done,
    lstm_shape,
)
from textgen.runs import made_from
from textgen.training.preview import SAMPLE_CHARS, SAMPLE_SECONDS
from textgen.vocab import for_display

if TYPE_CHECKING:
    from textgen.config import RunConfig, SampleConfig, ServeConfig, TrainConfig
    from textgen.generation import Piece, Sampler
    from textgen.idcache import EncodedCorpus
    from textgen.training.plan import TrainPlan


def json_line(record: Any, **extra: Any) -> str:
    """One strict-JSON line: ``extra`` then the fields of the dataclass ``record`` (see ``_strict``)."""
    return json.dumps(
        _strict({**extra, **dataclasses.asdict(record)}), default=str, ensure_ascii=False, allow_nan=False
    )


_SURROGATE = re.compile("[\ud800-\udfff]")


def _strict(value: Any) -> Any:
    """``value`` as strict JSON holds it: paths as strings, a loss that is NaN or infinite (a diverged run) as null,
    and bytes that were not UTF-8 (in a file name or an argument, which Python keeps as lone surrogates that no
    UTF-8 output can carry) as U+FFFD."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Path):
        value = str(value)
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_strict(v) for v in value]
    return value


def describe(values: dict[str, Any]) -> str:
    """``key=value`` pairs on one line."""
    return "  ".join(f"{k}={v}" for k, v in values.items())


def describe_run(cfg: RunConfig) -> list[tuple[str, str]]:
    """The settings of a run that matter, as labelled lines a person reads (every setting is in config.json and in
    ``--json``)."""
    model, data, training = cfg.model, cfg.data, cfg.training
    lstm = f"{lstm_shape(model.layers, model.units)}{' (layer-normalized)' if model.layer_norm else ''}"
    shifted = ", windows shifted each epoch" if data.shift_windows else ""
    dropout = f"dropout {model.dropout:g}"
    if model.locked_output_dropout is not None:
        dropout += f" on the inputs, {model.locked_output_dropout:g} locked on the output"
    if model.weight_drop:
        dropout += f", weight-drop {model.weight_drop:g}"
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
        ("optimizer", f"{describe_optimizer(training)}; clipped at global norm {training.clip_norm:g}"),
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


def describe_optimizer(training: TrainConfig) -> str:
    """The optimizer with its own settings, and how the learning rate moves."""
    extra = f", weight decay {training.weight_decay:g}" if training.weight_decay else ""
    extra += f", momentum {training.momentum:g}" if training.momentum else ""
    schedule = {
        "hold": f"held, then annealed to 0 over the last {training.anneal:.0%} of the run",
        "cosine": "annealed to 0 along a cosine over the run",
        "plateau": f"x {training.lr_factor:g} whenever validation stalls for {training.lr_patience} epoch(s)",
    }[training.lr_schedule]
    warmup = f" (rising from 0 over the first {training.warmup:,} updates: the warm-up)" if training.warmup else ""
    return f"{training.optimizer}{extra}, learning rate {training.lr:g}{warmup} {schedule}"


# --- errors -------------------------------------------------------------------------------


def show_error(err_console: Console, exc: TextgenError) -> None:
    """A library error on one line: what is wrong and what to do (a stopped run: how to resume)."""
    message = escape(str(exc))  # messages hold paths and '.[gpu]', not console markup
    err_console.print(f"[yellow]{message}[/]" if isinstance(exc, TrainingInterrupted) else f"[red]error:[/] {message}")


def show_os_error(err_console: Console, exc: OSError) -> None:
    """A failed read or write on one line: the file and the system's reason."""
    where = f"{exc.filename}: " if exc.filename else ""
    err_console.print(f"[red]error:[/] {escape(where + (exc.strerror or str(exc)))}; check the path and free space")


# Typer words a value that is not a number as pydantic does.
_NOT_A_NUMBER = {
    "Input should be a valid number, unable to parse string as a number": "not a number",
    "Input should be a valid integer, unable to parse string as an integer": "not a whole number",
}


def show_usage_error(err_console: Console, message: str, ctx: Any) -> None:
    """One of click's usage errors (a bad choice, an unknown option) on one line, with where to find help."""
    # Typer words choices as pydantic errors, and lists a missing option's choices one per line.
    message = " ".join(message.replace("Value error, ", "").split()).rstrip(".")
    for pydantic, plain in _NOT_A_NUMBER.items():
        message = message.replace(pydantic, plain)
    message = re.sub(r"\. Did you mean (.*)\?$", r" (did you mean \1?)", message)  # click's, for a command
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
                *(f"{label:<9} {escape(text)}" for label, text in describe_run(cfg)),
                *([f"layout    {escape(plan.layout_note)}"] if plan.layout_note else []),
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
        f"best validation {result.best_val_loss:.4f} nats/char ({result.best_val_bpc:.3f} bits/char), "
        f"last epoch {result.chars_per_sec:,.0f} chars/s",
        highlight=False,
    )
    console.print(run.loss_curve_path.read_text(encoding="utf-8"), markup=False, end="")
    console.print(f"loss curves: {run.loss_svg_path}", markup=False)
    console.print(f"saved to {run.path}; {further(run, result)}", markup=False)


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


# --- sample, repl ---------------------------------------------------------------------------


def warn(err_console: Console, note: str | None) -> None:
    """A warning on one line of stderr, if there is one."""
    if note:
        err_console.print(f"[yellow]warning:[/] {escape(note)}")


def show_serving(console: Console, url: str, source: ModelSource, config: ServeConfig) -> None:
    """Where the server listens, once its model answers."""
    what = source.name if source.weights is None else f"{source.name} ({source.weights} weights)"
    console.print(f"serving {escape(what)} on {url}: {config.slots} rows, up to {config.max_queue} requests waiting")
    console.print(f"  page     {url}/")
    console.print(f"  API      {url}/v1/completions (OpenAI completions; max_tokens counts characters)")
    console.print(f"  metrics  {url}/metrics")
    cache = f"{config.prompt_cache:,} prompt states kept" if config.prompt_cache else "no prompt states kept"
    console.print(f"  cache    {cache} (--prompt-cache)")
    limit = config.limits()
    console.print(
        f"  limits   {limit['max_body_bytes']:,}-byte bodies, {limit['request_timeout_s']:g} s a request, "
        f"{limit['max_tokens']:,} characters a continuation ({limit['max_whole_chars']:,} a whole answer), "
        f"{limit['max_prompt_chars']:,} of prompts, {limit['max_stops']} stops of up to {limit['max_stop_chars']}"
    )
    if config.api_key is not None:
        console.print("  auth     an API key on every route but /, /health, /ready, /info and /runs")
    else:
        console.print("  auth     none: anyone who can reach the server can use it")
    console.print("  log      a line per request on stderr (--log-format json: JSON)")
    if config.host not in ("127.0.0.1", "localhost", "::1") and config.api_key is None:
        console.print(f"[yellow]warning:[/] anyone who can reach {escape(config.host)} can use it; set --api-key")
    console.print(
        f"Ctrl-C or SIGTERM drains: {config.drain_seconds:g} s of 503s to new requests, then stops", style="dim"
    )


def show_sampling(
    console: Console,
    err_console: Console,
    sampler: Sampler,
    source: ModelSource,
    prime: str,
    settings: SampleConfig,
    as_json: bool,
    prime_file: str | None = None,
) -> None:
    """Generate and show samples of ``prime``: a single sample on a terminal streams in as it is generated;
    several, or output to a pipe, are shown when done (with ``--json``, one record each). A prime's characters
    outside the vocabulary are warned about first. A prime read from ``prime_file`` is not shown again: the
    samples are its continuations (with ``--json``, the file and its length stand for it). A ``--logit-bias``
    character the model lacks is an error before any text."""
    bias_row(settings.logit_bias, sampler.vocab)
    warn(err_console, sampler.vocab.unknown_note(prime))
    prompts = [prime] * settings.num
    shown = prime if prime_file is None else ""
    record = source.record() if prime_file is None else {**source.record(), "prime_file": prime_file,
                                                         "prime_chars": len(prime)}  # fmt: skip
    if settings.num == 1 and console.is_terminal and not as_json:
        stream_sample(console, shown, sampler.stream(prompts, settings))
    else:
        show_samples(console, sampler.generate(prompts, settings), shown, settings, as_json, **record)


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
            if settings.num > 1:  # sample i draws as row i of the seed's batch: --seed alone gives sample 1
                console.out(
                    f"{chr(10) if i else ''}--- sample {i + 1} of --num {settings.num} --seed {settings.seed} ---"
                )
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


def show_dynamic_evaluation(console: Console, err_console: Console, result: DynamicEvaluation, as_json: bool) -> None:
    """``evaluate --dynamic``: the static and the dynamic figure side by side, with the time each took."""
    if as_json:
        print(json_line(result))
        return
    if result.tuned_seconds is not None:
        err_console.print(
            f"tuned on the validation split in {result.tuned_seconds:.0f} s: eta {result.eta:g}, decay "
            f"{result.decay:g}, segments of {result.segment_len} (saved in the run's dynamic.json)",
            markup=False,
            highlight=False,
        )
    table = Table(box=None, pad_edge=False)
    for column in ("", "nats/char", "bits/char", "seconds"):
        table.add_column(column, justify="left" if not column else "right")
    table.add_row("static", f"{result.static_nats_per_char:.4f}", f"{result.static_bits_per_char:.4f}",
                  f"{result.static_seconds:.1f}")  # fmt: skip
    table.add_row("dynamic", f"{result.dynamic_nats_per_char:.4f}", f"{result.dynamic_bits_per_char:.4f}",
                  f"{result.dynamic_seconds:.1f}")  # fmt: skip
    console.print(
        f"{result.run} on the {result.source}: {result.chars:,} characters read as one stream in segments of "
        f"{result.segment_len}; dynamic: eta {result.eta:g}, decay {result.decay:g} "
        f"({result.dynamic_nats_per_char - result.static_nats_per_char:+.4f} nats/char, x{result.ratio:.4f})",
        markup=False,
        highlight=False,
    )
    console.print(table)
    if result.unknown_chars:
        err_console.print(
            f"[yellow]warning:[/] {result.unknown_chars:,} characters are not in the run's vocabulary; "
            "they were scored as unknown"
        )


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


def show_export(console: Console, result: ExportResult, as_json: bool) -> None:
    if as_json:
        print(json_line(result))
        return
    quantized = "" if result.quantize == "none" else f", {result.quantize} weights"
    console.print(
        f"exported {result.run} as {result.format}{quantized}: {result.path} ({_size(result.bytes)}); "
        f"try: {command(f'sample --model {shlex.quote(str(result.path))}')}",
        markup=False,
        highlight=False,
    )


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n / 1e3:.0f} kB"


def show_runs(console: Console, runs: list[RunSummary], checkpoint_dir: Path, as_json: bool) -> None:
    """The runs as a table on a terminal; piped, a header and one line per run (no box, no wrapping), for grep,
    sort and cut; or one JSON line each."""
    if as_json:
        for summary in runs:
            print(json_line(summary))
        return
    if not runs:
        first = command(QUICK_START_TRAIN + checkpoint_dir_flag(checkpoint_dir))
        console.print(f"no runs in {checkpoint_dir}/; train one: {first}", markup=False)
        return
    rows = [
        (
            r.run,
            r.corpus,
            r.model,
            epochs_done(r.epochs, r.batches_into_epoch),
            f"{r.best_val_bpc:.3f}" if r.best_val_bpc is not None else "-",
            f"{r.seconds / 60:.1f} min",
            r.status,
        )
        for r in runs
    ]
    if not console.is_terminal:  # what a run was made from, or why it is damaged, ends its own line
        lines = [
            ("run", "corpus", "model", "epochs", "best_val_bpc", "trained", "status", "note"),
            *((*row, r.problem or r.made_from) for row, r in zip(rows, runs, strict=True)),
        ]
        widths = [max(map(len, column)) for column in zip(*lines, strict=True)]
        for line in lines:
            console.out("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip())
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
    for row in rows:
        table.add_row(*map(escape, row))
    console.print(table)
    for r in runs:
        if r.problem or r.made_from:
            console.print(f"{r.run}: {r.problem or r.made_from}", markup=False, highlight=False)
