"""Cross-entropy of text under a model: one routine for training's validation and ``textgen evaluate``.

The text is laid out as the run's training batches are (``layout.StreamLayout``): ``batch_size``
contiguous streams read ``seq_len`` characters at a time, the LSTM state carried from one batch
to the next and zeroed at the start. So the best validation loss in a run's history and
``textgen evaluate --split val`` are the same number for the same weights.
"""

from __future__ import annotations

from collections.abc import Callable

import keras
import numpy as np
import tensorflow as tf

from textgen.config import DeviceProfile
from textgen.data import distributed_batches
from textgen.fastlstm import stateful_logits
from textgen.layout import StreamLayout
from textgen.model import reset_states

# (inputs, targets) -> summed cross-entropy in nats, carrying the model's LSTM states
EvalStep = Callable[[tf.Tensor, tf.Tensor], tf.Tensor]


def model_logits(
    model: keras.Model, profile: DeviceProfile, x: tf.Tensor, training: bool, seed: tf.Tensor | None = None
) -> tf.Tensor:
    """Logits (B, T, V) after inputs ``x``, carrying the LSTM states, through the profile's LSTM path."""
    return stateful_logits(model, x, training, seed) if profile.fast_lstm else model(x, training=training)


def loss_sum(
    model: keras.Model, profile: DeviceProfile, x: tf.Tensor, y: tf.Tensor, training: bool, seed: tf.Tensor | None
) -> tf.Tensor:
    """Summed cross-entropy (nats) of targets ``y`` after inputs ``x``, through the profile's LSTM path."""
    return summed_cross_entropy(y, model_logits(model, profile, x, training, seed))


def summed_cross_entropy(y: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
    """Summed cross-entropy (nats) of integer targets ``y`` under ``logits``."""
    return tf.reduce_sum(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))


def compile_eval_step(
    model: keras.Model, profile: DeviceProfile, strategy: tf.distribute.Strategy | None = None
) -> EvalStep:
    """The compiled evaluation step (no dropout), run through ``strategy`` with the per-replica batch."""
    strategy = strategy or tf.distribute.get_strategy()

    def replica_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        return loss_sum(model, profile, x, y, False, None)

    @tf.function(jit_compile=profile.jit_compile, autograph=False)
    def eval_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        return strategy.reduce("SUM", strategy.run(replica_step, args=(x, y)), axis=None)

    return eval_step


def score(
    eval_step: EvalStep,
    model: keras.Model,
    ids: np.ndarray,
    layout: StreamLayout,
    strategy: tf.distribute.Strategy | None = None,
) -> tuple[float, int]:
    """Summed cross-entropy (nats) and the number of characters scored, from zero LSTM states.

    ``model`` must be stateful with ``layout.streams`` rows (per replica of ``strategy``, their share).
    Only the full batches of the layout are scored: what is left at the end is shorter than one batch.
    """
    reset_states(model)
    batches = distributed_batches(strategy or tf.distribute.get_strategy(), ids, layout)
    total = sum(float(eval_step(x, y)) for x, y in batches)
    return total, layout.batches * layout.chars_per_batch
