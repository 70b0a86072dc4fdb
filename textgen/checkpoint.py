"""A run directory: config, vocabulary, weights, optimizer state and history, written atomically.

Layout of ``checkpoints/<run>/``::

    config.json        RunConfig (data, model, training, profile)
    vocab.json         the character vocabulary
    best.weights.h5    weights with the lowest validation loss so far
    last-*.weights.h5  weights at the resume point named by state.json
    optimizer-*.npz    optimizer variables at that point
    state.json         the commit record: resume point, callback states, best loss
    history.csv        one row per epoch
    loss_curve.txt     train and validation bits/char per epoch, as a text chart
    tensorboard/       TensorBoard logs

``state.json`` is replaced last, in one rename, and names the files of its resume
point, so a crash at any moment leaves the previous consistent state in place.
"""

from __future__ import annotations

import json
import math
import os
import re
import warnings
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from textgen.config import RunConfig
from textgen.errors import CheckpointError, ConfigError
from textgen.files import atomic_path, atomic_write_text
from textgen.results import RunSummary, StopReason, bits
from textgen.vocab import Vocabulary

if TYPE_CHECKING:
    import keras

DEFAULT_CHECKPOINT_DIR = Path("checkpoints")
_RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class Run:
    """One training run's directory."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    @property
    def name(self) -> str:
        return self.path.name

    config_path = property(lambda self: self.path / "config.json")
    vocab_path = property(lambda self: self.path / "vocab.json")
    best_weights_path = property(lambda self: self.path / "best.weights.h5")
    state_path = property(lambda self: self.path / "state.json")
    history_path = property(lambda self: self.path / "history.csv")
    loss_curve_path = property(lambda self: self.path / "loss_curve.txt")
    tensorboard_dir = property(lambda self: self.path / "tensorboard")

    # --- writing -----------------------------------------------------------

    def create(self, cfg: RunConfig, vocab: Vocabulary) -> None:
        """Make the directory and write the config and vocabulary."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            atomic_write_text(self.config_path, json.dumps(cfg.to_dict(), indent=2) + "\n")
            atomic_write_text(self.vocab_path, vocab.to_json() + "\n")
        except OSError as exc:
            raise CheckpointError(
                f"cannot write to {self.path}: {exc.strerror}; choose another place with --checkpoint-dir"
            ) from None

    def save_best(self, model: keras.Model) -> None:
        """Replace the best weights atomically."""
        with atomic_path(self.best_weights_path) as tmp:
            model.save_weights(tmp)

    def save_resume_point(
        self, model: keras.Model, optimizer: keras.optimizers.Optimizer, state: dict[str, Any]
    ) -> None:
        """Write weights and optimizer state for ``state`` (which must hold epoch and batch), then commit."""
        tag = f"e{state['epoch']:04d}-b{state['batch']:06d}"
        weights_name, optimizer_name = f"last-{tag}.weights.h5", f"optimizer-{tag}.npz"
        with atomic_path(self.path / weights_name) as tmp:
            model.save_weights(tmp)
        with atomic_path(self.path / optimizer_name) as tmp, open(tmp, "wb") as fh:
            np.savez(fh, *[np.asarray(v) for v in optimizer.variables])
        state = {**state, "last_weights": weights_name, "optimizer": optimizer_name}
        atomic_write_text(self.state_path, json.dumps(state, indent=2) + "\n")
        for stale in [*self.path.glob("last-*.weights.h5"), *self.path.glob("optimizer-*.npz")]:
            if stale.name not in (weights_name, optimizer_name):
                stale.unlink(missing_ok=True)

    def update_state(self, **changes: Any) -> None:
        """Change fields of state.json atomically."""
        state = {**self.load_state(), **changes}
        atomic_write_text(self.state_path, json.dumps(state, indent=2) + "\n")

    # --- reading -----------------------------------------------------------

    def load_config(self) -> RunConfig:
        try:
            return RunConfig.from_dict(self._read_json(self.config_path))
        except (ConfigError, TypeError) as exc:
            raise CheckpointError(f"{self.config_path} is corrupt ({exc}); train again") from None

    def load_vocab(self) -> Vocabulary:
        try:
            return Vocabulary.from_json(self.vocab_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise CheckpointError(f"{self.vocab_path} is missing: the run is incomplete; train again") from None
        except (ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{self.vocab_path} is corrupt ({exc}); train again") from None

    def load_state(self) -> dict[str, Any]:
        state = self._read_json(self.state_path)
        for key in ("epoch", "batch", "last_weights", "optimizer"):
            if key not in state:
                raise CheckpointError(f"{self.state_path} is corrupt (no {key!r}); train again")
        return state

    def has_state(self) -> bool:
        return self.state_path.is_file()

    def weights_path(self, which: str = "best") -> Path:
        """The weights file for ``best`` or ``last``."""
        path = self.best_weights_path if which == "best" else self.path / self.load_state()["last_weights"]
        if not path.is_file():
            raise CheckpointError(f"{path} is missing: the run has no saved weights yet; train it first")
        return path

    def load_weights(self, model: keras.Model, which: str = "best") -> None:
        """Load ``best`` or ``last`` weights into ``model`` (any batch size)."""
        path = self.weights_path(which)
        # Keras warns (and then raises) about a file of another model: keep its warnings unless it loads.
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                model.load_weights(path)
            except Exception as exc:  # h5py and Keras raise many kinds for a damaged file
                raise CheckpointError(
                    f"{path} is corrupt or from another model ({_one_line(exc)}); train again"
                ) from None
        for warning in caught:
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)

    def load_optimizer(self, optimizer: keras.optimizers.Optimizer) -> None:
        """Restore optimizer variables (the optimizer must be built)."""
        path = self.path / self.load_state()["optimizer"]
        try:
            with np.load(path) as saved:
                values = [saved[f"arr_{i}"] for i in range(len(saved.files))]
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
            raise CheckpointError(f"{path} is missing or corrupt ({exc}); cannot resume, train again") from None
        variables = optimizer.variables
        if len(values) != len(variables) or any(
            v.shape != tuple(var.shape) for v, var in zip(values, variables, strict=True)
        ):
            raise CheckpointError(f"{path} does not match this model's optimizer; cannot resume, train again")
        for var, value in zip(variables, values, strict=True):
            var.assign(value)

    def _read_json(self, path: Path) -> dict[str, Any]:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise CheckpointError(f"{path} is missing: {self.path} is not a complete run; train again") from None
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"{path} is corrupt ({exc}); train again") from None
        if not isinstance(data, dict):
            raise CheckpointError(f"{path} is corrupt (not a JSON object); train again")
        return data


