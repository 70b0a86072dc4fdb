"""The ``textgen`` command: thin Typer commands over the library. TensorFlow is imported lazily."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from textgen.checkpoint import DEFAULT_CHECKPOINT_DIR, find_run
from textgen.config import DataConfig, ModelConfig, SampleConfig, TrainConfig, parse_duration
from textgen.errors import TextgenError, TrainingInterrupted

app = typer.Typer(  # no help=: it would hide the callback's docstring, quick start included
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
)
console = Console(highlight=False, soft_wrap=True)


@app.callback()
def _main() -> None:
    """Train character-level LSTM language models on a book, and play with them.

    Quick start: `textgen train 2600-0.txt --device cpu`, then `textgen sample --temp 0.8`.
    """


err_console = Console(stderr=True, highlight=False, soft_wrap=True)


def _default(cls: type, name: str) -> Any:
    return next(f.default for f in dataclasses.fields(cls) if f.name == name)


def _quiet_tensorflow() -> None:
    """Import TensorFlow with its C++ start-up chatter kept off the terminal.

    Some of it is printed before TF_CPP_MIN_LOG_LEVEL is read, so stderr is muted
    during the import unless the user set TF_CPP_MIN_LOG_LEVEL themselves.
    """
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    if "tensorflow" in sys.modules or "TF_CPP_MIN_LOG_LEVEL" in os.environ:
        import keras

        return
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        import keras  # noqa: F401
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


@contextlib.contextmanager
def _errors() -> Iterator[None]:
    """Turn library errors and Ctrl-C into one line on stderr and a non-zero exit."""
    try:
        yield
    except TextgenError as exc:
        message = escape(str(exc))  # messages hold paths and '.[gpu]', not console markup
        err_console.print(
            f"[yellow]{message}[/]" if isinstance(exc, TrainingInterrupted) else f"[red]error:[/] {message}"
        )
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt:
        err_console.print("[yellow]interrupted[/]")
        raise typer.Exit(130) from None


TRAIN_EXAMPLES = """
**Examples**

    textgen train 2600-0.txt --device cpu             # War and Peace on the CPU

    textgen train 2600-0.txt --device cpu --resume    # continue the latest run

    textgen train 2600-0.txt --time-budget 12m        # a good model in minutes

    textgen train my_book.txt --epochs 20 --time-budget 30m --units 768 --layers 2

