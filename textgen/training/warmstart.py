"""A fine-tuned run's first weights: its base run's, with the rows of the characters only the new text has.

The base's characters keep their ids (``Vocabulary.extending``), so their embedding rows, the LSTM layers and their
output columns are copied as they are: before any update, the new model's logits for them are the base's. A new
character gets a fresh embedding row and an output column that starts silent (zero weights, and a bias below
anything the base's columns can reach): it takes almost no probability until the new text teaches it.
"""

from __future__ import annotations

import keras
import numpy as np

from textgen.checkpoint import Run
from textgen.config import Freeze, RunConfig
from textgen.model import build_model, lstm_layers

# How far (in nats) a new character's logit starts below the smallest logit any base character can have, whatever
# the state: its probability starts under e^-10 (4.5e-5) of the likeliest base character's.
NEW_CHAR_MARGIN = 10.0


def start_from_base(model: keras.Model, run: Run, cfg: RunConfig) -> None:
    """Set ``model``'s weights to the base run's that ``run`` keeps, extended to its vocabulary."""
    assert cfg.init_from is not None
    base = build_model(cfg.init_from.model, batch_size=1, stateful=False)
    run.load_init_weights(base)
    for layer in lstm_layers(model):
        layer.cell.set_weights(base.get_layer(layer.name).cell.get_weights())
    (base_rows,) = base.get_layer("embedding").get_weights()
    embedding = model.get_layer("embedding")
    (rows,) = embedding.get_weights()  # new characters keep their freshly initialized rows
    rows[: len(base_rows)] = base_rows
    embedding.set_weights([rows])
    kernel, bias = base.get_layer("logits").get_weights()
    model.get_layer("logits").set_weights(extended_output(kernel, bias, len(rows)))


def extended_output(kernel: np.ndarray, bias: np.ndarray, vocab_size: int) -> list[np.ndarray]:
    """The output layer's (units, V) kernel and (V,) bias widened to ``vocab_size`` columns: the base's as they
    are, then silent ones. A hidden state's entries lie in (-1, 1), so a base column's logit is at least its bias
    less its kernel's absolute sum: the new bias starts ``NEW_CHAR_MARGIN`` below the largest such floor."""
    added = vocab_size - kernel.shape[1]
    floor = float(np.max(bias - np.abs(kernel).sum(axis=0))) - NEW_CHAR_MARGIN
    new_kernel = np.concatenate([kernel, np.zeros([kernel.shape[0], added], kernel.dtype)], axis=1)
    return [new_kernel, np.concatenate([bias, np.full(added, floor, bias.dtype)])]


def freeze(model: keras.Model, what: Freeze) -> None:
    """Keep ``what`` of ``model`` as it starts (``--freeze``): set before the optimizer is built, so it holds no
    moments for the frozen weights and the train step takes no gradient for them."""
    if what is Freeze.none:
        return
    model.get_layer("embedding").trainable = False
    if what is Freeze.lstm:
        for layer in lstm_layers(model):
            layer.trainable = False
