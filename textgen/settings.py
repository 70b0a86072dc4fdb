"""What a user gave for each config, as typed fields that are ``None`` when not given: what the library's entry
points take (``textgen.api.train``), so that a caller gets completion and type errors."""

from __future__ import annotations

import dataclasses
from typing import Any

from textgen.config import Freeze, LRSchedule, Optimizer, Strategy, settings_given


class Settings:
    """The settings a user gave for one config, as typed fields that are ``None`` when not given: what the library's
    entry points take (``textgen.api.train``), so that a caller gets completion and type errors."""

    def given(self) -> dict[str, Any]:
        """The settings given, by field name."""
        return settings_given(vars(self))


@dataclasses.dataclass(frozen=True)
class DataSettings(Settings):
    """``DataConfig``'s settings a new run may be given."""

    batch_size: int | None = None
    seq_len: int | None = None
    max_vocab: int | None = None
    shift_windows: bool | None = None


@dataclasses.dataclass(frozen=True)
class ModelSettings(Settings):
    """``ModelConfig``'s settings a new run may be given (its vocabulary comes from the corpus)."""

    embedding_dim: int | None = None
    units: int | None = None
    layers: int | None = None
    dropout: float | None = None
    layer_norm: bool | None = None
    weight_drop: float | None = None
    locked_output_dropout: float | None = None


@dataclasses.dataclass(frozen=True)
class TrainSettings(Settings):
    """``TrainConfig``'s settings (a resumed run takes only epochs, time_budget, save_every and strategy)."""

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

    teacher: str
    temperature: float | None = None
    alpha: float | None = None


@dataclasses.dataclass(frozen=True)
class PruneSettings(Settings):
    """A pruned copy of the run ``source`` (``textgen prune``), with ``PruneConfig``'s settings given."""

    source: str
    sparsity: float | None = None
    ramp: float | None = None


@dataclasses.dataclass(frozen=True)
class InitSettings:
    """A new run that starts from the run ``source``'s ``weights`` (best or last) on its own corpus
    (``textgen train --init-from``), with what of them stays ``freeze``-d."""

    source: str
    weights: str = "best"
    freeze: Freeze = Freeze.none
