"""textgen.device profiles, and the model each profile builds (the GPU one checked on the CPU)."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import textgen.device
from textgen.config import ModelConfig
from textgen.device import CPU, GPU, resolve_profile
from textgen.errors import ConfigError, DeviceError
from textgen.model import build_model, reset_states

CFG = ModelConfig(vocab_size=20, embedding_dim=8, units=16, layers=2, dropout=0.1)


def test_gpu_is_refused_without_a_gpu() -> None:
    assert not textgen.device.gpus_visible(), "this test expects a machine without a GPU"
    with pytest.raises(DeviceError) as info:
        resolve_profile("gpu")
    message = str(info.value)
    assert "no GPU" in message
    assert "--device cpu" in message
    assert ".[gpu]" in message


def test_auto_picks_cpu_without_a_gpu() -> None:
    assert resolve_profile("auto") is CPU
    assert resolve_profile("cpu") is CPU


def test_auto_picks_gpu_when_one_is_visible(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(textgen.device, "gpus_visible", lambda: True)
    assert resolve_profile("auto") is GPU
    assert resolve_profile("gpu") is GPU


@pytest.mark.parametrize("name", ["tpu", "GPU", "", "cuda"])
def test_unknown_device_name(name: str) -> None:
    with pytest.raises(ConfigError, match="--device must be one of auto, cpu, gpu"):
        resolve_profile(name)


def test_profiles() -> None:
    assert CPU.precision == "float32"
    assert GPU.precision == "mixed_float16"
    assert not GPU.jit_compile  # the cuDNN LSTM kernel cannot be XLA-compiled


def lstm_layers(model: keras.Model) -> list[keras.layers.LSTM]:
    return [layer for layer in model.layers if isinstance(layer, keras.layers.LSTM)]


def test_gpu_profile_model_is_mixed_precision_and_cudnn_eligible() -> None:
    model = build_model(CFG, 4, precision=GPU.precision)
    lstms = lstm_layers(model)
    assert len(lstms) == CFG.layers
    for layer in lstms:
        config = layer.get_config()
        assert layer.dtype_policy.name == "mixed_float16"
        assert layer.compute_dtype == "float16"
        assert layer.variable_dtype == "float32"
        # the arguments that keep an LSTM on the cuDNN kernel
        assert config["activation"] == "tanh"
        assert config["recurrent_activation"] == "sigmoid"
        assert config["recurrent_dropout"] == 0
        assert config["unroll"] is False
        assert config["use_bias"] is True
        assert config["stateful"] is True
        assert config["dropout"] == CFG.dropout
    embedding = model.get_layer("embedding")
    assert embedding.compute_dtype == "float16"
    assert model.get_layer("logits").compute_dtype == "float32"
    assert model.output.dtype == "float32"
    logits = model(np.zeros((4, 5), dtype=np.int32))
    assert logits.dtype == "float32"
    assert tuple(logits.shape) == (4, 5, CFG.vocab_size)


def test_cpu_profile_model_is_float32() -> None:
    model = build_model(CFG, 2, precision=CPU.precision)
    for layer in [*lstm_layers(model), model.get_layer("embedding"), model.get_layer("logits")]:
        assert layer.compute_dtype == "float32"
        assert layer.dtype_policy.name == "float32"
    assert model.output.dtype == "float32"


def test_stateful_model_carries_state_until_reset() -> None:
    model = build_model(ModelConfig(vocab_size=10, embedding_dim=4, units=8), 2)
    x = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.int32)
    first = np.asarray(model(x))
    second = np.asarray(model(x))
    assert not np.allclose(first, second)  # the second call starts from the first call's state
    reset_states(model)
    np.testing.assert_allclose(np.asarray(model(x)), first, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("layer_norm", [False, True], ids=["plain", "layer-norm"])
def test_gpu_profile_trains_through_keras_lstm_with_loss_scaling(layer_norm: bool) -> None:
    """The CPU's fast LSTM path must not leak into the GPU profile: Keras' (cuDNN) LSTM, or the layer-normalized
    cell in Keras' RNN loop, with dropout (0.1, the default), in float16 with loss scaling."""
    import tensorflow as tf

    from textgen.config import DataConfig, RunConfig, TrainConfig
    from textgen.training.step import build_trainer

    assert not GPU.fast_lstm and CPU.fast_lstm
    cfg = RunConfig(
        DataConfig(corpus="", batch_size=4, seq_len=8),
        ModelConfig(vocab_size=12, embedding_dim=8, units=16, layer_norm=layer_norm),
        TrainConfig(),
        GPU,
    )
    trainer = build_trainer(cfg)
    assert isinstance(trainer.optimizer, keras.optimizers.LossScaleOptimizer)
    x = tf.constant(np.arange(32).reshape(4, 8) % 12, tf.int32)
    first = float(trainer.train_step(x, x))
    for _ in range(20):
        last = float(trainer.train_step(x, x))
    assert np.isfinite(first) and last < first