A name without a path is looked up in ./corpora and in $TEXTGEN_CORPUS_PATH.
Ctrl-C stops at a clean point and saves; `--resume` continues from there.
"""


@app.command(epilog=TRAIN_EXAMPLES)
def train(
    corpus: Annotated[
        str | None,
        typer.Argument(
            help="Plain-text file (UTF-8), or a name in ./corpora or $TEXTGEN_CORPUS_PATH.", show_default=False
        ),
    ] = None,
    units: Annotated[
        int | None,
        typer.Option(help=f"LSTM units per layer [default: {_default(ModelConfig, 'units')}]", show_default=False),
    ] = None,
    layers: Annotated[
        int | None,
        typer.Option(help=f"Stacked LSTM layers [default: {_default(ModelConfig, 'layers')}]", show_default=False),
    ] = None,
    embedding_dim: Annotated[
        int | None,
        typer.Option(
            help=f"Character embedding size [default: {_default(ModelConfig, 'embedding_dim')}]", show_default=False
        ),
    ] = None,
    dropout: Annotated[
        float | None,
        typer.Option(
            help=f"Dropout on the embedding, between layers and before the output [default: {_default(ModelConfig, 'dropout')}]",
            show_default=False,
        ),
    ] = None,
    batch_size: Annotated[
        int | None, typer.Option(help="Parallel streams per batch [default: the device profile's]", show_default=False)
    ] = None,
    seq_len: Annotated[
        int | None,
        typer.Option(
            help=f"Characters per stream per batch [default: {_default(DataConfig, 'seq_len')}]", show_default=False
        ),
    ] = None,
    lr: Annotated[
        float | None,
        typer.Option(help=f"Adam learning rate [default: {_default(TrainConfig, 'lr')}]", show_default=False),
    ] = None,
    lr_schedule: Annotated[
        str | None,
        typer.Option(
            help="cosine: anneal the learning rate to zero over --time-budget or --epochs, whichever ends first; "
            f"plateau: halve it when validation stalls [default: {_default(TrainConfig, 'lr_schedule')}]",
            show_default=False,
        ),
    ] = None,
    clip_norm: Annotated[
        float | None,
        typer.Option(
            help=f"Clip the global gradient norm to this [default: {_default(TrainConfig, 'clip_norm')}]",
            show_default=False,
        ),
    ] = None,
    epochs: Annotated[
        int | None,
        typer.Option(help=f"Maximum epochs [default: {_default(TrainConfig, 'epochs')}]", show_default=False),
    ] = None,
    time_budget: Annotated[
        str | None, typer.Option(help="Stop cleanly after this long, e.g. 90s, 30m, 1h30m", show_default=False)
    ] = None,
    seed: Annotated[
        int | None, typer.Option(help=f"Random seed [default: {_default(TrainConfig, 'seed')}]", show_default=False)
    ] = None,
    device: Annotated[str, typer.Option(help="Device profile: auto, cpu or gpu")] = "auto",
    run: Annotated[
        str | None,
        typer.Option(help="Run name [default: from the corpus name; latest run with --resume]", show_default=False),
    ] = None,
    checkpoint_dir: Annotated[Path, typer.Option(help="Where runs are saved")] = DEFAULT_CHECKPOINT_DIR,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue a run (the latest, or --run) where it stopped")
    ] = False,
    download: Annotated[
        bool, typer.Option("--download", help="Fetch a Project Gutenberg book (e.g. 2600-0.txt) if not found locally")
    ] = False,
    keep_boilerplate: Annotated[
        bool, typer.Option("--keep-boilerplate", help="Keep Project Gutenberg's license header and footer")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object per epoch and one at the end")] = False,
) -> None:
    """Train a character-level LSTM on a text file, saving checkpoints as it goes."""
    with _errors():
        data = {"batch_size": batch_size, "seq_len": seq_len}
        model = {"units": units, "layers": layers, "embedding_dim": embedding_dim, "dropout": dropout}
        training = {
            "epochs": epochs,
            "lr": lr,
            "lr_schedule": lr_schedule,
            "clip_norm": clip_norm,
            "seed": seed,
            "time_budget": parse_duration(time_budget) if time_budget else None,
        }
        _check_values(data, model, training)
        _quiet_tensorflow()
        from textgen.device import apply_profile, resolve_profile

        profile = resolve_profile(device)
        apply_profile(profile)
        from textgen.train import plan_training, resume_hint
        from textgen.train import train as run_training
        from textgen.ui import TrainingDisplay, describe, format_seconds

        plan = plan_training(
            corpus,
            profile,
            checkpoint_dir=checkpoint_dir,
            run_name=run,
            resume=resume,
            download=download,
            keep_boilerplate=keep_boilerplate,
            data=data,
            model=model,
            training=training,
        )
        cfg, splits = plan.config, plan.splits
        if not as_json:
            where = f"resuming at epoch {plan.resume_state['epoch'] + 1}" if plan.resume_state else "new run"
            console.print(f"[bold]{escape(plan.run.name)}[/] ({where}) -> {escape(str(plan.run.path))}")
            console.print(
                f"corpus   {escape(cfg.data.corpus)}: {len(splits.train):,} train / {len(splits.val):,} val / "
                f"{len(splits.test):,} test chars, {splits.vocab.size} ids"
            )
            console.print(f"model    {describe(dataclasses.asdict(cfg.model))}")
            console.print(
                f"training {describe({**dataclasses.asdict(cfg.training), 'batch_size': cfg.data.batch_size, 'seq_len': cfg.data.seq_len})}"
            )
            console.print(f"device   {cfg.profile.name}: {cfg.profile.notes}")
        result = run_training(plan, callbacks=[TrainingDisplay(console, as_json=as_json)])
        summary = {
            "event": "done",
            "run": result.run.name,
            "path": str(result.run.path),
            "epochs": result.epochs_done,
            "best_val_loss": result.best_val_loss,
            "best_val_bpc": result.best_val_bpc,
            "stop_reason": result.stop_reason,
            "seconds": result.seconds,
            "chars_per_sec": result.chars_per_sec,
        }
        if as_json:
            print(json.dumps(summary), flush=True)
            return
        reason = {
            "epochs": "all epochs done",
            "early_stopping": "validation stopped improving",
            "time_budget": "time budget spent",
        }[result.stop_reason]
        console.print(
            f"done ({reason}) after {result.epochs_done} epochs in {format_seconds(result.seconds)}: "
            f"best validation {result.best_val_loss:.4f} nats/char ({result.best_val_bpc:.3f} bits/char), "
            f"last epoch {result.chars_per_sec:,.0f} chars/s"
        )
        console.print(result.run.loss_curve_path.read_text(encoding="utf-8"), markup=False, end="")
        console.print(f"saved to {result.run.path}; {resume_hint(result.run)}", markup=False)


SAMPLE_EXAMPLES = """
**Examples**

    textgen sample --temp 0.8                        # latest run, 500 characters

    textgen sample --run war-and-peace --prime "Prince Andrew" --length 2000 --num 8 --seed 7

    textgen sample --temp 0 --top-k 5 --top-p 0.9 --json
