"""The commands textgen suggests: written as the user started textgen, and each runs as printed."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import subprocess_env

from textgen import commands
from textgen.basemodel import BASE_NAME
from textgen.commands import FINE_TUNE, FIRST_STUDY, QUICK_START_SAMPLE, QUICK_START_TRAIN, program, quick_start

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = Path(sys.executable).parent / "textgen"  # the venv's console script


def _script(tmp_path: Path, relative: str) -> Path:
    path = tmp_path / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


@pytest.mark.parametrize(
    ("argv0", "on_path", "shown"),
    [
        (".venv/bin/textgen", False, ".venv/bin/textgen"),  # started by its path: the same path
        (".venv/bin/textgen", True, "textgen"),  # PATH finds the same script: its name
        ("textgen", False, "./textgen"),  # in the working directory, not on PATH
        ("{tmp}/elsewhere/bin/textgen", False, "{tmp}/elsewhere/bin/textgen"),  # outside it: its absolute path
        ("{tmp}/.venv/lib/textgen/__main__.py", False, ".venv/bin/python -m textgen"),  # python -m textgen
        ("{tmp}/.venv/bin/pytest", False, "textgen"),  # not textgen's own program: a library caller
    ],
)
def test_the_program_is_written_as_the_user_started_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argv0: str, on_path: bool, shown: str
) -> None:
    work = tmp_path / "work"
    for script in (".venv/bin/textgen", ".venv/bin/python", "textgen"):
        _script(work, script)
    _script(tmp_path, "elsewhere/bin/textgen")
    monkeypatch.chdir(work)
    monkeypatch.setattr(sys, "argv", [argv0.format(tmp=work if ".venv" in argv0 else tmp_path)])
    monkeypatch.setattr(sys, "executable", str(work / ".venv/bin/python"))
    monkeypatch.setenv("PATH", str(work / ".venv/bin") if on_path else str(tmp_path / "empty"))
    assert program() == shown.format(tmp=tmp_path)


def test_the_readmes_quick_start_is_the_one_textgen_suggests(monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's first commands and the CLI's hints come from one place: a change to either shows here."""
    monkeypatch.setattr(commands, "program", lambda: ".venv/bin/textgen")  # as the README runs it, from the clone
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = re.search(r"## Quick start\n(.*?)\n## ", readme, re.DOTALL)
    assert section is not None
    blocks = re.findall(r"```bash\n(.*?)```", section.group(1), re.DOTALL)
    first, own_text, scratch = quick_start()
    assert blocks[0].rstrip().endswith(f"&& {first}")  # the install, then the base model's sample
    assert own_text in blocks[1] and scratch in blocks[2]


def _called(monkeypatch: pytest.MonkeyPatch, hint: str) -> tuple[str, dict[str, Any]]:
    """Run a suggested command's arguments through the CLI, the library call replaced: what it would call."""
    from typer.testing import CliRunner

    from textgen import api
    from textgen.cli import app

    calls: list[tuple[str, dict[str, Any]]] = []
    for name in ("train", "tune", "open_generator"):
        monkeypatch.setattr(  # train takes a TrainRequest: its fields are the call's
            api,
            name,
            lambda *args, _name=name, **kwargs: (
                calls.append((_name, vars(args[0]) if _name == "train" else kwargs)) or (None, None)
            ),
        )
    for shown in ("textgen.trainview.show_train_result", "textgen.ui.show_sampling", "textgen.tuneview.show_study"):
        monkeypatch.setattr(shown, lambda *args, **kwargs: None)
    words = shlex.split(hint)
    assert words[0] == "textgen"
    done = CliRunner().invoke(app, words[1:])
    assert done.exit_code == 0, done.stderr
    (call,) = calls
    return call


@pytest.mark.parametrize("hint", [QUICK_START_TRAIN, FIRST_STUDY])
def test_a_suggested_first_run_fetches_its_corpus_and_ends_in_minutes(
    monkeypatch: pytest.MonkeyPatch, hint: str
) -> None:
    name, kwargs = _called(monkeypatch, f"textgen {hint}")
    assert kwargs["download"] is True  # a fresh clone has no corpus
    budget = kwargs["training"].time_budget if name == "train" else kwargs["time_budget"]
    assert budget is not None and budget <= 3600  # the defaults run for hours


def test_the_suggested_fine_tune_starts_from_the_base_in_minutes(monkeypatch: pytest.MonkeyPatch) -> None:
    name, kwargs = _called(monkeypatch, f"textgen {FINE_TUNE}")
    assert name == "train" and kwargs["init_from"].source == BASE_NAME
    assert kwargs["training"].time_budget == 120


def test_the_suggested_sample_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    name, kwargs = _called(monkeypatch, f"textgen {QUICK_START_SAMPLE}")
    assert name == "open_generator" and kwargs["fallback"] is True  # with no run, the base model


def _textgen(args: list[str], cwd: Path, *, module: bool = False) -> subprocess.CompletedProcess[str]:
    """textgen started as a user starts it from the clone, by its relative path; PATH does not find it."""
    start = [os.path.relpath(sys.executable, cwd), "-m", "textgen"] if module else [os.path.relpath(SCRIPT, cwd)]
    env = subprocess_env(PATH=os.defpath.replace(str(SCRIPT.parent), ""), COLUMNS="300")  # help unwrapped
    return subprocess.run([*start, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_hints_name_the_program_as_the_user_typed_it(tmp_path: Path) -> None:
    typed = os.path.relpath(SCRIPT, ROOT)  # .venv/bin/textgen
    empty = tmp_path / "none"
    empty.mkdir()
    runs = _textgen(["runs", "--checkpoint-dir", str(empty)], ROOT)
    assert runs.returncode == 0, runs.stderr
    assert f"use the base model {BASE_NAME}" in runs.stdout  # the package's, which sample would use
    assert f"from the base: {typed} {FINE_TUNE} --checkpoint-dir {empty}" in runs.stdout
    assert f"from scratch: {typed} {QUICK_START_TRAIN} --checkpoint-dir {empty}" in runs.stdout
    study = _textgen(["tune", "--show", "--checkpoint-dir", str(empty)], ROOT)
    assert f"start one: {typed} {FIRST_STUDY} --checkpoint-dir {empty}" in study.stderr
    helped = _textgen(["--help"], ROOT, module=True)
    assert f"{os.path.relpath(sys.executable, ROOT)} -m textgen {QUICK_START_TRAIN}" in helped.stdout


def test_with_no_base_model_an_empty_runs_list_suggests_training_from_scratch(
    tmp_path: Path, no_base_model: None
) -> None:
    from helpers import invoke

    result = invoke("runs", "--checkpoint-dir", str(tmp_path))
    assert result.exit_code == 0, result.stderr
    assert f"no runs in {tmp_path}/; train one: textgen {QUICK_START_TRAIN}" in " ".join(result.stdout.split())
    assert BASE_NAME not in result.stdout
