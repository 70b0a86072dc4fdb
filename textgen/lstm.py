"""The LSTM cell's arithmetic in Keras' gate order (i, f, g, o): one step, and the loop that runs steps; shared by
training and sampling."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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


def run_unrolled(
    step: Callable[..., tuple[Any, ...]], carry: tuple[Any, ...], remaining: Callable[..., tf.Tensor], unroll: int
) -> tuple[Any, ...]:
    """Apply ``step`` to ``carry`` while ``remaining(*carry)`` steps are left: ``unroll`` steps per iteration of a
    ``tf.while_loop`` (each iteration adds control ops per loop variable, so fewer iterations cost less per step),
    then the rest one at a time."""

    def unrolled(*values: Any) -> tuple[Any, ...]:
        for _ in range(unroll):
            values = step(*values)
        return values

    carry = tf.while_loop(lambda *values: remaining(*values) >= unroll, unrolled, carry)
    return tuple(tf.while_loop(lambda *values: remaining(*values) > 0, step, carry))