"""

SAMPLE_DEFAULTS = SampleConfig()
RunOption = Annotated[str | None, typer.Option("--run", help="Run name [default: the latest run]", show_default=False)]
CheckpointDirOption = Annotated[Path, typer.Option(help="Where runs are saved")]
LastOption = Annotated[bool, typer.Option("--last", help="Use the last weights instead of the best")]
LengthOption = Annotated[int, typer.Option(help="Characters to generate per sample")]
TempOption = Annotated[float, typer.Option("--temp", help="Temperature; 0 picks the likeliest character")]
TopKOption = Annotated[int, typer.Option(help="Sample only from the K likeliest characters (0 = off)")]
TopPOption = Annotated[float, typer.Option(help="Sample from the smallest set with this much probability (1 = off)")]
SeedOption = Annotated[
    int | None, typer.Option(help="Seed for reproducible text [default: random]", show_default=False)
]
NumOption = Annotated[int, typer.Option(help="Number of samples, generated together as one batch")]


def _start_tensorflow_for_inference() -> None:
    """Import TensorFlow and set the thread pools of this machine's device profile."""
    _quiet_tensorflow()
    from textgen.device import configure_for_inference

    configure_for_inference()


def _load_generator(run_name: str | None, checkpoint_dir: Path, last: bool) -> Any:
    """The run's generator (TensorFlow imported here, after the run was found)."""
    found = find_run(checkpoint_dir, run_name)
    _start_tensorflow_for_inference()
    from textgen.sampling import Generator

    return Generator.from_run(found, "last" if last else "best"), found


def _warn_unknown(generator: Any, prime: str) -> None:
    unknown = generator.vocab.unknown_chars(prime)
    if unknown:
        chars = " ".join(repr(c) for c in unknown)
        err_console.print(f"[yellow]warning:[/] skipping prime characters the model has never seen: {chars}")


