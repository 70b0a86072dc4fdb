"""Rendering for the CLI: every command's result as text or as JSON lines, and errors on one line (training's
live progress is ``textgen.trainview``'s).

JSON is built from the library's result dataclasses with ``asdict``, so the two forms cannot drift.
Nothing here imports TensorFlow.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shlex
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from textgen.basemodel import BASE_NAME, has_base
from textgen.commands import QUICK_START_TRAIN, checkpoint_dir_flag, command, fine_tune
from textgen.corpus import read_prompt_file
from textgen.errors import TextgenError, TrainingInterrupted
from textgen.generation import bias_row
from textgen.results import (
    DynamicEvaluation,
    Evaluation,
    ExportResult,
    ModelSource,
    RunSummary,
    epochs_done,
)
from textgen.tracking import Track, untracked
from textgen.vocab import for_display

if TYPE_CHECKING:
    from textgen.genconfig import SampleConfig, ServeConfig
    from textgen.generation import Piece, Sampler


def json_line(record: Any, **extra: Any) -> str:
    """One strict-JSON line: ``extra`` then the fields of ``record``, a dataclass or a dict (see ``_strict``)."""
    fields = record if isinstance(record, dict) else dataclasses.asdict(record)
    return json.dumps(_strict({**extra, **fields}), default=str, ensure_ascii=False, allow_nan=False)


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


# --- sample, repl ---------------------------------------------------------------------------


def warn(err_console: Console, note: str | None) -> None:
    """A warning on one line of stderr, if there is one."""
    if note:
        err_console.print(f"[yellow]warning:[/] {escape(note)}")


def note(err_console: Console, text: str | None) -> None:
    """A note on one line of stderr (why a model was chosen), if there is one: stdout keeps the text alone."""
    if text:
        err_console.print(escape(text), style="dim")


def show_serving(console: Console, url: str, source: ModelSource, config: ServeConfig) -> None:
    """Where the server listens, once its model answers."""
    what = source.name if source.weights is None else f"{source.name} ({source.weights} weights)"
    if source.name == BASE_NAME:
        what = f"{BASE_NAME} (the base model: English prose)"
    console.print(f"serving {escape(what)} on {url}: {config.slots} rows, up to {config.max_queue} requests waiting")
    if source.note:
        console.print(f"  note     {escape(source.note)}")
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


# A prompt this long takes a while to read (a character at a time at batch 1: about 5,000 a second for base:en on 2
# cores, 2026-12-04), so a note says so before the wait.
LONG_PROMPT_CHARS = 50_000


def read_prime_file(err_console: Console, name: str | None) -> str | None:
    """The text of ``--prime-file`` (None without one), with a note first if it is read from a terminal (how to end
    it) and after if it is long (that reading it takes a while)."""
    if name is None:
        return None
    if name == "-" and sys.stdin.isatty():
        note(err_console, "type or paste the prompt, then Ctrl-D on a line of its own")
    text = read_prompt_file(name)
    if len(text) >= LONG_PROMPT_CHARS:
        note(err_console, f"a prompt of {len(text):,} characters: it is read a character at a time first")
    return text


def show_sampling(
    console: Console,
    err_console: Console,
    sampler: Sampler,
    source: ModelSource,
    prime: str,
    settings: SampleConfig,
    as_json: bool,
    prime_file: str | None = None,
    track: Track = untracked,
    read: bool = False,
) -> None:
    """Generate and show samples of ``prime``: a single sample on a terminal streams in as it is generated;
    several, or output to a pipe, are shown when done (with ``--json``, one record each). A prime's characters
    outside the vocabulary are warned about first. A prime read from ``prime_file`` is not shown again: the
    samples are its continuations (with ``--json``, the file and its length stand for it). With ``read``, the
    sampler has read the prime already (``sample --adapt``): the samples go on from its start. A ``--logit-bias``
    character the model lacks is an error before any text. ``track`` hears the prompt read."""
    bias_row(settings.logit_bias, sampler.vocab)
    note(err_console, source.note)
    warn(err_console, sampler.vocab.unknown_note(prime))
    prompts = ["" if read else prime] * settings.num
    shown = prime if prime_file is None else ""
    record = source.record() if prime_file is None else {**source.record(), "prime_file": prime_file,
                                                         "prime_chars": len(prime)}  # fmt: skip
    if settings.num == 1 and console.is_terminal and not as_json:
        stream_sample(console, shown, sampler.stream(prompts, settings, track=track))
    else:
        show_samples(console, sampler.generate(prompts, settings, track), shown, settings, as_json, **record)


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
    # logit_bias as the API takes it, {"e": -100}, where the dataclass holds pairs
    fields = {**dataclasses.asdict(settings), "logit_bias": dict(settings.logit_bias)}
    for i, text in enumerate(texts):
        if as_json:
            print(json_line(fields, **record, index=i, prime=prime, text=text))
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
        f"{result.run} on {result.source}: {result.nats_per_char:.4f} nats/char, "
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
        f"{result.run} on {result.source}: {result.chars:,} characters read as one stream in segments of "
        f"{result.segment_len}; dynamic: eta {result.eta:g}, decay {result.decay:g} "
        f"({result.dynamic_nats_per_char - result.static_nats_per_char:+.4f} nats/char, {result.ratio:.1%} of static)",
        markup=False,
        highlight=False,
    )
    console.print(table)
    if result.unknown_chars:
        err_console.print(
            f"[yellow]warning:[/] {result.unknown_chars:,} characters are not in the run's vocabulary; "
            "they were scored as unknown"
        )


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
        flag = checkpoint_dir_flag(checkpoint_dir)
        scratch = command(QUICK_START_TRAIN + flag)
        if not has_base():
            console.print(f"no runs in {checkpoint_dir}/; train one: {scratch}", markup=False)
            return
        console.print(
            f"no runs in {checkpoint_dir}/: sample, repl and serve use the base model {BASE_NAME}", markup=False
        )
        console.print(
            f"train one on your text, from the base: {fine_tune(checkpoint_dir=checkpoint_dir)}", markup=False
        )
        console.print(f"or one from scratch: {scratch}", markup=False)
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
