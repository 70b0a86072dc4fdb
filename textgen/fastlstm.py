"""A lean LSTM forward/backward for training on the CPU, on the Keras model's own variables.

Keras' LSTM on a CPU runs a ``tf.while_loop`` whose backward pass adds a thin
(64 x 512)^T @ (64 x 2048) weight-gradient matmul, and a 4 MB accumulation, at every
timestep. Here the recurrence keeps only what must be sequential: one matmul per
step forward, one per step backward (a hand-written gradient). The input projection
for all timesteps, and the weight gradients for all timesteps, are each one large
matmul outside the loop.

``stateful_logits`` computes exactly what the Keras model computes (same variables,
same gates i, f, g, o; the LSTM states carried in the layers' state variables), so
checkpoints, sampling and the GPU's cuDNN path are unchanged. A layer-normalized LSTM
(``textgen.model.LayerNormLSTMCell``) runs the same way: its input projection normalized
outside the loop, the recurrent projection and the cell inside it, each with its gradient
written out.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from textgen.lstm import layer_norm, lstm_cell, normalize, normalize_gradient, run_unrolled
from textgen.model import LayerNormLSTMCell, lstm_layers

UNROLL = 4  # timesteps per loop iteration, forward and backward


def _gate_derivatives(c_prev: tf.Tensor, gates: tuple[tf.Tensor, ...], tanh_out: tf.Tensor) -> tf.Tensor:
    """d z / d c for the i, f, g pre-activations and d z / d h for o's (..., 4U), given the activated gates and the
    tanh the output gate multiplies."""
    i, f, g, o = gates
    return tf.concat([g * i * (1.0 - i), c_prev * f * (1.0 - f), i * (1.0 - g * g), tanh_out * o * (1.0 - o)], axis=-1)


def _forward_over_time(
    step: Any, x_projection: tf.Tensor, h0: tf.Tensor, c0: tf.Tensor, saved: int
) -> tuple[tf.Tensor, ...]:
    """Run a forward ``step(t, h, c, *arrays)`` over every timestep of ``x_projection``, each step writing ``saved``
    values: the final (h, c), then each value stacked over time."""
    steps = tf.shape(x_projection)[0]
    arrays = [tf.TensorArray(x_projection.dtype, size=steps) for _ in range(saved)]
    _, h_last, c_last, *written = run_unrolled(step, (tf.constant(0), h0, c0, *arrays), lambda t, *_: steps - t, UNROLL)
    return h_last, c_last, *(array.stack() for array in written)


# The two loops are compiled with XLA, which fuses each step's gate arithmetic into a few kernels around the
# matmul: +7% chars/s on REF (19,677 against 18,375, benchmarks/train_throughput.py's child, 15 s each, 2026-11-24),
# level at 2 x 512 (7,460 against 7,535 in 20 s), for ~100 MB more peak RSS. The rest of the step stays uncompiled.
# The forward loop also computes the backward's gate derivatives (fused into the step, instead of a separate pass
# over the saved gates): +11% and +3.5% at 1 x 512, +1.6% and +2.3% at 2 x 512 in alternating A/B pairs.
@tf.function(jit_compile=True, autograph=False)
def _forward_loop(x_projection: tf.Tensor, h0: tf.Tensor, c0: tf.Tensor, recurrent: tf.Tensor) -> tuple[tf.Tensor, ...]:
    """Final (h, c) and, for every timestep, h and what the backward pass needs of the step (its derivatives)."""

    def step(t: tf.Tensor, h: tf.Tensor, c: tf.Tensor, *saved: tf.TensorArray) -> tuple[Any, ...]:
        c_prev = c
        h, c, (i, f, g, o) = lstm_cell(x_projection[t] + tf.matmul(h, recurrent), c_prev)
        # The derivatives need nothing from the backward pass, so they are computed here, fused with the step,
        # rather than saving the gates and reading them back in a separate pass.
        tanh_c = tf.tanh(c)  # lstm_cell's own tanh(c): XLA computes it once
        dc_through_h = o * (1.0 - tanh_c * tanh_c)  # d c / d h, through the output gate's tanh
        dz_factors = _gate_derivatives(c_prev, (i, f, g, o), tanh_c)
        return (
            t + 1,
            h,
            c,
            *(array.write(t, v) for array, v in zip(saved, (h, dc_through_h, dz_factors, f), strict=True)),
        )

    return _forward_over_time(step, x_projection, h0, c0, saved=4)


@tf.function(jit_compile=True, autograph=False)
def _backward_loop(
    d_hs: tf.Tensor,
    d_h_last: tf.Tensor,
    d_c_last: tf.Tensor,
    dc_through_h: tf.Tensor,
    dz_factors: tf.Tensor,
    forget: tf.Tensor,
    recurrent_t: tf.Tensor,
) -> tuple[tf.Tensor, ...]:
    """The gradients of the initial (h, c) and of the pre-activations (T, B, 4U), from the last timestep back."""
    steps = tf.shape(d_hs)[0]

    def step(t: tf.Tensor, d_h_next: tf.Tensor, d_c_next: tf.Tensor, dz: tf.TensorArray) -> tuple[Any, ...]:
        d_h = d_hs[t] + d_h_next
        d_c = d_c_next + d_h * dc_through_h[t]
        d_z = tf.concat([d_c, d_c, d_c, d_h], axis=-1) * dz_factors[t]
        return t - 1, tf.matmul(d_z, recurrent_t), d_c * forget[t], dz.write(t, d_z)

    carry = (steps - 1, d_h_last, d_c_last, tf.TensorArray(d_hs.dtype, size=steps))
    _, d_h0, d_c0, dz = run_unrolled(step, carry, lambda t, *_: t + 1, UNROLL)
    return d_h0, d_c0, dz.stack()


@tf.custom_gradient
def lstm_recurrence(
    x_projection: tf.Tensor, h0: tf.Tensor, c0: tf.Tensor, recurrent: tf.Tensor
) -> tuple[tuple[tf.Tensor, tf.Tensor, tf.Tensor], object]:
    """Run an LSTM over time-major ``x_projection`` (T, B, 4U) = inputs @ kernel + bias.

    Returns the hidden states (T, B, U) and the final (h, c).
    """
    # stop_gradient: this function's gradient is ``grad`` below; without it, an eager tape would try to differentiate
    # the compiled loop too (and fail).
    h_last, c_last, hs, dc_through_h, dz_factors, forget = _forward_loop(
        *(tf.stop_gradient(v) for v in (x_projection, h0, c0, recurrent))
    )

    def grad(d_hs: tf.Tensor, d_h_last: tf.Tensor | None, d_c_last: tf.Tensor | None) -> tuple[tf.Tensor, ...]:
        d_h0, d_c0, dz = _backward_loop(
            d_hs,
            tf.zeros_like(h0) if d_h_last is None else d_h_last,
            tf.zeros_like(c0) if d_c_last is None else d_c_last,
            dc_through_h,
            dz_factors,
            forget,
            tf.transpose(recurrent),
        )
        units = tf.shape(h0)[-1]
        h_prev = tf.concat([h0[None], hs[:-1]], axis=0)
        d_recurrent = tf.matmul(tf.reshape(h_prev, [-1, units]), tf.reshape(dz, [-1, 4 * units]), transpose_a=True)
        return dz, d_h0, d_c0, d_recurrent

    return (hs, h_last, c_last), grad


# The layer-normalized recurrence, as lstm_recurrence above with two more normalizations per step (of h @ recurrent
# and of c). Against the plain one it trained the default 1 x 512 at 0.76x the chars/s and scored 0.019 nats/char
# better on War and Peace's test split after 30 minutes (docs/quality.md).
@tf.function(jit_compile=True, autograph=False)
def _normalized_forward_loop(
    x_projection: tf.Tensor,
    h0: tf.Tensor,
    c0: tf.Tensor,
    recurrent: tf.Tensor,
    recurrent_gain: tf.Tensor,
    cell_gain: tf.Tensor,
    cell_shift: tf.Tensor,
) -> tuple[tf.Tensor, ...]:
    """Final (h, c) and, for every timestep, h and what the backward pass needs of the step."""

    def step(t: tf.Tensor, h: tf.Tensor, c: tf.Tensor, *saved: tf.TensorArray) -> tuple[Any, ...]:
        c_prev = c
        r_hat, r_inv_std = normalize(tf.matmul(h, recurrent))
        h, c, (i, f, g, o) = lstm_cell(x_projection[t] + recurrent_gain * r_hat, c_prev, (cell_gain, cell_shift))
        c_hat, c_inv_std = normalize(c)  # lstm_cell's own normalization and tanh: XLA computes them once
        tanh_n = tf.tanh(cell_gain * c_hat + cell_shift)
        dn_through_h = o * (1.0 - tanh_n * tanh_n)  # d (normalized c) / d h, through the output gate's tanh
        dz_factors = _gate_derivatives(c_prev, (i, f, g, o), tanh_n)
        values = (h, r_hat, r_inv_std, c_hat, c_inv_std, dn_through_h, dz_factors, f)
        return t + 1, h, c, *(array.write(t, v) for array, v in zip(saved, values, strict=True))

    return _forward_over_time(step, x_projection, h0, c0, saved=8)


@tf.function(jit_compile=True, autograph=False)
def _normalized_backward_loop(
    d_hs: tf.Tensor,
    d_h_last: tf.Tensor,
    d_c_last: tf.Tensor,
    saved: tuple[tf.Tensor, ...],
    recurrent_t: tf.Tensor,
    recurrent_gain: tf.Tensor,
    cell_gain: tf.Tensor,
) -> tuple[tf.Tensor, ...]:
    """The gradients of the initial (h, c), and for every timestep those of the pre-activations z, of the
    normalized recurrent projection's input and of the normalized cell, from the last timestep back."""
    _, r_hat, r_inv_std, c_hat, c_inv_std, dn_through_h, dz_factors, forget = saved
    steps = tf.shape(d_hs)[0]

    def step(t: tf.Tensor, d_h_next: tf.Tensor, d_c_next: tf.Tensor, *written: tf.TensorArray) -> tuple[Any, ...]:
        d_h = d_hs[t] + d_h_next
        d_n = d_h * dn_through_h[t]
        d_c = d_c_next + normalize_gradient(cell_gain * d_n, c_hat[t], c_inv_std[t])
        d_z = tf.concat([d_c, d_c, d_c, d_h], axis=-1) * dz_factors[t]
        d_r = normalize_gradient(recurrent_gain * d_z, r_hat[t], r_inv_std[t])
        values = (d_z, d_r, d_n)
        return (
            t - 1,
            tf.matmul(d_r, recurrent_t),
            d_c * forget[t],
            *(array.write(t, v) for array, v in zip(written, values, strict=True)),
        )

    arrays = [tf.TensorArray(d_hs.dtype, size=steps) for _ in range(3)]
    _, d_h0, d_c0, *written = run_unrolled(step, (steps - 1, d_h_last, d_c_last, *arrays), lambda t, *_: t + 1, UNROLL)
    return d_h0, d_c0, *(array.stack() for array in written)


