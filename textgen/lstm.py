"""The LSTM cell's arithmetic in Keras' gate order (i, f, g, o): one step, layer normalization, and the loop that
runs steps; shared by the Keras model, training's fast path and sampling."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

LAYER_NORM_EPSILON = 1e-3  # keras.layers.LayerNormalization's


def lstm_cell(
    z: tf.Tensor, c: tf.Tensor, cell_norm: tuple[tf.Tensor, tf.Tensor] | None = None
) -> tuple[tf.Tensor, tf.Tensor, tuple[tf.Tensor, ...]]:
    """New ``(h, c)`` and the activated gates ``(i, f, g, o)`` from pre-activations ``z`` (..., 4U).

    ``z = x @ kernel + h @ recurrent_kernel + bias``, as Keras' LSTM computes it (sigmoid gates,
    tanh candidate and output), so the same weights give the same states. With ``cell_norm`` (a gain
    and a shift), the cell is layer-normalized before the output's tanh (Ba et al., 2016, eq. 22).
    """
    i, f, g, o = tf.split(z, 4, axis=-1)
    i, f, g, o = tf.sigmoid(i), tf.sigmoid(f), tf.tanh(g), tf.sigmoid(o)
    c = f * c + i * g
    shown = c if cell_norm is None else layer_norm(c, *cell_norm)
    return o * tf.tanh(shown), c, (i, f, g, o)


def normalize(v: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """``v`` normalized over its last axis (zero mean, unit variance), and the reciprocal of its standard deviation
    (..., 1), which the hand-written gradient needs. The statistics of half-precision values are float32."""
    wide = tf.cast(v, tf.float32) if v.dtype in (tf.float16, tf.bfloat16) else v
    centred = wide - tf.reduce_mean(wide, axis=-1, keepdims=True)
    inv_std = tf.math.rsqrt(tf.reduce_mean(centred * centred, axis=-1, keepdims=True) + LAYER_NORM_EPSILON)
    return tf.cast(centred * inv_std, v.dtype), tf.cast(inv_std, v.dtype)


def normalize_gradient(d_normalized: tf.Tensor, normalized: tf.Tensor, inv_std: tf.Tensor) -> tf.Tensor:
    """The gradient of ``normalize``'s input from that of its output."""
    mean_d = tf.reduce_mean(d_normalized, axis=-1, keepdims=True)
    mean_d_x = tf.reduce_mean(d_normalized * normalized, axis=-1, keepdims=True)
    return inv_std * (d_normalized - mean_d - normalized * mean_d_x)


def layer_norm(v: tf.Tensor, gain: tf.Tensor, shift: tf.Tensor | None = None) -> tf.Tensor:
    """``v`` normalized over its last axis, times ``gain``, plus ``shift``."""
    scaled = normalize(v)[0] * gain
    return scaled if shift is None else scaled + shift


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
