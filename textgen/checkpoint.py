"""A run directory: config, vocabulary, weights, optimizer state and history, written atomically.

Layout of ``checkpoints/<run>/``::

    config.json        RunConfig (data, model, training, profile)
    vocab.json         the character vocabulary
    best.weights.h5    model weights with the lowest validation loss so far (the loss is stored in the file)
    last-*.weights.h5  model weights at the resume point named by state.json
    optimizer-*.npz    optimizer variables at that point
    state.json         the commit record: resume point, callback states, best loss, history
    history.csv        one row per epoch, rewritten from state.json after each commit
    .lock              locked (flock) by the process training the run
    loss_curve.txt     train and validation bits/char per epoch, as a text chart (a table for a short run)
    loss_curve.svg     the same curves as an image
    tensorboard/       TensorBoard logs

``state.json`` is the commit: replaced in one rename after the files it names, so a crash
at any moment leaves the previous consistent state in place. history.csv is rewritten from
it after each commit, and again by the next process that locks the run, which also removes
what an interrupted save left behind (temporary files, unnamed resume files).
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import fcntl
import io
import json
import math
import os
import re
import shutil
import warnings
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from textgen.commands import checkpoint_dir_flag, command
from textgen.config import DataConfig, RunConfig, Weights
from textgen.corpus import check_unchanged
from textgen.errors import CheckpointError, ConfigError, WeightsError, one_line, shown
from textgen.files import MAX_JSON_BYTES, TEMPORARY, atomic_path, atomic_write_text, read_json_object
from textgen.results import METRICS, StopReason
from textgen.typedjson import json_problem
from textgen.vocab import Vocabulary
from textgen.weightsfile import checked_checksum, save_weights

if TYPE_CHECKING:
    import keras

VOCAB_BYTES = 8 * 2**20  # all of Unicode, 4 bytes a character
# state.json holds the history, ~340 bytes an epoch: 64 MB is some 190,000 epochs.
STATE_BYTES = 64 * 2**20
BATCH_LOSSES_HEADER = "epoch,batch,steps,bpc\n"
CALLBACK_COUNTERS = ("wait", "best", "cooldown_counter")  # what state.json keeps of a stateful Keras callback
_RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")  # 100 characters: far below any filesystem's limit


@dataclass(frozen=True)
class EpochProgress:
    """How far an epoch's training has got, and the sums its history row is made of. Saved with every
    mid-epoch resume point, so the row of an epoch that was resumed covers all of it."""

    batch: int = 0  # the next batch to train
    loss_sum: float = 0.0
    batches: int = 0
    seconds: float = 0.0

    @property
    def loss(self) -> float:
        return self.loss_sum / self.batches if self.batches else math.nan


@dataclass(frozen=True)
class ResumeState:
    """``state.json``, the run's commit record: where training resumes and what it had reached. Written only by
    ``Run.save_resume_point`` and ``Run.mark_finished``, read only by ``Run.load_state``, which checks every field
    (older runs lack some: they get the defaults)."""

    epoch: int  # the epoch training resumes in (0-based)
    batch: int  # the next batch of that epoch
    step: int = 0  # optimizer updates so far
    seconds: float = 0.0  # of training, all invocations
    best_val_loss: float = math.inf
    start_val_loss: float | None = None  # a fine-tuned run's starting weights on validation, scored before training
    last_weights: str = ""  # the files of this resume point (named by ``save_resume_point``)
    optimizer: str = ""
    stream_states: str | None = None  # the streams' LSTM states, mid-epoch
    epoch_progress: EpochProgress | None = None  # the resumed epoch's sums, mid-epoch
    callbacks: dict[str, dict[str, float]] = field(default_factory=dict)  # early stopping's and the plateau's counters
    history: tuple[dict[str, float], ...] | None = None  # one row per epoch (None in runs that kept it in CSV only)
    finished: StopReason | None = None  # why training ended; None: stopped by a signal, or still training

    def to_json(self) -> str:
        state = dataclasses.asdict(self)
        state["history"] = None if self.history is None else list(self.history)
        return json.dumps(state, indent=2) + "\n"

    @classmethod
    def from_json(cls, data: dict[str, Any], path: Path) -> ResumeState:
        """The state in ``data``, read from ``path``; a field of the wrong type is a damaged file."""

        def damaged(what: str) -> CheckpointError:
            return CheckpointError(f"{path} is corrupt ({what}); train again")

        # Unknown keys are left out, and null ones take the default: neither is damage.
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known and v is not None}
        for key in ("epoch", "batch", "last_weights", "optimizer"):
            if key not in values:
                raise damaged(f"no {key!r}")
        problem = json_problem(values, cls, "")
        if problem:
            raise damaged(problem)
        bounds = {
            "epoch": 2**53, "batch": 2**53, "step": 2**53, "seconds": 2**53, "best_val_loss": math.inf,
            "start_val_loss": math.inf,
        }  # fmt: skip
        for key, most in bounds.items():
            if not 0 <= values.get(key, 0) <= most:  # NaN too
                raise damaged(f"{key}={shown(values[key])}")
        for key in ("last_weights", "optimizer", "stream_states"):  # plain names of files in the run's directory
            if values.get(key) and not _RUN_NAME.fullmatch(values[key]):
                raise damaged(f"{key}={shown(values[key])}")
        for row in values.get("history", ()):  # history.csv's rows, by epoch
            if "epoch" not in row or not set(row) <= {"epoch", *METRICS}:
                raise damaged(f"history row {shown(row)}")
        for name, counters in values.get("callbacks", {}).items():
            if not set(counters) <= set(CALLBACK_COUNTERS):  # restored with setattr: nothing else may be set
                raise damaged(f"callbacks.{name} holds {sorted(set(counters) - set(CALLBACK_COUNTERS))}")
        if "finished" in values:
            values["finished"] = StopReason(values["finished"])
        if "epoch_progress" in values:
            values["epoch_progress"] = EpochProgress(**values["epoch_progress"])
        if "history" in values:
            values["history"] = tuple(values["history"])
        return cls(**values)


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
    init_weights_path = property(lambda self: self.path / "init.weights.h5")  # a fine-tuned run's base weights
    state_path = property(lambda self: self.path / "state.json")
    history_path = property(lambda self: self.path / "history.csv")
    batch_losses_path = property(lambda self: self.path / "batch_losses.csv")  # the first epochs', for the curve
    loss_curve_path = property(lambda self: self.path / "loss_curve.txt")
    loss_svg_path = property(lambda self: self.path / "loss_curve.svg")
    tensorboard_dir = property(lambda self: self.path / "tensorboard")

    # --- writing -----------------------------------------------------------

    def create(self, cfg: RunConfig, vocab: Vocabulary) -> None:
        """Write the config and vocabulary into the (reserved) directory."""
        self.save_config(cfg, new=True)
        with self._saving("the run's vocabulary", new=True):
            atomic_write_text(self.vocab_path, vocab.to_json() + "\n")

    def save_config(self, cfg: RunConfig, new: bool = False) -> None:
        """Write the run's config: when it is created (``new``), and when a resume extends its epochs or time
        budget, so that a plain ``--resume`` after that keeps the extension."""
        with self._saving("the run's config", new):
            atomic_write_text(self.config_path, json.dumps(cfg.to_dict(), indent=2) + "\n")

    def copy_in_weights(self, source: Path) -> str:
        """Copy a base run's weights file (``Run.intact_weights``) into this run (``init.weights.h5``), atomically,
        the copy checked against its checksum too; the checksum of its arrays."""
        with self._saving("the base run's weights", new=True), atomic_path(self.init_weights_path) as tmp:
            shutil.copyfile(source, tmp)
            try:
                return checked_checksum(tmp)
            except ValueError as exc:  # changed since it was checked: not a failed write (no OSError for _saving)
                raise CheckpointError(f"{source} is corrupt ({exc}); run the command again") from None

    def load_init_weights(self, model: keras.Model) -> None:
        """Load the base run's weights that ``copy_in_weights`` kept into ``model`` (the base run's shape)."""
        self._load_weights_file(model, self.init_weights_path)

    def save_best(self, model: keras.Model, val_loss: float) -> None:
        """Replace the best weights atomically; the file carries its validation loss, so a run killed
        before its next commit still knows how good its best weights are."""
        with self._saving("the best weights"), atomic_path(self.best_weights_path) as tmp:
            save_weights(model, tmp, textgen_val_loss=val_loss)

    def best_weights_loss(self) -> float:
        """The validation loss stored in the best weights file (inf if there is none, or it is unreadable: any
        epoch may then replace the file)."""
        import h5py

        try:
            with h5py.File(self.best_weights_path, "r") as fh:
                loss = float(fh.attrs.get("textgen_val_loss", math.inf))
        except Exception:  # h5py raises many kinds for a damaged file; loading the weights says which
            return math.inf
        return loss if not math.isnan(loss) else math.inf

    def save_resume_point(
        self,
        model: keras.Model,
        optimizer: keras.optimizers.Optimizer,
        state: ResumeState,
        stream_states: list[np.ndarray] | None = None,
    ) -> None:
        """Write weights and optimizer state for ``state``, and mid-epoch the streams' LSTM states, then commit it by
        replacing state.json (with the names of those files); history.csv is then rewritten from the committed
        history."""
        tag = f"e{state.epoch:04d}-b{state.batch:06d}"
        state = dataclasses.replace(
            state,
            last_weights=f"last-{tag}.weights.h5",
            optimizer=f"optimizer-{tag}.npz",
            stream_states=f"states-{tag}.npz" if stream_states is not None else None,
        )
        with self._saving("a resume point"):
            with atomic_path(self.path / state.last_weights) as tmp:
                save_weights(model, tmp)
            with atomic_path(self.path / state.optimizer) as tmp, open(tmp, "wb") as fh:
                np.savez(fh, *[np.asarray(v) for v in optimizer.variables])
            if state.stream_states is not None:
                with atomic_path(self.path / state.stream_states) as tmp, open(tmp, "wb") as fh:
                    np.savez(fh, *(stream_states or []))
            atomic_write_text(self.state_path, state.to_json())
            self._write_history(state.history or ())
            self._remove_unreferenced(state)

    def start_over(self) -> None:
        """Remove what an attempt that never committed a resume point left, keeping config and vocabulary."""
        with self._saving("the run"):
            for path in (
                self.best_weights_path,
                self.history_path,
                self.batch_losses_path,
                self.loss_curve_path,
                self.loss_svg_path,
                self.state_path,
            ):
                path.unlink(missing_ok=True)
            self._remove_unreferenced(None)

    def mark_finished(self, reason: StopReason) -> None:
        """Record in state.json why training ended; the resume point stays usable for more epochs."""
        state = dataclasses.replace(self.load_state(), finished=reason)
        with self._saving("state.json"):
            atomic_write_text(self.state_path, state.to_json())

    def add_batch_loss(self, epoch: int, batch: int, steps: int, bpc: float) -> None:
        """Append a training loss to batch_losses.csv: ``bpc``, the mean of the batches of ``epoch`` (0-based) up to
        ``batch`` since the last row, of its ``steps``. Not part of a commit: ``keep_batch_losses`` drops the rows a
        resumed run trains again."""
        with self._saving("the batch losses"):
            header = "" if self.batch_losses_path.exists() else BATCH_LOSSES_HEADER
            with open(self.batch_losses_path, "a", encoding="utf-8") as fh:
                fh.write(f"{header}{epoch},{batch},{steps},{bpc:.5f}\n")

    def keep_batch_losses(self, epoch: int, batch: int) -> None:
        """Keep the batch losses up to batch ``batch`` of ``epoch`` (where a resumed run starts), and drop a row a kill
        cut short."""
        if not self.batch_losses_path.exists():
            return

        def kept(row: str) -> bool:
            fields = row.split(",")
            try:
                return len(fields) == 4 and float(fields[3]) >= 0 and (int(fields[0]), int(fields[1])) <= (epoch, batch)
            except ValueError:
                return False

        with self._saving("the batch losses"):
            rows = self.batch_losses_path.read_text(encoding="utf-8").splitlines()
            atomic_write_text(
                self.batch_losses_path, BATCH_LOSSES_HEADER + "".join(f"{row}\n" for row in filter(kept, rows))
            )

    def _write_history(self, rows: Iterable[dict[str, Any]]) -> None:
        out = io.StringIO()
        writer = csv.DictWriter(out, ["epoch", *sorted(METRICS)], lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        atomic_write_text(self.history_path, out.getvalue())

    def _remove_unreferenced(self, state: ResumeState | None) -> None:
        """Delete what no commit refers to: older resume files, and temporary files of interrupted saves."""
        keep = {state.last_weights, state.optimizer, state.stream_states} if state else set()
        for path in self.path.iterdir():
            stale = path.name.startswith(("last-", "optimizer-", "states-")) and path.name not in keep
            if stale or TEMPORARY.match(path.name):
                path.unlink(missing_ok=True)

    @contextlib.contextmanager
    def _saving(self, what: str, new: bool = False) -> Iterator[None]:
        """A failed write (disk full, permissions, a vanished directory) as one line; the atomic writes have
        left the previous resume point as it was. A ``new`` run, being made, has none: it is discarded, so the
        command is run again rather than resumed."""
        try:
            yield
        except OSError as exc:
            reason = exc.strerror or str(exc)
            if new:
                then = "run the command again (or choose another place with --checkpoint-dir)"
            else:
                then = resume_hint(self)
                reason += "; the last resume point is intact"
            raise CheckpointError(
                f"could not save {what} in {self.path}: {reason}. Free space or fix permissions, then {then}"
            ) from None

    def lock(self) -> RunLock:
        """Lock the run for this process (one writer per run); tidy up after an interrupted save."""
        lock = RunLock(self)
        try:
            state = self.load_state() if self.has_state() else None
        except CheckpointError:
            return lock  # what state.json refers to is unknown: delete nothing
        with self._saving("the run's history"):
            if state and state.history is not None:  # a kill between committing state.json and rewriting history.csv
                self._write_history(state.history)
            self._remove_unreferenced(state)
        return lock

    # --- reading -----------------------------------------------------------

    def load_config(self) -> RunConfig:
        try:
            return RunConfig.from_dict(self._read_json(self.config_path))
        except ConfigError as exc:
            raise CheckpointError(f"{self.config_path} is corrupt ({exc}); train again") from None

    def load_vocab(self, size: int | None = None) -> Vocabulary:
        """The run's vocabulary, checked against its model's size (``size``, or config.json's when not given)."""
        chars = self._read_json(self.vocab_path, VOCAB_BYTES).get("chars")
        if not isinstance(chars, str) or len(set(chars)) != len(chars):
            what = "'chars' is not a string" if not isinstance(chars, str) else "a character appears twice"
            raise CheckpointError(f"{self.vocab_path} is corrupt ({what}); train again")
        vocab = Vocabulary(tuple(chars))
        expected = size if size is not None else self.load_config().model.vocab_size
        if vocab.size != expected:
            raise CheckpointError(
                f"{self.vocab_path} has {vocab.size} ids but config.json's model has {expected}: "
                "the files are from different runs; train again"
            )
        return vocab

    def load_state(self) -> ResumeState:
        """The committed resume point (state.json), checked field by field."""
        return ResumeState.from_json(self._read_json(self.state_path, STATE_BYTES), self.state_path)

    def has_state(self) -> bool:
        return self.state_path.is_file()

    def check_usable(self, vocab_size: int | None = None) -> None:
        """Raise what keeps sample, evaluate and resume from using the run: damaged files, or no committed
        resume point (a run killed before its first save). The vocabulary is checked against the model's size
        (``vocab_size``, or config.json's)."""
        self.load_vocab(vocab_size)
        if not self.has_state():
            raise CheckpointError(
                f"run {self.name!r} never saved a resume point (it was stopped before its first save); "
                f"{resume_hint(self, what='train it')}"
            )
        state = self.load_state()
        for name in (state.last_weights, state.optimizer):
            if not (self.path / name).is_file():
                raise CheckpointError(f"{self.path / name} is missing: the run is damaged; train again")

    def is_usable(self, weights: Weights | None = None) -> bool:
        """Whether ``check_usable`` passes, and the ``best`` weights exist when those are asked for (a run
        saves its first best weights at its first epoch's end, after its first resume point; a fine-tuned one, its
        base's, before its first update)."""
        try:
            self.check_usable()
        except CheckpointError:
            return False
        return weights != Weights.best or self.best_weights_path.is_file()

    def weights_path(self, which: Weights = Weights.best) -> Path:
        """The weights file for ``best`` or ``last``."""
        path = self.best_weights_path if which == Weights.best else self.path / self.load_state().last_weights
        if not path.is_file():
            if which == Weights.best and self.is_usable(Weights.last):  # stopped before its first epoch's end, say
                raise WeightsError(
                    f"{path} is missing: the run has no best weights yet (they are saved when an epoch ends)",
                    "use --last for the weights of its last resume point, or train it further",
                    self.path,
                )
            raise CheckpointError(f"{path} is missing: the run has no saved weights yet; train it first")
        return path

    def load_weights(self, model: keras.Model, which: Weights = Weights.best) -> None:
        """Load ``best`` or ``last`` weights into ``model`` (any batch size)."""
        path = self.weights_path(which)
        try:
            self._load_weights_file(model, path)
        except CheckpointError:
            # A trainer's commit may have replaced the last weights between reading state.json and opening them.
            if which != Weights.last or path.exists() or self.weights_path(Weights.last) == path:
                raise
            self._load_weights_file(model, self.weights_path(Weights.last))

    def intact_weights(self, which: Weights = Weights.best) -> Path:
        """The weights file for ``best`` or ``last``, once its arrays match the checksum saved with them: a run made
        from it is refused before it is created, not when it first loads them."""
        path = self.weights_path(which)
        self._check_intact(path)
        return path

    def _check_intact(self, path: Path) -> None:
        try:
            checked_checksum(path)
        except ValueError as exc:
            raise WeightsError(f"{path} is corrupt ({exc})", self._instead(path), self.path) from None

    def _load_weights_file(self, model: keras.Model, path: Path) -> None:
        self._check_intact(path)
        # Keras warns (and then raises) about a file of another model: keep its warnings unless it loads.
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                # The model's variables only: the optimizer's are restored by load_optimizer, and files from
                # before issue 41 carry a copy of them.
                optimizer = getattr(model, "optimizer", None)
                model.load_weights(path, **({"objects_to_skip": [optimizer]} if optimizer else {}))
            except Exception as exc:  # h5py and Keras raise many kinds for a damaged file
                raise WeightsError(
                    f"{path} is corrupt or from another model ({one_line(exc)})", self._instead(path), self.path
                ) from None
        for warning in caught:
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)

    def _instead(self, path: Path) -> str:
        """How to go on without the damaged file ``path``: the best weights stand in for the resume point's, and
        the resume point's for the best."""
        if path == self.best_weights_path:
            return "use --last to read the last resume point's weights instead"
        return (
            "the run cannot resume from it, but its best weights still sample and evaluate; train a new run to "
            "train further"
        )

    def load_optimizer(self, optimizer: keras.optimizers.Optimizer) -> None:
        """Restore optimizer variables (the optimizer must be built)."""
        path = self.path / self.load_state().optimizer
        values = self._load_arrays(path)
        variables = optimizer.variables
        if len(values) != len(variables) or any(
            v.shape != tuple(var.shape) for v, var in zip(values, variables, strict=True)
        ):
            raise CheckpointError(f"{path} does not match this model's optimizer; {self._instead(path)}")
        for var, value in zip(variables, values, strict=True):
            var.assign(value)

    def load_stream_states(self) -> list[np.ndarray] | None:
        """The streams' LSTM states saved with a mid-epoch resume point (None at an epoch's start, or in a run
        from before they were saved: its streams restart cold)."""
        name = self.load_state().stream_states
        if not name:
            return None
        return self._load_arrays(self.path / name)

    def _load_arrays(self, path: Path) -> list[np.ndarray]:
        """The arrays of a resume point's ``.npz`` file (a zip: each member's CRC finds a flipped bit)."""
        try:
            with np.load(path) as saved:
                return [saved[f"arr_{i}"] for i in range(len(saved.files))]
        except Exception as exc:  # numpy and zipfile raise many kinds for a damaged file
            raise CheckpointError(f"{path} is missing or corrupt ({one_line(exc)}); {self._instead(path)}") from None

    def _read_json(self, path: Path, max_bytes: int = MAX_JSON_BYTES) -> dict[str, Any]:
        try:
            return read_json_object(path, max_bytes)
        except FileNotFoundError:
            raise CheckpointError(f"{path} is missing: {self.path} is not a complete run; train again") from None
        except OSError as exc:
            raise CheckpointError(f"cannot read {path}: {exc.strerror or exc}") from None
        except ValueError as exc:
            raise CheckpointError(f"{path} is corrupt ({one_line(exc)}); train again") from None


