"""The training model's structure and initialisation."""

import numpy as np

from textgen.config import ModelConfig
from textgen.model import build_model


def test_embeddings_start_with_unit_variance() -> None:
    # Keras' default uniform(+-0.05) starved the first LSTM of input for about an epoch.
    model = build_model(ModelConfig(vocab_size=100, embedding_dim=64, units=8), batch_size=2)
    table = model.get_layer("embedding").embeddings.numpy()
    assert abs(float(np.std(table)) - 1.0) < 0.05
    assert abs(float(np.mean(table))) < 0.05