@tf.custom_gradient
def normalized_lstm_recurrence(
    x_projection: tf.Tensor,
    h0: tf.Tensor,
    c0: tf.Tensor,
    recurrent: tf.Tensor,
    recurrent_gain: tf.Tensor,
    cell_gain: tf.Tensor,
    cell_shift: tf.Tensor,
) -> tuple[tuple[tf.Tensor, tf.Tensor, tf.Tensor], object]:
    """``lstm_recurrence`` layer-normalized: ``x_projection`` (T, B, 4U) = LN(inputs @ kernel) * input_gain + bias.

    Returns the hidden states (T, B, U) and the final (h, c).
    """
    inputs = (x_projection, h0, c0, recurrent, recurrent_gain, cell_gain, cell_shift)
    h_last, c_last, *saved = _normalized_forward_loop(*(tf.stop_gradient(v) for v in inputs))
    hs, r_hat, _, c_hat, *_ = saved

    def grad(d_hs: tf.Tensor, d_h_last: tf.Tensor | None, d_c_last: tf.Tensor | None) -> tuple[tf.Tensor, ...]:
        d_h0, d_c0, d_z, d_r, d_n = _normalized_backward_loop(
            d_hs,
            tf.zeros_like(h0) if d_h_last is None else d_h_last,
            tf.zeros_like(c0) if d_c_last is None else d_c_last,
            tuple(saved),
            tf.transpose(recurrent),
            recurrent_gain,
            cell_gain,
        )
        units = tf.shape(h0)[-1]
        h_prev = tf.concat([h0[None], hs[:-1]], axis=0)
        d_recurrent = tf.matmul(tf.reshape(h_prev, [-1, units]), tf.reshape(d_r, [-1, 4 * units]), transpose_a=True)
        over_time_and_batch = [0, 1]
        return (
            d_z,
            d_h0,
            d_c0,
            d_recurrent,
            tf.reduce_sum(d_z * r_hat, over_time_and_batch),
            tf.reduce_sum(d_n * c_hat, over_time_and_batch),
            tf.reduce_sum(d_n, over_time_and_batch),
        )

    return (hs, h_last, c_last), grad