class RunLock:
    """An exclusive ``flock`` on a run's ``.lock`` file, held by the one process that trains the run.

    The kernel releases it when the process exits, however it exits (kill -9 included), so there is
    never a stale lock to clean up by hand. Reading a run (sample, evaluate, runs) takes no lock.
    """

    def __init__(
        self,
        run: Run,
        busy: str = "run {name!r} is being trained by process {pid}; wait for it, stop it, or pick another --run",
    ) -> None:
        try:
            fd = os.open(run.path / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise CheckpointError(
                f"cannot write to {run.path}: {exc.strerror}; choose another place with --checkpoint-dir"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise CheckpointError(busy.format(name=run.name, pid=holder)) from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)  # for the message another process shows
        except OSError:
            pass  # the lock holds without it; only that message loses the PID
        self._release = weakref.finalize(self, os.close, fd)  # closing the file releases the lock

    def release(self) -> None:
        self._release()

    @property
    def held(self) -> bool:
        """Whether this process still holds the lock (until ``release``, or the lock's end)."""
        return self._release.alive


def check_corpus_unchanged(run: Run, data: DataConfig) -> None:
    """Refuse a corpus whose bytes changed since the run started: its splits would not be the run's."""
    paths = [Path(p) for p in data.paths]
    what = str(paths[0]) if len(paths) == 1 else f"a file of {data.corpus}"
    check_unchanged(
        paths,
        (data.corpus_size or 0, data.corpus_hash) if data.corpus_hash is not None else None,
        gone=lambda path: f"the corpus of run {run.name!r}, {path}, is gone; put it back to continue the run",
        changed=lambda then, now: (
            f"{what} changed since run {run.name!r} started ({then:,} bytes then, {now:,} "
            "now); its splits would differ. Restore the original text, or start a new run on the new one"
        ),
    )


def resume_hint(run: Run, more: str = "", what: str = "continue with") -> str:
    """How to continue ``run`` from the command line; ``more``: the flags a finished run needs to train further,
    ``what``: what they do (``train 30 more minutes``)."""
    return f"{what}: {command('train --resume')} --run {run.name}{checkpoint_dir_flag(run.path.parent)}{more}"


def check_run_name(name: str, flag: str = "--run") -> str:
    """``name`` if it is a valid run (or study) directory name."""
    if not _RUN_NAME.match(name):
        raise ConfigError(
            f"{flag} must be 1 to 100 letters, digits, '.', '_' or '-', starting with a letter or digit (got {name!r})"
        )
    return name
