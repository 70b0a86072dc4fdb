"""Files that check themselves (issue 42): every structured file textgen reads back, damaged the ways a crash, a
partial copy, a hand edit or an attacker would, is one line naming the file (or the variable) and the field.

One section per file: the shared JSON reader, a run's files (config.json, vocab.json, state.json), its weights and
optimizer state, recipes, a study's best.json and database, and $TF_CONFIG.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import shutil
import socket
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pytest
from helpers import TINY_DATA, TINY_MODEL, assert_one_line_error, invoke, run_textgen, write_corpus

from textgen.cluster import cluster_role
from textgen.config import DataConfig, ModelConfig, TrainConfig, flag
from textgen.errors import CheckpointError, ConfigError
from textgen.files import read_json_object
from textgen.recipe import RECIPE_FIELDS, read_recipe
from textgen.rundirs import study_path
from textgen.study import best_recipe, save_best_recipe, storage_of

# What a crash, a partial copy or an attacker leaves of a JSON file of ``text``.
DAMAGES: dict[str, Callable[[str], bytes]] = {
    "truncated": lambda text: text[: len(text) // 2].encode(),
    "empty": lambda text: b"",
    "10 MB": lambda text: b'{"pad": "' + b"x" * 10_000_000 + b'"}',
    "100,000 lists deep": lambda text: b"[" * 100_000 + b"]" * 100_000,
    "deep inside": lambda text: b'{"data": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    "a list": lambda text: b"[]",
    "a string": lambda text: b'"config"',
    "null": lambda text: b"null",
    "not UTF-8": lambda text: b'{"chars": "\xff\xfe"}',
    "binary": lambda text: bytes(range(256)) * 40,
}
# Values of every JSON type, and numbers no field takes.
WRONG = ["x", [], {}, None, True, 1.5, -1, 10**30, [[[[[[[[1]]]]]]]], "x" * 100_000]


def _json_kind(value: Any) -> str:
    return {bool: "bool", int: "number", float: "number", str: "string", list: "array", dict: "object"}.get(
        type(value), "null"
    )


# --- the shared reader ---------------------------------------------------------------------------


@pytest.mark.parametrize("damage", [d for d in DAMAGES if d not in ("deep inside", "not UTF-8")])
def test_the_json_reader_refuses_what_is_not_a_small_json_object(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "file.json"
    path.write_bytes(DAMAGES[damage]('{"a": 1}'))
    with pytest.raises(ValueError) as info:
        read_json_object(path)
    assert "\n" not in str(info.value) and len(str(info.value)) < 300


def test_the_json_reader_reads_an_object_with_a_byte_order_mark_and_no_more_than_its_cap(tmp_path: Path) -> None:
    path = tmp_path / "file.json"
    path.write_bytes(b'\xef\xbb\xbf{"a": [1, 2]}')  # a Windows editor's
    assert read_json_object(path) == {"a": [1, 2]}
    path.write_bytes(b"{}" + b" " * 100)
    assert read_json_object(path, max_bytes=102) == {}
    with pytest.raises(ValueError, match="bigger than"):
        read_json_object(path, max_bytes=101)


# --- a run's JSON files ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["config.json", "vocab.json", "state.json"])
@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_run_file_is_one_error_naming_it(trained_run, tmp_path: Path, name: str, damage: str) -> None:
    run = trained_run.copy_to(tmp_path / "ck")
    text = (run.path / name).read_text(encoding="utf-8")
    (run.path / name).write_bytes(DAMAGES[damage](text))
    with pytest.raises(CheckpointError, match=rf"{name} is corrupt \(") as info:
        run.check_usable()
    assert "\n" not in str(info.value) and len(str(info.value)) < 600
    summary = invoke("runs", "--checkpoint-dir", str(tmp_path / "ck"), "--json")  # listed, as damaged
    assert summary.exit_code == 0 and "corrupt" in summary.stdout, summary.stderr


def test_a_long_history_still_reads_and_a_state_beyond_its_cap_is_refused(trained_run, tmp_path: Path) -> None:
    run = trained_run.copy_to(tmp_path / "ck")
    text = run.state_path.read_text(encoding="utf-8")
    run.state_path.write_text(text + " " * 10_000_000, encoding="utf-8")  # ~30,000 epochs of history
    assert run.load_state() == trained_run.run.load_state()
    run.state_path.write_text(text + " " * 70_000_000, encoding="utf-8")
    with pytest.raises(CheckpointError, match="bigger than 64 MB"):
        run.load_state()


def _fields(data: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """The keys of a JSON object and of the objects in it, as paths."""
    out = []
    for key, value in data.items():
        out.append((*prefix, key))
        if isinstance(value, dict):
            out += _fields(value, (*prefix, key))
    return out


def _set(data: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    data = copy.deepcopy(data)
    inner = data
    for key in path[:-1]:
        inner = inner[key]
    if value is _set:
        del inner[path[-1]]
    else:
        inner[path[-1]] = value
    return data


def test_every_field_of_config_json_of_the_wrong_type_is_one_error_naming_it(trained_run, tmp_path: Path) -> None:
    run = trained_run.copy_to(tmp_path / "ck")
    original = json.loads(run.config_path.read_text(encoding="utf-8"))
    for section, fields in original.items():
        for field, good in fields.items():
            for bad in WRONG:
                run.config_path.write_text(json.dumps(_set(original, (section, field), bad)), encoding="utf-8")
                try:
                    run.load_config()
                except CheckpointError as exc:
                    message = str(exc)
                    assert "config.json is corrupt" in message and "\n" not in message and len(message) < 600
                    assert f"{section}.{field}" in message or flag(field) in message, message
                    continue
                # Only a value of the field's own JSON type, in its range, loads (or null for an optional field).
                assert good is None or bad is None or _json_kind(bad) == _json_kind(good), (section, field, bad)
            # A field left out is a run from before it existed (its default), or one error naming it.
            run.config_path.write_text(json.dumps(_set(original, (section, field), _set)), encoding="utf-8")
            try:
                run.load_config()
            except CheckpointError as exc:
                assert f"no {section}.{field}" in str(exc)


def test_every_field_of_state_json_of_the_wrong_type_is_one_error_naming_it(trained_run, tmp_path: Path) -> None:
    run = trained_run.copy_to(tmp_path / "ck")
    original = json.loads(run.state_path.read_text(encoding="utf-8"))
    original["epoch_progress"] = {"batch": 3, "loss_sum": 1.0, "batches": 3, "seconds": 1.0}  # a mid-epoch one
    for path in _fields(original):
        for bad in WRONG:
            run.state_path.write_text(json.dumps(_set(original, path, bad)), encoding="utf-8")
            try:
                run.check_usable()
            except CheckpointError as exc:
                message = str(exc)
                assert "state.json is corrupt" in message or "is missing" in message, message
                assert "\n" not in message and len(message) < 600
                continue
            good = _get(original, path)
            assert good is None or bad is None or _json_kind(bad) == _json_kind(good), (path, bad)


def _get(data: dict[str, Any], path: tuple[str, ...]) -> Any:
    for key in path:
        data = data[key]
    return data


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [
        ("last_weights", "../other-run/last.weights.h5", "last_weights="),  # a file outside the run
        ("optimizer", "/etc/passwd", "optimizer="),
        ("epoch", -1, "epoch=-1"),
        ("best_val_loss", -0.5, "best_val_loss=-0.5"),
        ("history", [{"epoch": 0, "colour": 1.0}], "history row"),  # history.csv has no such column
        ("history", [{"loss": 1.0}], "history row"),  # no epoch
        ("callbacks", {"early_stopping": {"model": 1.0}}, "callbacks.early_stopping holds ['model']"),
        ("finished", "tired", "finished='tired'"),
    ],
)
def test_state_json_values_of_the_right_type_that_cannot_be_are_one_error(
    trained_run, tmp_path: Path, key: str, value: Any, fragment: str
) -> None:
    run = trained_run.copy_to(tmp_path / "ck")
    run.state_path.write_text(json.dumps({**json.loads(run.state_path.read_text()), key: value}))
    with pytest.raises(CheckpointError, match=r"state\.json is corrupt") as info:
        run.load_state()
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    ("content", "fragment"),
    [({"chars": 5}, "'chars' is not a string"), ({"chars": "aab"}, "appears twice"), ({}, "'chars' is not")],
)
def test_a_hand_edited_vocabulary_is_one_error(trained_run, tmp_path: Path, content: dict, fragment: str) -> None:
    run = trained_run.copy_to(tmp_path / "ck")
    run.vocab_path.write_text(json.dumps(content), encoding="utf-8")
    with pytest.raises(CheckpointError, match=r"vocab\.json is corrupt") as info:
        run.load_vocab()
    assert fragment in str(info.value)


def test_a_resumed_run_with_a_callback_its_schedule_lacks_is_one_error(trained_run, tmp_path: Path) -> None:
    run = trained_run.copy_to(tmp_path / "ck")
    state = json.loads(run.state_path.read_text())
    state["callbacks"]["lr_schedule"] = {"wait": 1.0}  # the plateau schedule's; this run holds its rate
    run.state_path.write_text(json.dumps(state))
    out = invoke("train", "--resume", "--run", run.name, "--epochs", "5", "--checkpoint-dir", str(tmp_path / "ck"))
    assert_one_line_error(out, "state.json is corrupt (callbacks ['lr_schedule'] are not this run's)")


def test_damaged_run_files_are_one_line_from_every_command(trained_run, tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    run = trained_run.copy_to(ck)
    for name in ("config.json", "vocab.json", "state.json"):
        saved = (run.path / name).read_bytes()
        (run.path / name).write_bytes(DAMAGES["100,000 lists deep"](""))
        for command in (["sample", "--last"], ["evaluate", "--last"], ["train", "--resume", "--epochs", "5"]):
            out = invoke(*command, "--run", run.name, "--checkpoint-dir", str(ck))
            assert_one_line_error(out, f"{name} is corrupt (nested too deeply)")
        (run.path / name).write_bytes(saved)


# --- weights and optimizer state -------------------------------------------------------------------


def _flips(data: bytes, count: int = 40) -> list[bytes]:
    """``data`` with one bit flipped, at ``count`` places spread over it."""
    out = []
    for i in range(count):
        flipped = bytearray(data)
        flipped[(2 * i + 1) * len(data) // (2 * count)] ^= 1 << (i % 8)
        out.append(bytes(flipped))
    return out


@pytest.mark.parametrize("which", ["best", "last"])
def test_a_flipped_bit_in_the_weights_never_loads_other_weights(trained_run, tmp_path: Path, which: str) -> None:
    from textgen.model import build_model

    run = trained_run.copy_to(tmp_path / "ck")
    model = build_model(run.load_config().model, 1, stateful=False)
    run.load_weights(model, which)
    reference = model.get_weights()
    path = run.weights_path(which)
    damaged = 0
    for data in [*_flips(path.read_bytes()), path.read_bytes()[:1000]]:
        path.write_bytes(data)
        model.set_weights([np.zeros_like(w) for w in reference])
        try:
            run.load_weights(model, which)
        except CheckpointError as exc:
            damaged += 1
            assert str(exc).startswith(f"{path} is corrupt") and "\n" not in str(exc)
            assert ("--last" in str(exc)) == (which == "best"), str(exc)  # how to go on
            continue
        # A flip the file does not use (free space, padding): the weights are the same.
        assert all(np.array_equal(a, b) for a, b in zip(model.get_weights(), reference, strict=True))
        assert run.best_weights_loss() >= 0  # never an exception
    assert damaged >= 10


def test_a_damaged_best_weights_file_is_one_line_naming_what_to_use_instead(trained_run, tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    run = trained_run.copy_to(ck)
    data = bytearray(run.best_weights_path.read_bytes())
    data[len(data) // 2 :] = bytes(len(data) - len(data) // 2)  # zeroed: a partial copy
    run.best_weights_path.write_bytes(bytes(data))
    out = invoke("sample", "--run", run.name, "--checkpoint-dir", str(ck), "--length", "5")
    assert_one_line_error(out, "best.weights.h5 is corrupt", "use --last")
    out = invoke("sample", "--run", run.name, "--checkpoint-dir", str(ck), "--length", "5", "--last")
    assert out.exit_code == 0, out.stderr
    assert run.best_weights_loss() == float("inf") or run.best_weights_loss() >= 0


def test_a_damaged_resume_point_is_one_line_and_the_best_weights_still_sample(trained_run, tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    for file in ("last_weights", "optimizer"):
        run = trained_run.copy_to(ck, f"damaged-{file}")
        path = run.path / getattr(run.load_state(), file)
        path.write_bytes(_flips(path.read_bytes(), 3)[1])
        out = invoke("train", "--resume", "--run", run.name, "--epochs", "5", "--checkpoint-dir", str(ck))
        assert_one_line_error(out, f"{path.name} is", "cannot resume from it", "best weights still sample")
    out = invoke("sample", "--run", "damaged-optimizer", "--checkpoint-dir", str(ck), "--length", "5")
    assert out.exit_code == 0, out.stderr


# --- recipes ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_recipe_is_one_line_before_tensorflow_loads(tmp_path: Path, damage: str) -> None:
    write_corpus(tmp_path / "tiny.txt", 300)
    recipe = tmp_path / "recipe.json"
    recipe.write_bytes(DAMAGES[damage]('{"model": {"units": 64}}'))
    out = invoke("train", str(tmp_path / "tiny.txt"), "--config", str(recipe), "--checkpoint-dir", str(tmp_path))
    assert_one_line_error(out, str(recipe))
    assert len(out.stderr) < 600


def test_every_recipe_setting_of_the_wrong_type_or_range_is_one_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "recipe.json"
    for (part, names), kind in zip(RECIPE_FIELDS.items(), (DataConfig, ModelConfig, TrainConfig), strict=True):
        defaults = {field.name: field.default for field in dataclasses.fields(kind)}
        for name in names:
            for bad in WRONG:
                path.write_text(json.dumps({part: {name: bad}}), encoding="utf-8")
                try:
                    read_recipe(path)
                except ConfigError as exc:
                    message = str(exc)
                    assert message.startswith(f"recipe {path}: ") and "\n" not in message and len(message) < 600
                    assert f"{part}.{name}" in message or flag(name) in message, message
                    continue
                # Only a value of the setting's own JSON type (in its range) reads, or null for max_vocab (all).
                assert _json_kind(bad) == _json_kind(defaults[name]), (part, name, bad)


# --- a study's best.json and database --------------------------------------------------------------


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A study with one finished trial of a tiny recipe (~15 s), in BASE/ck/studies/tiny; its corpus BASE/tiny.txt."""
    base = tmp_path_factory.mktemp("study")
    write_corpus(base / "tiny.txt", 3000)
    tiny = ["--units", "32", "--layers", "1", "--embedding-dim", "8", "--batch-size", "8", "--seq-len", "32"]
    args = ["tune", str(base / "tiny.txt"), "--checkpoint-dir", str(base / "ck"), *tiny]
    out = invoke(*args, "--time-budget", "1m", "--trial-budget", "2s", "--trials", "1")
    assert out.exit_code == 0, out.stderr
    return study_path(base / "ck", "tiny")


