"""Settings and configs agree: every setting a user gives maps to one config field (checked by that field's rule as it
is made), and every config field has a flag or a reason on the allowlist below. A new training setting is a config
field, a settings field and a flag; these tests fail when one of the three is missing."""

from __future__ import annotations

import dataclasses

import pytest
import typer

from textgen import cli
from textgen.config import DataConfig, DistillConfig, ModelConfig, PruneConfig, TrainConfig, flag
from textgen.errors import ConfigError
from textgen.settings import (
    DataSettings,
    DistillSettings,
    ModelSettings,
    PruneSettings,
    Settings,
    TrainRequest,
    TrainSettings,
)

PAIRS: list[tuple[type[Settings], type, str]] = [
    (DataSettings, DataConfig, "train"),
    (ModelSettings, ModelConfig, "train"),
    (TrainSettings, TrainConfig, "train"),
    (DistillSettings, DistillConfig, "distill"),
    (PruneSettings, PruneConfig, "prune"),
]

# Settings with no config field of their own name, and why.
SETTINGS_WITHOUT_FIELD = {
    "more_time": "--time-budget +30m: planning turns it into the run's time_budget",
}

# Config fields no flag sets, and why.
FIELDS_WITHOUT_FLAG = {
    "corpus": "the corpus argument",
    "files": "the corpus's files, found from the argument",
    "corpus_size": "the corpus's fingerprint, measured",
    "corpus_hash": "the corpus's fingerprint, measured",
    "base_vocab": "a fine-tuned run's, from its base run",
    "strip_boilerplate": "set by --keep-boilerplate, its opposite",
    "val_fraction": "the split is fixed (5%): every run of a corpus is scored on the same text",
    "test_fraction": "the split is fixed (5%)",
    "vocab_size": "the corpus's characters",
    "patience": "early stopping's patience: tuned once, a library setting",
    "lr_patience": "the plateau schedule's patience: a library setting",
    "lr_factor": "the plateau schedule's cut: a library setting",
    "teacher_val_loss": "the teacher's best loss, measured when the student starts",
}


def options(command: str) -> set[str]:
    """Every option name of a ``textgen`` command."""
    group = typer.main.get_command(cli.app)
    ctx = typer.Context(group)
    found = group.get_command(ctx, command)  # type: ignore[attr-defined]
    return {name for param in found.params for name in (*param.opts, *param.secondary_opts)}


def flag_of(config: type, name: str) -> str:
    """The flag that sets a config field: its rule's own, or the one named after it."""
    rule = config.RULES.get(name)  # type: ignore[attr-defined]
    return (rule.flag if rule else None) or flag(name)


@pytest.mark.parametrize(("settings", "config", "command"), PAIRS, ids=lambda p: getattr(p, "__name__", p))
def test_every_setting_is_a_config_field(settings: type[Settings], config: type, command: str) -> None:
    fields = {f.name for f in dataclasses.fields(config)}
    orphans = [f.name for f in dataclasses.fields(settings) if f.name not in fields]
    assert set(orphans) <= set(SETTINGS_WITHOUT_FIELD), orphans


@pytest.mark.parametrize(("settings", "config", "command"), PAIRS, ids=lambda p: getattr(p, "__name__", p))
def test_every_config_field_is_a_setting_with_a_flag_or_says_why_not(
    settings: type[Settings], config: type, command: str
) -> None:
    given = {f.name for f in dataclasses.fields(settings)}
    flags = options(command)
    missing = [
        f.name
        for f in dataclasses.fields(config)
        if f.name not in FIELDS_WITHOUT_FLAG
        and f.name not in ("teacher", "source")  # the run a student or a pruned copy is made from: --teacher, --source
        and (f.name not in given or flag_of(config, f.name) not in flags)
    ]
    assert not missing, f"{config.__name__} fields with no setting or no flag of textgen {command}: {missing}"


def test_the_allowlists_name_only_fields_that_exist() -> None:
    fields = {f.name for _, config, _ in PAIRS for f in dataclasses.fields(config)}
    settings = {f.name for s, _, _ in PAIRS for f in dataclasses.fields(s)}
    assert set(FIELDS_WITHOUT_FLAG) <= fields
    assert set(SETTINGS_WITHOUT_FIELD) <= settings


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: ModelSettings(units=0), "--units must be a positive integer"),
        (lambda: DataSettings(seq_len=-1), "--seq-len must be a positive integer"),
        (lambda: ModelSettings(weight_drop=1.0), "--weight-drop must be in [0, 1)"),
        (lambda: TrainSettings(anneal=0.0), "--anneal must be in (0, 1]"),
        (lambda: DistillSettings("t", temperature=0.0), "--temperature must be between 0.1 and 100"),
        (lambda: PruneSettings("s", ramp=1.0), "--ramp must be in (0, 0.99]"),
        (lambda: TrainRequest(threads=0), "--threads must be between 1 and 1024"),
        (lambda: TrainRequest(training=TrainSettings(more_time=60.0)), "adds time to a run you resume"),
        (lambda: TrainRequest(resume=True, from_study="s"), "drop them to --resume"),
    ],
)
def test_settings_are_checked_as_they_are_made_by_their_configs_rules(make, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        make()


def test_a_setting_left_out_is_not_checked_and_a_config_field_must_hold_a_value() -> None:
    assert ModelSettings().given() == {}
    with pytest.raises(ConfigError, match="--units must be a positive integer"):
        ModelConfig(vocab_size=10, units=None)  # type: ignore[arg-type]
    assert ModelConfig(vocab_size=10, locked_output_dropout=None).locked_output_dropout is None  # None: off


def test_a_request_is_frozen_and_takes_one_corpus_name_or_many() -> None:
    request = TrainRequest("book.txt")
    assert request.corpus == ("book.txt",)
    assert TrainRequest(["a.txt", "b.txt"]).corpus == ("a.txt", "b.txt")
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.resume = True  # type: ignore[misc]
