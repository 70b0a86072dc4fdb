"""The LSTM cell's arithmetic in Keras' gate order (i, f, g, o): one step, shared by training and sampling."""

from __future__ import annotations

import tensorflow as tf


def lstm_cell(z: tf.Tensor, c: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tuple[tf.Tensor, ...]]:
    """New ``(h, c)`` and the activated gates ``(i, f, g, o)`` from pre-activations ``z`` (..., 4U).

    ``z = x @ kernel + h @ recurrent_kernel + bias``, as Keras' LSTM computes it (sigmoid gates,
    tanh candidate and output), so the same weights give the same states.
    """
    i, f, g, o = tf.split(z, 4, axis=-1)
    i, f, g, o = tf.sigmoid(i), tf.sigmoid(f), tf.tanh(g), tf.sigmoid(o)
    c = f * c + i * g
    return o * tf.tanh(c), c, (i, f, g, o)
