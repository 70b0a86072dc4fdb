"""The Keras training model: Embedding -> N x stateful LSTM -> Dense logits.

``ModelConfig.dropout`` drops the non-recurrent connections (Zaremba et al., 2014): each
LSTM's input (a mask shared over time, Keras' ``dropout``) and the last LSTM's output, whose
mask is drawn per element, or per stream and shared over time at ``locked_output_dropout``'s rate.
``ModelConfig.layer_norm`` layer-normalizes every LSTM (``LayerNormLSTMCell``). Weight-drop is
the training step's (``textgen.training.step``): it swaps the cells' recurrent kernels for a batch.
"""

from __future__ import annotations

from typing import Any

import keras

from textgen.config import ModelConfig
from textgen.lstm import layer_norm, lstm_cell

# The layer-normalized cell's own weights, after Keras' kernel, recurrent kernel and bias: a gain for each of
# the two projections (4U) and a gain and a shift for the cell (U). Their names keep them out of weight decay.
LAYER_NORM_WEIGHTS = ("input_gain", "recurrent_gain", "cell_gain", "cell_shift")


class LayerNormLSTMCell(keras.layers.LSTMCell):
    """Keras' LSTM cell with layer normalization (Ba, Kiros & Hinton, 2016, eq. 20-22): the input and the
    recurrent projections each normalized over their 4U pre-activations with a learned gain, and the cell
    normalized before the output's tanh with a gain and a shift,

        z = LN(x @ kernel) * input_gain + LN(h @ recurrent_kernel) * recurrent_gain + bias
        c = f * c + i * g;    h = o * tanh(LN(c) * cell_gain + cell_shift)

    The statistics are each row's own, so the cell is the same at any batch size and in any stream layout.
    Gains start at one and the shift at zero.
    """

    def build(self, input_shape: Any) -> None:
        super().build(input_shape)
        gates, units = (4 * self.units,), (self.units,)
        self.input_gain = self.add_weight(shape=gates, initializer="ones", name="input_gain")
        self.recurrent_gain = self.add_weight(shape=gates, initializer="ones", name="recurrent_gain")
        self.cell_gain = self.add_weight(shape=units, initializer="ones", name="cell_gain")
        self.cell_shift = self.add_weight(shape=units, initializer="zeros", name="cell_shift")

    def call(self, inputs: Any, states: Any, training: bool = False) -> tuple[Any, list[Any]]:
        h, c = states
        if training and 0.0 < self.dropout < 1.0:
            inputs = inputs * self.get_dropout_mask(inputs)
        z = (
            layer_norm(keras.ops.matmul(inputs, self.kernel), self.input_gain)
            + layer_norm(keras.ops.matmul(h, self.recurrent_kernel), self.recurrent_gain)
            + self.bias
        )
        h, c, _ = lstm_cell(z, c, (self.cell_gain, self.cell_shift))
        return h, [h, c]


def build_model(cfg: ModelConfig, batch_size: int, precision: str = "float32", stateful: bool = True) -> keras.Model:
    """The training model for a fixed ``batch_size`` (stateful layers need one).

    Every plain LSTM keeps the arguments that make it eligible for the cuDNN kernel on a GPU
    (tanh, sigmoid, no recurrent dropout, no unroll, bias); a layer-normalized one runs Keras'
    generic RNN loop there. Logits are float32 even under a mixed-precision ``precision``.
    """
    ids = keras.Input(batch_shape=(batch_size, None), dtype="int32", name="ids")
    # N(0, 1) embeddings, as in PyTorch: Keras' default uniform(+-0.05) feeds the first LSTM an input
    # ~20x weaker, and Adam needs about an epoch of steps to grow it (War and Peace, 1x512: validation
    # 1.84 nats/char after epoch 1 against 1.42; benchmarks/quality.py, see docs/quality.md).
    embedding_init = keras.initializers.RandomNormal(stddev=1.0)
    x = keras.layers.Embedding(
        cfg.vocab_size, cfg.embedding_dim, embeddings_initializer=embedding_init, dtype=precision, name="embedding"
    )(ids)
    for i in range(cfg.layers):
        if cfg.layer_norm:
            cell = LayerNormLSTMCell(cfg.units, dropout=cfg.dropout, dtype=precision, name="lstm_cell")
            layer = keras.layers.RNN(
                cell, return_sequences=True, stateful=stateful, unroll=False, dtype=precision, name=f"lstm_{i}"
            )
        else:
            layer = keras.layers.LSTM(
                cfg.units,
                return_sequences=True,
                stateful=stateful,
                dropout=cfg.dropout,
                activation="tanh",
                recurrent_activation="sigmoid",
                recurrent_dropout=0.0,
                unroll=False,
                use_bias=True,
                dtype=precision,
                name=f"lstm_{i}",
            )
        x = layer(x)
    # Locked: one mask per stream, shared by the batch's timesteps (in noise_shape, None takes the input's size).
    locked = cfg.locked_output_dropout
    rate, noise_shape = (cfg.dropout, None) if locked is None else (locked, (None, 1, None))
    x = keras.layers.Dropout(rate, noise_shape=noise_shape, name="output_dropout")(x)
    logits = keras.layers.Dense(cfg.vocab_size, dtype="float32", name="logits")(x)
    return keras.Model(ids, logits, name="textgen")


def lstm_layers(model: keras.Model) -> list[keras.layers.RNN]:
    """The model's LSTM layers, plain or layer-normalized, in order."""
    return [layer for layer in model.layers if isinstance(layer, keras.layers.RNN)]


def reset_states(model: keras.Model) -> None:
    """Zero the running state of every stateful layer (keras.Model has no reset_state)."""
    for layer in model.layers:
        if getattr(layer, "stateful", False):
            layer.reset_state()
