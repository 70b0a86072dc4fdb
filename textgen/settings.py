"""What a user asked for: a training as one frozen ``TrainRequest``, and the settings it gives each config as typed
fields that are ``None`` when not given. The CLI, a Python program (``textgen.api.train``) and each ``textgen tune``
trial build the same request; each setting is checked as it is made, by its config's own rules."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, ClassVar

from textgen.config import (
    DEFAULT_CHECKPOINT_DIR,
    DataConfig,
    Device,
    DistillConfig,
    Freeze,
    LRSchedule,
    ModelConfig,
    Optimizer,
    PruneConfig,
    Rule,
    Strategy,
    TrainConfig,
    Weights,
    check_fields,
    settings_given,
)
from textgen.durations import format_seconds
from textgen.errors import ConfigError


class Settings:
    """The settings a user gave for one config, as typed fields that are ``None`` when not given, each checked by
    its config's rule as the settings are made."""

    RULES: ClassVar[dict[str, Rule]] = {}

    def __post_init__(self) -> None:
        check_fields(self.RULES, vars(self), given=True)

    def given(self) -> dict[str, Any]:
        """The settings given, by field name."""
        return settings_given(vars(self))


@dataclasses.dataclass(frozen=True)
class DataSettings(Settings):
    """``DataConfig``'s settings a new run may be given."""

    RULES = DataConfig.RULES

    batch_size: int | None = None
    seq_len: int | None = None
    max_vocab: int | None = None
    shift_windows: bool | None = None
    strip_boilerplate: bool | None = None  # --keep-boilerplate sets it False
    encoding: str | None = None  # a codec, or "auto" for each file's own; on resume, it must be the run's
    # The characters the vocabulary starts with, in id order, extended by the corpus's own (the Python API's: the
    # base model's build gives it ``basemodel.BASE_CHARS``); a fine-tune's is its base's.
    base_vocab: str | None = None


@dataclasses.dataclass(frozen=True)
class ModelSettings(Settings):
    """``ModelConfig``'s settings a new run may be given (its vocabulary comes from the corpus)."""

    RULES = ModelConfig.RULES

    embedding_dim: int | None = None
    units: int | None = None
    layers: int | None = None
    dropout: float | None = None
    layer_norm: bool | None = None
    weight_drop: float | None = None
    weight_drop_after: int | None = None
    locked_output_dropout: float | None = None


@dataclasses.dataclass(frozen=True)
class TrainSettings(Settings):
    """``TrainConfig``'s settings (a resumed run takes only epochs, time_budget, save_every and strategy)."""

    RULES = TrainConfig.RULES

    epochs: int | None = None
    lr: float | None = None
    clip_norm: float | None = None
    seed: int | None = None
    time_budget: float | None = None
    more_time: float | None = None  # a budget of this much more than the run has trained (``--time-budget +30m``)
    patience: int | None = None
    lr_patience: int | None = None
    lr_factor: float | None = None
    lr_schedule: LRSchedule | None = None
    anneal: float | None = None
    save_every: float | None = None
    sample_every: float | None = None
    accumulate: int | None = None
    strategy: Strategy | None = None
    optimizer: Optimizer | None = None
    weight_decay: float | None = None
    momentum: float | None = None
    warmup: int | None = None

    def given(self) -> dict[str, Any]:
        """The ``TrainConfig`` settings given (``more_time`` becomes a ``time_budget`` when the run is planned)."""
        return {k: v for k, v in super().given().items() if k != "more_time"}


@dataclasses.dataclass(frozen=True)
class DistillSettings(Settings):
    """A student of the run ``teacher`` (``textgen distill``), with ``DistillConfig``'s settings given."""

    RULES = DistillConfig.RULES

    teacher: str
    temperature: float | None = None
    alpha: float | None = None


@dataclasses.dataclass(frozen=True)
class PruneSettings(Settings):
    """A pruned copy of the run ``source`` (``textgen prune``), with ``PruneConfig``'s settings given."""

    RULES = PruneConfig.RULES

    source: str
    sparsity: float | None = None
    ramp: float | None = None


@dataclasses.dataclass(frozen=True)
class InitSettings:
    """A new run that starts from the run ``source``'s ``weights`` (best or last) on its own corpus
    (``textgen train --init-from``), with what of them stays ``freeze``-d."""

    source: str
    weights: Weights = Weights.best
    freeze: Freeze = Freeze.none


@dataclasses.dataclass(frozen=True)
class TrainRequest:
    """One training to do, as asked: a new run on ``corpus``, the run ``run_name`` (or the latest) resumed, a
    student (``distill``), a pruned copy (``prune``), or a run fine-tuned from another (``init_from``). Everything
    that needs no file is checked as it is made; ``textgen.training.plan.check_request`` checks the rest (the
    corpus, the runs it names, a recipe) before TensorFlow loads.

    ``data``, ``model`` and ``training`` hold the settings given (fields left ``None`` take the defaults);
    ``recipe`` (a recipe file or a run's config.json) or ``from_study`` (a ``textgen tune`` study's best recipe)
    supplies those not given."""

    corpus: tuple[str, ...] = ()  # files, directories or glob patterns (a str or Path is taken as one)
    device: Device = Device.auto
    checkpoint_dir: Path = DEFAULT_CHECKPOINT_DIR
    run_name: str | None = None
    resume: bool = False
    download: bool = False  # fetch a Project Gutenberg book the corpus names, if absent
    threads: int | None = None  # intra-op threads for training; None: the device profile's
    data: DataSettings = DataSettings()
    model: ModelSettings = ModelSettings()
    training: TrainSettings = TrainSettings()
    distill: DistillSettings | None = None
    prune: PruneSettings | None = None
    init_from: InitSettings | None = None
    recipe: Path | None = None
    from_study: str | None = None

    def __post_init__(self) -> None:
        corpus: Any = self.corpus
        names = [corpus] if isinstance(corpus, str | Path) else list(corpus or ())
        object.__setattr__(self, "corpus", tuple(str(name) for name in names))
        object.__setattr__(self, "device", Device.parse(self.device, "device"))
        object.__setattr__(self, "checkpoint_dir", Path(self.checkpoint_dir))
        if self.threads is not None and not 0 < self.threads <= 1024:
            raise ConfigError(f"--threads must be between 1 and 1024 (got {self.threads})")
        if self.recipe is not None and self.from_study is not None:
            raise ConfigError("give --config or --from-study, not both")
        if self.resume and (self.recipe is not None or self.from_study is not None):
            raise ConfigError(
                "--config and --from-study start a new run; drop them to --resume (a run keeps its recipe)"
            )
        if self.init_from and (self.resume or self.distill or self.prune):
            what = "--resume" if self.resume else "textgen distill" if self.distill else "textgen prune"
            raise ConfigError(
                f"--init-from starts a new run from another run's weights; {what} does not take it "
                "(a fine-tuned run resumes with --resume alone)"
            )
        if self.training.more_time is not None and not self.resume:  # forgetting --resume must not start a run
            more = format_seconds(self.training.more_time)
            raise ConfigError(
                f"--time-budget +{more} adds time to a run you resume: add --resume (the latest run, or --run "
                f"NAME), or give --time-budget {more} for a new run"
            )

    @property
    def derived_from(self) -> DistillSettings | PruneSettings | None:
        """The run this one is made from, as a student or a pruned copy."""
        return self.distill or self.prune
