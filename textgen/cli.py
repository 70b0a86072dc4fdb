"""The ``textgen`` command: each command parses its options, makes one call to ``textgen.api``, renders with ``ui``.

TensorFlow is imported only inside those calls, so ``textgen --help`` and bad flags answer at once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import functools
import itertools
import os
import sys
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from typer._click import Command, Context  # typer 0.29 vendors click privately (see pyproject.toml)
from typer._click.exceptions import NoSuchOption
from typer.core import TyperGroup, TyperOption

from textgen import api, commands, tuneview, ui
from textgen.artifact import ExportFormat, Quantize
from textgen.checkpoint import DEFAULT_CHECKPOINT_DIR
from textgen.config import (
    OPTIMIZER_DEFAULTS,
    DataConfig,
    Device,
    DistillConfig,
    Freeze,
    InitConfig,
    LRSchedule,
    ModelConfig,
    Optimizer,
    PruneConfig,
    SampleConfig,
    ServeConfig,
    Split,
    Strategy,
    TrainConfig,
    Weights,
    flag,
)
from textgen.corpus import read_prompt_file
from textgen.durations import parse_budget, parse_duration
from textgen.errors import ClusterError, ConfigError, TextgenError, TextgenWarning
from textgen.repl import GREETING, Session
from textgen.settings import (
    DataSettings,
    DistillSettings,
    InitSettings,
    ModelSettings,
    PruneSettings,
    TrainRequest,
    TrainSettings,
)

console = Console(highlight=False, soft_wrap=True, emoji=False)  # user text is data: ":fire:" stays ":fire:"
err_console = Console(stderr=True, highlight=False, soft_wrap=True, emoji=False)


# Typer 0.29's help gives a flag a value type (`--json <bool>`) and puts a default written as text in parentheses
# (`[default: (the latest run)]`). It has no setting for either, so textgen's CLI adjusts its option class here.
_typer_type = TyperOption.display_type_rich
_typer_default = TyperOption._get_default_string


def _shown_type(option: TyperOption, ctx: Any) -> str | None:
    """An option's value type in ``--help``: none for a flag, which takes no value."""
    return None if option.is_flag else _typer_type(option, ctx)


def _shown_default(option: TyperOption, *, ctx: Any, show_default_is_str: bool, default_value: Any) -> str:
    """An option's default in ``--help``: a default written as text, as it is written."""
    if show_default_is_str:
        return str(option.show_default)
    return _typer_default(option, ctx=ctx, show_default_is_str=False, default_value=default_value)


TyperOption.display_type_rich = _shown_type  # type: ignore[method-assign, assignment]
TyperOption._get_default_string = _shown_default  # type: ignore[method-assign, assignment]


# What people write after a flag that takes no value (`--json true`), and the setting they mean.
FLAG_WORDS = {"true": True, "yes": True, "on": True, "1": True, "false": False, "no": False, "off": False, "0": False}


class OneLineErrors(TyperGroup):
    """Typer's command group, with click's usage errors (a bad choice, a missing value) on one line
    like textgen's own, instead of a usage block and an error panel; an unknown option is told where it belongs,
    and a flag given a value how to write it."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        call = {"args": args, "prog_name": prog_name, "complete_var": complete_var, **extra}
        if not standalone_mode:
            return super().main(**call, standalone_mode=False, windows_expand_args=windows_expand_args)
        try:
            code = super().main(**call, standalone_mode=False, windows_expand_args=windows_expand_args)  # Exit's code
        except typer.TyperException as exc:  # click's usage errors (click is typer 0.29's, vendored privately)
            message = getattr(exc, "format_message", exc.__str__)()
            if isinstance(exc, NoSuchOption) and exc.ctx is not None:
                message = self.no_such_option(exc.option_name, exc.ctx)
            if message.strip():  # no arguments: the message is the help, which Typer's rich help has printed
                ui.show_usage_error(err_console, message, getattr(exc, "ctx", None))
            sys.exit(exc.exit_code)
        except OSError as exc:  # outside the commands, which catch their own: --install-completion writing to $HOME
            ui.show_os_error(err_console, exc)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)

    def resolve_command(self, ctx: Context, args: list[str]) -> tuple[str | None, Command | None, list[str]]:
        """The command to run, refusing a value after one of its flags (`--json true`), which click would take
        as an argument of its own (a corpus named "true") or refuse as an extra one."""
        name, command, rest = super().resolve_command(ctx, args)
        if command is not None:
            flags = {opt: option for option in _options(command) if option.is_flag for opt in _names(option)}
            for given, word in itertools.pairwise(rest):
                if given in flags and word.lower() in FLAG_WORDS:
                    command_ctx = command.context_class(command, info_name=name, parent=ctx)
                    command_ctx.fail(_flag_given_a_value(given, FLAG_WORDS[word.lower()], flags[given], command_ctx))
        return name, command, rest

    def no_such_option(self, option: str, ctx: Context) -> str:
        """click's "no such option", naming the commands that have it, or else the command's nearest option."""
        where = f" for {ctx.info_name}" if ctx.command is not self else ""
        owners = [
            f"textgen {name}"
            for name, command in self.commands.items()
            if command is not ctx.command and any(option in _names(o) for o in _options(command))
        ]
        if owners:
            return f"no such option {option}{where} (it is an option of {_and(owners)})"
        names = [name for o in _options(ctx.command) for name in _names(o)]
        longer = [name for name in names if name.startswith(option)]  # --seq for --seq-len, before --seed
        near = longer if len(longer) == 1 else difflib.get_close_matches(option, names, 1)
        return f"no such option {option}{where}{f' (did you mean {near[0]}?)' if near else ''}"


def _options(command: Command) -> list[TyperOption]:
    """The options a command shows (``--help`` aside)."""
    return [p for p in command.params if isinstance(p, TyperOption) and not p.hidden]


def _names(option: TyperOption) -> list[str]:
    return [*option.opts, *option.secondary_opts]


def _flag_given_a_value(flag: str, on: bool, option: TyperOption, ctx: Context) -> str:
    """What to write instead of a flag followed by a word such as true or no: the flag, its --no- form, or nothing."""
    wanted = option.opts if on == (flag in option.opts) else option.secondary_opts
    instead = f"write {ctx.command_path} {wanted[0]}" if wanted else "leave it out for off"
    return f"{flag} is a flag and takes no value: {instead}"


def _and(names: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return " and ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)


app = typer.Typer(  # no help=: it would hide the callback's docstring, quick start included
    cls=OneLineErrors,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _show_version(asked: bool) -> None:
    if asked:
        console.print(" ".join(f"{name} {version}" for name, version in api.versions().items()), markup=False)
        raise typer.Exit()


# The help's first lines, with the quick start as the user runs textgen (``.venv/bin/textgen``, say): runnable as shown.
HELP = f"""Train character-level LSTM language models on a book, and play with them.