@app.command(epilog=SAMPLE_EXAMPLES)
def sample(
    run: RunOption = None,
    checkpoint_dir: CheckpointDirOption = DEFAULT_CHECKPOINT_DIR,
    last: LastOption = False,
    prime: Annotated[str, typer.Option(help="Text to start from; the model reads it first")] = "",
    length: LengthOption = SAMPLE_DEFAULTS.length,
    num: NumOption = SAMPLE_DEFAULTS.num,
    temp: TempOption = SAMPLE_DEFAULTS.temperature,
    top_k: TopKOption = SAMPLE_DEFAULTS.top_k,
    top_p: TopPOption = SAMPLE_DEFAULTS.top_p,
    seed: SeedOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per sample, with the settings used")] = False,
) -> None:
    """Generate text from a trained run (the latest by default)."""
    with _errors():
        settings = SampleConfig(length=length, num=num, temperature=temp, top_k=top_k, top_p=top_p, seed=seed).seeded()
        generator, found = _load_generator(run, checkpoint_dir, last)
        _warn_unknown(generator, prime)
        prompts = [prime] * settings.num
        if as_json:
            for i, text in enumerate(generator.generate(prompts, settings)):
                record = {"run": found.name, "weights": "last" if last else "best", "index": i, "prime": prime}
                print(json.dumps({**record, **dataclasses.asdict(settings), "text": text}, ensure_ascii=False))
            return
        if settings.num == 1 and console.is_terminal:
            console.print(prime, style="bold", end="")
            for piece in generator.stream(prompts, settings):
                console.out(piece.texts[0], end="", highlight=False)
            console.out("")
            return
        for i, text in enumerate(generator.generate(prompts, settings)):
            if settings.num > 1:
                console.out(f"{chr(10) if i else ''}--- sample {i + 1}/{settings.num} (seed {settings.seed}) ---")
            console.out(prime + text, highlight=False)


REPL_EXAMPLES = """
**Examples**

    textgen repl                      # the latest run

    textgen repl --run war-and-peace --temp 0.5 --length 300

In the REPL, type :help for commands (:temp, :len, :topk, :topp, :seed, :num, :context, :quit).
"""


@app.command(epilog=REPL_EXAMPLES)
def repl(
    run: RunOption = None,
    checkpoint_dir: CheckpointDirOption = DEFAULT_CHECKPOINT_DIR,
    last: LastOption = False,
    length: LengthOption = 300,
    temp: TempOption = SAMPLE_DEFAULTS.temperature,
    top_k: TopKOption = SAMPLE_DEFAULTS.top_k,
    top_p: TopPOption = SAMPLE_DEFAULTS.top_p,
    seed: SeedOption = None,
) -> None:
    """Type a prompt, watch the continuation stream in; the model is loaded once."""
    from textgen.repl import HELP, Session

    with _errors():
        settings = SampleConfig(length=length, temperature=temp, top_k=top_k, top_p=top_p, seed=seed)
        generator, found = _load_generator(run, checkpoint_dir, last)
        generator.generate([" "], SampleConfig(length=2, seed=0))  # compile now, not on the first prompt
    with contextlib.suppress(ImportError):  # not on every platform
        import readline  # noqa: F401 - line editing and history for input()
    session = Session(generator, settings, sys.stdout, lambda msg: err_console.print(f"[yellow]{msg}[/]"))
    console.print(f"[bold]{escape(found.name)}[/] loaded. {HELP.splitlines()[0]} Type :help for commands.")
    while True:
        try:
            line = input("> ")
        except EOFError:
            print()
            return
        except KeyboardInterrupt:
            print()
            continue
        if not session.handle(line):
            return


EVALUATE_EXAMPLES = """
**Examples**

    textgen evaluate                          # latest run, its test split

    textgen evaluate --run 2600-0 --split val --json

    textgen evaluate other_book.txt           # any text file
"""


@app.command(epilog=EVALUATE_EXAMPLES)
def evaluate(
    file: Annotated[
        str | None, typer.Argument(help="Score this text file instead of a split", show_default=False)
    ] = None,
    run: RunOption = None,
    checkpoint_dir: CheckpointDirOption = DEFAULT_CHECKPOINT_DIR,
    split: Annotated[str, typer.Option(help="Held-out split of the run's corpus: test or val")] = "test",
    last: LastOption = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object")] = False,
) -> None:
    """Cross-entropy of a run on held-out text: nats/char, bits/char and perplexity."""
    with _errors():
        found = find_run(checkpoint_dir, run)
        _start_tensorflow_for_inference()
        from textgen.evaluate import evaluate_run

        result = evaluate_run(found, split=split, file=file, which="last" if last else "best")
        summary = {
            "run": found.name,
            "source": result.source,
            "nats_per_char": result.nats_per_char,
            "bits_per_char": result.bits_per_char,
            "perplexity": result.perplexity,
            "chars": result.chars,
            "unknown_chars": result.unknown,
            "streams": result.streams,
            "method": result.method,
        }
        if as_json:
            print(json.dumps(summary))
            return
        console.print(
            f"{found.name} on the {result.source}: {result.nats_per_char:.4f} nats/char, "
            f"{result.bits_per_char:.4f} bits/char, perplexity {result.perplexity:.3f} "
            f"({result.chars:,} characters scored as {result.streams} contiguous streams, state carried throughout)"
        )
        if result.unknown:
            err_console.print(
                f"[yellow]warning:[/] {result.unknown:,} characters are not in the run's vocabulary; they were scored as unknown"
            )


