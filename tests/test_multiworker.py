"""Multi-worker training on tf.distribute: two real `textgen train --strategy multiworker` processes on
127.0.0.1 (free ports, one thread each) against one process, a worker killed, a stop on one worker, a resume."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import read_history, run_textgen, subprocess_env, write_corpus

# 64 streams x 16 characters, a tiny model: about 80 steps an epoch on the corpus below.
SETTINGS = ["--batch-size", "64", "--seq-len", "16", "--units", "32", "--embedding-dim", "8", "--dropout", "0"]
SETTINGS += ["--device", "cpu", "--threads", "1", "--lr", "0.01", "--json"]


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    return write_corpus(tmp_path / "books" / "tiny.txt", 20000)  # ~90,000 characters


def free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def start_workers(cwd: Path, args: list[str], ports: list[int]) -> list[tuple[subprocess.Popen, Path]]:
    """One `textgen train ARGS --strategy multiworker` per port, each told its place by TF_CONFIG."""
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    workers = []
    for index in range(len(ports)):
        log = cwd / f"worker{index}.log"
        tf_config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
        with open(log, "w") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "textgen", "train", *args, "--strategy", "multiworker"],
                cwd=cwd,
                env=subprocess_env(TF_CONFIG=tf_config),
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
        workers.append((proc, log))
    return workers


def finish(workers: list[tuple[subprocess.Popen, Path]], timeout: float = 240) -> list[int]:
    """Each worker's exit code; a worker still running after ``timeout`` fails the test (it hung)."""
    deadline = time.monotonic() + timeout
    codes = []
    for proc, log in workers:
        try:
            codes.append(proc.wait(timeout=max(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            for p, _ in workers:
                os.killpg(p.pid, signal.SIGKILL)
            pytest.fail(f"a worker hung:\n{log.read_text(errors='replace')}")
    return codes


def epoch_lines(log: Path) -> list[dict]:
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    return [line for line in lines if line.get("event") == "epoch"]


def wait_for_training(log: Path, proc: subprocess.Popen, steps_file: Path, timeout: float = 180) -> None:
    """Until the chief has saved a resume point inside the first epoch (its state.json exists)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not steps_file.exists():
        if proc.poll() is not None:
            pytest.fail(f"the worker ended early:\n{log.read_text(errors='replace')}")
        time.sleep(0.2)
    assert steps_file.exists(), log.read_text(errors="replace")


@pytest.mark.slow  # ~34 s: a two-worker cluster trained beside a single worker; the killed-chief test stays in the default suite
def test_two_workers_follow_one_workers_loss_trajectory(tmp_path: Path, corpus: Path) -> None:
    """Global batch 64 over two workers (32 streams each, each keeping its own rows) trains as one worker's
    batch of 64: the same mean training loss over every step of each epoch, and the same validation loss."""
    one = run_textgen(["train", str(corpus), *SETTINGS, "--epochs", "2", "--run", "one"], tmp_path, timeout=300)
    assert one.returncode == 0, one.stderr
    single = [json.loads(line) for line in one.stdout.splitlines() if '"event": "epoch"' in line]

    cluster_dir = tmp_path / "cluster"
    cluster_dir.mkdir()
    args = [str(corpus), *SETTINGS, "--epochs", "2", "--run", "two", "--checkpoint-dir", str(tmp_path / "ck")]
    workers = start_workers(cluster_dir, args, free_ports(2))
    assert finish(workers) == [0, 0], [log.read_text() for _, log in workers]
    for _, log in workers:
        epochs = epoch_lines(log)
        assert [e["epoch"] for e in epochs] == [1, 2]
        for mine, theirs in zip(epochs, single, strict=True):
            assert mine["batches"] == theirs["batches"] > 50
            assert mine["loss"] == pytest.approx(theirs["loss"], rel=1e-4)
            assert mine["val_loss"] == pytest.approx(theirs["val_loss"], rel=1e-4)
    # the chief wrote the run; the other worker wrote nothing beside it
    assert sorted(p.name for p in (tmp_path / "ck").iterdir() if not p.name.startswith(".")) == ["two"]
    assert [row["epoch"] for row in read_history(tmp_path / "ck" / "two")] == [0, 1]


# The chief's loss is the harder case (it writes the run); the other worker's costs 24 s more of the suite.
@pytest.mark.parametrize("victim", [pytest.param(1, marks=pytest.mark.slow), 0], ids=["worker", "chief"])
def test_a_killed_worker_stops_the_other_with_a_clear_error_and_the_cluster_resumes(
    tmp_path: Path, corpus: Path, victim: int
) -> None:
    checkpoint_dir = tmp_path / "ck"
    args = [str(corpus), *SETTINGS, "--epochs", "2", "--run", "mw", "--checkpoint-dir", str(checkpoint_dir)]
    args += ["--save-every", "1s"]
    workers = start_workers(tmp_path, args, free_ports(2))
    chief_proc, chief_log = workers[0]
    wait_for_training(chief_log, chief_proc, checkpoint_dir / "mw" / "state.json")
    os.killpg(workers[victim][0].pid, signal.SIGKILL)
    survivor_proc, survivor_log = workers[1 - victim]
    try:
        code = survivor_proc.wait(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(survivor_proc.pid, signal.SIGKILL)
        pytest.fail("the surviving worker hung after its peer was killed")
    workers[victim][0].wait()
    assert code == 1
    lines = [line for line in survivor_log.read_text().splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "another worker stopped or cannot be reached" in lines[0]
    assert "--resume" in lines[0]
    assert "Traceback" not in survivor_log.read_text()

    state = json.loads((checkpoint_dir / "mw" / "state.json").read_text())
    resumed_dir = tmp_path / "resumed"
    resumed_dir.mkdir()
    again = start_workers(resumed_dir, [*args, "--resume"], free_ports(2))
    assert finish(again) == [0, 0], [log.read_text() for _, log in again]
    done = [json.loads(line) for line in again[0][1].read_text().splitlines() if '"event": "done"' in line]
    assert done and done[0]["epochs"] == 2
    assert json.loads((checkpoint_dir / "mw" / "state.json").read_text())["step"] > state["step"]


# 33 s; the killed chief above covers a cluster that stops (run with -m slow)
@pytest.mark.slow
def test_sigterm_on_one_worker_stops_the_cluster_cleanly_with_a_resumable_run(tmp_path: Path, corpus: Path) -> None:
    checkpoint_dir = tmp_path / "ck"
    args = [str(corpus), *SETTINGS, "--epochs", "2", "--run", "mw", "--checkpoint-dir", str(checkpoint_dir)]
    args += ["--save-every", "1s"]
    workers = start_workers(tmp_path, args, free_ports(2))
    wait_for_training(workers[0][1], workers[0][0], checkpoint_dir / "mw" / "state.json")
    os.kill(workers[1][0].pid, signal.SIGTERM)
    codes = finish(workers, timeout=90)
    assert codes == [143, 143], [log.read_text() for _, log in workers]
    chief_output = workers[0][1].read_text()
    assert "a stop on another worker" in chief_output and "--resume" in chief_output
    assert not any("Traceback" in log.read_text() for _, log in workers)
    state = json.loads((checkpoint_dir / "mw" / "state.json").read_text())
    assert state["finished"] is None  # stopped, not done: resumed, the cluster trains on from where it stopped
    resumed_dir = tmp_path / "resumed"
    resumed_dir.mkdir()
    again = start_workers(resumed_dir, [*args, "--resume"], free_ports(2))
    assert finish(again) == [0, 0], [log.read_text() for _, log in again]
    final = json.loads((checkpoint_dir / "mw" / "state.json").read_text())
    assert final["finished"] == "epochs" and final["step"] > state["step"]


def fine_tune_in_a_cluster(tmp_path: Path, corpus: Path, ck: Path, init_from: str) -> dict:
    """Two workers fine-tune ``init_from`` on a text with a character the base never saw (run "ft" in ``ck``); both
    must finish and agree on the first epoch's loss. The new run's config."""
    new_text = tmp_path / "new" / "new.txt"
    new_text.parent.mkdir()
    new_text.write_text(corpus.read_text().replace(" the ", " thé "), encoding="utf-8")
    shape = {"--units", "--embedding-dim"}
    settings = [s for i, s in enumerate(SETTINGS) if s not in shape and (i == 0 or SETTINGS[i - 1] not in shape)]
    cluster_dir = tmp_path / "cluster"
    cluster_dir.mkdir()
    args = [str(new_text), *settings, "--epochs", "1", "--init-from", init_from, "--run", "ft", "--checkpoint-dir",
            str(ck)]  # fmt: skip
    workers = start_workers(cluster_dir, args, free_ports(2))
    assert finish(workers) == [0, 0], [log.read_text() for _, log in workers]
    chief, other = (epoch_lines(log) for _, log in workers)
    assert chief[0]["loss"] == pytest.approx(other[0]["loss"], rel=1e-6)
    return json.loads((ck / "ft" / "config.json").read_text())


def train_base(tmp_path: Path, corpus: Path, ck: Path) -> None:
    base = run_textgen(["train", str(corpus), *SETTINGS, "--epochs", "1", "--run", "base", "--checkpoint-dir",
                        str(ck)], tmp_path, timeout=300)  # fmt: skip
    assert base.returncode == 0, base.stderr


@pytest.mark.slow
def test_two_workers_fine_tune_from_a_run_in_the_shared_checkpoint_dir(tmp_path: Path, corpus: Path) -> None:
    """Each worker reads the base run where it plans (the other worker from a scratch copy), and both plan the same
    run: the base's directory is the one setting their configs may differ in."""
    ck = tmp_path / "ck"
    train_base(tmp_path, corpus, ck)
    config = fine_tune_in_a_cluster(tmp_path, corpus, ck, "base")
    assert config["init_from"]["name"] == "base"
    assert config["init_from"]["source"] == str((ck / "base").resolve())


@pytest.mark.slow  # ~55 s, as the one above: a training cluster; the export's read-back is tested in test_finetune.py
def test_two_workers_fine_tune_from_a_float_export(tmp_path: Path, corpus: Path) -> None:
    """Each worker reads the export's weights back itself, into its own scratch file: both plan the same run."""
    ck = tmp_path / "ck"
    train_base(tmp_path, corpus, ck)
    export = tmp_path / "exports" / "base-litert"
    exported = run_textgen(["export", "--run", "base", "--format", "litert", "-o", str(export), "--checkpoint-dir",
                            str(ck)], tmp_path, timeout=300)  # fmt: skip
    assert exported.returncode == 0, exported.stderr
    config = fine_tune_in_a_cluster(tmp_path, corpus, ck, str(export))
    assert config["init_from"]["name"] == "base" and config["init_from"]["export"] == "litert"
