"""The state every prompt is read from: one the model knows, not all zeros.

Training reads the zero state only at the first batch of each stream, so a short prompt read from zeros often
starts with garbage (``AxTOUZ7R NIPOS``; issue 57, part 3). Instead, the sampler starts from the state a model
reaches at the start of a paragraph: the model reads the ``CONTEXT`` characters before each of ``CANDIDATES``
paragraph starts of the run's training split (the text right after a blank line), and of the states it reaches
just before each paragraph's first character, the one nearest their mean is kept: a real state, not the mean.

With it are kept the logits there, what the model expects a paragraph to begin with: a prompt with nothing to read
(``textgen sample`` with no ``--prime``) starts from them, at a paragraph's start, rather than reading a newline
first (a third one after the blank line: a chapter heading, in a book). It is saved in the run directory as
``start-best.npz`` / ``start-last.npz`` (one per weights file), with the weights file's checksum: a missing,
stale (other weights) or damaged file, or one from before the logits were kept, is computed again (~1 s for the
default model on 2 cores) and rewritten atomically; a read-only run directory computes it each time. Exports carry
it in their own ``start.npz``. Scoring (``evaluate``, validation) still starts from zeros, as training does.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from textgen.checkpoint import Run, check_corpus_unchanged
from textgen.config import Weights
from textgen.errors import TextgenError
from textgen.files import atomic_path
from textgen.generation import Sampler, Start, States
from textgen.vocab import DOCUMENT_BOUNDARY, UNKNOWN_ID, Vocabulary
from textgen.weightsfile import weights_checksum as checksum_of

CANDIDATES = 64  # paragraph starts the state is chosen among
CONTEXT = 256  # characters read before each: far beyond what the zero state's influence lasts
SEARCHED = 2**23  # characters of the training split searched for paragraph starts: its first 8 M (a book is 3 M)
START_VERSION = 1  # the format of a start file


def start_path(run: Run, which: Weights) -> Path:
    """Where ``run``'s start state for its ``which`` weights is saved."""
    return run.path / f"start-{Weights(which).value}.npz"


def paragraph_starts(ids: np.ndarray, vocab: Vocabulary, count: int = CANDIDATES, context: int = CONTEXT) -> np.ndarray:
    """Up to ``count`` positions of ``ids``, spread evenly over it, where a paragraph begins (after a blank line or a
    document boundary) with at least ``context`` characters before it; in a text without blank lines, line starts;
    without either, evenly spaced positions."""
    ids = np.asarray(ids)
    context = min(context, max(1, len(ids) - 1))
    newline, boundary = (int(vocab.encode(c)[0]) for c in ("\n", DOCUMENT_BOUNDARY))
    position = np.arange(context, len(ids))
    follows = ids[context - 1 : len(ids) - 1]
    begins = (ids[context:] != newline) & (ids[context:] != UNKNOWN_ID)
    found = np.zeros(0, np.int64)
    if newline != UNKNOWN_ID:
        before_that = ids[context - 2 : len(ids) - 2] if context >= 2 else np.full_like(follows, -1)
        paragraph = (follows == newline) & (before_that == newline)
        if boundary != UNKNOWN_ID:
            paragraph |= follows == boundary
        found = position[paragraph & begins]
        if len(found) < count // 4:  # too few to choose among: line starts
            found = position[(follows == newline) & begins]
    if not len(found):
        found = position
    picked = np.unique(np.linspace(0, len(found) - 1, min(count, len(found))).round().astype(np.int64))
    return found[picked]


def candidate_states(sampler: Sampler, ids: np.ndarray) -> tuple[np.ndarray, States]:
    """The logits and the states (h, c of every layer; a row per candidate) that ``sampler`` reaches just before each
    paragraph start of ``ids`` (of its first ``SEARCHED`` characters), having read the ``CONTEXT`` characters before
    it from zeros."""
    ids = ids[:SEARCHED]
    starts = paragraph_starts(ids, sampler.vocab)
    context = min(CONTEXT, int(starts.min()))
    rows = np.stack([np.asarray(ids[s - context : s], np.int32) for s in starts])
    return sampler.read(rows, sampler.zero_states(len(rows)))


def nearest_to_mean(states: States) -> int:
    """The row of ``states`` nearest (Euclidean, over every layer's h and c) to their mean."""
    flat = np.concatenate([np.asarray(s, np.float64) for s in states], axis=1)
    return int(np.argmin(np.square(flat - flat.mean(axis=0)).sum(axis=1)))