def mask_seed(seed: tf.Tensor | None, offset: int) -> tf.Tensor:
    """A distinct stateless seed for each dropout mask of a step."""
    return tf.stack([seed[0], seed[1] + offset]) if seed is not None else tf.constant([offset, 0])


def dropout(x: tf.Tensor, rate: float, noise_shape: Any, seed: tf.Tensor) -> tf.Tensor:
    """Inverted dropout with a mask of ``noise_shape`` (broadcast over ``x``)."""
    keep = 1.0 - rate
    return x * tf.cast(tf.random.stateless_uniform(noise_shape, seed=seed) < keep, x.dtype) / keep


def stateful_logits(model: keras.Model, ids: tf.Tensor, training: bool, seed: tf.Tensor | None = None) -> tf.Tensor:
    """Logits (B, T, V) of a model built by ``textgen.model.build_model``, carrying its LSTM states.

    Reads and updates the stateful layers' state variables exactly as the Keras
    layers do. With ``training`` and dropout, each LSTM's input gets a dropout mask
    shared across timesteps, as Keras' LSTM ``dropout`` does, and the last LSTM's
    output one drawn as the model's ``output_dropout`` layer draws it: per element, or
    locked (its ``noise_shape`` set), per stream and shared across timesteps.
    """
    embedding = model.get_layer("embedding").embeddings
    x = tf.transpose(tf.gather(embedding, ids), [1, 0, 2])  # time-major (T, B, D)
    steps, batch = tf.shape(x)[0], tf.shape(x)[1]
    lstms = lstm_layers(model)
    for n, layer in enumerate(lstms):
        cell = layer.cell
        if training and cell.dropout > 0:
            x = dropout(x, cell.dropout, [1, batch, tf.shape(x)[-1]], mask_seed(seed, n))
        depth = tf.shape(x)[-1]
        projection = tf.matmul(tf.reshape(x, [-1, depth]), cell.kernel)
        normalized = isinstance(cell, LayerNormLSTMCell)
        x_projection = (layer_norm(projection, cell.input_gain) if normalized else projection) + cell.bias
        x_projection = tf.reshape(x_projection, [steps, batch, 4 * cell.units])
        h_state, c_state = layer.states
        # Plain tensors, not variables, go into the custom gradient (it returns their gradients).
        h0, c0, recurrent = (tf.convert_to_tensor(v) for v in (h_state, c_state, cell.recurrent_kernel))
        if normalized:
            gains = (tf.convert_to_tensor(v) for v in (cell.recurrent_gain, cell.cell_gain, cell.cell_shift))
            x, h_last, c_last = normalized_lstm_recurrence(x_projection, h0, c0, recurrent, *gains)
        else:
            x, h_last, c_last = lstm_recurrence(x_projection, h0, c0, recurrent)
        h_state.assign(tf.stop_gradient(h_last))
        c_state.assign(tf.stop_gradient(c_last))
    output_dropout = model.get_layer("output_dropout")
    if training and output_dropout.rate > 0:
        locked = output_dropout.noise_shape is not None
        shape = [1, batch, tf.shape(x)[-1]] if locked else tf.shape(x)
        x = dropout(x, output_dropout.rate, shape, mask_seed(seed, len(lstms)))
    dense = model.get_layer("logits")
    units = tf.shape(x)[-1]
    logits = tf.matmul(tf.reshape(x, [-1, units]), dense.kernel) + dense.bias
    return tf.transpose(tf.reshape(logits, [steps, batch, -1]), [1, 0, 2])
