"""Helpers shared by the tests: tiny generated corpora, history reading, subprocess runs."""

from __future__ import annotations

import csv
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import strategies as st

from textgen.layout import StreamLayout
from textgen.settings import DataSettings, ModelSettings, TrainSettings

# fmt: off
WORDS = [
    "the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "and", "the", "cat",
    "sat", "on", "the", "mat", "while", "seven", "small", "birds", "sang", "in", "an", "old",
    "green", "tree", "by", "the", "river",
]
# fmt: on

# Tiny model settings shared by the training tests (seconds per run on 2 cores).
TINY_DATA = {"batch_size": 8, "seq_len": 32}
TINY_MODEL = {"units": 32, "embedding_dim": 8, "layers": 1, "dropout": 0.0}


def make_text(n_words: int, seed: int = 0) -> str:
    """Random words from a small list, broken into lines of 12 words."""
    rng = random.Random(seed)
    words = [rng.choice(WORDS) for _ in range(n_words)]
    lines = [" ".join(words[i : i + 12]) for i in range(0, len(words), 12)]
    return "\n".join(lines) + "\n"


def write_corpus(path: Path, n_words: int = 3000, seed: int = 0) -> Path:
    """Write a tiny generated corpus (about 4.5 characters per word) and return its path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(make_text(n_words, seed), encoding="utf-8")
    return path


def plan_run(corpus, profile, *, cache_dir: Path | None = None, encoding: str | None = None, **request):
    """A run planned as ``textgen.api.train`` plans it (the request checked, then planned) for ``profile``."""
    import dataclasses

    from textgen.request import check_request
    from textgen.settings import TrainRequest
    from textgen.training import loop
    from textgen.training.plan import plan_training

    if encoding is not None:
        request["data"] = dataclasses.replace(request.get("data", DataSettings()), encoding=encoding)
    checked = check_request(TrainRequest(corpus or (), **request))
    # Started by the loop's clock, which tests may fake (clock.BatchClock)
    return plan_training(checked, profile, started=loop.time.monotonic(), cache_dir=cache_dir)


def train_tiny_run(base: Path, name: str, model: dict, training: dict, n_words: int = 3000):
    """A tiny run trained in-process on a corpus generated under ``base`` (a few seconds); its ``Run``."""
    from textgen.device import CPU, apply_profile
    from textgen.training.loop import train

    apply_profile(CPU)
    corpus = str(write_corpus(base / "tiny.txt", n_words))
    checkpoints = base / "checkpoints"
    plan = plan_run(
        corpus,
        CPU,
        checkpoint_dir=checkpoints,
        run_name=name,
        data=DataSettings(**TINY_DATA),
        model=ModelSettings(**model),
        training=TrainSettings(**training),
    )
    train(plan)
    return plan.run


def read_history(run_path: Path) -> list[dict[str, float]]:
    """history.csv as a list of rows of floats; an empty cell (a column the row's epoch predates) is NaN."""
    with open(Path(run_path) / "history.csv", newline="") as fh:
        return [{k: float(v or "nan") for k, v in row.items()} for row in csv.DictReader(fh)]


def steps_per_epoch(n_train_ids: int, batch_size: int, seq_len: int, shift_windows: bool = True) -> int:
    """Batches in one epoch of the stateful layout, computed independently of textgen.data: with the windows
    shifted each epoch (the default), of the ids that leave room for a shift of up to seq_len - 1."""
    room = min(seq_len - 1, n_train_ids - 1 - batch_size * seq_len) if shift_windows else 0
    return (n_train_ids - 1 - room) // (batch_size * seq_len)


def subprocess_env(**extra: str) -> dict[str, str]:
    """The environment a user would have: no TF log level pre-set (in-process CLI tests set one)."""
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "PYTHONWARNINGS")}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def run_textgen(args: list[str], cwd: Path, timeout: float = 180, **env: str) -> subprocess.CompletedProcess[str]:
    """``python -m textgen ARGS`` in a subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "textgen", *args],
        cwd=cwd,
        env=subprocess_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_python(args: list[str], cwd: Path | None = None, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` in a fresh process, with a user's environment."""
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=subprocess_env(), capture_output=True, text=True, timeout=timeout
    )


def invoke(*args: str):
    """Run the CLI in-process."""
    from typer.testing import CliRunner

    from textgen.cli import app

    return CliRunner().invoke(app, list(args))


def assert_one_line_error(result, *fragments: str) -> str:
    """The command failed with exactly one line on stderr, starting with "error:", and no traceback."""
    assert result.exit_code != 0, result.stdout
    assert isinstance(result.exception, SystemExit), repr(result.exception)  # not an escaped exception
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    for fragment in fragments:
        assert fragment in lines[0]
    return lines[0]


def wait_until(condition: Callable[[], object], what: str, timeout: float = 10.0) -> None:
    """Poll ``condition`` until it holds; fail saying ``what`` did not happen. Generous: how soon it happens is for a
    benchmark to measure (benchmarks/serve.py), not for tests sharing 2 cores with another test process."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} within {timeout:.0f}s")
        time.sleep(0.01)


def wait_for(path: Path, text: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Poll ``path`` until it contains ``text``; fail if ``proc`` ends or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            pytest.fail(f"training ended early (exit {proc.returncode}):\n{path.read_text(errors='replace')}")
        time.sleep(0.1)
    proc.kill()
    pytest.fail(f"no {text!r} in the output within {timeout}s")


# --- the stream layout -------------------------------------------------------------


@st.composite
def layouts(draw: st.DrawFn) -> tuple[int, int, int]:
    """(n, streams, seq_len) with room for at least one batch."""
    streams = draw(st.integers(1, 8))
    seq_len = draw(st.integers(1, 12))
    n = draw(st.integers(streams * seq_len + 1, streams * seq_len * 7 + 20))
    return n, streams, seq_len


def all_batches(ids: np.ndarray, layout: StreamLayout) -> tuple[np.ndarray, np.ndarray]:
    """Every batch of the layout stacked: inputs and targets shaped (batches, streams, seq_len)."""
    pairs = [layout.batch(ids, k) for k in range(layout.batches)]
    return np.stack([x for x, _ in pairs]), np.stack([y for _, y in pairs])


def layout_of(n: int, streams: int, seq_len: int, shift: int | None) -> StreamLayout:
    """The plain layout, or (``shift``: a seed) a shifted one."""
    if shift is None:
        return StreamLayout.of(n, streams, seq_len)
    return StreamLayout.shifted(n, streams, seq_len, np.random.default_rng(shift))


SHIFTS = st.one_of(st.none(), st.integers(0, 2**32 - 1))