Quick start, War and Peace on the CPU, then a sample of what the model learned:

`{commands.command(commands.QUICK_START_TRAIN)}`

`{commands.command(commands.QUICK_START_SAMPLE)}`
"""


@app.callback(help=HELP)
def _main(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            help="Print the versions of textgen, TensorFlow and Keras, and exit",
            callback=_show_version,
            is_eager=True,
        ),
    ] = False,
) -> None:
    """The options every command shares (``--version``); the help is ``HELP``."""


@contextlib.contextmanager
def _errors() -> Iterator[None]:
    """Turn library errors, failed reads and writes, and Ctrl-C into one line on stderr and a non-zero exit; and
    the library's warnings into one "warning:" line each."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always", TextgenWarning)  # every time: a REPL or a test may load twice
            warnings.showwarning = functools.partial(_show_warning, warnings.showwarning)
            yield
    except TextgenError as exc:
        ui.show_error(err_console, exc)
        if isinstance(exc, ClusterError):
            # TensorFlow's collectives are aborted for good in this process, and tearing the interpreter down
            # prints a leaked thread pool's traceback: leave at once, everything is saved.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(exc.exit_code)
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt:
        err_console.print("[yellow]interrupted[/]")
        raise typer.Exit(130) from None
    except BrokenPipeError:  # the reader stopped early (| head): click ends quietly, with exit code 1
        raise
    except OSError as exc:  # a file the library does not check first (a full disk, a read-only directory)
        ui.show_os_error(err_console, exc)
        raise typer.Exit(1) from None


def _show_warning(show: Any, message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any) -> None:
    """``warnings.showwarning`` for a command: textgen's warnings on one line, others as ``show`` shows them."""
    if issubclass(category, TextgenWarning):
        ui.warn(err_console, str(message))
    else:
        show(message, category, *args, **kwargs)


MODEL, DATA, TRAINING, SAMPLING = ModelConfig(vocab_size=1), DataConfig(corpus=""), TrainConfig(), SampleConfig()
SERVING = ServeConfig()
SGD_DEFAULTS = OPTIMIZER_DEFAULTS[Optimizer.sgd]
JsonOption = Annotated[bool, typer.Option("--json", help="Machine-readable output: one JSON object per line")]
RunOption = Annotated[str | None, typer.Option("--run", help="Run name", show_default="the latest run")]
CheckpointDirOption = Annotated[Path, typer.Option(help="Where runs are saved")]
LastOption = Annotated[bool, typer.Option("--last", help="Use the last weights instead of the best")]
TempOption = Annotated[float, typer.Option("--temp", help="Temperature; 0 picks the likeliest character")]
TopKOption = Annotated[int, typer.Option(help="Sample only from the K likeliest characters (0 = off)")]
TopPOption = Annotated[float, typer.Option(help="Sample from the smallest set with this much probability (1 = off)")]
SeedOption = Annotated[int | None, typer.Option(help="Seed for reproducible text", show_default="random")]
ModelOption = Annotated[
    Path | None,
    typer.Option(
        "--model", help="An exported model (textgen export) instead of a run", show_default=False, metavar="PATH"
    ),
]


ENCODING_HELP = "The text's encoding: auto tries UTF-8, then Windows-1252, then Latin-1; or a codec name such as utf-16"


def _option(help: str, panel: str, default: Any = None, *decls: str) -> Any:
    """A ``train`` option in its ``--help`` panel; ``default`` is what applies when it is not given."""
    shown: bool | str = True if default is None else str(default)
    return typer.Option(*decls, help=help, rich_help_panel=panel, show_default=shown)


EpochsOption = Annotated[
    int | None, _option("Maximum epochs", "Optimisation", f"{TRAINING.epochs}; none when a --time-budget is given")
]
SampleEveryOption = Annotated[
    str | None,
    _option(
        "Show what the model writes after each epoch and this often within one (~0.7 s each), e.g. 5m; 0: never",
        "Run",
        f"{TRAINING.sample_every / 60:g}m",
    ),
]


LAYER_NORM_HELP = (
    "Layer-normalize each LSTM (Ba et al., 2016): slower per character, a better loss for the time on long runs "
    "(docs/performance.md, docs/quality.md); on a GPU it runs Keras' generic loop, not cuDNN"
)

WEIGHT_DROP_HELP = (
    "Weight-drop (AWD-LSTM): drop this fraction of each LSTM's recurrent weights while training, one mask for all "
    "of an update's timesteps and streams"
)
LOCKED_OUTPUT_DROPOUT_HELP = (
    "Drop the LSTM's output at this rate with one mask per stream for all of a batch's timesteps (locked, as its "
    "inputs are), instead of per element at --dropout, which then drops the inputs only"
)

SHIFT_WINDOWS_HELP = (
    "Start each epoch's training streams a different 0 to --seq-len - 1 characters in (seeded), so that the "
    "windows, and where backpropagation through time is cut, fall elsewhere each epoch"
)

