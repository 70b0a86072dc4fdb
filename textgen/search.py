"""What a ``textgen tune`` study searches and how it stops a trial early: the search space over training recipes,
within what the corpus can hold, and the pruner that compares trials at the same training time.

Optuna's own pruners compare trials at equal step numbers; these trials report at epoch ends, whose times differ
with the model and batch, so ``SameTimePruner`` compares them at equal training time instead.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from textgen.config import OPTIMIZERS, DataConfig, DeviceProfile, ModelConfig, TrainConfig
from textgen.errors import ConfigError
from textgen.layout import fills_one_batch
from textgen.recipe import Recipe
from textgen.study import check_fixed_settings

MIN_TRIALS_TO_PRUNE = 2  # finished trials a running one is compared with before it can be stopped
PRUNE_WARMUP = 0.2  # no trial is stopped in its first fifth: slow starters (small learning rates) catch up later

BATCH_SIZES = (16, 32, 64, 128, 256)
SEQ_LENS = (50, 400)  # in steps of 50


class SearchSpace:
    """What a study searches: every recipe setting but those the user fixed, within what the corpus can hold (its
    validation split must fill one batch of ``batch_size`` x ``seq_len``).

    Not the schedule: the pruner compares trials at the same training time, and a longer anneal leads mid-run by
    construction (`--anneal 0.4` by 0.010 on War and Peace at 45 minutes of 60) yet ended level (test 1.1651
    against 0.2's 1.1655), so searching it would prune for timing rather than quality."""

    def __init__(self, fixed: Recipe, val_chars: int, profile: DeviceProfile) -> None:
        self.fixed, self.val_chars, self.profile = fixed, val_chars, profile
        check_fixed_settings(fixed)
        data = fixed.get("data", {})
        seq_len = data.get("seq_len", SEQ_LENS[0])
        if "batch_size" in data:
            if not fills_one_batch(val_chars, data["batch_size"], seq_len):
                raise ConfigError(
                    f"--batch-size {data['batch_size']} x --seq-len {seq_len} needs more validation text than the "
                    f"corpus has ({val_chars:,} characters): fix smaller ones, or leave them to the search"
                )
            self.batch_sizes = [data["batch_size"]]
        else:
            batch_sizes = sorted({*BATCH_SIZES, profile.batch_size})
            self.batch_sizes = [b for b in batch_sizes if fills_one_batch(val_chars, b, seq_len)]
            if not self.batch_sizes:
                raise ConfigError(
                    f"the corpus is too short to tune on: its validation split has {val_chars:,} characters, fewer "
                    f"than one batch of {min(BATCH_SIZES)} x {seq_len}; give a longer text"
                )

    def suggest(self, trial: optuna.Trial) -> Recipe:
        """The recipe a trial tries: TPE's choice, the fixed settings as given."""

        def pick(part: str, key: str, suggest: Any, *args: Any, name: str | None = None, **kwargs: Any) -> Any:
            given = self.fixed.get(part, {}).get(key)
            return given if given is not None else suggest(name or key, *args, **kwargs)

        optimizer = pick("training", "optimizer", trial.suggest_categorical, list(OPTIMIZERS))
        sgd = optimizer == "sgd"  # a step ~50x the adaptive rules': its own range, under its own name
        lr_range, lr_name = ((0.02, 1.0), "sgd_lr") if sgd else ((5e-4, 1e-2), "lr")
        lr = pick("training", "lr", trial.suggest_float, *lr_range, name=lr_name, log=True)
        searched_decay = optimizer == "adamw" or "weight_decay" in self.fixed.get("training", {})
        decay = pick("training", "weight_decay", trial.suggest_float, 1e-3, 0.3, log=True) if searched_decay else 0.0
        batch_size = pick("data", "batch_size", trial.suggest_categorical, self.batch_sizes)
        longest = min(SEQ_LENS[1], (self.val_chars - 1) // batch_size // 50 * 50)
        return {
            "data": {
                "batch_size": batch_size,
                "seq_len": pick("data", "seq_len", trial.suggest_int, SEQ_LENS[0], max(longest, SEQ_LENS[0]), step=50),
            },
            "model": {
                "units": pick("model", "units", trial.suggest_categorical, [128, 256, 384, 512, 768, 1024]),
                "layers": pick("model", "layers", trial.suggest_int, 1, 3),
                "embedding_dim": pick("model", "embedding_dim", trial.suggest_categorical, [16, 32, 64, 128]),
                "dropout": pick("model", "dropout", trial.suggest_float, 0.0, 0.4, step=0.05),
                "layer_norm": pick("model", "layer_norm", trial.suggest_categorical, [False, True]),
                "weight_drop": pick("model", "weight_drop", trial.suggest_float, 0.0, 0.5, step=0.05),
                # Not searched: a trial is too short to reach the epochs it would start at.
                "weight_drop_after": self.fixed.get("model", {}).get(
                    "weight_drop_after", ModelConfig.weight_drop_after
                ),
                # None: the output dropped per element at dropout, as textgen train's default does.
                "locked_output_dropout": pick(
                    "model", "locked_output_dropout", trial.suggest_categorical, [None, 0.0, 0.1, 0.2, 0.3, 0.4]
                ),
            },
            "training": {
                "optimizer": optimizer,
                "lr": lr,
                "weight_decay": decay,
                "momentum": TrainConfig.of(optimizer=optimizer).momentum,  # SGD's 0.9
                "clip_norm": pick("training", "clip_norm", trial.suggest_float, 0.5, 10.0, log=True),
            },
        }

    def first_params(self) -> dict[str, Any]:
        """textgen train's own recipe for the optimizer (the fixed one, or Adam), to try first: the one to beat. A
        batch the corpus cannot hold is left to the search; fixed settings are never suggested, so need no entry."""
        optimizer = self.fixed.get("training", {}).get("optimizer", TrainConfig.optimizer)
        training, model, data = TrainConfig.of(optimizer=optimizer), ModelConfig(vocab_size=1), DataConfig(corpus="")
        params = {
            "optimizer": optimizer,
            "sgd_lr" if optimizer == "sgd" else "lr": training.lr,
            "weight_decay": training.weight_decay,
            "clip_norm": training.clip_norm,
            "units": model.units,
            "layers": model.layers,
            "embedding_dim": model.embedding_dim,
            "dropout": model.dropout,
            "layer_norm": model.layer_norm,
            "weight_drop": model.weight_drop,
            "locked_output_dropout": model.locked_output_dropout,
        }
        fixed = self.fixed.get("data", {})  # a fixed batch size or length changes what fits beside it
        batch_size, seq_len = fixed.get("batch_size", self.profile.batch_size), fixed.get("seq_len", data.seq_len)
        if batch_size in self.batch_sizes and fills_one_batch(self.val_chars, batch_size, seq_len):
            params.update(batch_size=batch_size, seq_len=seq_len)
        return params


class SameTimePruner(optuna.pruners.BasePruner):
    """Stop a trial whose validation loss is behind the median of the finished trials' at the same training time.

    Steps are training milliseconds. A curve's value at a time is the best it had reported by then, for the
    running trial and the finished ones alike; a trial is compared only once ``min_trials`` finished trials had
    reported by its time, and not before ``warmup_ms``.
    """

    def __init__(self, min_trials: int = MIN_TRIALS_TO_PRUNE, warmup_ms: int = 0) -> None:
        self.min_trials, self.warmup_ms = min_trials, warmup_ms

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        step = trial.last_step
        if step is None or step < self.warmup_ms:
            return False
        mine = best_by(trial.intermediate_values, step)
        finished = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        others = [v for t in finished if (v := best_by(t.intermediate_values, step)) is not None]
        return mine is not None and len(others) >= self.min_trials and mine > statistics.median(others)


def best_by(curve: dict[int, float], step: int) -> float | None:
    """The lowest value a curve had reported by ``step``, if any."""
    values = [v for s, v in curve.items() if s <= step and math.isfinite(v)]
    return min(values) if values else None