def _best_json_damages(text: str) -> dict[str, bytes]:
    """best.json as a crash, a partial copy or a hand edit leaves it."""
    recipe = json.loads(text)
    edits = {
        "a section that is no object": {**recipe, "model": [1]},
        "a setting of the wrong type": _set(recipe, ("model", "units"), "many"),
        "a setting out of range": _set(recipe, ("training", "lr"), -1),
        "an unknown setting": _set(recipe, ("model", "colour"), "red"),
    }
    return {
        **{damage: make(text) for damage, make in DAMAGES.items()},
        **{edit: json.dumps(value).encode() for edit, value in edits.items()},
    }


def test_a_damaged_best_json_is_written_again_from_the_database(study: Path) -> None:
    best = study / "best.json"
    good = best.read_text(encoding="utf-8")
    loaded = optuna.load_study(study_name=None, storage=storage_of(study))
    for damage, data in _best_json_damages(good).items():
        best.write_bytes(data)
        assert best_recipe(study) == read_recipe(study / "trial-000" / "config.json"), damage  # train --from-study
        assert best.read_text(encoding="utf-8") == good, damage
        best.write_bytes(data)
        save_best_recipe(loaded, study)  # what a continued study does, at each finished trial and at its end
        assert best.read_text(encoding="utf-8") == good, damage
    best.unlink()
    assert best_recipe(study) and best.read_text(encoding="utf-8") == good


