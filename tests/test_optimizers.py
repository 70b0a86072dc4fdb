"""--optimizer adam|adamw|rmsprop|sgd, --weight-decay and --momentum: defaults, training on the fast CPU
path, the state restored on resume, and decay that leaves the biases alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import TINY_DATA, TINY_MODEL, assert_one_line_error, invoke, plan_run, read_history, write_corpus

from textgen.checkpoint import Run
from textgen.config import OPTIMIZERS, TrainConfig
from textgen.device import CPU, apply_profile
from textgen.errors import ConfigError
from textgen.settings import DataSettings, ModelSettings, TrainSettings

LEARNING_RATES = {"adam": 1e-2, "adamw": 1e-2, "rmsprop": 5e-3, "sgd": 0.5}  # what a tiny model learns fast with


def test_each_optimizer_gets_its_own_defaults() -> None:
    assert TrainConfig.of().optimizer == "adam" and TrainConfig.of().weight_decay == 0.0
    assert TrainConfig.of(optimizer="adamw").weight_decay == 0.01
    sgd = TrainConfig.of(optimizer="sgd")
    assert (sgd.lr, sgd.momentum) == (0.1, 0.9)
    given = TrainConfig.of(optimizer="sgd", lr=0.3, momentum=0.0, weight_decay=None)
    assert (given.lr, given.momentum, given.weight_decay) == (0.3, 0.0, 0.0)  # what is given wins


@pytest.mark.parametrize(
    ("settings", "fragment"),
    [
        ({"optimizer": "lamb"}, "--optimizer must be adam or adamw or rmsprop or sgd"),
        ({"optimizer": "adam", "momentum": 0.9}, "--momentum is SGD's"),
        ({"weight_decay": -0.1}, "--weight-decay must be in [0, 1)"),
        ({"optimizer": "sgd", "momentum": 1.0}, "--momentum must be in [0, 1)"),
    ],
)
def test_bad_optimizer_settings_are_refused(settings: dict, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        TrainConfig.of(**settings)
    assert fragment in str(info.value)


def test_the_cli_refuses_momentum_without_sgd(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "t.txt", 200)
    result = invoke("train", str(corpus), "--momentum", "0.5", "--checkpoint-dir", str(tmp_path / "ck"))
    assert_one_line_error(result, "--momentum is SGD's", "--optimizer sgd")


def test_a_resumed_sgd_run_may_restate_its_momentum(tmp_path: Path) -> None:
    """Resume flags are checked against the run's own optimizer, not the default one."""
    corpus = write_corpus(tmp_path / "t.txt", 400)
    common = ["--checkpoint-dir", str(tmp_path / "ck"), "--run", "sgd"]
    recipe = ["--units", "16", "--batch-size", "4", "--seq-len", "16", "--optimizer", "sgd", "--lr", "0.1"]
    first = invoke("train", str(corpus), *common, *recipe, "--epochs", "1", "--json")
    assert first.exit_code == 0, first.stderr
    again = invoke("train", "--resume", *common, "--momentum", "0.9", "--epochs", "2", "--json")
    assert again.exit_code == 0, again.stderr
    assert_one_line_error(invoke("train", "--resume", *common, "--momentum", "0.5", "--epochs", "3"), "momentum", "0.9")


def _plan(base: Path, name: str, resume: bool = False, **training):

    apply_profile(CPU)
    corpus = None if resume else str(write_corpus(base / "tiny.txt", 3000))
    return plan_run(
        corpus,
        CPU,
        checkpoint_dir=base / "checkpoints",
        run_name=name,
        resume=resume,
        data=DataSettings(**{} if resume else TINY_DATA),
        model=ModelSettings(**{} if resume else TINY_MODEL),
        training=TrainSettings(**training),
    )


# ~11-14 s each: adam (the default) and sgd (momentum) by default, the others with -m slow (the suite ~10 min).
@pytest.mark.parametrize(
    "optimizer", [o if o in ("adam", "sgd") else pytest.param(o, marks=pytest.mark.slow) for o in OPTIMIZERS]
)
def test_each_optimizer_trains_on_the_fast_path_and_resumes_with_its_state(tmp_path: Path, optimizer: str) -> None:
    """Two epochs in one go and one epoch plus a resumed one end on the same weights only if the resumed run
    got the optimizer's moments, momentum and step count back."""
    from textgen.training.loop import train

    assert CPU.fast_lstm
    settings = {"optimizer": optimizer, "lr": LEARNING_RATES[optimizer], "lr_schedule": "plateau"}
    straight = Run(train(_plan(tmp_path / "straight", "r", epochs=2, **settings)).path)
    config = straight.load_config().training
    assert (config.optimizer, config.lr) == (optimizer, LEARNING_RATES[optimizer])
    assert config.weight_decay == (0.01 if optimizer == "adamw" else 0.0)
    assert config.momentum == (0.9 if optimizer == "sgd" else 0.0)
    history = read_history(straight.path)
    assert history[1]["val_loss"] < 0.9 * history[0]["val_loss"]

    train(_plan(tmp_path / "split", "r", epochs=1, **settings))
    resumed = Run(train(_plan(tmp_path / "split", "r", resume=True, epochs=2)).path)
    again = resumed.load_config().training
    assert (again.optimizer, again.lr, again.weight_decay, again.momentum) == (
        config.optimizer,
        config.lr,
        config.weight_decay,
        config.momentum,
    )
    saved = [run.path / run.load_state().optimizer for run in (straight, resumed)]
    with np.load(saved[0]) as x, np.load(saved[1]) as y:
        assert x.files == y.files
        for key in x.files:
            np.testing.assert_allclose(x[key], y[key], rtol=1e-5, atol=1e-6)
    import keras

    from textgen.model import build_model

    models = []
    for run in (straight, resumed):
        model = build_model(run.load_config().model, TINY_DATA["batch_size"])
        run.load_weights(model, "last")
        models.append(model)
    for x, y in zip(models[0].get_weights(), models[1].get_weights(), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
    keras.backend.clear_session()


def test_weight_decay_shrinks_the_kernels_and_not_the_biases() -> None:
    import keras
    import tensorflow as tf

    from textgen.training.step import make_optimizer

    kernel = keras.Variable(np.ones((3, 4), np.float32), name="kernel")
    bias = keras.Variable(np.ones(4, np.float32), name="bias")
    optimizer = make_optimizer(TrainConfig.of(optimizer="sgd", lr=0.1, momentum=0.0, weight_decay=0.5))
    optimizer.build([kernel, bias])
    optimizer.apply([tf.zeros_like(kernel), tf.zeros_like(bias)], [kernel, bias])  # no gradient: only the decay
    np.testing.assert_allclose(kernel.numpy(), 1 - 0.1 * 0.5)
    np.testing.assert_array_equal(bias.numpy(), 1.0)