# Fine-tuning's options: textgen train's, and textgen tune's for a study whose every trial starts from a run.
FINE_TUNING = "Fine-tuning"
InitFromOption = Annotated[
    str | None,
    _option(
        "Fine-tune: start from this run's best weights (or a float export's), on the text given; the model's shape "
        "comes from it, and its vocabulary is extended by the characters only the new text has",
        FINE_TUNING,
        None,
    ),
]
TuneInitFromOption = Annotated[
    str | None,
    _option(
        "Fine-tune this run's best weights in every trial, on the text given; the model's shape comes from it",
        FINE_TUNING,
        None,
    ),
]
InitLastOption = Annotated[
    bool, _option("With --init-from: start from the run's last weights, not its best", FINE_TUNING, None, "--last")
]
FreezeOption = Annotated[
    Freeze | None,
    _option(
        "With --init-from: keep the embedding (embedding), or the embedding and the LSTM layers (lstm), as the "
        "base run left them; for very small texts",
        FINE_TUNING,
        Freeze.none,
    ),
]

TRAIN_EXAMPLES = """
**Examples**

    textgen train 2600-0.txt --device cpu --download --time-budget 12m
    textgen train --resume                            # continue the latest run
    textgen train --resume --time-budget +30m         # train it 30 minutes more
    textgen train my_book.txt --units 768 --layers 2  # your own text
    textgen train books/ --max-vocab 120              # a directory's .txt files
    textgen train 'books/*.txt' a.txt --accumulate 4  # a glob and a file
    textgen train 2600-0.txt --optimizer adamw --weight-decay 0.05 --epochs 5
    textgen train my_book.txt --layers 2 --layer-norm --time-budget 2h
    textgen train my_book.txt --from-study my_book    # tune's best recipe
    textgen train other.txt --config checkpoints/studies/my_book/best.json
    textgen train my_book.txt --init-from 2600-0 --time-budget 10m  # fine-tune
    textgen train tiny.txt --init-from 2600-0 --freeze embedding --run tiny
    TF_CONFIG='{...}' textgen train books/ --strategy multiworker --run lib

A name that is not a file here is looked up in ./corpora, then in $TEXTGEN_CORPUS_PATH; --download fetches
a Project Gutenberg book (2600-0.txt: War and Peace) found nowhere into ./corpora.
Ctrl-C stops at a clean point and saves; `--resume` continues from there.
"""


