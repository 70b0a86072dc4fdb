"""The run's commits: the best weights and a resume point at every epoch's end, and mid-epoch ones when
``--save-every`` has passed or the run stops, each a consistent snapshot a killed run resumes from exactly."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import keras
import numpy as np

from textgen.checkpoint import CALLBACK_COUNTERS, EpochProgress, ResumeState, Run
from textgen.errors import CheckpointError, TrainingDiverged
from textgen.plot import read_history
from textgen.results import StopReason


class RunCheckpoint(keras.callbacks.Callback):
    """Saves the best weights and an atomic resume point at every epoch end, and mid-epoch when ``save_every``
    seconds have passed since the last one (``after_batch``)."""

    def __init__(
        self,
        run: Run,
        optimizer: keras.optimizers.Optimizer,
        stateful_callbacks: dict[str, Any],
        eligible: Callable[[], bool] = lambda: True,
        stream_states: list[keras.Variable] | None = None,
        save_every: float = math.inf,
        unsaved: list[Callable[[], None]] | None = None,
    ) -> None:
        super().__init__()
        self.save_every = save_every
        # The save of where training got, while that is past the last commit: a lost worker's handler makes it.
        self.unsaved = unsaved if unsaved is not None else []
        self.run, self.optimizer, self.stateful_callbacks = run, optimizer, stateful_callbacks
        self.eligible = eligible  # whether the weights may be the run's best (a pruned run's: at full sparsity)
        self.stream_states = stream_states  # saved with mid-epoch resume points, if given
        self.streams_at: list[np.ndarray] | None = None  # their values at the last mid-epoch resume point
        self.best_val_loss = math.inf
        self.start_val_loss: float | None = None  # set by ``start_best``, kept across resumes
        self.history: tuple[dict[str, float], ...] = ()  # one row per epoch, committed with every resume point
        self.saved_at = time.monotonic()
        self.resume_at: tuple[int, int, EpochProgress | None] = (0, 0, None)  # set by the loop before an epoch end

    def restore(self, state: ResumeState | None) -> None:
        """Continue from a saved state (None for a new run): best loss, history, schedule counters."""
        if state is None:
            return
        # The best weights file carries its own loss: if a kill came between replacing it and the next
        # commit, it is better than the state says, and a worse epoch must not replace it.
        self.best_val_loss = min(state.best_val_loss, self.run.best_weights_loss())
        self.start_val_loss = state.start_val_loss
        self.history = state.history if state.history is not None else _csv_rows(self.run.history_path)
        unknown = sorted(set(state.callbacks) - set(self.stateful_callbacks))
        if unknown:  # a hand edit: this run's schedule has no such callback
            raise CheckpointError(
                f"{self.run.state_path} is corrupt (callbacks {unknown} are not this run's); train again"
            )
        for name, values in state.callbacks.items():
            for key, value in values.items():
                setattr(self.stateful_callbacks[name], key, value)

    def start_best(self, val_loss: float) -> None:
        """Make the starting weights, scored ``val_loss`` on validation, the run's first best."""
        self.best_val_loss = self.start_val_loss = val_loss
        self.run.save_best(self.model, val_loss)
        # An epoch must beat them to count as an improvement: to early stopping and to the plateau schedule alike.
        for callback in self.stateful_callbacks.values():
            callback.best = val_loss

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        logs = logs or {}
        if logs["val_loss"] < self.best_val_loss and self.eligible():
            self.best_val_loss = logs["val_loss"]
            self.run.save_best(self.model, self.best_val_loss)
        # A row per epoch: an epoch a time budget cut and a resumed run finished replaces its partial row.
        self.history = (*(row for row in self.history if row["epoch"] != epoch), {"epoch": epoch, **logs})
        resume_epoch, resume_batch, position = self.resume_at
        self.save_resume_point(resume_epoch, resume_batch, logs["seconds"], position, validated=True)

    def after_batch(self, epoch: int, position: EpochProgress, elapsed: Callable[[], float]) -> None:
        """Note where training got, and commit it if ``save_every`` has passed since the last commit."""
        self.unsaved[:] = [lambda: self.save_resume_point(epoch, position.batch, elapsed(), position)]
        if time.monotonic() - self.saved_at >= self.save_every:
            self.unsaved.pop()()

    def save_resume_point(
        self, epoch: int, batch: int, seconds: float, position: EpochProgress | None = None, validated: bool = False
    ) -> None:
        """Commit weights, optimizer and loop position: training resumes at ``epoch``, ``batch`` (with the
        epoch's progress so far and the streams' states when that is mid-epoch). Validation resets the states:
        ``validated`` commits those of the last resume point, made before validating at the same batch.
        Weights that are no longer finite are never committed."""
        if not all(np.isfinite(w).all() for w in self.model.get_weights()):
            raise TrainingDiverged(
                f"training diverged: the weights became NaN or infinite at epoch {epoch + 1}",
                "nothing after the last resume point was saved. Start a new run with a lower --lr or --clip-norm",
            )
        state = ResumeState(
            epoch=epoch,
            batch=batch,
            step=int(self.optimizer.iterations.numpy()),
            seconds=seconds,
            best_val_loss=self.best_val_loss,
            start_val_loss=self.start_val_loss,
            callbacks={name: _callback_state(cb) for name, cb in self.stateful_callbacks.items()},
            history=self.history,
            epoch_progress=position,
        )
        streams = None
        if batch > 0 and self.stream_states is not None:
            if not validated:
                self.streams_at = [np.asarray(v) for v in self.stream_states]
            streams = self.streams_at
        self.run.save_resume_point(self.model, self.optimizer, state, streams)
        self.saved_at = time.monotonic()
        self.unsaved.clear()

    def mark_finished(self, reason: StopReason) -> None:
        """Record why training stopped; the resume point stays usable for more epochs."""
        self.run.mark_finished(reason)


def _csv_rows(path: Path) -> tuple[dict[str, float], ...]:
    """History rows of a run from before they were kept in state.json."""
    columns = read_history(path)
    return tuple(
        {"epoch": int(e), **{k: columns[k][i] for k in columns if k != "epoch"}}
        for i, e in enumerate(columns.get("epoch", []))
    )


def _callback_state(callback: Any) -> dict[str, float]:
    # Keras' callbacks hold best=None until their first epoch end (Ctrl-C in epoch 1).
    return {k: float(getattr(callback, k)) for k in CALLBACK_COUNTERS if getattr(callback, k, None) is not None}
