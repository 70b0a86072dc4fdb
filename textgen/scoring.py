"""Cross-entropy of text under a model: one routine for training's validation and ``textgen evaluate``.

The text is laid out as the run's training batches are (``layout.StreamLayout``): ``batch_size``
contiguous streams read ``seq_len`` characters at a time, the LSTM state carried from one batch
to the next and zeroed at the start; the characters that do not fill a last batch are scored too
(``StreamLayout.covering``). So the best validation loss in a run's history and
``textgen evaluate --split val`` are the same number for the same weights.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import keras
import numpy as np
import tensorflow as tf

from textgen.config import DeviceProfile
from textgen.data import distributed_batches
from textgen.fastlstm import stateful_logits
from textgen.layout import MASKED, StreamLayout
from textgen.model import reset_states
from textgen.tracking import Track, untracked

# (inputs, targets) -> summed cross-entropy (nats) of the targets not MASKED, carrying the model's LSTM states
EvalStep = Callable[[tf.Tensor, tf.Tensor], tf.Tensor]


def model_logits(
    model: keras.Model, profile: DeviceProfile, x: tf.Tensor, training: bool, seed: tf.Tensor | None = None
) -> tf.Tensor:
    """Logits (B, T, V) after inputs ``x``, carrying the LSTM states, through the profile's LSTM path."""
    return stateful_logits(model, x, training, seed) if profile.fast_lstm else model(x, training=training)


def summed_cross_entropy(y: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
    """Summed cross-entropy (nats) of integer targets ``y`` under ``logits``."""
    return tf.reduce_sum(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))


def masked_cross_entropy(y: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
    """Summed cross-entropy (nats) of integer targets ``y`` under ``logits``, leaving out the ``MASKED`` ones
    (the padding of a last batch)."""
    scored = tf.not_equal(y, MASKED)
    losses = keras.losses.sparse_categorical_crossentropy(tf.where(scored, y, 0), logits, from_logits=True)
    return tf.reduce_sum(tf.where(scored, losses, tf.zeros_like(losses)))


def compile_eval_step(
    model: keras.Model, profile: DeviceProfile, strategy: tf.distribute.Strategy | None = None
) -> EvalStep:
    """The compiled evaluation step (no dropout), run through ``strategy`` with the per-replica batch."""
    strategy = strategy or tf.distribute.get_strategy()

    def replica_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        return masked_cross_entropy(y, model_logits(model, profile, x, False))

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
    track: Track = untracked,
) -> tuple[float, int]:
    """Summed cross-entropy (nats) of every character of ``ids`` after the first, from zero LSTM states, and how
    many that is.

    The ids are read in ``layout``'s streams and ``seq_len`` (of the layout, only these count: a training layout
    of full batches serves) as ``StreamLayout.covering`` lays them out: the full batches, then the rest in padded
    batches of the same shape. ``model`` must be stateful with ``layout.streams`` rows (per replica of
    ``strategy``, their share). ``track`` hears the characters scored, batch by batch.
    """
    strategy = strategy or tf.distribute.get_strategy()
    layout = StreamLayout.covering(len(ids), layout.streams, layout.seq_len)
    reset_states(model)
    total, done, batch_chars = 0.0, 0, layout.streams * layout.seq_len
    batches = itertools.chain(
        distributed_batches(strategy, ids, layout),
        ((_by_replica(strategy, x), _by_replica(strategy, y)) for x, y in layout.last_batches(ids)),
    )
    for x, y in batches:
        total += float(eval_step(x, y))
        done = min(done + batch_chars, layout.scored)
        track("scoring", done, layout.scored)
    return total, layout.scored


def _by_replica(strategy: tf.distribute.Strategy, rows: np.ndarray) -> tf.Tensor:
    """``rows`` (streams, T) dealt to ``strategy``'s replicas as ``distributed_batches`` deals a batch: replica ``r``
    takes rows ``r * per`` to ``(r + 1) * per``."""
    per = len(rows) // strategy.num_replicas_in_sync

    def replica_rows(context: tf.distribute.experimental.ValueContext) -> tf.Tensor:
        first = context.replica_id_in_sync_group * per
        return tf.constant(rows[first : first + per])

    return strategy.experimental_distribute_values_from_function(replica_rows)
