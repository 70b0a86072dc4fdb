"""The fast CPU training path computes what Keras' LSTM computes: loss, gradients, states."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from textgen.config import ModelConfig
from textgen.fastlstm import lstm_recurrence, normalized_lstm_recurrence, stateful_logits
from textgen.model import LAYER_NORM_WEIGHTS, build_model, lstm_layers, reset_states
from textgen.training.step import recurrent_kernels_dropped


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


def _dropped_kernels(model: keras.Model, rate: float, seed: tf.Tensor) -> list[np.ndarray]:
    """The recurrent kernels the LSTMs read while weight-drop is on."""
    with recurrent_kernels_dropped(model, rate, seed):
        return [tf.convert_to_tensor(layer.cell.recurrent_kernel).numpy() for layer in lstm_layers(model)]


@pytest.mark.parametrize("layer_norm", [False, True], ids=["plain", "layer-norm"])
@pytest.mark.parametrize("fast", [True, False], ids=["fast", "keras"])
def test_weight_drop_matches_autodiff_through_a_masked_kernel(fast: bool, layer_norm: bool) -> None:
    """With weight-drop, the fast path (its hand-written recurrence gradient) and Keras' LSTM compute the loss and
    gradients of a model whose recurrent kernels hold the masked weights at every timestep and in every stream, by
    TensorFlow's autodiff, the kernels' gradients passed back through the mask."""
    keras.utils.set_random_seed(4)
    rate, seed = 0.4, tf.constant([7, 1], tf.int64)
    cfg = ModelConfig(vocab_size=23, embedding_dim=8, units=16, layers=2, dropout=0.0, layer_norm=layer_norm)
    model = build_model(cfg, batch_size=3)
    rng = np.random.default_rng(0)
    if layer_norm:
        _randomize_layer_norm(model, rng)
    x = tf.constant(rng.integers(0, 23, (3, 9)), tf.int32)
    y = tf.constant(rng.integers(0, 23, (3, 9)), tf.int32)
    kernels = [layer.cell.recurrent_kernel for layer in lstm_layers(model)]
    raw, dropped = [k.numpy() for k in kernels], _dropped_kernels(model, rate, seed)
    for weights, masked in zip(raw, dropped, strict=True):
        kept = masked != 0
        np.testing.assert_allclose(masked[kept], weights[kept] / (1 - rate), rtol=1e-6)  # inverted: kept and scaled
        assert 1 - kept.mean() == pytest.approx(rate, abs=0.05)  # 1,024 weights: 3 standard deviations

    def dropped_logits() -> tf.Tensor:  # called within the gradient tape, as the train step does
        with recurrent_kernels_dropped(model, rate, seed):
            return stateful_logits(model, x, True, seed) if fast else model(x, training=True)

    reset_states(model)
    loss, grads = _loss_and_grads(model, dropped_logits, x, y)
    for kernel, masked in zip(kernels, dropped, strict=True):
        kernel.assign(masked)
    reset_states(model)
    expected_loss, expected = _loss_and_grads(model, lambda: model(x, training=True), x, y)
    at = [next(i for i, v in enumerate(model.trainable_variables) if v is kernel) for kernel in kernels]
    for i, masked in zip(at, dropped, strict=True):
        expected[i] = expected[i] * (masked != 0) / (1 - rate)  # d masked / d raw: the mask, scaled

    assert loss == pytest.approx(expected_loss, rel=1e-6)
    looser = 10 if layer_norm else 1  # as in the test of the fast path against Keras' LSTM above
    for grad, want in zip(grads, expected, strict=True):
        np.testing.assert_allclose(grad, want, rtol=1e-4, atol=1e-7 * looser)
    assert all(np.abs(grads[i]).sum() > 0 for i in at)


def test_weight_drop_draws_a_mask_per_update_and_layer_from_the_seed_and_is_off_at_zero() -> None:
    model = build_model(ModelConfig(vocab_size=11, embedding_dim=8, units=8, layers=2), batch_size=2)
    kernels = [layer.cell.recurrent_kernel for layer in lstm_layers(model)]
    first = _dropped_kernels(model, 0.5, tf.constant([1, 2], tf.int64))
    again = _dropped_kernels(model, 0.5, tf.constant([1, 2], tf.int64))
    later = _dropped_kernels(model, 0.5, tf.constant([1, 3], tf.int64))
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a, b)  # a function of the seed: a resumed run draws what it would have
    assert not np.array_equal(first[0] != 0, first[1] != 0)  # each layer its own mask
    assert not np.array_equal(first[0] != 0, later[0] != 0)  # each update its own
    assert all(layer.cell.recurrent_kernel is k for layer, k in zip(lstm_layers(model), kernels, strict=True))
    with recurrent_kernels_dropped(model, 0.0, tf.constant([1, 2], tf.int64)):  # off (the default): nothing swapped
        assert all(layer.cell.recurrent_kernel is k for layer, k in zip(lstm_layers(model), kernels, strict=True))


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "keras"])
def test_locked_output_dropout_drops_the_same_units_of_a_stream_at_every_timestep(fast: bool) -> None:
    """With an identity output layer the logits are the last LSTM's outputs, so the mask shows."""
    keras.utils.set_random_seed(6)
    rate, units, streams = 0.25, 16, 64
    cfg = ModelConfig(vocab_size=units, embedding_dim=8, units=units, dropout=0.0, locked_output_dropout=rate)
    model = build_model(cfg, batch_size=streams)
    model.get_layer("logits").set_weights([np.eye(units, dtype="float32"), np.zeros(units, "float32")])
    x = tf.constant(np.arange(streams * 20).reshape(streams, 20) % units, tf.int32)
    reset_states(model)
    outputs = model(x, training=False).numpy()
    reset_states(model)
    np.testing.assert_allclose(stateful_logits(model, x, training=False).numpy(), outputs, rtol=1e-5, atol=1e-6)
    reset_states(model)
    seed = tf.constant([3, 4], tf.int64)
    dropped = (stateful_logits(model, x, training=True, seed=seed) if fast else model(x, training=True)).numpy()
    kept = dropped != 0
    assert (kept == kept[:, :1]).all()  # one mask per stream, shared by the timesteps
    assert len({row.tobytes() for row in kept[:, 0]}) > streams // 2  # each stream its own
    assert 1 - kept[:, 0].mean() == pytest.approx(rate, abs=0.05)  # 1,024 draws: 3.7 standard deviations
    np.testing.assert_allclose(dropped[kept], outputs[kept] / (1 - rate), rtol=1e-5, atol=1e-6)


