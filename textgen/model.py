"""The Keras training model: Embedding -> N x stateful LSTM -> Dense logits.

``ModelConfig.dropout`` drops the non-recurrent connections (Zaremba et al., 2014): each
LSTM's input (a mask shared over time, Keras' ``dropout``) and the last LSTM's output.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textgen.config import ModelConfig

if TYPE_CHECKING:
    import keras


def build_model(cfg: ModelConfig, batch_size: int, precision: str = "float32", stateful: bool = True) -> keras.Model:
    """The training model for a fixed ``batch_size`` (stateful layers need one).

    Every LSTM keeps the arguments that make it eligible for the cuDNN kernel on a GPU
    (tanh, sigmoid, no recurrent dropout, no unroll, bias). Logits are float32 even
    under a mixed-precision ``precision``.
    """
    import keras

    ids = keras.Input(batch_shape=(batch_size, None), dtype="int32", name="ids")
    # N(0, 1) embeddings, as in PyTorch: Keras' default uniform(+-0.05) feeds the first LSTM an input
    # ~20x weaker, and Adam needs about an epoch of steps to grow it (War and Peace, 1x512: validation
    # 1.84 nats/char after epoch 1 against 1.42; benchmarks/quality.py, see README's Quality).
    embedding_init = keras.initializers.RandomNormal(stddev=1.0)
    x = keras.layers.Embedding(
        cfg.vocab_size, cfg.embedding_dim, embeddings_initializer=embedding_init, dtype=precision, name="embedding"
    )(ids)
    for i in range(cfg.layers):
        x = keras.layers.LSTM(
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
        )(x)
    x = keras.layers.Dropout(cfg.dropout, name="output_dropout")(x)
    logits = keras.layers.Dense(cfg.vocab_size, dtype="float32", name="logits")(x)
    return keras.Model(ids, logits, name="textgen")


def reset_states(model: keras.Model) -> None:
    """Zero the running state of every stateful layer (keras.Model has no reset_state)."""
    for layer in model.layers:
        if getattr(layer, "stateful", False):
            layer.reset_state()
