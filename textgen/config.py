"""Frozen config dataclasses, one per concern, and the CLI flags that set their fields (generating text's in
``textgen.genconfig``).

Field names match CLI flags (``seq_len`` <-> ``--seq-len``) and JSON keys, so
a run directory's ``config.json`` rebuilds exactly what ``train`` built.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from textgen.errors import ConfigError, FieldError, shown
from textgen.typedjson import from_dict, to_dict

T = TypeVar("T")

DEFAULT_CHECKPOINT_DIR = Path("checkpoints")  # where runs are saved unless --checkpoint-dir says


_FLAG_NAMES = {"temperature": "--temp", "drain_seconds": "--drain"}  # --temp: short, as char-rnn users know it


def flag(field_name: str) -> str:
    """The CLI flag that sets a config field."""
    return _FLAG_NAMES.get(field_name, "--" + field_name.replace("_", "-"))


def flag_setting(field_name: str, value: Any) -> str:
    """A config field's value as the flags that give it: ``--units 512``, ``--layer-norm``, ``--no-layer-norm``."""
    if isinstance(value, bool):
        return flag(field_name) if value else "--no-" + flag(field_name).removeprefix("--")
    return f"{flag(field_name)} {value}"


def require(ok: bool, field_name: str, rule: str, value: Any, flag_name: str | None = None) -> None:
    """Refuse ``value`` unless ``ok``: one line naming the flag of ``field_name`` and the ``rule`` it breaks."""
    if not ok:
        raise FieldError(f"{flag_name or flag(field_name)} must be {rule} (got {shown(value)})", field_name, rule)


INT32_MAX = 2**31 - 1  # the sampler's and the data pipeline's integers are int32
MAX_SAMPLES = 4096  # samples generated at once, as --streams scored at once


def _is_positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value <= INT32_MAX


def require_positive_ints(cfg: Any, *names: str) -> None:
    """Refuse the first of ``cfg``'s fields ``names`` that is not a positive int32."""
    for name in names:
        require(
            _is_positive_int(getattr(cfg, name)), name, f"a positive integer up to {INT32_MAX:,}", getattr(cfg, name)
        )


def is_finite(value: Any) -> bool:
    """A real number, not NaN or infinite (a float flag can be given as nan or inf)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@dataclasses.dataclass(frozen=True)
class Rule:
    """What one field's value must be: a test, and the words that say it in an error (``--units must be ...``)."""

    ok: Callable[[Any], bool]
    says: str
    optional: bool = False  # None is a value of its own (off, or all), not a missing one
    flag: str | None = None  # the flag that sets the field, where it is not ``flag(name)``

    def or_none(self) -> Rule:
        return dataclasses.replace(self, optional=True)


POSITIVE_INT = Rule(_is_positive_int, f"a positive integer up to {INT32_MAX:,}")
SWITCH = Rule(lambda v: isinstance(v, bool), "true or false")
RATE = Rule(lambda v: is_finite(v) and 0.0 <= v < 1.0, "in [0, 1)")


def check_fields(rules: Mapping[str, Rule], values: Mapping[str, Any], *, given: bool = False) -> None:
    """Refuse the first value that breaks its field's rule, naming its flag. A config checks all its fields with
    it; the settings a user gives (``given``: ``None`` is a setting left out) are checked with the same rules as
    they are made, before TensorFlow loads and before any config exists."""
    for name, value in values.items():
        rule = rules.get(name)
        if rule is None or (value is None and (given or rule.optional)):
            continue
        require(value is not None and rule.ok(value), name, rule.says, value, rule.flag)


