"""Rich rendering for the CLI: live training progress and per-epoch summaries."""

from __future__ import annotations

import json
import time
from typing import Any

import keras
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


def format_seconds(seconds: float) -> str:
    """``3h02m``, ``4m05s`` or ``12.3s``."""
    if seconds >= 3600:
        return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"
    if seconds >= 60:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{seconds:.1f}s"


class TrainingDisplay(keras.callbacks.Callback):
    """Live progress per epoch on a terminal; a summary line (or JSON line) per epoch."""

    def __init__(self, console: Console, as_json: bool = False) -> None:
        super().__init__()
        self.console, self.as_json = console, as_json
        self.progress = Progress(
            TextColumn("[bold]epoch {task.fields[epoch]}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]:>7,.0f} chars/s"),
            TextColumn("loss {task.fields[loss]:.3f} ({task.fields[bpc]:.3f} bpc)"),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=console,
            transient=True,
            disable=as_json or not console.is_terminal,
        )
        self.best = float("inf")

    def on_train_begin(self, logs: dict | None = None) -> None:
        self.progress.start()

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        first = epoch == self.params["initial_epoch"]
        self.done_before = self.params["initial_batch"] if first else 0
        self.epoch_started = time.monotonic()
        self.task = self.progress.add_task(
            "train",
            total=self.params["steps"],
            completed=self.done_before,
            epoch=f"{epoch + 1}/{self.params['epochs']}",
            rate=0.0,
            loss=float("nan"),
            bpc=float("nan"),
        )

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        logs = logs or {}
        done = batch + 1 - self.done_before
        rate = done * self.params["chars_per_step"] / max(time.monotonic() - self.epoch_started, 1e-9)
        self.progress.update(self.task, completed=batch + 1, rate=rate, loss=logs["loss"], bpc=logs["bpc"])

    def on_test_begin(self, logs: dict | None = None) -> None:
        self.progress.update(self.task, description="validating")

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        logs = dict(logs or {})
        self.progress.remove_task(self.task)
        improved = logs["val_loss"] < self.best
        self.best = min(self.best, logs["val_loss"])
        if self.as_json:
            print(json.dumps({"event": "epoch", "epoch": epoch + 1, **logs}), flush=True)
            return
        partial = "" if logs["batches"] + self.done_before >= self.params["steps"] else " (partial)"
        self.console.print(
            f"epoch {epoch + 1}/{self.params['epochs']}{partial}  "
            f"loss {logs['loss']:.4f} ({logs['bpc']:.3f} bpc)  "
            f"val {logs['val_loss']:.4f} ({logs['val_bpc']:.3f} bpc){'  [green]best[/]' if improved else ''}  "
            f"{logs['chars_per_sec']:,.0f} chars/s  lr {logs['learning_rate']:.2g}  "
            f"{format_seconds(logs['seconds'])} total",
            highlight=False,
        )

    def on_train_end(self, logs: dict | None = None) -> None:
        self.progress.stop()


def describe(values: dict[str, Any]) -> str:
    """``key=value`` pairs on one line."""
    return "  ".join(f"{k}={v}" for k, v in values.items())
