"""The ``textgen`` commands' options, declared once: cli.py's signatures name them, one line each.

Each option more than one command takes is a ``Spec`` in ``SPECS`` (its flag, help, panel, and the default its help
names). A command that words one its own way (distill's "the student's units", tune's "Fixed settings" panel)
passes that to ``option``; the aliases below are the options as each command shows them. One command's own
options are declared at the end, with ``own``.

A new training setting is a field in ``textgen.settings``, a rule in ``textgen.config``, a ``Spec`` and an alias
here, and a line in ``train``'s signature (Typer reads a command's options from it); ``settings`` then builds the
settings from the parsed options by name, so no command body changes.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

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
    Split,
    Strategy,
    TrainConfig,
    Weights,
)
from textgen.errors import ConfigError
from textgen.settings import InitSettings, Settings

S = TypeVar("S", bound=Settings)

MODEL, DATA, TRAINING = ModelConfig(vocab_size=1), DataConfig(corpus=""), TrainConfig()
SGD_DEFAULTS = OPTIMIZER_DEFAULTS[Optimizer.sgd]
# The --help panels: what a user looks for together.
DATA_PANEL, MODEL_PANEL, OPTIMISATION, RUN = "Data", "Model", "Optimisation", "Run"
RECIPE, FINE_TUNING = "Recipe", "Fine-tuning"
FIXED = "Fixed settings (searched unless given)"  # textgen tune's: the recipe's settings it does not search


@dataclasses.dataclass(frozen=True)
class Spec:
    """An option as ``textgen train`` (or, for the others, its first command) shows it: ``shown`` is the default
    the help names (what applies when it is not given; None: the parameter's own default, if any)."""

    help: str
    panel: str | None = None
    shown: Any = None
    decls: tuple[str, ...] = ()
    metavar: str | None = None


_KEEP: Any = object()


def option(name: str, help: str = _KEEP, *, panel: str | None = _KEEP, shown: Any = _KEEP) -> Any:
    """The option ``SPECS[name]``, with the help, panel or shown default a command words its own way."""
    spec = SPECS[name]
    spec = dataclasses.replace(
        spec,
        help=spec.help if help is _KEEP else help,
        panel=spec.panel if panel is _KEEP else panel,
        shown=spec.shown if shown is _KEEP else shown,
    )
    return typer.Option(
        *spec.decls,
        help=spec.help,
        rich_help_panel=spec.panel,
        show_default=_show_default(spec.shown),
        metavar=spec.metavar,
    )


def own(help: str, *decls: str, panel: str | None = None, shown: Any = None) -> Any:
    """An option only one command has, in its ``--help`` panel, with the default its help names."""
    return typer.Option(*decls, help=help, rich_help_panel=panel, show_default=_show_default(shown))


def _show_default(shown: Any) -> bool | str:
    """Typer's ``show_default``: the parameter's default (None), none (False), or this, written as text."""
    return True if shown is None else shown if shown is False else str(shown)


def settings(cls: type[S], given: dict[str, Any], **parsed: Any) -> S:
    """Settings ``cls`` from a command's parsed options (its ``locals()``): each field an option of the same name
    sets, and the values ``parsed`` from options that are not given as they are (a duration, a negated flag)."""
    names = {field.name for field in dataclasses.fields(cls)}  # type: ignore[arg-type]  # every Settings is a dataclass
    return cls(**{name: value for name, value in given.items() if name in names} | parsed)


def init_settings(init_from: str | None, last: bool, freeze: Freeze | None) -> InitSettings | None:
    """``--init-from``'s settings; ``--last`` and ``--freeze`` say nothing without it."""
    if init_from is None:
        if last or freeze is not None:
            raise ConfigError(f"{'--last' if last else '--freeze'} goes with --init-from RUN (fine-tuning a run)")
        return None
    return InitSettings(init_from, Weights.of(last), freeze or Freeze.none)


ENCODING_HELP = "The text's encoding: auto tries UTF-8, then Windows-1252, then Latin-1; or a codec name such as utf-16"
TIME_BUDGET_HELP = (
    "Stop cleanly once the run has trained this long, wall-clock (start-up and the last validation included), e.g. "
    "90s, 30m, 1h30m; it counts the whole run: with --resume, +30m trains 30 minutes more"
)
TRAIN_JSON_HELP = "One JSON object per epoch and one at the end"

SPECS: dict[str, Spec] = {
    # Data
    "batch_size": Spec("Parallel streams per batch", DATA_PANEL, "the device profile's"),
    "seq_len": Spec("Characters per stream per batch", DATA_PANEL, DATA.seq_len),
    "download": Spec(
        "Fetch a Project Gutenberg book (e.g. 2600-0.txt) if not found locally", DATA_PANEL, None, ("--download",)
    ),
    "keep_boilerplate": Spec(
        "Keep Project Gutenberg's license header and footer", DATA_PANEL, None, ("--keep-boilerplate",)
    ),
    "encoding": Spec(ENCODING_HELP, DATA_PANEL),
    "max_vocab": Spec(
        "Keep only this many of the most frequent characters; the rest become the unknown id", DATA_PANEL, "all"
    ),
    "shift_windows": Spec(
        "Start each epoch's training streams a different 0 to --seq-len - 1 characters in (seeded), so that the "
        "windows, and where backpropagation through time is cut, fall elsewhere each epoch",
        DATA_PANEL,
        "on",
        ("--shift-windows/--no-shift-windows",),
    ),
    # Model
    "units": Spec("LSTM units per layer", MODEL_PANEL, MODEL.units),
    "layers": Spec("Stacked LSTM layers", MODEL_PANEL, MODEL.layers),
    "embedding_dim": Spec("Character embedding size", MODEL_PANEL, MODEL.embedding_dim),
    "dropout": Spec("Dropout on the embedding, between layers and before the output", MODEL_PANEL, MODEL.dropout),
    "layer_norm": Spec(
        "Layer-normalize each LSTM (Ba et al., 2016): slower per character, a better loss for the time on long runs "
        "(docs/performance.md, docs/quality.md); on a GPU it runs Keras' generic loop, not cuDNN",
        MODEL_PANEL,
        "off",
        ("--layer-norm/--no-layer-norm",),
    ),
    "weight_drop": Spec(
        "Weight-drop (AWD-LSTM): drop this fraction of each LSTM's recurrent weights while training, one mask for "
        "all of an update's timesteps and streams",
        MODEL_PANEL,
        f"{MODEL.weight_drop:g}; {InitConfig.WEIGHT_DROP:g} fine-tuning a text under {InitConfig.REGULARIZE_BELOW:,} "
        "characters",
    ),
    "weight_drop_after": Spec(
        "Train this many epochs before --weight-drop starts (it needs a rate): weight-drop slows early learning and "
        "pays once a run has made many passes over its text (docs/quality.md)",
        MODEL_PANEL,
        MODEL.weight_drop_after,
    ),
    "locked_output_dropout": Spec(
        "Drop the LSTM's output at this rate with one mask per stream for all of a batch's timesteps (locked, as "
        "its inputs are), instead of per element at --dropout, which then drops the inputs only",
        MODEL_PANEL,
        f"off: per element at --dropout; {InitConfig.LOCKED_OUTPUT_DROPOUT:g} fine-tuning a text under "
        f"{InitConfig.REGULARIZE_BELOW:,} characters",
    ),
    # Optimisation
    "lr": Spec("Peak learning rate", OPTIMISATION, f"{TRAINING.lr:g}; sgd: {SGD_DEFAULTS['lr']:g}"),
    "optimizer": Spec(
        "The update rule: adam; adamw (Adam with decoupled weight decay); rmsprop; sgd (Nesterov momentum)",
        OPTIMISATION,
        TRAINING.optimizer,
    ),
    "weight_decay": Spec(
        "Decoupled weight decay of the kernels and the embedding (not the biases), for any --optimizer",
        OPTIMISATION,
        f"0; adamw: {OPTIMIZER_DEFAULTS[Optimizer.adamw]['weight_decay']:g}",
    ),
    "momentum": Spec("SGD's Nesterov momentum", OPTIMISATION, f"sgd: {SGD_DEFAULTS['momentum']:g}"),
    "lr_schedule": Spec(
        "cosine: anneal the learning rate to zero over --time-budget or --epochs, whichever ends first; hold: keep "
        "it, then anneal it the same way over their last --anneal; plateau: halve it when validation stalls",
        OPTIMISATION,
        TRAINING.lr_schedule,
    ),
    "anneal": Spec(
        "hold: the part of the run, at its end, over which the learning rate anneals (0.2: the last fifth)",
        OPTIMISATION,
        TRAINING.anneal,
    ),
    "clip_norm": Spec("Clip the global gradient norm to this", OPTIMISATION, TRAINING.clip_norm),
    "epochs": Spec("Maximum epochs", OPTIMISATION, f"{TRAINING.epochs}; none when a --time-budget is given"),
    "time_budget": Spec(TIME_BUDGET_HELP, OPTIMISATION, "no limit"),
    "seed": Spec("Random seed", OPTIMISATION, TRAINING.seed),
    "accumulate": Spec(
        "Sum the gradients of this many batches of streams into one update: the update of a batch this many times "
        "bigger, with the memory of one",
        OPTIMISATION,
        TRAINING.accumulate,
    ),
    "warmup": Spec(
        "Raise the learning rate from 0 over this many first updates (hold and cosine schedules)",
        OPTIMISATION,
        f"0; {InitConfig.WARMUP_STEPS} with --init-from",
    ),
    # Run
    "device": Spec("Device profile; auto picks gpu when TensorFlow sees one", RUN),
    "strategy": Spec(
        "tf.distribute: mirrored uses every GPU of this machine; multiworker the machines in $TF_CONFIG (run the "
        "same command on each, with a shared --checkpoint-dir)",
        RUN,
        TRAINING.strategy,
    ),
    "threads": Spec(
        "Intra-op threads for training (e.g. 1 per worker when workers share a machine)", RUN, "the profile's"
    ),
    "run": Spec("Run name, or base:en for the base model in the package", None, "the latest run", ("--run",)),
    "checkpoint_dir": Spec("Where runs are saved"),
    "resume": Spec("Continue a run (the latest, or --run) where it stopped", RUN, None, ("--resume",)),
    "save_every": Spec("Save a resume point this often within an epoch, e.g. 5m", RUN, "5m"),
    "sample_every": Spec(
        "Show what the model writes after each epoch and this often within one (~0.7 s each), e.g. 5m; 0: never",
        RUN,
        f"{TRAINING.sample_every / 60:g}m",
    ),
    "json": Spec("Machine-readable output: one JSON object per line", None, None, ("--json",)),
    # Recipe
    "recipe": Spec(
        "Train a recipe: the best.json of textgen tune, or a run's config.json (its model, batch layout and "
        "optimizer; the flags you give override it, and another --optimizer drops its lr, momentum and weight "
        "decay for that optimizer's defaults)",
        RECIPE,
        None,
        ("--config",),
    ),
    "from_study": Spec("Train the best recipe of a textgen tune study (by name)", RECIPE),
    # Fine-tuning: textgen train's, and textgen tune's for a study whose every trial starts from a run.
    "init_from": Spec(
        "Fine-tune: start from this run's best weights (or a float export's; base:en: the base model in the "
        "package), on the text given; the model's shape "
        "comes from it, and its vocabulary is extended by the characters only the new text has",
        FINE_TUNING,
    ),
    "init_last": Spec(
        "With --init-from: start from the run's last weights, not its best", FINE_TUNING, None, ("--last",)
    ),
    "freeze": Spec(
        "With --init-from: keep the embedding (embedding), or the embedding and the LSTM layers (lstm), as the "
        "base run left them; for very small texts",
        FINE_TUNING,
        Freeze.none,
    ),
    # Reading a run or an export: sample, repl, serve, evaluate, export
    "last": Spec("Use the last weights instead of the best", None, None, ("--last",)),
    "model": Spec("An exported model (textgen export) instead of a run", None, False, ("--model",), "PATH"),
    "temp": Spec("Temperature; 0 picks the likeliest character", None, None, ("--temp",)),
    "top_k": Spec("Sample only from the K likeliest characters (0 = off)"),
    "top_p": Spec("Sample from the smallest set with this much probability (1 = off)"),
    "frequency_penalty": Spec(
        "Subtract this from a character's logit for each time the sample has generated it, in [-2, 2] (0 = off)"
    ),
    "presence_penalty": Spec(
        "Subtract this from a character's logit once the sample has generated it, in [-2, 2] (0 = off)"
    ),
    "logit_bias": Spec(
        "Add BIAS, in [-100, 100], to character C's logit; -100 bans it. Repeatable. C may be space, \\n, \\t, "
        "\\r or \\uXXXX (\\u005c is a backslash); ==1 biases '='. E.g. --logit-bias e=-100 --logit-bias space=2",
        None,
        "none",
        ("--logit-bias",),
        "C=BIAS",
    ),
    "sample_seed": Spec("Seed for reproducible text", None, "random"),
    "prime_file": Spec(
        "Start from this file's text (- reads standard input); it is read, not shown",
        None,
        False,
        ("--prime-file",),
        "PATH",
    ),
}

# Data
BatchSize = Annotated[int | None, option("batch_size")]
SeqLen = Annotated[int | None, option("seq_len")]
Download = Annotated[bool, option("download")]
KeepBoilerplate = Annotated[bool, option("keep_boilerplate")]
Encoding = Annotated[str, option("encoding")]
MaxVocab = Annotated[int | None, option("max_vocab")]
ShiftWindows = Annotated[bool | None, option("shift_windows")]
# Model
Units = Annotated[int | None, option("units")]
Layers = Annotated[int | None, option("layers")]
EmbeddingDim = Annotated[int | None, option("embedding_dim")]
Dropout = Annotated[float | None, option("dropout")]
LayerNorm = Annotated[bool | None, option("layer_norm")]
WeightDrop = Annotated[float | None, option("weight_drop")]
WeightDropAfter = Annotated[int | None, option("weight_drop_after")]
LockedOutputDropout = Annotated[float | None, option("locked_output_dropout")]
# Optimisation
LR = Annotated[float | None, option("lr")]
OptimizerOption = Annotated[Optimizer | None, option("optimizer")]
WeightDecay = Annotated[float | None, option("weight_decay")]
Momentum = Annotated[float | None, option("momentum")]
Schedule = Annotated[LRSchedule | None, option("lr_schedule")]
Anneal = Annotated[float | None, option("anneal")]
ClipNorm = Annotated[float | None, option("clip_norm")]
EpochsOption = Annotated[int | None, option("epochs")]
TimeBudget = Annotated[str | None, option("time_budget")]
TrainSeed = Annotated[int | None, option("seed")]
Accumulate = Annotated[int | None, option("accumulate")]
Warmup = Annotated[int | None, option("warmup")]
# Run
DeviceOption = Annotated[Device, option("device")]
StrategyOption = Annotated[Strategy | None, option("strategy")]
Threads = Annotated[int | None, option("threads")]
Resume = Annotated[bool, option("resume")]
SaveEvery = Annotated[str | None, option("save_every")]
SampleEveryOption = Annotated[str | None, option("sample_every")]
RunsDirOption = Annotated[Path, option("checkpoint_dir", panel=RUN)]
TrainJsonOption = Annotated[bool, option("json", TRAIN_JSON_HELP, panel=RUN)]
# textgen distill's model: the student's, the teacher's when not given
TEACHERS = "the teacher's"
StudentUnits = Annotated[int | None, option("units", "The student's LSTM units per layer", shown=TEACHERS)]
StudentLayers = Annotated[int | None, option("layers", "The student's stacked LSTM layers", shown=TEACHERS)]
StudentEmbeddingDim = Annotated[int | None, option("embedding_dim", shown=TEACHERS)]
StudentDropout = Annotated[float | None, option("dropout", "The student's dropout", shown=TEACHERS)]
StudentLayerNorm = Annotated[bool | None, option("layer_norm", "Layer-normalize the student's LSTMs", shown=TEACHERS)]
StudentWeightDrop = Annotated[float | None, option("weight_drop", shown=TEACHERS)]
StudentLockedOutputDropout = Annotated[float | None, option("locked_output_dropout", shown=TEACHERS)]


def fixed(name: str, help: str = _KEEP) -> Any:
    """A recipe setting as ``textgen tune`` shows it: fixed when given, else searched (so no default shown)."""
    return option(name, help, panel=FIXED, shown=None)


# textgen tune's recipe settings
FixedUnits = Annotated[int | None, fixed("units")]
FixedLayers = Annotated[int | None, fixed("layers")]
FixedEmbeddingDim = Annotated[int | None, fixed("embedding_dim")]
FixedDropout = Annotated[float | None, fixed("dropout", "Dropout")]
FixedLayerNorm = Annotated[bool | None, fixed("layer_norm", "Layer-normalized LSTMs, or not")]
FixedWeightDrop = Annotated[float | None, fixed("weight_drop", "Weight-drop of the recurrent weights")]
FixedLockedOutputDropout = Annotated[
    float | None, fixed("locked_output_dropout", "Locked dropout of the LSTM's output (searched: off, or a rate)")
]
FixedBatchSize = Annotated[int | None, fixed("batch_size")]
FixedSeqLen = Annotated[int | None, fixed("seq_len")]
FixedOptimizer = Annotated[Optimizer | None, fixed("optimizer", "The update rule")]
FixedLR = Annotated[float | None, fixed("lr")]
FixedWeightDecay = Annotated[
    float | None, fixed("weight_decay", "Decoupled weight decay, for any optimizer (searched for adamw only)")
]
FixedClipNorm = Annotated[float | None, fixed("clip_norm")]
# distill's and prune's: a run trained from another
FromRunTimeBudget = Annotated[
    str | None, option("time_budget", "Stop cleanly once the run has trained this long, wall-clock, e.g. 10m")
]
FromRunDevice = Annotated[Device, option("device", "Device profile")]
# Recipe and fine-tuning
Recipe = Annotated[Path | None, option("recipe")]
FromStudy = Annotated[str | None, option("from_study")]
InitFromOption = Annotated[str | None, option("init_from")]
InitLastOption = Annotated[bool, option("init_last")]
FreezeOption = Annotated[Freeze | None, option("freeze")]
# Reading a run or an export
JsonOption = Annotated[bool, option("json")]
RunOption = Annotated[str | None, option("run")]
CheckpointDirOption = Annotated[Path, option("checkpoint_dir")]
LastOption = Annotated[bool, option("last")]
TempOption = Annotated[float, option("temp")]
TopKOption = Annotated[int, option("top_k")]
TopPOption = Annotated[float, option("top_p")]
SeedOption = Annotated[int | None, option("sample_seed")]
FrequencyPenaltyOption = Annotated[float, option("frequency_penalty")]
PresencePenaltyOption = Annotated[float, option("presence_penalty")]
LogitBiasOption = Annotated[list[str] | None, option("logit_bias")]
ModelOption = Annotated[Path | None, option("model")]
PrimeFileOption = Annotated[str | None, option("prime_file")]


# One command's own options, declared here with the rest, so that cli.py holds the commands.
TrainCorpus = Annotated[
    list[str] | None,
    typer.Argument(
        help="Plain-text files, directories (their *.txt files) or glob patterns; a name that is not a file here is "
        "looked up in ./corpora, then $TEXTGEN_CORPUS_PATH.",
        show_default=False,
    ),
]
TrainRun = Annotated[str | None, option("run", panel=RUN, shown="the corpus name; the latest run with --resume")]
# distill
Teacher = Annotated[str, own("The run to learn from (its best weights)", shown=False)]
Temperature = Annotated[
    float | None,
    own(
        "Softens the teacher's and the student's predictions in the soft-target loss",
        panel="Distillation",
        shown=DistillConfig.temperature,
    ),
]
Alpha = Annotated[
    float | None,
    own(
        "Weight of the true next character; the rest goes to the teacher's soft targets",
        panel="Distillation",
        shown=DistillConfig.alpha,
    ),
]
DistillLR = Annotated[float | None, option("lr", "Adam's peak learning rate", shown=TRAINING.lr)]
StudentRun = Annotated[str | None, option("run", "The student run's name", panel=RUN, shown="TEACHER-UNITSu")]
# prune
Source = Annotated[str | None, own("The run to prune (its best weights); required", "--source", shown=False)]
Sparsity = Annotated[float, own("Fraction of each LSTM and output kernel set to zero in the end", panel="Pruning")]
Ramp = Annotated[
    float, own("Fraction of the fine-tuning (up to 0.99) over which the sparsity rises to its target", panel="Pruning")
]
PruneLR = Annotated[float | None, option("lr", "Adam's peak learning rate for the fine-tuning", shown=1e-3)]
PrunedRun = Annotated[
    str | None, option("run", "The pruned run's name", panel=RUN, shown="SOURCE-prunedNN, NN = --sparsity in %")
]
# tune
TuneCorpus = Annotated[
    list[str] | None,
    typer.Argument(
        help="The text to tune on: files, directories or globs (not needed to continue or show a study)",
        show_default=False,
    ),
]
StudyBudget = Annotated[
    str | None,
    own("Wall-clock for the whole study, all invocations together, e.g. 2h", shown="2h; a continued study: its own"),
]
TrialBudget = Annotated[
    str | None, own("Training time of each trial, e.g. 10m", shown="10m; a continued study: its own")
]
Trials = Annotated[
    int | None,
    own(
        "Stop when the study has this many trials (a continued study's earlier ones count)",
        shown="as many as the time allows",
    ),
]
Study = Annotated[str | None, own("The study's name", shown="the corpus name; with --show, the latest")]
StudySeed = Annotated[
    int | None, own("Seed of the search and of every trial's training", shown="0; a continued study: its own")
]
TuneInitFrom = Annotated[
    str | None,
    option(
        "init_from",
        "Fine-tune this run's best weights in every trial, on the text given; the model's shape comes from it",
    ),
]
TuneDevice = Annotated[Device, option("device", "Device profile of every trial", panel=None)]
TuneDownload = Annotated[bool, option("download", panel=None)]
Show = Annotated[bool, own("List a study's trials and best recipe, and exit", "--show")]
TuneJson = Annotated[bool, option("json", "One JSON object per trial and one for the study at the end")]
# serve
Host = Annotated[str, own("Address to listen on (0.0.0.0: every interface)")]
Port = Annotated[int, own("Port to listen on (0: any free one)")]
Slots = Annotated[int, own("Continuations generated at once (rows of the batch)")]
MaxQueue = Annotated[int, own("Requests that may wait for a row; more get 429")]
ApiKey = Annotated[
    str | None,
    typer.Option(
        envvar="TEXTGEN_API_KEY",
        help="Require 'Authorization: Bearer KEY' on every route but /, /health, /ready, /info and /runs",
        show_default=False,
    ),
]
MaxBody = Annotated[int, own("Largest request body, in bytes")]
RequestTimeout = Annotated[float, own("Seconds a request may take before it ends (finish_reason timeout)")]
Drain = Annotated[float, own("Seconds running streams may go on after SIGTERM or Ctrl-C")]
Prefill = Annotated[
    int,
    own(
        "Read prompts of up to N characters on arrival and draw the first characters, apart from the batch, when the "
        "batch would take over 0.1 s to reach them: a sooner first character, paid for by the other streams (0: read "
        "every prompt in the batch)"
    ),
]
PromptCache = Annotated[
    int,
    own(
        "Keep the state reached every 256 characters of a prompt and at the end of one of 256 or more, at most N "
        "states and 256 MB, so that a prompt starting with one starts there and reads only the rest (0: keep none)"
    ),
]
LogFormat = Annotated[str, own("The request log on stderr: text (a line each) or json (a JSON object a line)")]
# sample, repl, evaluate
Prime = Annotated[str, own("Text to start from; the model reads it first")]
SampleLength = Annotated[int, own("Characters to generate per sample")]
Num = Annotated[int, own("Number of samples, generated together as one batch")]
SampleJson = Annotated[bool, option("json", "One JSON object per sample, with the settings used")]
Adapt = Annotated[
    bool,
    own(
        "With --prime-file: adapt the weights to the document as it is read (dynamic evaluation, with the run's "
        "dynamic.json settings), then continue it; the run is not changed",
        "--adapt",
    ),
]
ReplLength = Annotated[int, own("Characters to generate per answer")]
EvaluateFile = Annotated[str | None, typer.Argument(help="Score this text file instead of a split", show_default=False)]
SplitOption = Annotated[Split, own("Held-out split of the run's corpus")]
EvaluateEncoding = Annotated[str, option("encoding", ENCODING_HELP + " (for FILE)", panel=None)]
Streams = Annotated[
    int | None,
    own(
        "Read the text as this many parallel streams, each starting cold (fewer read it a little better; "
        "docs/how-it-trains.md#evaluation); compare runs at one value",
        shown="the run's batch size",
    ),
]
Dynamic = Annotated[
    bool,
    own(
        "Also score with dynamic evaluation: the text read as one stream, the weights adapting to each segment "
        "once it is scored (never saved); the settings are tuned on the validation split the first time "
        "(minutes) and kept in the run's dynamic.json",
        "--dynamic",
    ),
]
Retune = Annotated[
    bool, own("With --dynamic: tune its step and pull again, at dynamic.json's segment length", "--retune")
]
