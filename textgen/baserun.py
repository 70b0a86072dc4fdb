"""What a fine-tuned run starts from (``textgen train --init-from``): a run's weights, or an export's read back;
and the model shape it keeps. Below both the planning of runs and exports, which read a base back."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from textgen import config as cfgmod
from textgen.checkpoint import Run
from textgen.config import ModelConfig, Weights
from textgen.errors import ConfigError
from textgen.vocab import Vocabulary


@dataclass(frozen=True)
class Base:
    """What a fine-tuned run starts from (``--init-from``): a run's best or last weights, or the float weights of
    an export, read back into a weights file of its model's shape."""

    source: Path  # the run's or the export's directory
    name: str  # the run's name (an export's: the run it was exported from)
    weights: Weights
    weights_file: Path
    vocab: Vocabulary
    model: ModelConfig
    corpus: str | None  # what it trained on (an export does not say)
    val_loss: float | None  # its best validation loss (an export does not say)
    export: str | None = None  # an export's format and weights, e.g. "litert float16"; None for a run

    @classmethod
    def of_run(cls, run: Run, weights: Weights) -> Base:
        config = run.load_config()
        return cls(
            source=run.path.resolve(),
            name=run.name,
            weights=weights,
            weights_file=run.intact_weights(weights),
            vocab=run.load_vocab(config.model.vocab_size),
            model=config.model,
            corpus=config.data.corpus_name,
            val_loss=_finite_or_none(run.best_weights_loss()),
        )


SHAPE_SETTINGS = ("units", "layers", "embedding_dim", "layer_norm")  # what a fine-tuned run takes from its base


def check_shape_kept(model: dict[str, Any], name: str, shape: ModelConfig) -> None:
    """No setting may change the model's shape, which a fine-tuned run takes from its base, the run ``name`` of
    model ``shape`` (the same value again changes nothing: a recipe may hold it)."""
    changed = [cfgmod.flag(k) for k in SHAPE_SETTINGS if k in model and model[k] != getattr(shape, k)]
    if changed:
        raise ConfigError(
            f"{', '.join(changed)} would change the model, which a fine-tuned run takes from {name!r}; "
            "drop it (or train a new model without --init-from)"
        )


def _finite_or_none(value: float) -> float | None:
    return value if np.isfinite(value) else None