@app.command(epilog=TRAIN_EXAMPLES)
def train(
    corpus: Annotated[
        list[str] | None,
        typer.Argument(
            help="Plain-text files, directories (their *.txt files) or glob patterns; a name that is not a file "
            "here is looked up in ./corpora, then $TEXTGEN_CORPUS_PATH.",
            show_default=False,
        ),
    ] = None,
    batch_size: Annotated[int | None, _option("Parallel streams per batch", "Data", "the device profile's")] = None,
    seq_len: Annotated[int | None, _option("Characters per stream per batch", "Data", DATA.seq_len)] = None,
    download: Annotated[
        bool,
        _option("Fetch a Project Gutenberg book (e.g. 2600-0.txt) if not found locally", "Data", None, "--download"),
    ] = False,
    keep_boilerplate: Annotated[
        bool, _option("Keep Project Gutenberg's license header and footer", "Data", None, "--keep-boilerplate")
    ] = False,
    encoding: Annotated[str, _option(ENCODING_HELP, "Data")] = "auto",
    max_vocab: Annotated[
        int | None,
        _option("Keep only this many of the most frequent characters; the rest become the unknown id", "Data", "all"),
    ] = None,
    shift_windows: Annotated[
        bool | None, _option(SHIFT_WINDOWS_HELP, "Data", "on", "--shift-windows/--no-shift-windows")
    ] = None,
    units: Annotated[int | None, _option("LSTM units per layer", "Model", MODEL.units)] = None,
    layers: Annotated[int | None, _option("Stacked LSTM layers", "Model", MODEL.layers)] = None,
    embedding_dim: Annotated[int | None, _option("Character embedding size", "Model", MODEL.embedding_dim)] = None,
    dropout: Annotated[
        float | None, _option("Dropout on the embedding, between layers and before the output", "Model", MODEL.dropout)
    ] = None,
    layer_norm: Annotated[bool | None, _option(LAYER_NORM_HELP, "Model", "off", "--layer-norm/--no-layer-norm")] = None,
    weight_drop: Annotated[float | None, _option(WEIGHT_DROP_HELP, "Model", MODEL.weight_drop)] = None,
    locked_output_dropout: Annotated[
        float | None, _option(LOCKED_OUTPUT_DROPOUT_HELP, "Model", "off: per element at --dropout")
    ] = None,
    lr: Annotated[
        float | None, _option("Peak learning rate", "Optimisation", f"{TRAINING.lr:g}; sgd: {SGD_DEFAULTS['lr']:g}")
    ] = None,
    optimizer: Annotated[
        Optimizer | None,
        _option(
            "The update rule: adam; adamw (Adam with decoupled weight decay); rmsprop; sgd (Nesterov momentum)",
            "Optimisation",
            TRAINING.optimizer,
        ),
    ] = None,
    weight_decay: Annotated[
        float | None,
        _option(
            "Decoupled weight decay of the kernels and the embedding (not the biases), for any --optimizer",
            "Optimisation",
            f"0; adamw: {OPTIMIZER_DEFAULTS['adamw']['weight_decay']:g}",
        ),
    ] = None,
    momentum: Annotated[
        float | None, _option("SGD's Nesterov momentum", "Optimisation", f"sgd: {SGD_DEFAULTS['momentum']:g}")
    ] = None,
    lr_schedule: Annotated[
        LRSchedule | None,
        _option(
            "cosine: anneal the learning rate to zero over --time-budget or --epochs, whichever ends first; "
            "hold: keep it, then anneal it the same way over their last --anneal; plateau: halve it when validation "
            "stalls",
            "Optimisation",
            TRAINING.lr_schedule,
        ),
    ] = None,
    anneal: Annotated[
        float | None,
        _option(
            "hold: the part of the run, at its end, over which the learning rate anneals (0.2: the last fifth)",
            "Optimisation",
            TRAINING.anneal,
        ),
    ] = None,
    clip_norm: Annotated[
        float | None, _option("Clip the global gradient norm to this", "Optimisation", TRAINING.clip_norm)
    ] = None,
    epochs: EpochsOption = None,
    time_budget: Annotated[
        str | None,
        _option(
            "Stop cleanly once the run has trained this long, wall-clock (start-up and the last validation "
            "included), e.g. 90s, 30m, 1h30m; it counts the whole run: with --resume, +30m trains 30 minutes more",
            "Optimisation",
            "no limit",
        ),
    ] = None,
    seed: Annotated[int | None, _option("Random seed", "Optimisation", TRAINING.seed)] = None,
    accumulate: Annotated[
        int | None,
        _option(
            "Sum the gradients of this many batches of streams into one update: the update of a batch this "
            "many times bigger, with the memory of one",
            "Optimisation",
            TRAINING.accumulate,
        ),
    ] = None,
    device: Annotated[Device, _option("Device profile; auto picks gpu when TensorFlow sees one", "Run")] = Device.auto,
    strategy: Annotated[
        Strategy | None,
        _option(
            "tf.distribute: mirrored uses every GPU of this machine; multiworker the machines in $TF_CONFIG "
            "(run the same command on each, with a shared --checkpoint-dir)",
            "Run",
            TRAINING.strategy,
        ),
    ] = None,
    threads: Annotated[
        int | None,
        _option(
            "Intra-op threads for training (e.g. 1 per worker when workers share a machine)", "Run", "the profile's"
        ),
    ] = None,
    run: Annotated[str | None, _option("Run name", "Run", "the corpus name; the latest run with --resume")] = None,
    checkpoint_dir: Annotated[Path, _option("Where runs are saved", "Run")] = DEFAULT_CHECKPOINT_DIR,
    resume: Annotated[
        bool, _option("Continue a run (the latest, or --run) where it stopped", "Run", None, "--resume")
    ] = False,
    save_every: Annotated[
        str | None, _option("Save a resume point this often within an epoch, e.g. 5m", "Run", "5m")
    ] = None,
    sample_every: SampleEveryOption = None,
    recipe: Annotated[
        Path | None,
        _option(
            "Train a recipe: the best.json of textgen tune, or a run's config.json (its model, batch layout and "
            "optimizer; the flags you give override it, and another --optimizer drops its lr, momentum and weight "
            "decay for that optimizer's defaults)",
            "Recipe",
            None,
            "--config",
        ),
    ] = None,
    from_study: Annotated[
        str | None, _option("Train the best recipe of a textgen tune study (by name)", "Recipe", None)
    ] = None,
    init_from: InitFromOption = None,
    last: InitLastOption = False,
    freeze: FreezeOption = None,
    warmup: Annotated[
        int | None,
        _option(
            "Raise the learning rate from 0 over this many first updates (hold and cosine schedules)",
            "Optimisation",
            f"0; {InitConfig.WARMUP_STEPS} with --init-from",
        ),
    ] = None,
    as_json: Annotated[bool, _option("One JSON object per epoch and one at the end", "Run", None, "--json")] = False,
) -> None:
    """Train a character-level LSTM on text files, saving checkpoints as it goes."""
    with _errors():
        budget, more_time = parse_budget(time_budget)
        request = TrainRequest(
            tuple(corpus or ()),
            device=device,
            checkpoint_dir=checkpoint_dir,
            run_name=run,
            resume=resume,
            download=download,
            threads=threads,
            data=DataSettings(
                batch_size=batch_size,
                seq_len=seq_len,
                max_vocab=max_vocab,
                shift_windows=shift_windows,
                strip_boilerplate=False if keep_boilerplate else None,
                encoding=encoding,
            ),
            model=ModelSettings(
                units=units,
                layers=layers,
                embedding_dim=embedding_dim,
                dropout=dropout,
                layer_norm=layer_norm,
                weight_drop=weight_drop,
                locked_output_dropout=locked_output_dropout,
            ),
            training=TrainSettings(
                epochs=epochs,
                lr=lr,
                lr_schedule=lr_schedule,
                anneal=anneal,
                optimizer=optimizer,
                weight_decay=weight_decay,
                momentum=momentum,
                clip_norm=clip_norm,
                seed=seed,
                time_budget=budget,
                more_time=more_time,
                save_every=parse_duration(save_every, "--save-every") if save_every else None,
                sample_every=parse_duration(sample_every, "--sample-every", zero=True) if sample_every else None,
                accumulate=accumulate,
                strategy=strategy,
                warmup=warmup,
            ),
            recipe=recipe,
            from_study=from_study,
            init_from=_init_settings(init_from, last, freeze),
        )
        result = api.train(request, ui.TrainingDisplay(console, as_json=as_json))
        ui.show_train_result(console, result, as_json)


def _init_settings(init_from: str | None, last: bool, freeze: Freeze | None) -> InitSettings | None:
    """``--init-from``'s settings; ``--last`` and ``--freeze`` say nothing without it."""
    if init_from is None:
        if last or freeze is not None:
            raise ConfigError(f"{'--last' if last else '--freeze'} goes with --init-from RUN (fine-tuning a run)")
        return None
    return InitSettings(init_from, Weights.last if last else Weights.best, freeze or Freeze.none)


# Options shared by the commands that train a run from another (distill, prune).
TimeBudgetOption = Annotated[
    str | None,
    _option("Stop cleanly once the run has trained this long, wall-clock, e.g. 10m", "Optimisation", "no limit"),
]
TrainSeedOption = Annotated[int | None, _option("Random seed", "Optimisation", TRAINING.seed)]
DeviceOption = Annotated[Device, _option("Device profile", "Run")]
RunsDirOption = Annotated[Path, _option("Where runs are saved", "Run")]
TrainJsonOption = Annotated[bool, _option("One JSON object per epoch and one at the end", "Run", None, "--json")]


DISTILL_EXAMPLES = """
**Examples**

    textgen distill --teacher 2600-0 --units 128 --time-budget 20m
    textgen distill --teacher 2600-0 --units 256 --layers 2 --run wp-2x256

The student is an ordinary run: sample, evaluate, export it; `textgen train --resume --run NAME` continues it.
"""


