"""What the library's jobs return: plain dataclasses that the CLI renders as text, or as JSON with ``asdict``."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LN2 = math.log(2.0)


def bits(nats: float) -> float:
    """Nats per character -> bits per character."""
    return nats / LN2


def epochs_done(epochs: int, batches_into_epoch: int = 0) -> str:
    """A run's training as every message counts it (the end of training, its loss chart, textgen runs, the serve
    page): complete epochs, and the batches of one a time budget or a stop cut: "1 epoch", "0 epochs and 1,089
    batches", "2 epochs and 1 batch"."""
    text = f"{epochs:,} epoch{'' if epochs == 1 else 's'}"
    batches = f"{batches_into_epoch:,} batch{'' if batches_into_epoch == 1 else 'es'}"
    return f"{text} and {batches}" if batches_into_epoch else text


def lstm_shape(layers: int, units: int) -> str:
    """A model's LSTM stack as every message writes it: "1 × 512 LSTM"."""
    return f"{layers} × {units} LSTM"


class StopReason(str, enum.Enum):
    """Why a training run ended; the value is what ``state.json`` records as ``finished`` (a run stopped by a signal,
    a divergence or a lost worker records none: it resumes from its last commit)."""

    EPOCHS = "epochs"
    EARLY_STOPPING = "early_stopping"
    TIME_BUDGET = "time_budget"
    PRUNED = "pruned"  # ended by a judge of its curve (``textgen tune``'s pruner)
    INTERRUPTED = "interrupted"  # a stop signal: Ctrl-C, SIGTERM or SIGHUP, on any worker
    DIVERGED = "diverged"  # the loss became NaN or infinite
    LOST_WORKER = "lost_worker"  # another worker of a cluster stopped or became unreachable

    @property
    def label(self) -> str:
        return _STOP_LABELS[self]


_STOP_LABELS = {
    StopReason.EPOCHS: "all epochs done",
    StopReason.EARLY_STOPPING: "early-stopped",
    StopReason.TIME_BUDGET: "time budget spent",
    StopReason.PRUNED: "pruned by the tuner",
    StopReason.INTERRUPTED: "interrupted",
    StopReason.DIVERGED: "diverged",
    StopReason.LOST_WORKER: "a worker was lost",
}


class TrialStatus(str, enum.Enum):
    """Where a ``textgen tune`` trial stands; the value is what ``--json`` prints."""

    COMPLETE = "complete"
    PRUNED = "pruned"
    RUNNING = "running"
    WAITING = "waiting"  # queued: the first recipe, or an interrupted trial to resume
    INTERRUPTED = "interrupted"  # by a signal or a kill: the study resumes it
    FAILED = "failed"

    @property
    def label(self) -> str:
        """The word the trials table shows (80 columns hold it)."""
        return _TRIAL_LABELS.get(self, self.value)


_TRIAL_LABELS = {TrialStatus.COMPLETE: "done", TrialStatus.INTERRUPTED: "stopped"}


class StudyStop(str, enum.Enum):
    """Why ``textgen tune`` stopped a study; the value is what ``--json`` prints."""

    TRIALS = "trials"  # --trials of them done
    TIME_BUDGET = "time_budget"  # no room left for another trial
    INTERRUPTED = "interrupted"  # a signal, or an error out of a trial
    SHOWN = "shown"  # not run: textgen tune --show


@dataclass(frozen=True)
class ModelSource:
    """Where a sampler's weights come from: a run's ``best`` or ``last`` weights, or an export (``weights`` None)."""

    name: str  # the run's name, or the export's path (base:en for the package's base model)
    weights: str | None = None
    # Why this model, when the user named none and it is not the latest run (there is none): shown, not a field to read
    note: str | None = field(default=None, repr=False)

    def record(self) -> dict[str, str]:
        """What a ``--json`` record says of it."""
        return {"model": self.name} if self.weights is None else {"run": self.name, "weights": self.weights}


@dataclass(frozen=True)
class EpochLog:
    """One epoch of training (or the part of it a time budget left)."""

    epoch: int  # 1-based
    loss: float  # mean training cross-entropy, nats/char
    bpc: float
    val_loss: float
    val_bpc: float
    chars_per_sec: float  # training speed, validation excluded
    learning_rate: float  # at the epoch's end
    batches: int  # trained in this epoch (a resumed epoch counts those before the resume too)
    seconds: float  # trained so far by the run, all invocations
    improved: bool  # the best validation loss so far
    partial: bool  # cut short by a time budget
    sample: str | None = None  # what the model wrote after the epoch (``--sample-every 0``: None)

    def metrics(self) -> dict[str, Any]:
        """The numbers Keras' callbacks log (history.csv, TensorBoard, early stopping); ``partial`` as 1 or 0, so
        that history.csv says which epoch a time budget cut and counts epochs as the rest of textgen does."""
        return {**{k: getattr(self, k) for k in METRICS}, "partial": int(self.partial)}


METRICS = ("loss", "bpc", "val_loss", "val_bpc", "chars_per_sec", "learning_rate", "batches", "partial", "seconds")


