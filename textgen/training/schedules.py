"""Learning-rate schedules and early stopping: how far through its schedule a run is, the rate at each batch, and
when a stalled validation loss ends the run."""

from __future__ import annotations

import math
from collections.abc import Callable

import keras

from textgen.config import TrainConfig
from textgen.results import StopReason


def schedule_progress(tcfg: TrainConfig, steps: int, elapsed: Callable[[], float]) -> Callable[[int, int], float]:
    """How far through its schedules a run is at (epoch, batch): through its epochs, or through its time budget if
    that is further on, so the schedules end with whichever limit stops the run first."""

    def progress(epoch: int, batch: int) -> float:
        by_batches = (epoch * steps + batch) / (tcfg.epochs * steps) if tcfg.epochs else 0.0
        if tcfg.time_budget:
            return max(by_batches, elapsed() / tcfg.time_budget)
        return by_batches

    return progress


def learning_rate_schedule(
    tcfg: TrainConfig, optimizer: keras.optimizers.Optimizer, progress: Callable[[int, int], float]
) -> keras.callbacks.Callback:
    """The callback that sets the run's learning rate: ``plateau`` cuts it when validation stalls; ``cosine`` and
    ``hold`` set it before every batch from the run's progress."""
    if tcfg.lr_schedule == "plateau":
        return keras.callbacks.ReduceLROnPlateau(
            monitor="val_loss", factor=tcfg.lr_factor, patience=tcfg.lr_patience, min_lr=tcfg.lr / 64
        )
    return CosineSchedule(optimizer, tcfg.lr, progress, annealed_part(tcfg), tcfg.warmup)


def annealed_part(tcfg: TrainConfig) -> float:
    """The part of the run, at its end, over which the rate anneals: the hold schedule's ``anneal``, else all."""
    return tcfg.anneal if tcfg.lr_schedule == "hold" else 1.0


def cosine_lr(peak: float, progress: float, anneal: float = 1.0) -> float:
    """The learning rate ``progress`` (0 to 1) of the way through a run that holds ``peak``, then anneals it to 0
    along a cosine over the run's last ``anneal`` (all of it by default)."""
    annealed = (progress - (1.0 - anneal)) / anneal
    return peak * 0.5 * (1.0 + math.cos(math.pi * min(max(annealed, 0.0), 1.0)))


def warmup_factor(update: int, warmup: int) -> float:
    """The share of its schedule's rate that update number ``update`` (from 0) takes during a linear warm-up over
    ``warmup`` updates: a fine-tuned run's first updates, from a fresh optimizer, must not wreck what it starts
    from."""
    return min(1.0, (update + 1) / warmup) if warmup else 1.0


class CosineSchedule(keras.callbacks.Callback):
    """Set the learning rate before every batch from how far the run has got (see ``cosine_lr``), warmed up over
    the run's first ``warmup`` updates (counted by the optimizer, which a resume restores)."""

    def __init__(
        self,
        optimizer: keras.optimizers.Optimizer,
        peak: float,
        progress: Callable[[int, int], float],
        anneal: float = 1.0,
        warmup: int = 0,
    ) -> None:
        super().__init__()
        self.optimizer, self.peak, self.progress, self.anneal = optimizer, peak, progress, anneal
        self.warmup = warmup
        self.epoch = 0

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self.epoch = epoch

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        rate = cosine_lr(self.peak, self.progress(self.epoch, batch), self.anneal)
        if self.warmup:  # read the step (a variable read) only until the warm-up is over
            # .numpy(): a multi-worker run's MirroredVariable has no int().
            update = int(self.optimizer.iterations.numpy())
            rate *= warmup_factor(update, self.warmup)
            if update >= self.warmup:
                self.warmup = 0
        self.optimizer.learning_rate = rate


class EarlyStoppingAfterHold(keras.callbacks.EarlyStopping):
    """Keras' early stopping on validation loss, except that the epochs that end before the learning rate anneals
    (``holding``) do not count against the patience: at the hold schedule's peak rate validation stalls by design,
    and the anneal after it is what takes the most off. Counted, a stall there stopped a run before its anneal
    (War and Peace, 60 minutes, seed 1: stopped at 52 minutes, three epochs after its best one at the peak rate)."""

    def __init__(self, patience: int, holding: Callable[[int], bool], request: Callable[[StopReason], None]) -> None:
        super().__init__(monitor="val_loss", patience=patience)
        self.holding, self.request = holding, request

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        super().on_epoch_end(epoch, logs)  # a new best still counts as one
        if self.holding(epoch):
            self.wait = 0
        elif self.model.stop_training:
            self.request(StopReason.EARLY_STOPPING)  # the loop's one channel, not Keras' flag
        self.model.stop_training = False