@app.command(epilog=DISTILL_EXAMPLES)
def distill(
    teacher: Annotated[str, typer.Option(help="The run to learn from (its best weights)", show_default=False)],
    units: Annotated[int | None, _option("The student's LSTM units per layer", "Model", "the teacher's")] = None,
    layers: Annotated[int | None, _option("The student's stacked LSTM layers", "Model", "the teacher's")] = None,
    embedding_dim: Annotated[int | None, _option("Character embedding size", "Model", "the teacher's")] = None,
    dropout: Annotated[float | None, _option("The student's dropout", "Model", "the teacher's")] = None,
    layer_norm: Annotated[
        bool | None,
        _option("Layer-normalize the student's LSTMs", "Model", "the teacher's", "--layer-norm/--no-layer-norm"),
    ] = None,
    weight_drop: Annotated[float | None, _option(WEIGHT_DROP_HELP, "Model", "the teacher's")] = None,
    locked_output_dropout: Annotated[
        float | None, _option(LOCKED_OUTPUT_DROPOUT_HELP, "Model", "the teacher's")
    ] = None,
    temperature: Annotated[
        float | None,
        _option(
            "Softens the teacher's and the student's predictions in the soft-target loss",
            "Distillation",
            DistillConfig.temperature,
        ),
    ] = None,
    alpha: Annotated[
        float | None,
        _option(
            "Weight of the true next character; the rest goes to the teacher's soft targets",
            "Distillation",
            DistillConfig.alpha,
        ),
    ] = None,
    lr: Annotated[float | None, _option("Adam's peak learning rate", "Optimisation", TRAINING.lr)] = None,
    epochs: EpochsOption = None,
    time_budget: TimeBudgetOption = None,
    seed: TrainSeedOption = None,
    device: DeviceOption = Device.auto,
    run: Annotated[str | None, _option("The student run's name", "Run", "TEACHER-UNITSu")] = None,
    checkpoint_dir: RunsDirOption = DEFAULT_CHECKPOINT_DIR,
    as_json: TrainJsonOption = False,
) -> None:
    """Train a smaller student on a trained run's softened predictions (knowledge distillation)."""
    with _errors():  # settings are checked as they are made
        model = ModelSettings(
            units=units,
            layers=layers,
            embedding_dim=embedding_dim,
            dropout=dropout,
            layer_norm=layer_norm,
            weight_drop=weight_drop,
            locked_output_dropout=locked_output_dropout,
        )
        training = TrainSettings(lr=lr, epochs=epochs, seed=seed)
        distill = DistillSettings(teacher, temperature, alpha)
    _train_from_run(device, checkpoint_dir, run, training, time_budget, as_json, distill, model)


PRUNE_EXAMPLES = """
**Examples**

    textgen prune --source 2600-0 --sparsity 0.8 --time-budget 40m --ramp 0.4
    textgen export --run 2600-0-pruned80 --format litert --quantize int8

The pruned run is an ordinary run: sample, evaluate, export it; `textgen train --resume --run NAME` continues it.
Its zeros compress: gzip the exported model.
"""


@app.command(epilog=PRUNE_EXAMPLES)
def prune(
    ctx: typer.Context,
    # Not required by click: the old form, prune --run SOURCE --name NAME, names it with --run (see below).
    source: Annotated[
        str | None, typer.Option("--source", help="The run to prune (its best weights); required", show_default=False)
    ] = None,
    sparsity: Annotated[
        float, _option("Fraction of each LSTM and output kernel set to zero in the end", "Pruning")
    ] = PruneConfig.sparsity,
    ramp: Annotated[
        float,
        _option("Fraction of the fine-tuning (up to 0.99) over which the sparsity rises to its target", "Pruning"),
    ] = PruneConfig.ramp,
    lr: Annotated[float | None, _option("Adam's peak learning rate for the fine-tuning", "Optimisation", 1e-3)] = None,
    epochs: EpochsOption = None,
    time_budget: TimeBudgetOption = None,
    seed: TrainSeedOption = None,
    device: DeviceOption = Device.auto,
    run: Annotated[str | None, _option("The pruned run's name", "Run", "SOURCE-prunedNN, NN = --sparsity in %")] = None,
    checkpoint_dir: RunsDirOption = DEFAULT_CHECKPOINT_DIR,
    as_json: TrainJsonOption = False,
    name: Annotated[str | None, typer.Option(hidden=True)] = None,
) -> None:
    """Prune a trained run to a sparsity, fine-tuning it as the smallest weights are masked to zero."""
    if name is not None:  # the old form, prune --run SOURCE --name NAME: kept for one release
        if source is not None or run is None:
            ctx.fail(f"--name is deprecated: write textgen prune --source {source or 'SOURCE'} --run {name}")
        ui.warn(err_console, f"--name is deprecated: write textgen prune --source {run} --run {name}")
        source, run = run, name
    if source is None:
        instead = f": write textgen prune --source {run} (--run names the pruned run)" if run else ""
        ctx.fail(f"missing option '--source', the run to prune{instead}")
    with _errors():  # settings are checked as they are made
        training, pruning = TrainSettings(lr=lr, epochs=epochs, seed=seed), PruneSettings(source, sparsity, ramp)
    _train_from_run(device, checkpoint_dir, run, training, time_budget, as_json, pruning)


def _train_from_run(
    device: Device,
    checkpoint_dir: Path,
    run_name: str | None,
    training: TrainSettings,
    time_budget: str | None,
    as_json: bool,
    derived_from: DistillSettings | PruneSettings,
    model: ModelSettings | None = None,
) -> None:
    """Train a run made from another (a student, or a pruned copy; see ``api.train``) on that run's corpus."""
    with _errors():
        budget, more_time = parse_budget(time_budget)
        training = dataclasses.replace(training, time_budget=budget, more_time=more_time)
        request = TrainRequest(
            device=device,
            checkpoint_dir=checkpoint_dir,
            run_name=run_name,
            model=model or ModelSettings(),
            training=training,
            distill=derived_from if isinstance(derived_from, DistillSettings) else None,
            prune=derived_from if isinstance(derived_from, PruneSettings) else None,
        )
        result = api.train(request, ui.TrainingDisplay(console, as_json=as_json))
        ui.show_train_result(console, result, as_json)


PrimeFileOption = Annotated[
    str | None,
    typer.Option(
        "--prime-file",
        help="Start from this file's text (- reads standard input); it is read, not shown",
        show_default=False,
        metavar="PATH",
    ),
]


