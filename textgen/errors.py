"""One exception family whose messages tell the user what is wrong and what to do, and values cut short for them."""

from __future__ import annotations

import reprlib
from pathlib import Path
from typing import Any

from textgen.results import StopReason

_SHORT = reprlib.Repr()  # (its keyword arguments are Python 3.12's)
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxother = 2, 40, 40


def shown(value: Any) -> str:
    """A value for a message: its repr, cut short (a damaged file's may be megabytes, or nested thousands deep)."""
    return _SHORT.repr(value)


class TextgenError(Exception):
    """Base class: the CLI prints the message on one line and exits non-zero."""

    exit_code = 1


class CorpusError(TextgenError):
    """The corpus file is missing, unreadable, not text, or too short."""


class ConfigError(TextgenError):
    """A flag or config value is out of range or inconsistent."""


class FieldError(ConfigError):
    """A config field's value breaks its rule: which field and which rule (a server names them in its answer)."""

    def __init__(self, message: str, field: str, rule: str) -> None:
        super().__init__(message)
        self.field, self.rule = field, rule


class CheckpointError(TextgenError):
    """A run directory is missing, corrupt, or cannot be written."""


class WeightsError(CheckpointError):
    """A run's best or last weights are missing or damaged. The message's next step suits the commands that choose
    between them with --last (sample, evaluate, export, train --init-from); one without that choice (serve) puts its
    own with ``instead``."""

    def __init__(self, problem: str, step: str, run: Path) -> None:
        super().__init__(f"{problem}; {step}")
        self.problem, self.run = problem, run  # run: the run's directory

    def instead(self, step: str) -> WeightsError:
        """The same problem with another next step."""
        return WeightsError(self.problem, step, self.run)


class GenerationError(TextgenError):
    """TensorFlow failed while a model generated: out of memory, or an exported SavedModel it cannot run."""


class DeviceError(TextgenError):
    """The requested device profile cannot run on this machine."""


class TrainingStopped(TextgenError):
    """Training ended early: ``what`` happened, then what was saved and what to do (``step``)."""

    def __init__(self, what: str, step: str) -> None:
        super().__init__(f"{what}; {step}")
        self.what = what  # the event alone, as a study records a trial's end


class TrainingInterrupted(TrainingStopped):
    """Training stopped on a signal (Ctrl-C, SIGTERM, SIGHUP) after saving a resumable checkpoint."""

    stop_reason = StopReason.INTERRUPTED

    def __init__(self, what: str, step: str, exit_code: int = 130) -> None:
        super().__init__(what, step)
        self.exit_code = exit_code  # 128 + the signal's number, as a shell reports a process it stopped


class TrainingDiverged(TrainingStopped):
    """The training loss became NaN or infinite; nothing after the last resume point was saved."""

    stop_reason = StopReason.DIVERGED


class ClusterError(TextgenError):
    """Another worker of a multi-worker run stopped or became unreachable; the run keeps its last resume point."""

    stop_reason = StopReason.LOST_WORKER


class IdFileError(CorpusError):
    """An id file of the encoded corpus could not be read while in use (removed or damaged meanwhile)."""


class ExportInterrupted(TextgenError):
    """``textgen export`` stopped on a signal (Ctrl-C, SIGTERM, SIGHUP): its scratch directory is removed and an
    earlier export at its path is as it was."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code  # 128 + the signal's number, as a shell reports a process it stopped


class TextgenWarning(UserWarning):
    """Something to know that does not stop the command (an export too old to check): the CLI shows it as one
    "warning:" line."""


def one_line(exc: BaseException, limit: int = 300) -> str:
    """An exception's message on one line, cut to ``limit`` characters (TensorFlow's can hold a graph's nodes)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