def test_a_study_whose_best_json_is_damaged_continues(study: Path) -> None:
    best = study / "best.json"
    good = best.read_text(encoding="utf-8")
    ck = study.parent.parent
    for data in (b'{"model": {"units": "many"}', DAMAGES["100,000 lists deep"]("")):
        best.write_bytes(data)
        out = invoke("tune", "--study", "tiny", "--checkpoint-dir", str(ck), "--trials", "1")  # it has its trial
        assert out.exit_code == 0, out.stderr
        assert best.read_text(encoding="utf-8") == good
    best.write_bytes(b"[")
    out = invoke("tune", "--show", "--study", "tiny", "--checkpoint-dir", str(ck))
    assert out.exit_code == 0, out.stderr


@pytest.mark.parametrize(
    ("revision", "written", "fragments"),
    [
        ("v3.0.0.d", "3.0.0", ["written by Optuna 3.0.0", "optuna storage upgrade --storage sqlite:///"]),
        ("v9.9.9.a", "9.9.9", ["written by Optuna 9.9.9, newer than this Optuna", "pip install -U optuna"]),
    ],
)
def test_a_study_database_of_another_optuna_version_is_one_line_saying_what_to_do(
    study: Path, revision: str, written: str, fragments: list[str]
) -> None:
    other = study.parent / f"optuna-{written}"
    other.mkdir()
    shutil.copy(study / "study.db", other / "study.db")
    (other / "best.json").write_text("{", encoding="utf-8")
    with sqlite3.connect(other / "study.db") as db:  # what that version's Optuna would have written
        db.execute("UPDATE alembic_version SET version_num = ?", (revision,))
        db.execute("UPDATE version_info SET library_version = ?", (written,))
    db.close()
    ck = str(study.parent.parent)
    corpus = str(study.parent.parent.parent / "tiny.txt")
    for args in (
        ["tune", "--show", "--study", other.name, "--checkpoint-dir", ck],
        ["tune", "--study", other.name, "--checkpoint-dir", ck, "--trials", "2"],
        ["train", corpus, "--from-study", other.name, "--checkpoint-dir", ck],  # best.json to write again
    ):
        assert_one_line_error(invoke(*args), str(other / "study.db"), *fragments)