RUNS_EXAMPLES = """
**Examples**

    textgen runs                              # the runs in ./checkpoints

    textgen runs --checkpoint-dir /data/runs --json
"""


@app.command(epilog=RUNS_EXAMPLES)
def runs(
    checkpoint_dir: CheckpointDirOption = DEFAULT_CHECKPOINT_DIR,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per run")] = False,
) -> None:
    """List trained runs, most recent first, with their model, epochs and best validation loss."""
    from textgen.checkpoint import list_runs

    with _errors():
        rows = []
        for found in list_runs(checkpoint_dir):
            cfg = found.load_config()
            state = found.load_state() if found.has_state() else {}
            best = state.get("best_val_loss")
            rows.append(
                {
                    "run": found.name,
                    "corpus": Path(cfg.data.corpus).name,
                    "model": f"{cfg.model.layers}x{cfg.model.units}"
                    + (f" d{cfg.model.dropout:g}" if cfg.model.dropout else ""),
                    "epochs": state.get("epoch", 0),  # complete ones
                    "batches_into_epoch": state.get("batch", 0),  # of the one a time budget or Ctrl-C cut
                    "steps": state.get("step", 0),
                    "best_val_bpc": best / math.log(2) if best else None,
                    "seconds": state.get("seconds", 0.0),
                    "finished": state.get("finished"),
                    "device": cfg.profile.name,
                    "config": cfg.to_dict(),
                }
            )
        if as_json:
            for row in rows:
                print(json.dumps(row))
            return
        if not rows:
            console.print(
                f"no runs in {checkpoint_dir}/; train one: textgen train 2600-0.txt --device cpu", markup=False
            )
            return
        from rich import box
        from rich.table import Table

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
        for r in rows:
            bpc = f"{r['best_val_bpc']:.3f}" if r["best_val_bpc"] else "-"
            status = {
                None: "resumable",
                "epochs": "done",
                "early_stopping": "early-stopped",
                "time_budget": "budget spent",
            }.get(r["finished"], r["finished"])
            table.add_row(
                r["run"],
                r["corpus"],
                r["model"],
                _epochs_cell(r["epochs"], r["batches_into_epoch"], r["steps"]),
                bpc,
                f"{r['seconds'] / 60:.1f} min",
                status,
            )
        console.print(table)


def _epochs_cell(epochs: int, batches_into_epoch: int, steps: int) -> str:
    """Epochs trained, with the fraction of one cut short (e.g. 5.2); "0 + 89 batches" before the first ends."""
    if not batches_into_epoch:
        return str(epochs)
    if not epochs:
        return f"0 + {batches_into_epoch} batches"
    return f"{epochs + batches_into_epoch / ((steps - batches_into_epoch) / epochs):.1f}"


def _check_values(data: dict[str, Any], model: dict[str, Any], training: dict[str, Any]) -> None:
    """Validate flag values before the slow TensorFlow import."""
    clean = [{k: v for k, v in d.items() if v is not None} for d in (data, model, training)]
    DataConfig(corpus="", **clean[0])
    ModelConfig(vocab_size=1, **clean[1])
    TrainConfig(**clean[2])


def main() -> None:
    """Console-script entry point."""
    app()
