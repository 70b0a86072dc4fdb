"""The Keras callbacks the training loop drives, built for a run: state reset, the learning-rate and pruning
schedules, early stopping, TensorBoard logs, and the run's checkpoint."""

from __future__ import annotations

import sys
from collections.abc import Callable

import keras

from textgen.plot import TABLE_UPTO
from textgen.results import StopReason, bits
from textgen.training.plan import TrainPlan
from textgen.training.pruning import PruneSchedule
from textgen.training.resume_point import RunCheckpoint
from textgen.training.schedules import EarlyStoppingAfterHold, annealed_part, learning_rate_schedule, schedule_progress
from textgen.training.step import Trainer

BATCH_LOSS_EPOCHS = TABLE_UPTO  # epochs whose training loss is kept by batch: the curves of so few draw it
BATCH_LOSS_POINTS = 100  # about this many an epoch


def build_callbacks(
    plan: TrainPlan,
    trainer: Trainer,
    steps: int,
    elapsed: Callable[[], float],
    request_stop: Callable[[StopReason], None],
    unsaved: list[Callable[[], None]],
) -> tuple[RunCheckpoint, keras.callbacks.CallbackList]:
    """The run's checkpoint and the Keras callbacks the loop drives: state reset, learning-rate schedule, the
    pruning schedule, early stopping, TensorBoard logs, the first epochs' losses by batch, and the checkpoint (which
    also writes the history).
    ``unsaved`` holds the save of where training got while that is past the checkpoint's last commit."""
    tcfg, run, prune = plan.config.training, plan.run, plan.config.prune
    progress = schedule_progress(tcfg, steps, elapsed)
    # A pruned run's loss rises by design while its sparsity ramps up: it does not stop early, and its best
    # weights are the best at the full sparsity.
    patience = sys.maxsize if prune else tcfg.patience
    anneal = annealed_part(tcfg)
    # Not restore_best_weights: best.weights.h5 already holds them, and restoring them in memory at the end of
    # training would put them under a save made after it (a lost worker's), as if training had got there.
    early_stopping = EarlyStoppingAfterHold(
        patience, holding=lambda epoch: progress(epoch + 1, 0) < 1 - anneal, request=request_stop
    )
    lr_schedule = learning_rate_schedule(tcfg, trainer.optimizer, progress)
    stateful: dict[str, keras.callbacks.Callback] = {"early_stopping": early_stopping}
    if isinstance(lr_schedule, keras.callbacks.ReduceLROnPlateau):
        stateful["lr_schedule"] = lr_schedule
    pruning = PruneSchedule(trainer.masks, prune.sparsity, prune.ramp, progress) if prune else None
    checkpoint = RunCheckpoint(
        run,
        trainer.optimizer,
        stateful,
        eligible=lambda: pruning is None or pruning.at_target,
        # One replica's: a replica's states are its own, which a mirrored variable's value does not show (several
        # replicas restart their streams cold after a mid-epoch resume).
        stream_states=trainer.stream_states() if trainer.strategy.num_replicas_in_sync == 1 else None,
        save_every=tcfg.save_every,
        unsaved=unsaved,
    )
    callbacks = keras.callbacks.CallbackList(
        [
            ResetStatesCallback(trainer),
            lr_schedule,
            *([pruning] if pruning else []),
            early_stopping,
            keras.callbacks.TensorBoard(str(run.tensorboard_dir), write_graph=False),
            *([BatchLosses(plan, steps)] if plan.chief else []),  # another worker's run is a scratch copy
            checkpoint,
        ],
        model=trainer.model,
        epochs=tcfg.epochs,
        steps=steps,
    )
    return checkpoint, callbacks


class ResetStatesCallback(keras.callbacks.Callback):
    """Zero every LSTM state at the start of each epoch (``validate`` does so before validation)."""

    def __init__(self, trainer: Trainer) -> None:
        super().__init__()
        self.trainer = trainer

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self.trainer.reset_states()


class BatchLosses(keras.callbacks.Callback):
    """The training loss of a run's first ``BATCH_LOSS_EPOCHS`` epochs, the mean of every ``steps //
    BATCH_LOSS_POINTS`` batches, in the run's batch_losses.csv: its loss curve draws them while its epochs are few (a
    point an epoch would be a dot or two). From where the run starts: the rows of batches trained again are dropped."""

    def __init__(self, plan: TrainPlan, steps: int) -> None:
        super().__init__()
        self.run, self.resume, self.steps = plan.run, plan.resume_state, steps
        self.every = max(1, steps // BATCH_LOSS_POINTS)
        self.epoch, self.losses = 0, list[float]()

    def on_train_begin(self, logs: dict | None = None) -> None:
        self.run.keep_batch_losses(*((self.resume.epoch, self.resume.batch) if self.resume else (0, 0)))

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self.epoch, self.losses = epoch, []

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if self.epoch >= BATCH_LOSS_EPOCHS or logs is None:
            return
        self.losses.append(logs["batch_loss"])
        if (batch + 1) % self.every == 0 or batch + 1 == self.steps:
            self.run.add_batch_loss(self.epoch, batch + 1, self.steps, bits(sum(self.losses) / len(self.losses)))
            self.losses = []
