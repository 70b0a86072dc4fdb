"""The fast CPU training path computes what Keras' LSTM computes: loss, gradients, states."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from textgen.config import ModelConfig
from textgen.fastlstm import lstm_recurrence, normalized_lstm_recurrence, stateful_logits
from textgen.model import LAYER_NORM_WEIGHTS, build_model, lstm_layers, reset_states


def _states(model: keras.Model) -> list[np.ndarray]:
    return [s.numpy() for layer in model.layers if getattr(layer, "stateful", False) for s in layer.states]


def _set_states(model: keras.Model, values: list[np.ndarray]) -> None:
    variables = [s for layer in model.layers if getattr(layer, "stateful", False) for s in layer.states]
    for variable, value in zip(variables, values, strict=True):
        variable.assign(value)


def _loss_and_grads(model: keras.Model, logits_fn, x: tf.Tensor, y: tf.Tensor) -> tuple[float, list[np.ndarray]]:
    with tf.GradientTape() as tape:
        logits = logits_fn()
        loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))
    grads = tape.gradient(loss, model.trainable_variables)
    return float(loss), [tf.convert_to_tensor(g).numpy() for g in grads]


def _randomize_layer_norm(model: keras.Model, rng: np.random.Generator) -> None:
    """Gains and shifts away from their ones and zeros, so that each one's place in the arithmetic shows."""
    for layer in lstm_layers(model):
        for name in LAYER_NORM_WEIGHTS:
            weight = getattr(layer.cell, name)
            weight.assign(rng.normal(1.0 if "gain" in name else 0.0, 0.3, weight.shape).astype("float32"))


@pytest.mark.parametrize("layer_norm", [False, True], ids=["plain", "layer-norm"])
@pytest.mark.parametrize("layers", [1, 2])
def test_fast_path_matches_keras_lstm_over_consecutive_batches(layers: int, layer_norm: bool) -> None:
    keras.utils.set_random_seed(3)
    cfg = ModelConfig(vocab_size=23, embedding_dim=8, units=16, layers=layers, dropout=0.0, layer_norm=layer_norm)
    model = build_model(cfg, batch_size=3)
    reset_states(model)
    rng = np.random.default_rng(0)
    if layer_norm:
        _randomize_layer_norm(model, rng)
    for _ in range(3):  # states carry from batch to batch
        x = tf.constant(rng.integers(0, 23, (3, 9)), tf.int32)
        y = tf.constant(rng.integers(0, 23, (3, 9)), tf.int32)
        start = _states(model)
        keras_loss, keras_grads = _loss_and_grads(model, lambda x=x: model(x, training=True), x, y)
        keras_states = _states(model)
        _set_states(model, start)
        fast_loss, fast_grads = _loss_and_grads(model, lambda x=x: stateful_logits(model, x, True), x, y)
        assert fast_loss == pytest.approx(keras_loss, rel=1e-6)
        # Normalizing divides by each row's spread, which magnifies float32 rounding (2.6e-7 in a gradient of 0.03,
        # 1.9e-6 in a cell of 5 were seen); the float64 test below checks the arithmetic itself.
        looser = 10 if layer_norm else 1
        for keras_grad, fast_grad in zip(keras_grads, fast_grads, strict=True):
            np.testing.assert_allclose(fast_grad, keras_grad, rtol=1e-4, atol=1e-7 * looser)
        for keras_state, fast_state in zip(keras_states, _states(model), strict=True):
            np.testing.assert_allclose(fast_state, keras_state, rtol=1e-5, atol=1e-6 * looser)
        assert np.abs(keras_states[0]).sum() > 0  # the states really moved


@pytest.mark.parametrize("steps", [1, 4, 6, 9])  # fewer timesteps than the loop unrolls, a multiple, and more
def test_recurrence_gradient_matches_autodiff_in_float64(steps: int) -> None:
    batch, units = 2, 5
    rng = np.random.default_rng(1)
    inputs = [
        tf.constant(rng.normal(size=shape), tf.float64)
        for shape in [(steps, batch, 4 * units), (batch, units), (batch, units), (units, 4 * units)]
    ]
    weights = tf.constant(rng.normal(size=(steps, batch, units)), tf.float64)

    def reference(x_projection, h, c, recurrent):
        hs = []
        for t in range(steps):
            i, f, g, o = tf.split(x_projection[t] + h @ recurrent, 4, axis=-1)
            c = tf.sigmoid(f) * c + tf.sigmoid(i) * tf.tanh(g)
            h = tf.sigmoid(o) * tf.tanh(c)
            hs.append(h)
        return tf.stack(hs), h, c

    results = []
    for fn in (reference, lstm_recurrence):
        with tf.GradientTape() as tape:
            tape.watch(inputs)
            hs, h_last, c_last = fn(*inputs)
            loss = tf.reduce_sum(hs * weights) + tf.reduce_sum(c_last * weights[0]) + tf.reduce_sum(h_last)
        results.append([g.numpy() for g in tape.gradient(loss, inputs)])
    for expected, got in zip(*results, strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)


