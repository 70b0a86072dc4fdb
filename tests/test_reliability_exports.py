"""An export checks itself, and writing one fails or stops safely (issue 42, categories 2 and 7, and 1 for exports).

Every file of an export is damaged in turn, as a crash, a partial copy, a hand edit or a failing disk would: the
command is one line naming the file (or what in textgen.json disagrees with the network), never a traceback or
an ``IndexError``. An export from before the manifest loads, with one warning. A full disk, TensorFlow's and
LiteRT's errors, and a stop signal while exporting are one line, and leave the previous export as it was and no
scratch directory.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import tensorflow as tf
from ai_edge_litert.interpreter import Interpreter
from helpers import assert_one_line_error, invoke, subprocess_env, write_corpus
from tensorflow.lite.python.convert_phase import ConverterError

from textgen import api, export
from textgen.artifact import INFO_FILE, MANIFEST_FILE, START_FILE, ArtifactInfo, file_digest
from textgen.checkpoint import Run
from textgen.errors import TextgenWarning
from textgen.runtime import open_artifact
from textgen.signals import STOP_SIGNALS

FORMATS = ["litert", "savedmodel"]


@pytest.fixture(scope="module")
def run(trained_run, tmp_path_factory: pytest.TempPathFactory) -> Run:
    return trained_run.copy_to(tmp_path_factory.mktemp("exports") / "checkpoints", "tiny")


@pytest.fixture(scope="module")
def exports(run: Run, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One export of each format, not to be changed: tests damage copies."""
    base = tmp_path_factory.mktemp("exported")
    return {
        format: api.export(checkpoint_dir=run.path.parent, run_name=run.name, format=format, path=base / format).path
        for format in FORMATS
    }


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A text to score exports on."""
    return write_corpus(tmp_path_factory.mktemp("text") / "other.txt", 600, seed=5)


def copy(source: Path, dest: Path) -> Path:
    shutil.copytree(source, dest)
    return dest


def contents(path: Path) -> dict[str, bytes]:
    """Every file under ``path``, by relative path."""
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def sample(model: Path, *args: str) -> Any:
    return invoke("sample", "--model", str(model), "--length", "20", "--seed", "3", *args)


def make_legacy(export: Path) -> Path:
    """``export`` as textgen wrote it before the manifest: textgen.json of format 1, no manifest.json."""
    info = json.loads((export / INFO_FILE).read_text(encoding="utf-8"))
    (export / INFO_FILE).write_text(json.dumps({**info, "textgen_artifact": 1}), encoding="utf-8")
    (export / MANIFEST_FILE).unlink()
    return export


# --- 2. an export checks itself before it runs ------------------------------------------------------


def test_the_manifest_records_every_file_of_the_export(exports: dict[str, Path]) -> None:
    for export_path in exports.values():
        manifest = json.loads((export_path / MANIFEST_FILE).read_text())
        files = {name for name in contents(export_path) if name != MANIFEST_FILE}
        assert set(manifest["files"]) == files and INFO_FILE in files
        for name, record in manifest["files"].items():
            assert record == {"bytes": (export_path / name).stat().st_size, "sha256": file_digest(export_path / name)}
    assert ".step" not in {p.name for p in exports["litert"].rglob("*")}  # the converter's SavedModel is not shipped


def damaged_copies(export_path: Path, dest: Path) -> list[tuple[str, str, Path]]:
    """A copy of ``export_path`` per file and per damage: (file, damage, copy)."""
    copies = []
    for name, data in contents(export_path).items():
        middle = len(data) // 2
        damages: dict[str, bytes | None] = {
            "deleted": None,
            "emptied": b"",
            "cut in half": data[:middle],
            "one byte short": data[:-1],
            "one byte more": data + b"\0",
            **{
                f"byte {i} flipped": data[:i] + bytes([data[i] ^ 0x01]) + data[i + 1 :]
                for i in (0, middle, len(data) - 1)
            },
        }
        for damage, new in damages.items():
            target = copy(export_path, dest / f"{name.replace('/', '_')}-{damage.replace(' ', '-')}")
            if new is None:
                (target / name).unlink()
            else:
                (target / name).write_bytes(new)
            copies.append((name, damage, target))
    return copies


def parses_to(path: Path, expected: object) -> bool:
    """Whether the file at ``path`` holds the JSON ``expected``, however it is laid out."""
    try:
        return json.loads(path.read_bytes()) == expected
    except ValueError:
        return False


@pytest.mark.parametrize("format", FORMATS)
def test_every_file_of_an_export_damaged_in_every_way_is_one_line_naming_it(
    format: str, exports: dict[str, Path], tmp_path: Path
) -> None:
    manifest = json.loads((exports[format] / MANIFEST_FILE).read_text())
    for name, damage, target in damaged_copies(exports[format], tmp_path):
        result = sample(target)
        if name == MANIFEST_FILE and damage.startswith("one byte") and parses_to(target / name, manifest):
            assert result.exit_code == 0, result.stderr  # a newline more or less: the same manifest
            continue
        assert result.exit_code != 0, (name, damage)
        line = assert_one_line_error(result)
        assert Path(name).name in line, (name, damage, line)


def edited_fields(info: dict[str, Any]) -> list[tuple[str, Any]]:
    """(field, a wrong value or type) for every field of textgen.json."""
    model, chars = info["model"], info["chars"]
    return [
        ("textgen_artifact", 0),
        ("textgen_artifact", "2"),
        ("textgen_artifact", True),
        ("format", "onnx"),
        ("format", "savedmodel" if info["format"] == "litert" else "litert"),
        ("quantize", "int4"),
        ("quantize", None),
        ("model", None),
        ("model", [model]),
        ("model", {**model, "units": model["units"] * 2}),
        ("model", {**model, "layers": model["layers"] + 1}),
        ("model", {**model, "vocab_size": model["vocab_size"] - 1}),
        ("model", {**model, "units": str(model["units"])}),
        ("model", {**model, "dropout": 2.0}),
        ("model", {**model, "layer_norm": "no"}),
        ("model", {**model, "heads": 4}),
        ("chars", chars[:-2]),
        ("chars", chars + "Ω"),
        ("chars", chars[:-1] + chars[0]),
        ("chars", list(chars)),
        ("run", 7),
        ("weights", None),
        ("batch_size", 0),
        ("batch_size", "8"),
        ("seq_len", -3),
        ("seq_len", 1.5),
        ("strip_boilerplate", "yes"),
        ("strip_boilerplate", 1),
        ("extra", 1),
    ]


@pytest.mark.parametrize("format", FORMATS)
def test_textgen_json_edited_by_hand_is_one_line_naming_it(format: str, exports: dict[str, Path], tmp_path: Path):
    """Each field given a wrong value or type, or removed: in an export with a manifest, and in one without (whose
    network is then the judge of what textgen.json says of it)."""
    info = json.loads((exports[format] / INFO_FILE).read_text())
    edits = [(field, {**info, field: value}) for field, value in edited_fields(info)]
    edits += [(f"no {field}", {k: v for k, v in info.items() if k != field}) for field in info]
    for legacy in (False, True):
        for i, (field, edited) in enumerate(edits):
            target = copy(exports[format], tmp_path / f"{legacy}-{i}")
            if legacy:
                make_legacy(target)
                edited = (
                    {**edited, "textgen_artifact": 1}
                    if "textgen_artifact" in edited and field != "textgen_artifact"
                    else edited
                )
            (target / INFO_FILE).write_text(json.dumps(edited), encoding="utf-8")
            result = sample(target)
            assert result.exit_code != 0, (field, legacy)
            assert INFO_FILE in assert_one_line_error(result), (field, legacy, result.stderr)


@pytest.mark.parametrize("format", FORMATS)
def test_textgen_json_and_the_network_must_agree(format: str, exports: dict[str, Path], tmp_path: Path) -> None:
    """A textgen.json that is whole but describes another network (its manifest out of the way): a vocabulary
    shorter or longer than the logits, other units, other layers; one line naming both, never an IndexError."""
    info = json.loads((exports[format] / INFO_FILE).read_text())
    model, chars = info["model"], info["chars"]
    network = "model.tflite" if format == "litert" else "saved_model.pb"
    cases = [
        ({"chars": chars[:-5], "model": {**model, "vocab_size": model["vocab_size"] - 5}}, "vocabulary size"),
        ({"chars": chars + "ΩΨ", "model": {**model, "vocab_size": model["vocab_size"] + 2}}, "vocabulary size"),
        ({"model": {**model, "units": model["units"] + 1}}, "units"),
        ({"model": {**model, "layers": 2}}, "layers"),
    ]
    for i, (changes, what) in enumerate(cases):
        target = make_legacy(copy(exports[format], tmp_path / str(i)))
        (target / INFO_FILE).write_text(json.dumps({**info, **changes, "textgen_artifact": 1}), encoding="utf-8")
        assert_one_line_error(sample(target), f"{INFO_FILE} says {what}", f"but {network} has")


@pytest.mark.parametrize("format", FORMATS)
def test_an_export_from_before_the_manifest_loads_with_one_warning(
    format: str, exports: dict[str, Path], corpus: Path, tmp_path: Path
) -> None:
    legacy = make_legacy(copy(exports[format], tmp_path / "old"))
    expected = sample(exports[format], "--json")
    assert expected.exit_code == 0 and not expected.stderr
    for result in (sample(legacy, "--json"), invoke("evaluate", "--model", str(legacy), str(corpus))):
        assert result.exit_code == 0, result.stderr
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("warning: ") and "export the run again" in lines[0], lines
    assert json.loads(sample(legacy, "--json").stdout)["text"] == json.loads(expected.stdout)["text"]
    with pytest.warns(TextgenWarning, match="has no manifest.json"):
        open_artifact(legacy)


def test_a_damaged_export_from_before_the_manifest_is_one_line(exports: dict[str, Path], tmp_path: Path) -> None:
    """Without a manifest, the network's own loader finds what it can (not a flipped byte: that is what the
    manifest is for), and its errors are one line too."""
    for format in FORMATS:
        for name, damage, target in damaged_copies(exports[format], tmp_path / format):
            if name in (INFO_FILE, MANIFEST_FILE, "fingerprint.pb") or damage not in (
                "deleted",
                "emptied",
                "cut in half",
            ):
                continue
            if (name, damage) == (START_FILE, "deleted"):  # an export from before the manifest had none: zeros
                continue
            make_legacy(target)
            line = assert_one_line_error(sample(target))
            assert str(target) in line, (name, damage, line)


# --- 1. TensorFlow's and LiteRT's errors while loading an export ------------------------------------


TF_ERRORS = [
    tf.errors.OutOfRangeError(None, None, "Read less bytes than requested"),
    tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor"),
    tf.errors.UnknownError(None, None, "unknown"),
    tf.errors.NotFoundError(None, None, "variables/variables.index; No such file or directory"),
    tf.errors.DataLossError(None, None, "Checksum does not match"),
]


@pytest.mark.parametrize("error", TF_ERRORS, ids=lambda e: type(e).__name__)
def test_tensorflow_errors_loading_a_savedmodel_are_one_line(
    error: Exception, exports: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(*args: object, **kwargs: object) -> None:
        raise error

    monkeypatch.setattr(tf.saved_model, "load", fail)
    assert_one_line_error(sample(exports["savedmodel"]), f"TensorFlow cannot load {exports['savedmodel']}")


@pytest.mark.parametrize("method", ["__init__", "allocate_tensors", "invoke"])
def test_litert_errors_are_one_line(
    method: str, exports: dict[str, Path], corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(*args: object, **kwargs: object) -> None:
        error = ValueError if method == "__init__" else RuntimeError
        raise error("Failed to apply XNNPACK delegate\nNode number 3 (TfLiteXNNPackDelegate) failed to prepare.")

    monkeypatch.setattr(Interpreter, method, fail)
    litert = exports["litert"] / "model.tflite"
    for result in (sample(exports["litert"]), invoke("evaluate", "--model", str(exports["litert"]), str(corpus))):
        assert_one_line_error(result, str(litert), "XNNPACK delegate")


# --- 1. a failed write while exporting leaves the previous export -----------------------------------


def disk_full(*args: object, **kwargs: object) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def tf_disk_full(*args: object, **kwargs: object) -> None:
    raise tf.errors.ResourceExhaustedError(None, None, "exports/.x.abc/saved_model.pb.tmp1; No space left on device")


def raising(error: Exception) -> Callable[..., None]:
    def fail(*args: object, **kwargs: object) -> None:
        raise error

    return fail


FAILURES = {  # name: (format, what fails, how, what the line says)
    "tf-save-no-space": ("litert", (tf.saved_model, "save"), tf_disk_full, "no space left on device"),
    "write-no-space": ("litert", (Path, "write_bytes"), disk_full, "no space left on device"),
    "manifest-no-space": ("savedmodel", (export, "write_manifest"), disk_full, "no space left on device"),
    "fsync-io-error": (
        "litert",
        (export, "fsync_tree"),
        raising(OSError(errno.EIO, "Input/output error")),
        "Input/output",
    ),
    "converter": ("litert", (export, "litert_bytes"), raising(ConverterError("could not convert")), "convert"),
    **{
        f"tf-{type(error).__name__}": ("savedmodel", (tf.saved_model, "save"), raising(error), error.message)
        for error in TF_ERRORS
    },
}


def export_to(run: Run, format: str, path: Path) -> Any:
    return invoke("export", "--checkpoint-dir", str(run.path.parent), "--format", format, "-o", str(path))


@pytest.mark.parametrize("case", FAILURES)
def test_a_failed_export_is_one_line_and_keeps_the_previous_export(
    case: str, run: Run, exports: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    format, (owner, name), fail, says = FAILURES[case]
    previous = copy(exports["litert" if format == "savedmodel" else "savedmodel"], tmp_path / "out" / "model")
    before = contents(previous)
    monkeypatch.setattr(owner, name, fail)
    line = assert_one_line_error(export_to(run, format, previous), "export failed: ", says)
    assert line.endswith(f"; the previous export at {previous} is intact"), line
    monkeypatch.undo()
    assert contents(previous) == before and os.listdir(previous.parent) == ["model"]
    ArtifactInfo.read(previous)  # whole, and checked


def test_a_full_disk_on_a_first_export_leaves_nothing(run: Run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(Path, "write_bytes", disk_full)
    line = assert_one_line_error(export_to(run, "litert", tmp_path / "out" / "model"))
    assert line == f"error: export failed: no space left on device (writing {tmp_path / 'out' / 'model'}); " + (
        f"nothing was written to {tmp_path / 'out' / 'model'}"
    )
    assert os.listdir(tmp_path / "out") == []


def test_a_failed_rename_puts_the_previous_export_back(
    run: Run, exports: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    previous = copy(exports["savedmodel"], tmp_path / "model")
    before, replace = contents(previous), os.replace

    def fail_to_publish(src: Any, dst: Any) -> None:
        if Path(dst) == previous and ".old-" not in Path(src).name:
            raise OSError(errno.EIO, "Input/output error")
        replace(src, dst)

    monkeypatch.setattr(os, "replace", fail_to_publish)
    assert_one_line_error(export_to(run, "litert", previous), f"the previous export at {previous} is intact")
    monkeypatch.undo()
    assert contents(previous) == before and os.listdir(tmp_path) == ["model"]


# --- 7. signals during export -----------------------------------------------------------------------


STOPS = {  # where the signal arrives: (what it arrives in, the signal)
    "loading": ((export.Generator, "from_run"), signal.SIGINT),
    "saving": ((tf.saved_model, "save"), signal.SIGTERM),
    "converting": ((export, "litert_bytes"), signal.SIGHUP),
    "manifest": ((export, "write_manifest"), signal.SIGTERM),
}


def signalled(original: Callable[..., Any], *signals: signal.Signals) -> Callable[..., Any]:
    """``original``, sending this process ``signals`` once it returns."""

    def call(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        for sig in signals:
            os.kill(os.getpid(), sig)
        return result

    return call


@pytest.mark.parametrize("when", STOPS)
def test_a_stop_signal_during_export_keeps_the_previous_export_and_no_scratch(
    when: str, run: Run, exports: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (owner, name), sig = STOPS[when]
    previous = copy(exports["savedmodel"], tmp_path / "out" / "model")
    before, handlers = contents(previous), [signal.getsignal(s) for s in STOP_SIGNALS]
    monkeypatch.setattr(owner, name, signalled(getattr(owner, name), sig))
    result = export_to(run, "litert", previous)
    assert result.exit_code == 128 + sig
    assert_one_line_error(result, f"export stopped by {sig.name}; the previous export at {previous} is intact")
    assert contents(previous) == before and os.listdir(previous.parent) == ["model"]
    assert [signal.getsignal(s) for s in STOP_SIGNALS] == handlers


def test_a_second_signal_stops_at_once_and_still_cleans_up(
    run: Run, exports: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    previous = copy(exports["savedmodel"], tmp_path / "model")
    before = contents(previous)
    monkeypatch.setattr(tf.saved_model, "save", signalled(tf.saved_model.save, signal.SIGTERM, signal.SIGTERM))
    result = export_to(run, "litert", previous)
    assert result.exit_code == 130 and "interrupted" in result.stderr and "Traceback" not in result.stderr
    assert contents(previous) == before and os.listdir(tmp_path) == ["model"]


def test_a_signal_once_the_export_is_being_put_in_place_lets_it_finish(
    run: Run, exports: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    previous = copy(exports["savedmodel"], tmp_path / "model")
    monkeypatch.setattr(export, "fsync_tree", signalled(export.fsync_tree, signal.SIGTERM))
    result = export_to(run, "litert", previous)
    assert result.exit_code == 0, result.stderr
    assert ArtifactInfo.read(previous).format == "litert" and os.listdir(tmp_path) == ["model"]


def test_sigterm_to_a_real_export_removes_its_scratch_directory(run: Run, exports: dict[str, Path], tmp_path: Path):
    previous = copy(exports["litert"], tmp_path / "model")
    before = contents(previous)
    args = ["export", "--checkpoint-dir", str(run.path.parent), "--format", "litert", "-o", str(previous)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "textgen", *args], env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 120
        while not any(p.name.startswith(".model.") for p in tmp_path.iterdir()):  # the export has begun writing
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert err.decode().strip() == f"error: export stopped by SIGTERM; the previous export at {previous} is intact"
    assert contents(previous) == before and os.listdir(tmp_path) == ["model"]
