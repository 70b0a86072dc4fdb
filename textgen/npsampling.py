"""The sampling strategy in NumPy: the twin of ``textgen.sampling.choose_next``, for runtimes without TensorFlow.

Both draw by inverting the cumulative distribution at a uniform number from ``uniforms``, a counter-based
hash of (seed, position, row) computed here and handed to either implementation, so the same logits and
seed give the same ids in TensorFlow and in NumPy (tests/test_sampling.py runs every strategy test on both),
and a sample's text depends neither on how it is split into calls nor on how many rows are drawn at once.
"""

from __future__ import annotations

import numpy as np

from textgen.vocab import UNKNOWN_ID

NEG_INF = np.float32(-1e9)  # large enough to zero a probability, finite so softmax stays defined
assert UNKNOWN_ID == 0, "choose_next leaves the unknown id out by slicing it off"

_MIX = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xD1B54A32D192ED03), np.uint64(0x8CB92BA72F3D8DD7))
_OFFSET = np.uint64(0x632BE59BD9B4E019)


def uniforms(seed: int, position: int, steps: int, batch: int) -> np.ndarray:
    """Uniform numbers in [0, 1), float32 (steps, batch): row ``b`` of step ``position + t`` gets a value that
    depends only on (seed, position + t, b), through splitmix64's finaliser."""
    return row_uniforms(np.full(batch, seed), np.full(batch, position), np.arange(batch), steps)


def row_uniforms(seeds: np.ndarray, positions: np.ndarray, rows: np.ndarray, steps: int) -> np.ndarray:
    """``uniforms`` for rows that each have their own seed, position and row number (B,): column ``b`` is what
    ``uniforms(seeds[b], positions[b], steps, rows[b] + 1)`` gives in its last column. A server's rows draw as
    ``textgen sample`` would draw them alone."""
    t = np.asarray(positions, np.uint64)[None, :] + np.arange(steps, dtype=np.uint64)[:, None]
    x = np.asarray(seeds, np.uint64)[None, :] * _MIX[0] + t * _MIX[1] + np.asarray(rows, np.uint64)[None, :] * _MIX[2]
    # An offset, so that (0, 0, 0) does not hash to 0: seed 0's first draw was u = 0, the vocabulary's first character
    # the model gave any probability (a tab in base:en's: every preview of a seed-0 fine-tune began with one).
    x = x + _OFFSET
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    x = x ^ (x >> np.uint64(31))
    # 24 bits: every value is exact in float32, so TensorFlow and NumPy compare against the same number.
    return (x >> np.uint64(40)).astype(np.float32) * np.float32(2.0**-24)


BAN = -100  # a logit_bias this low bans its character: NEG_INF, not -100, which a high temperature would soften


def penalize(
    logits: np.ndarray, counts: np.ndarray, frequency: np.ndarray, presence: np.ndarray, bias: np.ndarray
) -> np.ndarray:
    """OpenAI's penalties and bias on ``logits`` (B, V): ``counts`` (B, V) of each character generated so far, each
    row's ``frequency`` and ``presence`` penalties (B,), and ``bias`` (B, V), whose -100s ban."""
    penalty = counts * frequency[:, None] + (counts > 0) * presence[:, None]
    return np.where(bias <= BAN, NEG_INF, logits + bias - penalty).astype(np.float32)


def _softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def top_k_filter(logits: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Keep the ``k`` largest logits of each row (``k`` (B,); 0 keeps them all)."""
    vocab = logits.shape[-1]
    k = np.where(k > 0, np.minimum(k, vocab), vocab)
    kth = np.take_along_axis(-np.sort(-logits, axis=-1), (k - 1)[:, None], axis=-1)
    return np.where(logits < kth, NEG_INF, logits)


def top_p_filter(logits: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Keep the smallest set of most likely ids whose probability mass reaches ``p`` (B,) (the likeliest always;
    a ``p`` of 1 keeps them all)."""
    sorted_logits = -np.sort(-logits, axis=-1)
    mass = np.cumsum(_softmax(sorted_logits), axis=-1)
    mass_before = np.concatenate([np.zeros_like(mass[:, :1]), mass[:, :-1]], axis=-1)
    kept = (mass_before < p[:, None]) | (p[:, None] >= 1)
    kept[:, 0] = True  # a p of 0 or less (a SavedModel caller's) would keep nothing
    threshold = np.where(kept, sorted_logits, np.inf).min(axis=-1, keepdims=True)
    return np.where(logits < threshold, NEG_INF, logits)


def draw(logits: np.ndarray, u: np.ndarray) -> np.ndarray:
    """The index in each row where the cumulative probability first exceeds ``u`` of the total (the
    unnormalised exponentials: dividing by their sum first would change no draw)."""
    cdf = np.exp(logits - logits.max(axis=-1, keepdims=True)).cumsum(axis=-1)
    ids = (cdf <= (u * cdf[:, -1])[:, None]).sum(axis=-1)
    return np.minimum(ids, logits.shape[-1] - 1)


def choose_next(
    logits: np.ndarray,
    temperature: np.ndarray,
    top_k: np.ndarray,
    top_p: np.ndarray,
    u: np.ndarray,
    penalties: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None,
) -> np.ndarray:
    """Next ids (int32, one per row): argmax where the row's temperature is 0, else a filtered draw at the
    uniforms ``u``. Each setting has one value per row (B,), as ``textgen.generation.RowSettings`` holds them;
    ``penalties`` are ``penalize``'s (counts, frequency, presence, bias), applied first.

    The unknown id is left out by slicing (it is id 0), not masked with ``NEG_INF`` as in TensorFlow: the
    same ids, with fewer operations per character (~40% of this function's time at batch 1).
    """
    logits = np.asarray(logits, np.float32)
    if penalties is not None:
        logits = penalize(logits, *penalties)
    known = logits[:, UNKNOWN_ID + 1 :]
    sampled = temperature > 0
    if not sampled.any():
        return (np.argmax(known, axis=-1) + 1).astype(np.int32)
    scaled = known / np.where(sampled, temperature, np.float32(1))[:, None]
    if (top_k > 0).any():
        scaled = top_k_filter(scaled, top_k)
    if (top_p < 1).any():
        scaled = top_p_filter(scaled, top_p)
    ids = draw(scaled, u)
    if not sampled.all():
        ids = np.where(sampled, ids, np.argmax(known, axis=-1))
    return (ids + 1).astype(np.int32)