# --- $TF_CONFIG ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tf_config", "fragment"),
    [
        ("{not json", "is not a JSON object"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ("[]", "a JSON array, not an object"),
        ('{"task": {"type": "worker", "index": 0}}', "has no cluster"),
        ('{"cluster": [], "task": {"type": "worker", "index": 0}}', "has no cluster"),
        ('{"cluster": {"worker": "a:1"}, "task": {"type": "worker", "index": 0}}', "cluster.worker must be a list"),
        ('{"cluster": {"worker": [2222]}, "task": {"type": "worker", "index": 0}}', 'of "host:port" strings'),
        ('{"cluster": {"worker": ["host"]}, "task": {"type": "worker", "index": 0}}', 'of "host:port" strings'),
        ('{"cluster": {"worker": ["a b:1"]}, "task": {"type": "worker", "index": 0}}', 'of "host:port" strings'),
        ('{"cluster": {"worker": ["a:0"]}, "task": {"type": "worker", "index": 0}}', "port is not from 1 to 65535"),
        ('{"cluster": {"worker": ["a:99999"]}, "task": {"type": "worker", "index": 0}}', "port is not from 1"),
        ('{"cluster": {"worker": ["a:1", "a:1"]}, "task": {"type": "worker", "index": 0}}', "lists a:1 twice"),
        ('{"cluster": {"chief": ["a:1", "b:1"]}, "task": {"type": "chief", "index": 0}}', "more than one chief"),
        ('{"cluster": {"worker": ["a:1"]}}', "has no task"),
        ('{"cluster": {"worker": ["a:1"]}, "task": "worker"}', "has no task"),
        ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "ps", "index": 0}}', "task.type='ps'"),
        ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "chief", "index": 0}}', "task.type='chief'"),
        ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": "0"}}', "task.index='0'"),
        ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": true}}', "task.index=True"),
        ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 1}}', "cluster.worker has 1"),
        ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": -1}}', "task.index=-1"),
    ],
)
def test_a_tf_config_that_is_not_a_cluster_is_one_error_naming_the_field(
    monkeypatch: pytest.MonkeyPatch, tf_config: str, fragment: str
) -> None:
    monkeypatch.setenv("TF_CONFIG", tf_config)
    with pytest.raises(ConfigError, match=r"^\$TF_CONFIG ") as info:
        cluster_role("multiworker")
    assert fragment in str(info.value) and "\n" not in str(info.value) and len(str(info.value)) < 600