def _one_line(exc: Exception, limit: int = 300) -> str:
    """An exception's message on one line, cut to ``limit`` characters (Keras' can hold whole arrays)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def list_runs(checkpoint_dir: Path = DEFAULT_CHECKPOINT_DIR) -> list[Run]:
    """Runs under ``checkpoint_dir``, most recently updated first."""
    if not Path(checkpoint_dir).is_dir():
        return []
    runs = [Run(p) for p in Path(checkpoint_dir).iterdir() if (p / "config.json").is_file()]

    def updated(run: Run) -> float:
        return max(p.stat().st_mtime for p in (run.config_path, run.state_path) if p.exists())

    return sorted(runs, key=updated, reverse=True)


def run_summaries(checkpoint_dir: Path = DEFAULT_CHECKPOINT_DIR) -> list[RunSummary]:
    """Every run under ``checkpoint_dir``, most recently updated first, as ``textgen runs`` lists them."""
    return [_summary(run) for run in list_runs(checkpoint_dir)]


def _summary(run: Run) -> RunSummary:
    cfg = run.load_config()
    state = run.load_state() if run.has_state() else {}
    best = state.get("best_val_loss")
    finished = state.get("finished")
    if finished is not None and finished not in {r.value for r in StopReason}:
        raise CheckpointError(f"{run.state_path} is corrupt (finished={finished!r}); train again")
    return RunSummary(
        run=run.name,
        corpus=Path(cfg.data.corpus).name,
        model=f"{cfg.model.layers}x{cfg.model.units}" + (f" d{cfg.model.dropout:g}" if cfg.model.dropout else ""),
        epochs=state.get("epoch", 0),
        batches_into_epoch=state.get("batch", 0),
        steps=state.get("step", 0),
        best_val_bpc=bits(best) if best is not None and math.isfinite(best) else None,
        seconds=state.get("seconds", 0.0),
        finished=StopReason(finished) if finished else None,
        device=cfg.profile.name,
        config=cfg.to_dict(),
    )


def find_run(checkpoint_dir: Path = DEFAULT_CHECKPOINT_DIR, name: str | None = None) -> Run:
    """The run called ``name``, or the most recently updated one."""
    if name is not None:
        run = Run(Path(checkpoint_dir) / name)
        if not run.config_path.is_file():
            known = ", ".join(r.name for r in list_runs(checkpoint_dir)) or "none"
            raise CheckpointError(f"no run {name!r} in {checkpoint_dir}/ (runs: {known})")
        return run
    runs = list_runs(checkpoint_dir)
    if not runs:
        raise CheckpointError(
            f"no trained run in {checkpoint_dir}/; train one first: textgen train 2600-0.txt --device cpu"
        )
    return runs[0]


def new_run_name(checkpoint_dir: Path, stem: str) -> str:
    """``stem`` made safe for a directory name, with -2, -3, ... if it is taken."""
    base = re.sub(r"[^A-Za-z0-9._-]+", "-", stem).strip("-.") or "run"
    name, n = base, 1
    while (Path(checkpoint_dir) / name).exists():
        n += 1
        name = f"{base}-{n}"
    return name


def resume_hint(run: Run) -> str:
    """How to continue ``run`` from the command line."""
    where = "" if run.path.parent == DEFAULT_CHECKPOINT_DIR else f" --checkpoint-dir {run.path.parent}"
    return f"continue with: textgen train --resume --run {run.name}{where}"


def check_run_name(name: str) -> str:
    """``name`` if it is a valid run directory name."""
    if not _RUN_NAME.match(name):
        raise ConfigError(f"--run must be letters, digits, '.', '_' or '-' (got {name!r})")
    return name


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