@functools.cache  # SampleConfig asks for every request a server takes (~30 us a call there, by py-spy)
def physical_memory() -> int:
    """Bytes of RAM on this machine."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Where the text comes from and how it is cut into stateful batches."""

    corpus: str
    strip_boilerplate: bool = True
    batch_size: int = 64
    seq_len: int = 100
    val_fraction: float = 0.05
    test_fraction: float = 0.05
    encoding: str = "utf-8"  # the codec the corpus was decoded with, or "auto" for each file's own
    corpus_size: int | None = None  # bytes; with corpus_hash, the corpus's fingerprint (None in older runs)
    corpus_hash: str | None = None
    # The corpus's files by their real paths, in order (empty in older runs: the corpus is one file, and ``corpus``
    # its real path); ``corpus`` is what the user gave, for people to read.
    files: tuple[str, ...] = ()
    max_vocab: int | None = None  # keep this many of the most frequent characters; None keeps all
    # Start each epoch's training streams a seeded 0 to seq_len - 1 characters in (docs/quality.md: War and Peace's
    # test split at 60 minutes, 1.1536 against 1.1643 with the windows fixed; False in runs saved before it existed).
    shift_windows: bool = True
    # A fine-tuned run's corpus is encoded with its base run's vocabulary (these characters, in id order), extended
    # by the characters only this corpus has; None: the corpus's own vocabulary.
    base_vocab: str | None = None

    RULES: ClassVar[dict[str, Rule]] = {
        "batch_size": POSITIVE_INT,
        "seq_len": POSITIVE_INT,
        "max_vocab": POSITIVE_INT.or_none(),  # None keeps every character
        "shift_windows": SWITCH,
        "strip_boilerplate": SWITCH,
        "val_fraction": Rule(lambda v: is_finite(v) and 0 < v < 0.5, "between 0 and 0.5"),
        "test_fraction": Rule(lambda v: is_finite(v) and 0 < v < 0.5, "between 0 and 0.5"),
    }

    def __post_init__(self) -> None:
        object.__setattr__(self, "files", tuple(self.files))  # a list when read from JSON
        check_fields(self.RULES, vars(self))

    @property
    def paths(self) -> tuple[str, ...]:
        """The corpus's files."""
        return self.files or (self.corpus,)

    @property
    def corpus_name(self) -> str:
        """The corpus, short: a file's name, or how many files and what was given."""
        return os.path.basename(self.corpus) if len(self.paths) == 1 else f"{len(self.files)} files: {self.corpus}"


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Embedding -> layers x LSTM(units) -> Dense(vocab_size) logits.

    The defaults are the recipe that scored best on War and Peace's test split after
    60 minutes on 2 CPU cores (docs/quality.md).
    """

    vocab_size: int
    embedding_dim: int = 64
    units: int = 512
    layers: int = 1
    dropout: float = 0.1
    layer_norm: bool = False  # layer-normalized LSTMs (textgen.model.LayerNormLSTMCell)
    # Weight-drop (Merity et al., 2017): DropConnect on every LSTM's recurrent kernel, one mask per update; 0: off.
    weight_drop: float = 0.0
    # Epochs trained before weight-drop starts: it slows a run's early learning and pays only once the run makes
    # many passes over its text (docs/quality.md). 0: from the first update.
    weight_drop_after: int = 0
    # The last LSTM's output dropout. None: each element dropped at ``dropout``, anew at every timestep. A rate: a
    # mask per stream shared by the batch's timesteps (locked, as on the LSTM inputs), ``dropout`` then the inputs'.
    locked_output_dropout: float | None = None

    RULES: ClassVar[dict[str, Rule]] = {
        "vocab_size": POSITIVE_INT,
        "embedding_dim": POSITIVE_INT,
        "units": POSITIVE_INT,
        "layers": POSITIVE_INT,
        "dropout": RATE,
        "weight_drop": RATE,
        "weight_drop_after": Rule(
            lambda v: isinstance(v, int) and 0 <= v <= 1_000_000, "a number of epochs from 0 to 1,000,000"
        ),
        "locked_output_dropout": RATE.or_none(),  # None: per element at ``dropout``
        "layer_norm": SWITCH,
    }

    def __post_init__(self) -> None:
        check_fields(self.RULES, vars(self))

    @property
    def parameters(self) -> int:
        """Trainable parameters: embedding, each LSTM (4 gates, and layer normalization's gains and shift), the
        output layer."""
        normalization = 10 * self.units if self.layer_norm else 0  # two 4U gains, and the cell's gain and shift
        lstm = sum(
            4 * self.units * ((self.embedding_dim if i == 0 else self.units) + self.units + 1) + normalization
            for i in range(self.layers)
        )
        return self.vocab_size * self.embedding_dim + lstm + (self.units + 1) * self.vocab_size


class Choice(str, enum.Enum):
    """A setting with named values: it compares equal to its value and prints as it (JSON, messages, flags)."""

    def __str__(self) -> str:
        return str(self.value)

    @classmethod
    def parse(cls: type[C], value: Any, field_name: str) -> C:
        """The member named ``value`` (a member, or its value as config.json and recipes hold it)."""
        try:
            return cls(value)
        except ValueError:
            raise ConfigError(
                f"{flag(field_name)} must be {' or '.join(m.value for m in cls)} (got {value!r})"
            ) from None


C = TypeVar("C", bound=Choice)


class LRSchedule(Choice):
    """How the learning rate moves during training."""

    cosine = "cosine"  # anneal to zero over the time budget or the epochs, whichever ends first
    hold = "hold"  # the peak rate, then the cosine anneal to zero over the run's last `anneal` of it
    plateau = "plateau"  # cut by lr_factor whenever validation loss stops improving


class Split(Choice):
    """The held-out parts of a run's corpus."""

    test = "test"
    val = "val"


class Strategy(Choice):
    """How training is spread: one device, several GPUs of one machine, or several machines (tf.distribute)."""

    none = "none"  # the default device
    mirrored = "mirrored"  # MirroredStrategy: every GPU of this machine
    multiworker = "multiworker"  # MultiWorkerMirroredStrategy: the cluster in $TF_CONFIG


class Optimizer(Choice):
    """The update rule (Keras' optimizers; each takes a decoupled --weight-decay)."""

    adam = "adam"
    adamw = "adamw"  # Adam with decoupled weight decay (Loshchilov and Hutter, 2019): 0.01 unless given
    rmsprop = "rmsprop"
    sgd = "sgd"  # with Nesterov momentum: 0.9 unless given


class Freeze(Choice):
    """What of a fine-tuned run's weights stays as its base run left it."""

    none = "none"
    embedding = "embedding"  # the character embedding (new characters' rows included)
    lstm = "lstm"  # the embedding and every LSTM layer: only the output layer trains


class Weights(Choice):
    """Which of a run's weights: its best validated, or its last resume point's."""

    best = "best"
    last = "last"

    @classmethod
    def of(cls, last: bool) -> Weights:
        """What ``--last`` asks for: the last resume point's weights, else the best validated."""
        return cls.last if last else cls.best


class Device(Choice):
    """What ``--device`` accepts: a device profile's name, or ``auto`` (gpu when TensorFlow sees one)."""

    auto = "auto"
    cpu = "cpu"
    gpu = "gpu"


# What each optimizer gets for the settings the user leaves out: AdamW decays, and SGD needs momentum and a far
# larger step than the adaptive rules' 2e-3.
OPTIMIZER_DEFAULTS: dict[Optimizer, dict[str, float]] = {
    Optimizer.adamw: {"weight_decay": 0.01},
    Optimizer.sgd: {"lr": 0.1, "momentum": 0.9},
}


OPTIMIZERS = tuple(s.value for s in Optimizer)
SPLITS = tuple(s.value for s in Split)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Optimiser, schedule and stopping rules."""

    epochs: int | None = 30  # None: no cap, the time budget ends the run (the default when only a budget is given)
    lr: float = 2e-3
    clip_norm: float = 5.0
    seed: int = 0
    time_budget: float | None = None  # seconds of training for the whole run, resumes included; None: no limit
    patience: int = 3  # epochs without validation improvement before stopping
    lr_patience: int = 1  # epochs without improvement before the learning rate is cut
    lr_factor: float = 0.5
    lr_schedule: LRSchedule = LRSchedule.hold
    anneal: float = 0.2  # hold: the part of the run, at its end, over which the rate anneals (the last fifth)
    save_every: float = 300.0  # seconds of training between mid-epoch resume points
    sample_every: float = 300.0  # seconds between samples shown within an epoch (one after each epoch too); 0: none
    accumulate: int = 1  # batches of streams whose gradients are summed into one update
    strategy: Strategy = Strategy.none  # how training is spread over devices and machines
    optimizer: Optimizer = Optimizer.adam
    weight_decay: float = 0.0  # decoupled: each update shrinks the kernels and the embedding by lr x this
    momentum: float = 0.0  # SGD's Nesterov momentum
    warmup: int = 0  # optimizer steps over which the learning rate rises from 0 to its schedule's (hold, cosine)

    @classmethod
    def of(cls, **given: Any) -> TrainConfig:
        """The config of the settings given, with the optimizer's own defaults for the rest (OPTIMIZER_DEFAULTS)."""
        given = settings_given(given)
        if "time_budget" in given and "epochs" not in given:  # the budget decides, not the default epoch cap
            given["epochs"] = None
        optimizer = Optimizer.parse(given.get("optimizer", cls.optimizer), "optimizer")
        return cls(**{**OPTIMIZER_DEFAULTS.get(optimizer, {}), **given})

    RULES: ClassVar[dict[str, Rule]] = {
        "epochs": POSITIVE_INT.or_none(),  # None only with a time budget (below)
        "lr": Rule(lambda v: is_finite(v) and v > 0, "a positive number"),
        "clip_norm": Rule(lambda v: is_finite(v) and v > 0, "a positive number"),
        "seed": Rule(lambda v: isinstance(v, int) and 0 <= v <= INT32_MAX, f"an integer in [0, {INT32_MAX}]"),
        "time_budget": Rule(lambda v: is_finite(v) and v > 0, "a positive duration like 90s, 30m or 1h30m").or_none(),
        "patience": POSITIVE_INT,
        "lr_patience": POSITIVE_INT,
        "lr_factor": Rule(lambda v: is_finite(v) and 0 < v < 1, "between 0 and 1"),
        "anneal": Rule(lambda v: is_finite(v) and 0 < v <= 1, "in (0, 1]"),
        "save_every": Rule(lambda v: is_finite(v) and v > 0, "a positive duration like 5m"),
        "sample_every": Rule(lambda v: is_finite(v) and v >= 0, "a duration like 5m, or 0 for no samples"),
        "accumulate": Rule(lambda v: isinstance(v, int) and 1 <= v <= 64, "from 1 to 64"),
        "weight_decay": RATE,
        "momentum": RATE,
        "warmup": Rule(lambda v: isinstance(v, int) and 0 <= v <= 1_000_000, "a number of steps from 0 to 1,000,000"),
    }

    def __post_init__(self) -> None:
        if self.epochs is None and self.time_budget is None:
            require(False, "epochs", POSITIVE_INT.says, None)
        for name, kind in (("optimizer", Optimizer), ("strategy", Strategy), ("lr_schedule", LRSchedule)):
            object.__setattr__(self, name, kind.parse(getattr(self, name), name))  # a string when read from JSON
        check_fields(self.RULES, vars(self))
        if self.warmup and self.lr_schedule == "plateau":
            raise ConfigError("--warmup works with --lr-schedule hold or cosine, not plateau; drop one of them")
        if self.momentum and self.optimizer != "sgd":
            raise ConfigError(
                f"--momentum is SGD's (got --optimizer {self.optimizer}, which keeps its own moving averages); "
                "add --optimizer sgd or drop --momentum"
            )


def settings_given(values: dict[str, Any]) -> dict[str, Any]:
    """The settings a user gave: a CLI flag left out arrives as ``None``."""
    return {k: v for k, v in values.items() if v is not None}


def replace(cfg: T, **changes: Any) -> T:
    """A copy of a config with the given fields changed; ``None`` values are ignored."""
    return dataclasses.replace(cfg, **settings_given(changes))  # type: ignore[type-var]


@dataclasses.dataclass(frozen=True)
class DeviceProfile:
    """A named bundle of device settings, printed at start and saved with the run."""

    name: Device  # cpu or gpu
    precision: str  # a Keras dtype policy: "float32" or "mixed_float16"
    batch_size: int
    intra_op_threads: int  # training's thread pools; 0 lets TensorFlow choose
    inter_op_threads: int
    jit_compile: bool
    fast_lstm: bool = False  # train through textgen.fastlstm instead of Keras' LSTM loop
    sample_intra_op_threads: int = 0  # sampling's and evaluation's thread pools
    sample_inter_op_threads: int = 0
    notes: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", Device.parse(self.name, "device"))  # a string when read from JSON
        # Checked because a run's config.json brings them back: a hand-edited one must not reach Keras or TensorFlow.
        if self.precision not in PRECISIONS:
            raise ConfigError(f"profile.precision must be {' or '.join(PRECISIONS)} (got {shown(self.precision)})")
        sizes = (
            "batch_size",
            "intra_op_threads",
            "inter_op_threads",
            "sample_intra_op_threads",
            "sample_inter_op_threads",
        )
        for name in sizes:
            value = getattr(self, name)
            if not (isinstance(value, int) and 0 <= value <= 4096):  # threads: 0 is TensorFlow's choice
                raise ConfigError(f"profile.{name} must be an integer from 0 to 4096 (got {shown(value)})")


PRECISIONS = ("float32", "mixed_float16")  # the Keras dtype policies of the device profiles


@dataclasses.dataclass(frozen=True)
class DistillConfig:
    """Train on a teacher run's softened predictions as well as on the text (Hinton et al., 2015)."""

    teacher: str  # the teacher run's directory
    # On War and Peace (a 1 x 512 teacher at 1.182 val, a 1 x 128 student, 6 epochs): temperature 1 with alpha 0
    # reached 1.535 val nats/char, training from scratch 1.556, and Hinton's temperature 2 with alpha 0.5 1.622.
    temperature: float = 1.0  # softens both distributions in the soft-target term
    alpha: float = 0.0  # weight of the true next character; 1 - alpha goes to the teacher's soft targets
    teacher_val_loss: float | None = None  # its best weights' loss when the student started (None in older runs)

    RULES: ClassVar[dict[str, Rule]] = {
        "temperature": Rule(lambda v: is_finite(v) and 0.1 <= v <= 100, "between 0.1 and 100", flag="--temperature"),
        "alpha": Rule(lambda v: is_finite(v) and 0.0 <= v <= 1.0, "between 0 and 1"),
    }

    def __post_init__(self) -> None:
        check_fields(self.RULES, vars(self))


@dataclasses.dataclass(frozen=True)
class PruneConfig:
    """Gradual magnitude pruning (Zhu and Gupta, 2017) of a trained run, fine-tuned as it goes."""

    # Fine-tuning starts from trained weights: half the peak learning rate of training from scratch.
    FINE_TUNE_LR: ClassVar[float] = 1e-3

    source: str  # the pruned run's directory
    sparsity: float = 0.8  # the fraction of each LSTM and output kernel set to zero in the end
    ramp: float = 0.5  # the fraction of the fine-tuning over which the sparsity rises to its target

    RULES: ClassVar[dict[str, Rule]] = {
        "sparsity": Rule(lambda v: is_finite(v) and 0.0 < v < 1.0, "between 0 and 1 (exclusive)"),
        # The sparsity rises in steps of 1% of the run: it reaches the target at the step that starts at ``ramp``,
        # so a ramp over 0.99 would never get there (and the run would have no best weights at full sparsity).
        "ramp": Rule(lambda v: is_finite(v) and 0.0 < v <= 0.99, "in (0, 0.99]"),
    }

    def __post_init__(self) -> None:
        check_fields(self.RULES, vars(self))


@dataclasses.dataclass(frozen=True)
class DynamicConfig:
    """Dynamic evaluation's settings (Krause et al., 2018; ``textgen.dynamic``): each segment of ``segment_len``
    characters is scored, then one step θ ← θ − eta·g/(√MS + ε) + decay·(θ₀ − θ) adapts the weights to it.

    Kept in a run's ``dynamic.json`` once tuned on its validation split, apart from the weights, which never change.
    """

    eta: float = 1e-4  # the step on the RMS-normalised gradient (the middle of textgen.dynamic.TUNE_ETAS)
    decay: float = 1e-3  # λ: the pull back toward the trained weights θ₀ at every step
    segment_len: int = 50  # characters scored, then adapted to, at a time

    RULES: ClassVar[dict[str, Rule]] = {
        "eta": Rule(lambda v: is_finite(v) and 0.0 <= v <= 1.0, "a number in [0, 1]", flag="dynamic eta"),
        "decay": Rule(lambda v: is_finite(v) and 0.0 <= v < 1.0, "in [0, 1)", flag="dynamic decay"),
        "segment_len": Rule(
            lambda v: isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 10_000,
            "an integer from 1 to 10,000",
            flag="dynamic segment_len",
        ),
    }

    def __post_init__(self) -> None:
        check_fields(self.RULES, vars(self))


@dataclasses.dataclass(frozen=True)
class InitConfig:
    """Where a fine-tuned run's first weights came from: a copy of them is kept in the run (``init.weights.h5``),
    so the base run may change or go without harm to this one."""

    # Fine-tuning a 3-minute War and Peace run on 50 KB of Great Expectations for 1 minute, two seeds: test 1.7085
    # nats/char without a warm-up, 1.7022 with 100 steps, 1.7008 with 300 (docs/finetuning.md). 100 is most of the
    # gain, and leaves a short budget's first epochs their rate.
    WARMUP_STEPS: ClassVar[int] = 100
    # A fine-tune of a text this small overfits within a minute: 50 KB fine-tuned from base:en for 2 minutes had its
    # best weights at the third of 13 epochs. Weight-drop with locked output dropout did best of the regularizers
    # tried (docs/finetuning.md); larger texts were not measured with them and keep the base's settings.
    REGULARIZE_BELOW: ClassVar[int] = 100_000
    WEIGHT_DROP: ClassVar[float] = 0.25
    LOCKED_OUTPUT_DROPOUT: ClassVar[float] = 0.2

    source: str  # the base run's directory (or the export's), when this run started
    name: str  # the base run's name (an export's: the run it was exported from)
    weights: Weights  # which of its weights
    weights_hash: str  # blake2b of the weights file copied in
    val_loss: float | None  # the base run's best validation loss (on its own corpus); None from an export
    corpus: str | None  # what the base run trained on; None from an export
    model: ModelConfig  # the base run's model; this run's is the same with the vocabulary extended
    freeze: Freeze = Freeze.none
    export: str | None = (
        None  # the weights came from an export: its format, and its weights unless float32 ("litert float16")
    )

    def __post_init__(self) -> None:
        if isinstance(self.model, dict):  # as JSON reads it back
            object.__setattr__(self, "model", from_dict(ModelConfig, self.model, "init_from.model"))
        object.__setattr__(self, "freeze", Freeze.parse(self.freeze, "freeze"))
        object.__setattr__(self, "weights", Weights.parse(self.weights, "weights"))


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Everything ``train`` decided, enough for ``sample`` to rebuild the model."""

    data: DataConfig
    model: ModelConfig
    training: TrainConfig
    profile: DeviceProfile
    distill: DistillConfig | None = None  # a student trained by ``textgen distill``
    prune: PruneConfig | None = None  # a run made by ``textgen prune``
    init_from: InitConfig | None = None  # a run started from another's weights (``textgen train --init-from``)

    @property
    def train_streams(self) -> int:
        """Streams of the training split read per optimizer step: ``--batch-size`` x ``--accumulate``."""
        return self.data.batch_size * self.training.accumulate

    def to_dict(self) -> dict[str, Any]:
        return {
            f.name: to_dict(getattr(self, f.name))
            for f in dataclasses.fields(self)
            if getattr(self, f.name) is not None
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunConfig:
        parts = {"data": DataConfig, "model": ModelConfig, "training": TrainConfig, "profile": DeviceProfile}
        optional = {"distill": DistillConfig, "prune": PruneConfig, "init_from": InitConfig}
        missing, unknown = sorted(set(parts) - set(data)), sorted(set(data) - set(parts) - set(optional))
        if missing or unknown:
            raise ConfigError(f"config sections differ (missing {missing}, unknown {unknown})")
        # A run saved before --shift-windows existed trained its windows fixed, and resumes so.
        if isinstance(data["data"], dict):
            data = {**data, "data": {"shift_windows": False, **data["data"]}}
        return cls(
            **{name: from_dict(kind, data[name], name) for name, kind in {**parts, **optional}.items() if name in data}
        )


def check_fits_in_memory(model: ModelConfig) -> None:
    """Refuse a new model whose training state cannot fit in this machine's memory (weights, gradients and
    Adam's two moments: 16 bytes a parameter, within half the RAM)."""
    need = 16 * model.parameters
    if need > physical_memory() // 2:
        raise ConfigError(
            f"--units {model.units} --layers {model.layers} --embedding-dim {model.embedding_dim} make "
            f"{model.parameters:,} parameters, ~{need / 2**30:.0f} GiB to train, more than this machine's "
            f"{physical_memory() / 2**30:.0f} GiB can hold; use a smaller model"
        )
