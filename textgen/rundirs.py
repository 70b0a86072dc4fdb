"""The runs of a checkpoint directory: a new run reserved under a free name, the latest usable run or a named one
found, and where studies are kept."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

from textgen.basemodel import has_base
from textgen.checkpoint import Run, RunLock, check_run_name
from textgen.commands import QUICK_START_TRAIN, checkpoint_dir_flag, command, fine_tune
from textgen.config import DEFAULT_CHECKPOINT_DIR, Weights
from textgen.errors import CheckpointError, ConfigError, WeightsError


def reserve_run(checkpoint_dir: Path, name: str | None, stem: str) -> tuple[Run, RunLock]:
    """A new run directory, created exclusively and locked: two processes never get the same one.

    ``name`` (``--run``) is used as given; otherwise ``stem`` made safe, with -2, -3, ... if taken.
    An existing empty directory of that name is taken over.
    """
    if name is not None:
        candidates: Iterator[str] = iter([check_run_name(name)])
    else:
        base = safe_name(stem)
        candidates = (base if n == 1 else f"{base}-{n}" for n in range(1, 1_000_000))
    for candidate in candidates:
        run = Run(Path(checkpoint_dir) / candidate)
        try:
            run.path.mkdir()
        except FileExistsError:
            if name is None:
                continue
            if not run.path.is_dir():
                raise ConfigError(f"{run.path} exists and is not a run directory; pick another --run") from None
            lock = RunLock(run)
            if any(p.name != ".lock" for p in run.path.iterdir()):
                lock.release()
                raise ConfigError(
                    f"run {name!r} already exists in {checkpoint_dir}/; add --resume to continue it or pick another --run"
                ) from None
            return run, lock
        except OSError as exc:
            raise CheckpointError(
                f"cannot write to {checkpoint_dir}: {exc.strerror}; choose another place with --checkpoint-dir"
            ) from None
        return run, RunLock(run)
    raise ConfigError(f"no free run name for {stem!r} in {checkpoint_dir}/; pick one with --run")


def safe_name(stem: str) -> str:
    """``stem`` (a file's name) as a run or study directory name."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", stem).strip("-._")[:90] or "run"


def discard_reserved(run: Run, lock: RunLock) -> None:
    """Remove a reserved run directory whose planning or creation failed, with what it wrote there (a base's
    weights, a config: nothing else can be in it), and unlock it: the same command then makes the run anew."""
    shutil.rmtree(run.path, ignore_errors=True)
    lock.release()


def list_runs(checkpoint_dir: Path = DEFAULT_CHECKPOINT_DIR) -> list[Run]:
    """Runs under ``checkpoint_dir`` (directories with a config.json), most recently updated first."""
    if not Path(checkpoint_dir).is_dir():
        return []
    runs = [Run(p) for p in Path(checkpoint_dir).iterdir() if (p / "config.json").is_file()]

    def updated(run: Run) -> float:
        times = [p.stat().st_mtime for p in (run.config_path, run.state_path) if p.exists()]
        return max(times, default=0.0)

    return sorted(runs, key=updated, reverse=True)


def find_run(
    checkpoint_dir: Path = DEFAULT_CHECKPOINT_DIR, name: str | None = None, weights: Weights | None = None
) -> Run:
    """The run called ``name``, or the most recently updated *usable* one (a run killed before its first
    save is never picked by default), with ``best`` or ``last`` weights if ``weights`` says so."""
    if name is not None:
        run = Run(Path(checkpoint_dir) / name)
        if not run.config_path.is_file():
            known = ", ".join(r.name for r in list_runs(checkpoint_dir)) or "none"
            raise CheckpointError(f"no run {name!r} in {checkpoint_dir}/ (runs: {known})")
        return run
    runs = list_runs(checkpoint_dir)
    usable = next((run for run in runs if run.is_usable(weights)), None)
    if usable is not None:
        return usable
    if runs:  # none is usable: say what is wrong with the latest
        runs[0].check_usable()
        if weights == Weights.best:
            raise WeightsError(
                f"{runs[0].best_weights_path} is missing: run {runs[0].name!r} has not finished its first epoch",
                "use --last, or train it further",
                runs[0].path,
            )
    flag = checkpoint_dir_flag(checkpoint_dir)
    scratch = f"train one first: {command(QUICK_START_TRAIN + flag)}"
    raise CheckpointError(
        f"no trained run in {checkpoint_dir}/; "
        + (
            f"{scratch}, or fine-tune the base model on your text: {fine_tune(checkpoint_dir=checkpoint_dir)}"
            if has_base()
            else scratch
        )
    )


def study_path(checkpoint_dir: Path, name: str, flag: str = "--study") -> Path:
    """Where ``textgen tune`` keeps a study: its database, its best recipe and its trials' runs."""
    return Path(checkpoint_dir) / "studies" / check_run_name(name, flag)


def ensure_writable(checkpoint_dir: Path) -> None:
    """Fail early, with what to do, if runs cannot be written under ``checkpoint_dir``."""
    try:
        Path(checkpoint_dir).mkdir(parents=True, exist_ok=True)
        probe = Path(checkpoint_dir) / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise CheckpointError(
            f"cannot write to {checkpoint_dir}: {exc.strerror}; choose another place with --checkpoint-dir"
        ) from None
