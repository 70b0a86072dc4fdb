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


def test_a_layer_normalized_model_runs_under_the_gpu_profiles_mixed_precision() -> None:
    """The gpu profile's mixed_float16 (checked on the CPU): float32 logits near the float32 model's."""
    from textgen.device import GPU
    from textgen.model import reset_states

    cfg = ModelConfig(vocab_size=11, embedding_dim=8, units=16, layers=2, layer_norm=True)
    mixed, full = build_model(cfg, 2, GPU.precision), build_model(cfg, 2)
    full.set_weights(mixed.get_weights())
    assert mixed.get_layer("lstm_0").compute_dtype == "float16"
    x = np.arange(20).reshape(2, 10) % 11
    reset_states(mixed)
    reset_states(full)
    logits = mixed(x).numpy()
    assert logits.dtype == np.float32
    np.testing.assert_allclose(logits, full(x).numpy(), atol=0.02)  # float16's 3 digits, seen 0.002