SAMPLE_EXAMPLES = """
**Examples**

    textgen sample --temp 0.8                  # the latest run, 500 characters
    textgen sample --run 2600-0 --prime "Prince Andrew" --num 8 --seed 7
    textgen sample --temp 0 --top-k 5 --top-p 0.9 --json
    textgen sample --prime-file ch1.txt --adapt   # adapt, then continue
    cat notes.txt | textgen sample --prime-file -
"""


@app.command(epilog=SAMPLE_EXAMPLES)
def sample(
    run: RunOption = None,
    checkpoint_dir: CheckpointDirOption = DEFAULT_CHECKPOINT_DIR,
    last: LastOption = False,
    prime: Annotated[str, typer.Option(help="Text to start from; the model reads it first")] = "",
    length: Annotated[int, typer.Option(help="Characters to generate per sample")] = SAMPLING.length,
    num: Annotated[int, typer.Option(help="Number of samples, generated together as one batch")] = SAMPLING.num,
    temp: TempOption = SAMPLING.temperature,
    top_k: TopKOption = SAMPLING.top_k,
    top_p: TopPOption = SAMPLING.top_p,
    seed: SeedOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per sample, with the settings used")] = False,
    model: ModelOption = None,
    prime_file: PrimeFileOption = None,
    adapt: Annotated[
        bool,
        typer.Option(
            "--adapt",
            help="With --prime-file: adapt the weights to the document as it is read (dynamic evaluation, with the "
            "run's dynamic.json settings), then continue it; the run is not changed",
        ),
    ] = False,
) -> None:
    """Generate text from a trained run (the latest by default) or an exported model."""
    with _errors():
        settings = SampleConfig(length=length, num=num, temperature=temp, top_k=top_k, top_p=top_p, seed=seed).seeded()
        if adapt and prime_file is None:
            raise ConfigError("--adapt adapts the weights to a document: add --prime-file PATH")
        if prime_file is not None and prime:
            raise ConfigError("give --prime or --prime-file, not both")
        document = read_prompt_file(prime_file) if prime_file is not None else None
        sampler, source = api.open_generator(
            checkpoint_dir=checkpoint_dir, run_name=run, weights=Weights.last if last else Weights.best, model=model,
            adapt_to=document if adapt else None,
        )  # fmt: skip
        if document is None:
            ui.show_sampling(console, err_console, sampler, source, prime, settings, as_json)
        else:
            ui.show_sampling(console, err_console, sampler, source, document, settings, as_json, prime_file=prime_file)


REPL_EXAMPLES = """
**Examples**

    textgen repl                               # the latest run
    textgen repl --run 2600-0 --temp 0.5 --length 300

In the REPL, type :help for commands (:temp, :len, :topk, :topp, :seed, :num, :context, :quit).
"""


@app.command(epilog=REPL_EXAMPLES)
def repl(
    run: RunOption = None,
    checkpoint_dir: CheckpointDirOption = DEFAULT_CHECKPOINT_DIR,
    last: LastOption = False,
    length: Annotated[int, typer.Option(help="Characters to generate per answer")] = 300,
    temp: TempOption = SAMPLING.temperature,
    top_k: TopKOption = SAMPLING.top_k,
    top_p: TopPOption = SAMPLING.top_p,
    seed: SeedOption = None,
    model: ModelOption = None,
    prime_file: PrimeFileOption = None,
) -> None:
    """Type a prompt, watch the continuation stream in; the model is loaded once."""
    with _errors():
        settings = SampleConfig(length=length, temperature=temp, top_k=top_k, top_p=top_p, seed=seed)
        document = read_prompt_file(prime_file) if prime_file is not None else None
        weights = Weights.last if last else Weights.best
        sampler, source = api.open_generator(
            checkpoint_dir=checkpoint_dir, run_name=run, weights=weights, model=model, warm_up=True
        )
    session = Session(sampler, settings, sys.stdout, lambda msg: err_console.print(f"[yellow]{escape(msg)}[/]"))
    console.print(f"[bold]{escape(source.name)}[/] loaded. {GREETING}")
    with _errors():
        if document is not None:  # the file's text is the first prompt; the conversation goes on from it
            session.generate(document)
        session.run("> ")


SERVE_EXAMPLES = """
**Examples**

    textgen serve                                 # the latest run, on http://127.0.0.1:8000 (open it for the page)
    textgen serve --run 2600-0 --port 9000
    textgen serve --model exports/2600-0-litert   # an export, without TensorFlow
    TEXTGEN_API_KEY=secret textgen serve --host 0.0.0.0

Clients speak OpenAI's completions API (POST /v1/completions, "max_tokens" in characters); /metrics is
Prometheus text. SIGTERM or Ctrl-C drains: for --drain seconds new requests get 503 and running streams go on,
then they end and the server exits. Each request leaves a line on stderr (--log-format json: a JSON object).
"""


@app.command(epilog=SERVE_EXAMPLES)
def serve(
    run: RunOption = None,
    checkpoint_dir: CheckpointDirOption = DEFAULT_CHECKPOINT_DIR,
    model: ModelOption = None,
    host: Annotated[str, typer.Option(help="Address to listen on (0.0.0.0: every interface)")] = SERVING.host,
    port: Annotated[int, typer.Option(help="Port to listen on (0: any free one)")] = SERVING.port,
    slots: Annotated[int, typer.Option(help="Continuations generated at once (rows of the batch)")] = SERVING.slots,
    max_queue: Annotated[int, typer.Option(help="Requests that may wait for a row; more get 429")] = SERVING.max_queue,
    api_key: Annotated[
        str | None,
        typer.Option(
            envvar="TEXTGEN_API_KEY",
            help="Require 'Authorization: Bearer KEY' on every route but /, /health, /ready, /info and /runs",
            show_default=False,
        ),
    ] = None,
    max_body: Annotated[int, typer.Option(help="Largest request body, in bytes")] = SERVING.max_body,
    request_timeout: Annotated[
        float, typer.Option(help="Seconds a request may take before it ends (finish_reason timeout)")
    ] = SERVING.request_timeout,
    drain: Annotated[
        float, typer.Option(help="Seconds running streams may go on after SIGTERM or Ctrl-C")
    ] = SERVING.drain_seconds,
    prefill: Annotated[
        int,
        typer.Option(
            help="Read prompts of up to N characters on arrival and draw the first characters, apart from the "
            "batch, when the batch would take over 0.1 s to reach them: a sooner first character, paid for by the "
            "other streams (0: read every prompt in the batch)"
        ),
    ] = SERVING.prefill,
    log_format: Annotated[
        str, typer.Option(help="The request log on stderr: text (a line each) or json (a JSON object a line)")
    ] = SERVING.log_format,
) -> None:
    """Serve a run (or an export) to many clients at once: an OpenAI-compatible API and a page to try it."""
    with _errors():
        config = ServeConfig(
            host, port, slots, max_queue, api_key, max_body, request_timeout, drain, prefill, log_format
        )
        api.serve(
            config,
            checkpoint_dir=checkpoint_dir,
            run_name=run,
            model=model,
            on_ready=lambda url, source: ui.show_serving(console, url, source, config),
        )
    console.print("stopped")


