"""Damaged runs and what is left of interrupted work (issue 55): every command that reads a run's weights names the
damaged file and a next step that command has; a killed export's scratch directory goes with the next export;
TensorFlow's errors while a SavedModel generates, and a completion script that cannot be written, are one line."""

from __future__ import annotations

import errno
import fcntl
import os
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import pytest
from helpers import TINY_DATA, TINY_MODEL, assert_one_line_error, invoke, subprocess_env

import textgen.checkpoint


def _truncated(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _garbage(path: Path) -> None:
    path.write_bytes(bytes(range(256)) * 40)


def _other_weights(path: Path) -> None:
    """A sound HDF5 file whose arrays no longer match the checksum saved with them (a flipped bit, an edit)."""
    with h5py.File(path, "a") as fh:
        kernel = next(fh[name] for name in _datasets(fh) if fh[name].size > 1)
        kernel[...] = np.asarray(kernel[()]) + 1


def _datasets(fh: h5py.File) -> list[str]:
    names: list[str] = []
    fh.visititems(lambda name, item: names.append(name) if isinstance(item, h5py.Dataset) else None)
    return names


DAMAGES: dict[str, Callable[[Path], None]] = {
    "truncated": _truncated,
    "garbage": _garbage,
    "checksum": _other_weights,
}
# What no message about a damaged source may say: a write failure's advice, or resuming a run never made.
NOT_A_WRITE = ("Free space", "fix permissions", "--resume")


def _last_weights(run) -> Path:
    return run.path / run.load_state().last_weights


# --- serve: no --last, so no "use --last" --------------------------------------------------------


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_serve_of_damaged_best_weights_names_the_file_and_a_step_serve_has(
    trained_run, tmp_path: Path, damage: str
) -> None:
    ck = tmp_path / "ck"
    run = trained_run.copy_to(ck)
    DAMAGES[damage](run.best_weights_path)
    out = invoke("serve", "--run", run.name, "--checkpoint-dir", str(ck), "--port", "0")
    line = assert_one_line_error(out, f"{run.best_weights_path} is corrupt", "serve --model exports/tiny-litert")
    assert "use --last" not in line and "export --run tiny" in line, line


def test_serve_of_a_run_without_best_weights_yet_offers_no_last_option(trained_run, tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    run = trained_run.copy_to(ck)
    run.best_weights_path.unlink()  # stopped before its first epoch's end, say
    for named in (["--run", run.name], []):  # the run named, or found as the latest
        out = invoke("serve", *named, "--checkpoint-dir", str(ck), "--port", "0")
        line = assert_one_line_error(out, "best.weights.h5 is missing", "serve --model exports/tiny-litert")
        assert "use --last" not in line, line


@pytest.mark.parametrize("command", ["distill", "prune"])
def test_distill_or_prune_of_damaged_best_weights_offers_no_last_option_and_makes_no_run(
    trained_run, tmp_path: Path, command: str
) -> None:
    ck = tmp_path / "ck"
    run = trained_run.copy_to(ck)
    _truncated(run.best_weights_path)
    flag = "--teacher" if command == "distill" else "--source"
    out = invoke(command, flag, run.name, "--epochs", "1", "--checkpoint-dir", str(ck))
    line = assert_one_line_error(out, f"{run.best_weights_path} is corrupt", f"{flag} reads a run's best weights")
    assert "--last" not in line, line
    assert [p.name for p in ck.iterdir()] == [run.name]  # refused before a run was made from it


# --- train --init-from: a damaged base is not a failed write -------------------------------------


@pytest.mark.parametrize("damage", list(DAMAGES))
@pytest.mark.parametrize("which", ["best", "last"])
def test_a_damaged_base_run_is_one_line_naming_it_and_no_run_is_made(
    trained_run, tmp_path: Path, damage: str, which: str
) -> None:
    ck = tmp_path / "ck"
    base = trained_run.copy_to(ck, "base")
    path = base.best_weights_path if which == "best" else _last_weights(base)
    DAMAGES[damage](path)
    last = ["--last"] if which == "last" else []
    out = invoke(
        "train", str(trained_run.corpus), "--init-from", "base", *last, "--run", "tuned", "--checkpoint-dir", str(ck)
    )
    line = assert_one_line_error(out, f"{path} is corrupt")
    assert not any(words in line for words in NOT_A_WRITE), line
    assert ("use --last" in line) == (which == "best"), line  # train --init-from has --last
    assert sorted(p.name for p in ck.iterdir()) == ["base"]  # refused before a run was made


def test_a_failed_write_of_a_new_run_says_run_the_command_again_not_resume(
    trained_run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write = textgen.checkpoint.atomic_write_text

    def disk_full_for_the_vocabulary(path: Path, text: str) -> None:
        if Path(path).name == "vocab.json":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        write(path, text)

    monkeypatch.setattr(textgen.checkpoint, "atomic_write_text", disk_full_for_the_vocabulary)
    flags = [f"--{key.replace('_', '-')}={value}" for key, value in {**TINY_DATA, **TINY_MODEL}.items()]
    out = invoke("train", str(trained_run.corpus), *flags, "--run", "new", "--checkpoint-dir", str(tmp_path / "ck"))
    line = assert_one_line_error(out, "could not save the run's vocabulary", "No space left on device")
    assert "run the command again" in line and "--resume" not in line and "resume point" not in line, line
    assert not (tmp_path / "ck" / "new").exists()  # its config, written first, went with it: nothing to resume


# --- a killed export's scratch directory goes with the next export of the same target ---------------


def test_the_next_export_removes_what_killed_exports_to_its_path_left(trained_run, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    # What kill -9 leaves: a scratch directory mid-write, and an earlier export moved aside mid-replacement.
    leftovers = [out / ".model.k3x_9q2z", out / ".model.old-0a1b2c3d"]
    for leftover in leftovers:
        (leftover / "variables").mkdir(parents=True)
        (leftover / "variables" / "variables.index").write_bytes(b"half")
    kept = [out / ".model.notes", out / ".other.k3x_9q2z"]  # not an export's to model: another's, or the user's
    for directory in kept:
        directory.mkdir()
    running = out / ".model.r7mm2kdw"  # the scratch directory of an export running now: it holds it locked
    running.mkdir()
    fd = os.open(running, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        export = invoke("export", "--checkpoint-dir", str(trained_run.checkpoint_dir), "--format", "litert", "-o",
                        str(out / "model"))  # fmt: skip
    finally:
        os.close(fd)
    assert export.exit_code == 0, export.stderr
    assert sorted(p.name for p in out.iterdir()) == sorted(["model", running.name, *(p.name for p in kept)])


# --- TensorFlow's errors while a model generates ---------------------------------------------------


@pytest.fixture(scope="module")
def savedmodel(trained_run, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from textgen import api
    from textgen.artifact import ExportFormat

    path = tmp_path_factory.mktemp("export") / "sm"
    api.export(
        checkpoint_dir=trained_run.checkpoint_dir,
        run_name=trained_run.run.name,
        format=ExportFormat.savedmodel,
        path=path,
    )
    return path


def _tf_errors() -> dict[str, Exception]:
    import tensorflow as tf

    oom = "OOM when allocating tensor with shape[4096,2048] and type float on /job:localhost/replica:0/task:0"
    return {
        "out of memory": tf.errors.ResourceExhaustedError(None, None, oom),
        "invalid argument": tf.errors.InvalidArgumentError(
            None, None, "indices[3] = 97 is not in [0, 62)\n\t [[{{node"
        ),
    }


@pytest.mark.parametrize("error", ["out of memory", "invalid argument"])
def test_tensorflow_errors_while_a_savedmodel_generates_are_one_line(
    savedmodel: Path, error: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import textgen.sampling

    def fail(*args: object, **kwargs: object) -> None:
        raise _tf_errors()[error]

    monkeypatch.setattr(textgen.sampling, "_call_generate", fail)
    out = invoke("sample", "--model", str(savedmodel), "--num", "4096", "--length", "5")
    if error == "out of memory":
        assert_one_line_error(out, "TensorFlow ran out of memory while generating (OOM when", "fewer samples at once")
    else:
        assert_one_line_error(out, f"TensorFlow failed running {savedmodel} (indices[3] = 97", "export the run again")


def test_running_out_of_memory_while_a_run_generates_is_one_line(trained_run, monkeypatch: pytest.MonkeyPatch) -> None:
    import textgen.sampling

    def fail(*args: object, **kwargs: object) -> None:
        raise _tf_errors()["out of memory"]

    monkeypatch.setattr(textgen.sampling, "_call_generate", fail)
    out = invoke("sample", "--checkpoint-dir", str(trained_run.checkpoint_dir), "--num", "4096", "--length", "5")
    assert_one_line_error(out, "TensorFlow ran out of memory while generating", "fewer samples at once")


# --- tab completion into a home that cannot be written -------------------------------------------


@pytest.mark.parametrize("home", ["read-only", "a file"])
def test_installing_completion_into_a_home_that_cannot_be_written_is_one_line(tmp_path: Path, home: str) -> None:
    path = tmp_path / "home"
    if home == "a file":  # unwritable even for root, whom a directory's mode does not stop
        path.write_text("")
    else:
        if os.geteuid() == 0:
            pytest.skip("root writes into a read-only directory")
        path.mkdir(mode=0o555)
    # From bash, as a user would: typer finds the shell among the process's parents (a test runner started apart
    # from any shell has none, and typer then says only "Shell None is not supported")
    shell = f"{shlex.quote(sys.executable)} -m textgen --install-completion; exit $?"  # not exec'd: bash stays
    out = subprocess.run(
        ["bash", "-c", shell],
        cwd=tmp_path,
        env=subprocess_env(HOME=str(path), SHELL="/bin/bash"),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 1, out.stdout + out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert out.stderr.startswith(f"error: {path}"), out.stderr