def test_a_good_tf_config_gives_each_process_its_place(monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = {"chief": ["[::1]:2000"], "worker": ["host-1.example:2001", "10.0.0.2:2002"], "evaluator": ["e:3"]}
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 1}}))
    role = cluster_role("multiworker")
    assert (role.workers, role.index, role.chief, role.address) == (3, 2, False, "10.0.0.2:2002")


def test_a_worker_whose_port_is_taken_is_one_line_naming_it(tmp_path: Path) -> None:
    write_corpus(tmp_path / "tiny.txt", 300)
    with socket.socket() as taken, socket.socket() as free:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        free.bind(("127.0.0.1", 0))
        port, other = taken.getsockname()[1], free.getsockname()[1]
        free.close()
        cluster = {"worker": [f"127.0.0.1:{port}", f"127.0.0.1:{other}"]}
        tf_config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 0}})
        flags = [f"--{k.replace('_', '-')}={v}" for k, v in {**TINY_DATA, **TINY_MODEL}.items()]
        proc = run_textgen(
            ["train", "tiny.txt", "--strategy", "multiworker", "--run", "w", *flags], tmp_path, timeout=120,
            TF_CONFIG=tf_config,
        )  # fmt: skip
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode != 0 and len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"error: port {port} of this worker (127.0.0.1:{port} in $TF_CONFIG) is in use")