def test_a_locked_output_rate_is_apart_from_the_inputs_dropout() -> None:
    default = build_model(ModelConfig(vocab_size=11, dropout=0.3), batch_size=2).get_layer("output_dropout")
    assert (default.rate, default.noise_shape) == (0.3, None)  # per element at --dropout, as before
    model = build_model(ModelConfig(vocab_size=11, dropout=0.3, locked_output_dropout=0.1), batch_size=2)
    assert model.get_layer("lstm_0").dropout == 0.3
    assert model.get_layer("output_dropout").rate == 0.1 and model.get_layer("output_dropout").noise_shape == (
        None,
        1,
        None,
    )


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "keras"])
def test_the_regularizers_act_only_in_the_train_step(fast: bool) -> None:
    """A compiled train step with weight-drop and a locked output mask leaves the cells reading their variables, and
    evaluation reads the model as inference does, with no mask."""
    import dataclasses

    from textgen.config import DataConfig, RunConfig, TrainConfig
    from textgen.device import CPU
    from textgen.scoring import masked_cross_entropy
    from textgen.training.step import build_trainer

    model_cfg = ModelConfig(
        vocab_size=11, embedding_dim=8, units=8, layers=2, weight_drop=0.5, locked_output_dropout=0.3
    )
    cfg = RunConfig(
        DataConfig(corpus="", batch_size=2, seq_len=6),
        model_cfg,
        TrainConfig(),
        dataclasses.replace(CPU, fast_lstm=fast),
    )
    trainer = build_trainer(cfg)
    model = trainer.model
    x = tf.constant(np.arange(12).reshape(2, 6) % 11, tf.int32)
    before = [layer.cell.recurrent_kernel.numpy() for layer in lstm_layers(model)]
    for _ in range(2):
        assert np.isfinite(float(trainer.train_step(x, x)))
    for layer, kernel in zip(lstm_layers(model), before, strict=True):
        assert not np.allclose(layer.cell.recurrent_kernel.numpy(), kernel)  # their gradients came through the masks
    assert all(any(layer.cell.recurrent_kernel is v for v in model.trainable_variables) for layer in lstm_layers(model))
    reset_states(model)
    evaluated = float(trainer.eval_step(x, x))
    reset_states(model)
    assert evaluated == pytest.approx(float(masked_cross_entropy(x, model(x, training=False))), rel=1e-6)