def compute_start(sampler: Sampler, ids: np.ndarray) -> Start:
    """The start state of ``sampler`` for a training text ``ids``: the candidate nearest the candidates' mean."""
    logits, states = candidate_states(sampler, ids)
    row = nearest_to_mean(states)
    return Start(
        tuple(np.ascontiguousarray(s[row : row + 1], np.float32) for s in states),
        np.ascontiguousarray(logits[row : row + 1], np.float32),
    )


def save_start(path: Path, start: Start, checksum: str) -> None:
    """Write a start state, with the checksum of the weights it belongs to, atomically."""
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        arrays: dict[str, Any] = {f"state_{i}": s for i, s in enumerate(start.states)}
        if start.logits is not None:
            arrays["logits"] = start.logits
        np.savez(fh, version=np.array(START_VERSION), checksum=np.array(checksum), **arrays)


def load_start(path: Path, layers: int, units: int, vocab_size: int) -> tuple[Start, str]:
    """A saved start state and its weights' checksum; ``ValueError`` (or ``OSError``) if it is damaged, of another
    model or of another format."""
    try:
        with np.load(path, allow_pickle=False) as saved:
            if int(saved["version"]) != START_VERSION:
                raise ValueError(f"format {int(saved['version'])}, not {START_VERSION}")
            checksum = str(saved["checksum"])
            states = tuple(saved[f"state_{i}"] for i in range(2 * layers))
            logits = saved["logits"] if "logits" in saved.files else None
    except (KeyError, EOFError) as exc:  # a missing member; an empty file
        raise ValueError(f"incomplete ({exc})") from None
    except Exception as exc:  # numpy and zipfile raise many kinds for a damaged file
        if isinstance(exc, (ValueError, OSError)):
            raise
        raise ValueError(str(exc)) from None
    expected = [(s, (1, units)) for s in states] + ([] if logits is None else [(logits, (1, vocab_size))])
    for array, shape in expected:
        if array.shape != shape or array.dtype != np.float32 or not np.isfinite(array).all():
            raise ValueError(f"an array of shape {array.shape} and type {array.dtype}, not {shape} float32")
    return Start(states, logits), checksum


def weights_checksum(run: Run, which: Weights) -> str | None:
    """The checksum of ``run``'s ``which`` weights file, None if it cannot be read (its loading says why)."""
    try:
        return checksum_of(run.weights_path(which))
    except Exception:  # h5py raises many kinds for a damaged file; loading it reports the problem
        return None


def run_start(
    run: Run, which: Weights, sampler: Sampler, checksum: str | None, cache_dir: Path | None = None
) -> Start | None:
    """``run``'s start state for its ``which`` weights, which ``sampler`` holds and whose file had ``checksum`` when
    they were loaded: the saved one if it belongs to them (and has its logits), else computed from the training split
    and saved (not in a read-only run directory, nor if the weights file changed since). None, for zeros, when it
    cannot be computed (the run's corpus is gone or changed) and no saved state of these weights is left."""
    path = start_path(run, which)
    cfg = sampler.cfg
    saved: Start | None = None
    with contextlib.suppress(OSError, ValueError):
        start, saved_for = load_start(path, cfg.layers, cfg.units, cfg.vocab_size)
        saved = start if checksum is not None and saved_for == checksum else None
    if saved is not None and saved.logits is not None:
        return saved
    ids = train_ids(run, cache_dir)
    if ids is None:  # a file from before the logits still holds the state: better than zeros
        return saved
    start = compute_start(sampler, ids)
    # A read-only run directory, or a full disk, only costs computing it again next time.
    if checksum is not None and weights_checksum(run, which) == checksum:
        with contextlib.suppress(OSError):
            save_start(path, start, checksum)
    return start


def train_ids(run: Run, cache_dir: Path | None, limit: int | None = SEARCHED) -> np.ndarray | None:
    """The training split's ids (its first ``limit``, in memory), from the id cache (encoded into a scratch
    directory if the cache cannot be written); None if the corpus is gone or changed."""
    from textgen.data import load_splits  # not for an export's sampler (textgen.runtime), which needs no corpus
    from textgen.idcache import cache_root

    try:
        cfg = run.load_config()
        check_corpus_unchanged(run, cfg.data)
        root = cache_dir or cache_root(run.path.parent)
        existing = root if root.exists() else next((p for p in root.parents if p.exists()), root)
        if os.access(existing, os.W_OK):
            return np.array(load_splits(cfg.data, root, run.load_vocab()).train[:limit])
        with tempfile.TemporaryDirectory(prefix="textgen-start-") as scratch:
            return np.array(load_splits(cfg.data, Path(scratch), run.load_vocab()).train[:limit])
    except (TextgenError, OSError, ValueError):  # gone, changed, unreadable: prompts are read from zeros instead
        return None