@dataclass(frozen=True)
class TrainResult:
    """How a training run ended."""

    run: str
    path: Path
    epochs: int  # complete epochs trained so far, all invocations
    best_val_loss: float
    stop_reason: StopReason
    seconds: float  # trained by the run, all invocations
    chars_per_sec: float  # training speed of the last epoch
    max_epochs: int | None  # the run's --epochs (None: its time budget ends it)
    session_seconds: float = 0.0  # this invocation's wall clock, start-up included
    documents: int = 1  # files in the corpus
    unknown_chars: int = 0  # characters of the corpus --max-vocab mapped to the unknown id
    chief: bool = True  # whether this process wrote the run (the other workers of a cluster do not)
    stop_requested: str | None = None  # a stop signal that came as the last epoch ended (the run finished anyway)
    batches_into_epoch: int = 0  # of the epoch a time budget cut (the run resumes there), as RunSummary's
    start_val_loss: float | None = None  # a new fine-tuned run's starting weights on validation, before training
    best_val_bpc: float = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "best_val_bpc", bits(self.best_val_loss))


@dataclass(frozen=True)
class Evaluation:
    """Mean cross-entropy of a run on held-out text, scored as contiguous stateful streams."""

    run: str
    source: str
    nats_per_char: float
    chars: int  # characters scored
    unknown_chars: int  # characters scored that are outside the vocabulary (scored as the unknown id)
    streams: int  # contiguous streams read in parallel, each from zero states
    seq_len: int  # characters per stream per batch; the state carries across batches
    bits_per_char: float = field(init=False)
    perplexity: float = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "bits_per_char", bits(self.nats_per_char))
        object.__setattr__(self, "perplexity", math.exp(self.nats_per_char))


@dataclass(frozen=True)
class DynamicEvaluation:
    """A run's cross-entropy on held-out text read as one stream in segments, static (the trained weights) and
    dynamic (adapting to each segment once it is scored: ``textgen.dynamic``), and how long each took."""

    run: str
    source: str
    static_nats_per_char: float
    dynamic_nats_per_char: float
    chars: int  # characters scored (every one after the first)
    unknown_chars: int  # of them, outside the vocabulary
    static_seconds: float
    dynamic_seconds: float
    eta: float  # the settings used (dynamic.json's)
    decay: float
    segment_len: int
    tuned_seconds: float | None = None  # the settings were tuned on the validation split now, in this time
    static_bits_per_char: float = field(init=False)
    dynamic_bits_per_char: float = field(init=False)
    ratio: float = field(init=False)  # dynamic / static

    def __post_init__(self) -> None:
        object.__setattr__(self, "static_bits_per_char", bits(self.static_nats_per_char))
        object.__setattr__(self, "dynamic_bits_per_char", bits(self.dynamic_nats_per_char))
        object.__setattr__(self, "ratio", self.dynamic_nats_per_char / self.static_nats_per_char)


@dataclass(frozen=True)
class RunSummary:
    """One run as ``textgen runs`` lists it (a damaged one has only its name and ``problem``)."""

    run: str
    corpus: str = ""
    model: str = ""  # e.g. "1 × 512 LSTM, dropout 0.1"
    epochs: int = 0  # complete ones
    batches_into_epoch: int = 0  # of the one a time budget or Ctrl-C cut
    steps: int = 0
    best_val_bpc: float | None = None
    seconds: float = 0.0
    finished: StopReason | None = None  # None: stopped by a signal, or still training; resumable either way
    usable: bool = False  # has a committed resume point (killed before its first save: no)
    device: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    made_from: str = ""  # e.g. "distilled from wp" or "pruned to 80% from wp"
    problem: str | None = None  # why the run's files cannot be read

    @property
    def status(self) -> str:
        if self.problem:
            return "damaged"
        if not self.usable:
            return "incomplete"
        return self.finished.label if self.finished else "resumable"


@dataclass(frozen=True)
class ExportResult:
    """Where an export went and what it holds."""

    run: str
    path: Path
    format: str
    quantize: str
    bytes: int  # on disk, the whole directory


@dataclass(frozen=True)
class TrialSummary:
    """One trial of a ``textgen tune`` study."""

    number: int
    state: TrialStatus
    recipe: dict[str, Any]  # the settings tried, flat (units, lr, optimizer, ...)
    # complete: validation nats/char read as SCORE_STREAMS streams; pruned: its last epoch's validation as training
    # reads it, as --batch-size streams (the stream count moves the reading a little: 0.001 from 16 to 64 streams)
    val_loss: float | None
    seconds: float  # wall-clock this trial took (a resumed trial's earlier time is the interrupted trial's row)
    run: str  # the trial's run directory
    note: str = ""  # why it failed, or which trial it resumes
    val_bpc: float | None = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "val_bpc", None if self.val_loss is None else bits(self.val_loss))


@dataclass(frozen=True)
class StudyResult:
    """A ``textgen tune`` study: its trials, the best one, and how much of its time budget it has used."""

    study: str
    path: Path
    corpus: list[str]
    trial_budget: float
    time_budget: float | None  # None when only shown (textgen tune --show)
    seconds: float  # wall-clock spent on trials, all invocations
    trials: list[TrialSummary]
    best: TrialSummary | None
    best_recipe: Path | None  # best.json: textgen train CORPUS --config it (or --from-study the study)
    stop_reason: StudyStop | None = None  # None while the study runs (what TuneProgress.begin gets)