def _normalize(v):
    mean, variance = tf.nn.moments(v, axes=[-1], keepdims=True)
    return (v - mean) / tf.sqrt(variance + 1e-3)


@pytest.mark.parametrize("steps", [1, 4, 6, 9])
def test_layer_normalized_recurrence_gradient_matches_autodiff_in_float64(steps: int) -> None:
    """Against Ba et al.'s equations written plainly, one step at a time, differentiated by TensorFlow."""
    batch, units = 3, 5
    rng = np.random.default_rng(2)
    shapes = [(steps, batch, 4 * units), (batch, units), (batch, units), (units, 4 * units), (4 * units,), (units,)]
    inputs = [tf.constant(rng.normal(size=shape), tf.float64) for shape in [*shapes, (units,)]]
    inputs[4], inputs[5] = inputs[4] * 0.3 + 1.0, inputs[5] * 0.3 + 1.0  # gains near one, as they start
    weights = tf.constant(rng.normal(size=(steps, batch, units)), tf.float64)

    def reference(x_projection, h, c, recurrent, recurrent_gain, cell_gain, cell_shift):
        hs = []
        for t in range(steps):
            z = x_projection[t] + recurrent_gain * _normalize(h @ recurrent)
            i, f, g, o = tf.split(z, 4, axis=-1)
            c = tf.sigmoid(f) * c + tf.sigmoid(i) * tf.tanh(g)
            h = tf.sigmoid(o) * tf.tanh(cell_gain * _normalize(c) + cell_shift)
            hs.append(h)
        return tf.stack(hs), h, c

    results = []
    for fn in (reference, normalized_lstm_recurrence):
        with tf.GradientTape() as tape:
            tape.watch(inputs)
            hs, h_last, c_last = fn(*inputs)
            loss = tf.reduce_sum(hs * weights) + tf.reduce_sum(c_last * weights[0]) + tf.reduce_sum(h_last)
        results.append([hs.numpy(), *(g.numpy() for g in tape.gradient(loss, inputs))])
    for expected, got in zip(*results, strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-11)


def test_layer_norm_adds_its_gains_and_shift_to_each_lstm() -> None:
    cfg = ModelConfig(vocab_size=11, embedding_dim=8, units=16, layers=2, layer_norm=True)
    model = build_model(cfg, batch_size=2)
    assert model.count_params() == cfg.parameters
    for layer in lstm_layers(model):
        names = [w.name for w in layer.weights]
        assert names == ["kernel", "recurrent_kernel", "bias", *LAYER_NORM_WEIGHTS]
        assert layer.stateful and layer.cell.dropout == cfg.dropout


def test_fast_path_dropout_masks_inputs_only_in_training() -> None:
    keras.utils.set_random_seed(5)
    model = build_model(ModelConfig(vocab_size=11, embedding_dim=8, units=8, dropout=0.5), batch_size=2)
    x = tf.constant(np.arange(12).reshape(2, 6) % 11, tf.int32)
    seed = tf.constant([1, 2], tf.int64)
    reset_states(model)
    inference = stateful_logits(model, x, training=False).numpy()
    reset_states(model)
    np.testing.assert_allclose(inference, model(x, training=False).numpy(), rtol=1e-5, atol=1e-6)
    reset_states(model)
    dropped = stateful_logits(model, x, training=True, seed=seed).numpy()
    reset_states(model)
    again = stateful_logits(model, x, training=True, seed=seed).numpy()
    assert not np.allclose(dropped, inference)
    np.testing.assert_allclose(dropped, again)  # the mask is a function of the seed


def test_output_dropout_zeroes_or_rescales_each_output() -> None:
    """With an identity output layer the logits are the last LSTM's outputs, so the mask shows."""
    keras.utils.set_random_seed(6)
    rate, units = 0.25, 16
    model = build_model(
        ModelConfig(vocab_size=units, embedding_dim=8, units=units, layers=1, dropout=rate), batch_size=4
    )
    model.get_layer("lstm_0").cell.dropout = 0.0  # isolate the output dropout
    model.get_layer("logits").set_weights([np.eye(units, dtype="float32"), np.zeros(units, "float32")])
    x = tf.constant(np.arange(4 * 50).reshape(4, 50) % units, tf.int32)
    reset_states(model)
    outputs = stateful_logits(model, x, training=False).numpy()
    reset_states(model)
    dropped = stateful_logits(model, x, training=True, seed=tf.constant([3, 4], tf.int64)).numpy()
    kept = dropped != 0
    np.testing.assert_allclose(dropped[kept], outputs[kept] / (1 - rate), rtol=1e-5)
    assert 1 - kept.mean() == pytest.approx(rate, abs=0.03)  # 3,200 draws: 4 standard deviations
    reset_states(model)
    np.testing.assert_allclose(model(x, training=False).numpy(), outputs, rtol=1e-5, atol=1e-6)


def test_the_keras_model_drops_its_outputs_too() -> None:
    model = build_model(ModelConfig(vocab_size=11, dropout=0.3), batch_size=2)
    assert model.get_layer("output_dropout").rate == 0.3
    assert model.get_layer("lstm_0").dropout == 0.3