EVALUATE_EXAMPLES = """
**Examples**

    textgen evaluate                         # the latest run, its test split
    textgen evaluate --run 2600-0 --split val --json
    textgen evaluate other_book.txt          # any text file
    textgen evaluate --run big --streams 64  # compare runs of any --batch-size
    textgen evaluate --dynamic               # static and dynamic side by side
"""


@app.command(epilog=EVALUATE_EXAMPLES)
def evaluate(
    file: Annotated[
        str | None, typer.Argument(help="Score this text file instead of a split", show_default=False)
    ] = None,
    run: RunOption = None,
    checkpoint_dir: CheckpointDirOption = DEFAULT_CHECKPOINT_DIR,
    split: Annotated[Split, typer.Option(help="Held-out split of the run's corpus")] = Split.test,
    last: LastOption = False,
    encoding: Annotated[str, typer.Option(help=ENCODING_HELP + " (for FILE)")] = "auto",
    streams: Annotated[
        int | None,
        typer.Option(
            help="Read the text as this many parallel streams, each starting cold (fewer read it a little better; "
            "docs/how-it-trains.md#evaluation); compare runs at one value",
            show_default="the run's batch size",
        ),
    ] = None,
    as_json: JsonOption = False,
    model: ModelOption = None,
    dynamic: Annotated[
        bool,
        typer.Option(
            "--dynamic",
            help="Also score with dynamic evaluation: the text read as one stream, the weights adapting to each "
            "segment once it is scored (never saved); the settings are tuned on the validation split the first "
            "time (minutes) and kept in the run's dynamic.json",
        ),
    ] = False,
    retune: Annotated[bool, typer.Option("--retune", help="With --dynamic: tune its settings again")] = False,
) -> None:
    """Cross-entropy of a run (or an exported model) on held-out text: nats/char, bits/char and perplexity."""
    with _errors():
        if retune and not dynamic:
            raise ConfigError("--retune tunes --dynamic's settings: add --dynamic")
        if dynamic:
            _evaluate_dynamic(file, run, checkpoint_dir, split, last, encoding, streams, as_json, model, retune)
            return
        result = api.evaluate(
            checkpoint_dir=checkpoint_dir,
            run_name=run,
            split=split,
            file=file,
            weights=Weights.last if last else Weights.best,
            encoding=encoding,
            model=model,
            streams=streams,
        )
        ui.show_evaluation(console, err_console, result, as_json)


def _evaluate_dynamic(
    file: str | None,
    run: str | None,
    checkpoint_dir: Path,
    split: Split,
    last: bool,
    encoding: str,
    streams: int | None,
    as_json: bool,
    model: Path | None,
    retune: bool,
) -> None:
    """``textgen evaluate --dynamic``: a run's weights only, read as one stream."""
    if model is not None or streams is not None:
        raise ConfigError(f"--dynamic adapts a run's weights as one stream: drop {'--model' if model else '--streams'}")
    result = api.evaluate_dynamic(
        checkpoint_dir=checkpoint_dir, run_name=run, split=split, file=file,
        weights=Weights.last if last else Weights.best, encoding=encoding, retune=retune,
    )  # fmt: skip
    ui.show_dynamic_evaluation(console, err_console, result, as_json)


EXPORT_EXAMPLES = """
**Examples**

    textgen export --format litert --quantize int8     # for phones and browsers
    textgen export --run 2600-0 --format savedmodel -o serving/wp/1
    textgen sample --model exports/2600-0-litert-int8  # no TensorFlow needed

The directory holds the network and textgen.json (vocabulary, model config); nothing else from the run is needed.
"""


