"""textgen.config: durations, value checks naming the flag, and the JSON round trip."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from textgen.config import DataConfig, ModelConfig, RunConfig, TrainConfig, flag, flag_setting, replace
from textgen.device import CPU, GPU
from textgen.durations import parse_duration
from textgen.errors import ConfigError
from textgen.typedjson import from_dict, to_dict


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90.0),
        ("90s", 90.0),
        ("0.5", 0.5),
        ("30m", 1800.0),
        ("1h", 3600.0),
        ("1h30m", 5400.0),
        ("1h30m15s", 5415.0),
        ("2.5h", 9000.0),
        ("1.5m", 90.0),
        (" 20S ", 20.0),
        ("0h5m", 300.0),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "text", ["abc", "0", "0s", "0h0m", "-5m", "", "   ", "5x", "m", "h", "1.h", "5ms", "30m1h", "1d"]
)
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ConfigError, match="--time-budget") as info:
        parse_duration(text)
    assert repr(text) in str(info.value)


@pytest.mark.parametrize(
    ("cls", "values", "flag_name"),
    [
        (ModelConfig, {"units": 0}, "--units"),
        (ModelConfig, {"units": -3}, "--units"),
        (ModelConfig, {"units": 2.5}, "--units"),
        (ModelConfig, {"units": True}, "--units"),
        (ModelConfig, {"layers": 0}, "--layers"),
        (ModelConfig, {"embedding_dim": 0}, "--embedding-dim"),
        (ModelConfig, {"dropout": 1.5}, "--dropout"),
        (ModelConfig, {"dropout": 1.0}, "--dropout"),
        (ModelConfig, {"dropout": -0.1}, "--dropout"),
        (ModelConfig, {"layer_norm": "yes"}, "--layer-norm"),
        (ModelConfig, {"weight_drop": 1.0}, "--weight-drop"),
        (ModelConfig, {"weight_drop": -0.1}, "--weight-drop"),
        (ModelConfig, {"locked_output_dropout": 1.0}, "--locked-output-dropout"),
        (ModelConfig, {"locked_output_dropout": float("nan")}, "--locked-output-dropout"),
        (ModelConfig, {"layer_norm": 1}, "--layer-norm"),
        (TrainConfig, {"epochs": -1}, "--epochs"),
        (TrainConfig, {"epochs": 0}, "--epochs"),
        (TrainConfig, {"epochs": 2.5}, "--epochs"),
        (TrainConfig, {"lr": 0.0}, "--lr"),
        (TrainConfig, {"lr": -1e-3}, "--lr"),
        (TrainConfig, {"clip_norm": 0.0}, "--clip-norm"),
        (TrainConfig, {"seed": -1}, "--seed"),
        (TrainConfig, {"time_budget": 0.0}, "--time-budget"),
        (TrainConfig, {"time_budget": -5.0}, "--time-budget"),
        (TrainConfig, {"patience": 0}, "--patience"),
        (TrainConfig, {"lr_patience": 0}, "--lr-patience"),
        (TrainConfig, {"lr_factor": 1.0}, "--lr-factor"),
        (TrainConfig, {"lr_factor": 0.0}, "--lr-factor"),
        (TrainConfig, {"anneal": 0.0}, "--anneal"),
        (TrainConfig, {"anneal": 1.5}, "--anneal"),
        (TrainConfig, {"anneal": float("nan")}, "--anneal"),
        (DataConfig, {"batch_size": 0}, "--batch-size"),
        (DataConfig, {"seq_len": -1}, "--seq-len"),
        (DataConfig, {"shift_windows": 1}, "--shift-windows"),
        (DataConfig, {"val_fraction": 0.0}, "--val-fraction"),
        (DataConfig, {"test_fraction": 0.6}, "--test-fraction"),
    ],
)
def test_invalid_values_name_the_flag(cls: type, values: dict[str, Any], flag_name: str) -> None:
    required = {ModelConfig: {"vocab_size": 10}, DataConfig: {"corpus": "c.txt"}, TrainConfig: {}}[cls]
    with pytest.raises(ConfigError) as info:
        cls(**{**required, **values})
    message = str(info.value)
    assert message.startswith(flag_name + " must be")
    assert repr(next(iter(values.values()))) in message


def test_valid_values_are_accepted() -> None:
    ModelConfig(vocab_size=2, embedding_dim=1, units=1, layers=3, dropout=0.0)
    ModelConfig(vocab_size=2, dropout=0.99)
    TrainConfig(epochs=1, lr=1e-9, seed=0, time_budget=0.5, lr_factor=0.99, anneal=1.0)
    DataConfig(corpus="c.txt", batch_size=1, seq_len=1, val_fraction=0.49, test_fraction=0.01)


def test_flag_names() -> None:
    assert flag("seq_len") == "--seq-len"
    assert flag("units") == "--units"
    assert flag("time_budget") == "--time-budget"
    assert flag_setting("units", 512) == "--units 512"
    assert flag_setting("layer_norm", True) == "--layer-norm"
    assert flag_setting("layer_norm", False) == "--no-layer-norm"


def test_a_run_saved_before_layer_norm_existed_reads_as_plain() -> None:
    saved = to_dict(ModelConfig(vocab_size=9))
    del saved["layer_norm"]
    assert from_dict(ModelConfig, saved).layer_norm is False


def test_a_run_saved_before_weight_drop_and_the_locked_output_reads_without_them() -> None:
    saved = run_config().to_dict()
    del saved["model"]["weight_drop"], saved["model"]["locked_output_dropout"]
    model = RunConfig.from_dict(saved).model
    assert (model.weight_drop, model.locked_output_dropout) == (0.0, None)  # per element at --dropout, as then


def test_the_recurrent_regularizers_round_trip_through_json() -> None:
    cfg = run_config()
    for weight_drop, locked in ((0.25, 0.2), (0.5, 0.0)):  # a locked rate of 0: no output dropout, not the default
        regularized = dataclasses.replace(
            cfg, model=dataclasses.replace(cfg.model, weight_drop=weight_drop, locked_output_dropout=locked)
        )
        data = json.loads(json.dumps(regularized.to_dict()))
        assert (data["model"]["weight_drop"], data["model"]["locked_output_dropout"]) == (weight_drop, locked)
        assert RunConfig.from_dict(data) == regularized


def test_a_run_saved_before_shift_windows_existed_keeps_its_windows_fixed() -> None:
    """New runs shift their windows each epoch; one saved without the setting trained (and resumes) without."""
    saved = run_config().to_dict()
    assert saved["data"]["shift_windows"] is True
    assert RunConfig.from_dict(saved).data.shift_windows is True
    del saved["data"]["shift_windows"]
    assert RunConfig.from_dict(saved).data.shift_windows is False


def run_config() -> RunConfig:
    return RunConfig(
        data=DataConfig(corpus="/books/2600-0.txt", strip_boilerplate=False, batch_size=8, seq_len=32),
        model=ModelConfig(vocab_size=83, embedding_dim=16, units=64, layers=2, dropout=0.25, layer_norm=True),
        training=TrainConfig(epochs=7, lr=1e-3, seed=3, time_budget=5400.0, patience=2),
        profile=GPU,
    )


def test_run_config_round_trip_through_json() -> None:
    cfg = run_config()
    data = json.loads(json.dumps(cfg.to_dict()))
    assert RunConfig.from_dict(data) == cfg
    assert data["model"]["units"] == 64 and data["model"]["layer_norm"] is True
    assert data["training"]["time_budget"] == 5400.0
    assert data["profile"]["precision"] == "mixed_float16"


def test_run_config_round_trip_without_time_budget() -> None:
    cfg = RunConfig(DataConfig(corpus="c.txt"), ModelConfig(vocab_size=5), TrainConfig(), CPU)
    again = RunConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert again == cfg
    assert again.training.time_budget is None


def test_section_round_trip() -> None:
    model = ModelConfig(vocab_size=9, units=16)
    assert from_dict(ModelConfig, to_dict(model)) == model


@pytest.mark.parametrize("section", ["data", "model", "training", "profile"])
def test_from_dict_rejects_unknown_keys(section: str) -> None:
    data = run_config().to_dict()
    data[section]["mystery_knob"] = 1
    with pytest.raises(ConfigError, match="mystery_knob"):
        RunConfig.from_dict(data)


def test_from_dict_rejects_missing_sections() -> None:
    data = run_config().to_dict()
    del data["training"]
    with pytest.raises(ConfigError, match="training"):
        RunConfig.from_dict(data)


def test_from_dict_checks_values() -> None:
    data = run_config().to_dict()
    data["model"]["units"] = 0
    with pytest.raises(ConfigError, match="--units"):
        RunConfig.from_dict(data)


def test_replace_ignores_none() -> None:
    cfg = TrainConfig(epochs=5, time_budget=60.0)
    assert replace(cfg, epochs=None, time_budget=None) == cfg
    assert replace(cfg, epochs=9).epochs == 9
    with pytest.raises(ConfigError, match="--epochs"):
        replace(cfg, epochs=0)


def test_a_time_budget_is_a_total_or_with_a_plus_that_much_more() -> None:
    from textgen.durations import parse_budget, parse_duration

    assert parse_budget("30m") == (1800.0, None)
    assert parse_budget(" +1h30m ") == (None, 5400.0)
    assert parse_budget(None) == (None, None)
    with pytest.raises(
        ConfigError,
        match=r"--time-budget must be a duration like 90s, 30m or 1h30m \(got '\+\+1m'\)",
    ):
        parse_budget("++1m")
    assert parse_duration("0", "--sample-every", zero=True) == 0.0
    with pytest.raises(ConfigError, match="--save-every must be positive"):
        parse_duration("0s", "--save-every")
