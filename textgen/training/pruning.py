"""Pruning: which kernels are masked, the masks themselves, and the schedule that raises their sparsity."""

from __future__ import annotations

import math
from collections.abc import Callable

import keras
import numpy as np

from textgen.model import lstm_layers


def prunable_kernels(model: keras.Model) -> list[keras.Variable]:
    """The weights ``textgen prune`` masks: every LSTM's input and recurrent kernels and the output kernel
    (the embedding and the biases, ~1% of the default model, stay dense)."""
    lstms = [layer.cell for layer in lstm_layers(model)]
    return [v for cell in lstms for v in (cell.kernel, cell.recurrent_kernel)] + [model.get_layer("logits").kernel]


def update_masks(masks: list[tuple[keras.Variable, keras.Variable]], sparsity: float) -> None:
    """Mask the ``sparsity`` fraction of smallest-magnitude weights of each kernel, and zero them.

    Masked weights are exactly zero and stay the smallest, so as the sparsity rises the masked set only grows,
    and masks recomputed from the weights after a resume are the masks that were in force.
    """
    for kernel, mask in masks:
        weights = kernel.numpy()
        pruned = round(sparsity * weights.size)
        keep = np.ones(weights.size, np.float32)
        if pruned:
            keep[np.argpartition(np.abs(weights).ravel(), pruned - 1)[:pruned]] = 0.0
        keep = keep.reshape(weights.shape)
        mask.assign(keep)
        kernel.assign(weights * keep)


class PruneSchedule(keras.callbacks.Callback):
    """Raise the masked fraction of every pruned kernel from 0 to ``target`` over the first ``ramp`` of the run,
    on Zhu and Gupta's cubic curve (fast at first, while the weights can recover), in steps of 1% of the run
    (numpy.argpartition over the default model's 1.3M weights takes ~30 ms)."""

    STEPS = 100

    def __init__(
        self,
        masks: list[tuple[keras.Variable, keras.Variable]],
        target: float,
        ramp: float,
        progress: Callable[[int, int], float],
    ) -> None:
        super().__init__()
        self.masks, self.target, self.ramp, self.progress = masks, target, ramp, progress
        self.epoch = 0
        self.reached = 0.0  # the sparsity the weights already have (a resumed run's)
        self.sparsity = -1.0  # the masks' sparsity; none yet: the first batch (of a new or a resumed run) sets them

    def sparsity_at(self, progress: float) -> float:
        quantised = math.floor(min(max(progress, 0.0), 1.0) * self.STEPS) / self.STEPS
        return self.target * (1.0 - (1.0 - min(quantised / self.ramp, 1.0)) ** 3)

    @property
    def at_target(self) -> bool:
        """Whether the weights are at the full sparsity (a run resumed only to validate sets no masks)."""
        return max(self.sparsity, self.reached) >= self.target

    def on_train_begin(self, logs: dict | None = None) -> None:
        """A resumed run's pruned weights are exactly zero: its sparsity goes on from theirs, never below. (More
        --epochs or --time-budget move the schedule back; unmasking would train pruned weights again.)"""
        zeros = [(int(np.count_nonzero(kernel.numpy() == 0)), int(np.prod(kernel.shape))) for kernel, _ in self.masks]
        if zeros and all(n >= round(self.target * size) for n, size in zeros):
            self.reached = self.target  # exactly, for at_target
        else:
            self.reached = min((n / size for n, size in zeros), default=0.0)

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self.epoch = epoch

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        sparsity = max(self.sparsity_at(self.progress(self.epoch, batch)), self.reached)
        if sparsity != self.sparsity:
            update_masks(self.masks, sparsity)
            self.sparsity = sparsity