@app.command(epilog=EXPORT_EXAMPLES)
def export(
    format: Annotated[
        ExportFormat,
        typer.Option(help="litert: a .tflite next-token step; savedmodel: a SavedModel for TensorFlow Serving"),
    ],
    run: RunOption = None,
    checkpoint_dir: CheckpointDirOption = DEFAULT_CHECKPOINT_DIR,
    last: LastOption = False,
    quantize: Annotated[
        Quantize, typer.Option(help="LiteRT weights: none (float32), float16 (half size) or int8 (dynamic range)")
    ] = Quantize.none,
    output: Annotated[
        Path | None,
        typer.Option("-o", "--output", help="Directory to write", show_default="exports/RUN-FORMAT[-QUANTIZE]"),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Export a run as a self-contained model for LiteRT or TensorFlow Serving."""
    with _errors():
        result = api.export(
            checkpoint_dir=checkpoint_dir,
            run_name=run,
            format=format,
            quantize=quantize,
            path=output,
            weights=Weights.last if last else Weights.best,
        )
        ui.show_export(console, result, as_json)


TUNE_EXAMPLES = """
**Examples**

    textgen tune 2600-0.txt --download --time-budget 2h --trial-budget 10m
    textgen tune 2600-0.txt --time-budget 3h         # continue it: 1 more hour
    textgen tune --show                              # the latest study's trials
    textgen tune my_book.txt --units 256             # search all but --units
    textgen train 2600-0.txt --from-study 2600-0 --time-budget 2h  # its best
    textgen tune my_book.txt --init-from 2600-0 --study ft --trial-budget 5m
    textgen train my_book.txt --from-study ft --time-budget 30m  # fine-tunes

The first trial is textgen train's default recipe; trials behind the others at the same training time are
stopped early. Each trial is a run in CHECKPOINT_DIR/studies/STUDY/. Ctrl-C saves the running trial; the same
command continues the study, resuming that trial.
"""


FIXED = "Fixed settings (searched unless given)"


@app.command(epilog=TUNE_EXAMPLES)
def tune(
    corpus: Annotated[
        list[str] | None,
        typer.Argument(
            help="The text to tune on: files, directories or globs (not needed to continue or show a study)",
            show_default=False,
        ),
    ] = None,
    time_budget: Annotated[
        str | None,
        typer.Option(
            help="Wall-clock for the whole study, all invocations together, e.g. 2h",
            show_default="2h; a continued study: its own",
        ),
    ] = None,
    trial_budget: Annotated[
        str | None,
        typer.Option(help="Training time of each trial, e.g. 10m", show_default="10m; a continued study: its own"),
    ] = None,
    trials: Annotated[
        int | None,
        typer.Option(
            help="Stop when the study has this many trials (a continued study's earlier ones count)",
            show_default="as many as the time allows",
        ),
    ] = None,
    study: Annotated[
        str | None, typer.Option(help="The study's name", show_default="the corpus name; with --show, the latest")
    ] = None,
    seed: Annotated[
        int | None,
        typer.Option(
            help="Seed of the search and of every trial's training", show_default="0; a continued study: its own"
        ),
    ] = None,
    units: Annotated[int | None, _option("LSTM units per layer", FIXED)] = None,
    layers: Annotated[int | None, _option("Stacked LSTM layers", FIXED)] = None,
    embedding_dim: Annotated[int | None, _option("Character embedding size", FIXED)] = None,
    dropout: Annotated[float | None, _option("Dropout", FIXED)] = None,
    layer_norm: Annotated[
        bool | None, _option("Layer-normalized LSTMs, or not", FIXED, None, "--layer-norm/--no-layer-norm")
    ] = None,
    weight_drop: Annotated[float | None, _option("Weight-drop of the recurrent weights", FIXED)] = None,
    locked_output_dropout: Annotated[
        float | None, _option("Locked dropout of the LSTM's output (searched: off, or a rate)", FIXED)
    ] = None,
    batch_size: Annotated[int | None, _option("Parallel streams per batch", FIXED)] = None,
    seq_len: Annotated[int | None, _option("Characters per stream per batch", FIXED)] = None,
    optimizer: Annotated[Optimizer | None, _option("The update rule", FIXED)] = None,
    lr: Annotated[float | None, _option("Peak learning rate", FIXED)] = None,
    weight_decay: Annotated[
        float | None, _option("Decoupled weight decay, for any optimizer (searched for adamw only)", FIXED)
    ] = None,
    clip_norm: Annotated[float | None, _option("Clip the global gradient norm to this", FIXED)] = None,
    init_from: TuneInitFromOption = None,
    last: InitLastOption = False,
    freeze: FreezeOption = None,
    device: Annotated[Device, typer.Option(help="Device profile of every trial")] = Device.auto,
    download: Annotated[
        bool, typer.Option("--download", help="Fetch a Project Gutenberg book (e.g. 2600-0.txt) if not found locally")
    ] = False,
    checkpoint_dir: CheckpointDirOption = DEFAULT_CHECKPOINT_DIR,
    show: Annotated[bool, typer.Option("--show", help="List a study's trials and best recipe, and exit")] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="One JSON object per trial and one for the study at the end")
    ] = False,
) -> None:
    """Search for the training recipe that scores best on a corpus's validation split, in a time budget."""
    with _errors():  # settings are checked as they are made
        data = DataSettings(batch_size=batch_size, seq_len=seq_len)
        model = ModelSettings(
            units=units,
            layers=layers,
            embedding_dim=embedding_dim,
            dropout=dropout,
            layer_norm=layer_norm,
            weight_drop=weight_drop,
            locked_output_dropout=locked_output_dropout,
        )
        training = TrainSettings(optimizer=optimizer, lr=lr, weight_decay=weight_decay, clip_norm=clip_norm)
        if show:
            searching = {
                "--time-budget": time_budget,
                "--trial-budget": trial_budget,
                "--trials": trials,
                "--seed": seed,
                "--device": None if device is Device.auto else device,
                "--init-from": init_from,
                "--last": last or None,
                "--freeze": freeze,
                **{flag(k): v for settings in (data, model, training) for k, v in settings.given().items()},
            }
            given = [name for name, value in searching.items() if value is not None]
            tuneview.show_study(
                console,
                api.show_study(checkpoint_dir=checkpoint_dir, study=study, corpus=corpus, searching=given),
                as_json,
            )
            return
        display = tuneview.TuneDisplay(console, as_json=as_json)
        result = api.tune(
            corpus,
            device=device,
            checkpoint_dir=checkpoint_dir,
            study=study,
            time_budget=parse_duration(time_budget) if time_budget else None,
            trial_budget=parse_duration(trial_budget, "--trial-budget") if trial_budget else None,
            trials=trials,
            seed=seed,
            data=data,
            model=model,
            training=training,
            init_from=_init_settings(init_from, last, freeze),
            progress=display,
            download=download,
        )
        tuneview.show_study(console, result, as_json, shown_live=display.live is not None)


RUNS_EXAMPLES = """
**Examples**

    textgen runs                                     # the runs in ./checkpoints
    textgen runs --checkpoint-dir /data/runs --json
"""


@app.command(epilog=RUNS_EXAMPLES)
def runs(checkpoint_dir: CheckpointDirOption = DEFAULT_CHECKPOINT_DIR, as_json: JsonOption = False) -> None:
    """List trained runs, most recent first, with their model, epochs and best validation loss."""
    with _errors():
        ui.show_runs(console, api.runs(checkpoint_dir=checkpoint_dir), checkpoint_dir, as_json)


def main() -> None:
    """Console-script entry point."""
    app()
