"""The stateful stream layout: which ids of a text a stateful model reads in which batch, as pure arithmetic.

A text's ids, from the layout's ``first``, are cut into ``streams`` contiguous streams, and batch ``k`` holds
characters ``[k*seq_len, (k+1)*seq_len)`` of every stream, so row ``i`` of batch ``k+1`` continues row ``i`` of
batch ``k`` exactly. Targets are the inputs shifted by one character. ``textgen.data`` reads these batches
through tf.data for training; scoring reads them here too. No TensorFlow: an exported model scores without it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from textgen.errors import CorpusError

COUNT_CHUNK = 1 << 24  # ids per read when counting: 16 MB of a uint8 memory map


def fills_one_batch(n: int, streams: int, seq_len: int) -> bool:
    """Whether ``n`` ids fill one batch of ``streams`` x ``seq_len`` inputs and their targets (one id further)."""
    return n >= streams * seq_len + 1


@dataclass(frozen=True)
class StreamLayout:
    """``streams`` contiguous streams of ``batches * seq_len`` characters each, read ``seq_len`` at a time, the
    first beginning at id ``first``."""

    streams: int
    seq_len: int
    batches: int
    first: int = 0

    @classmethod
    def of(cls, n: int, streams: int, seq_len: int) -> StreamLayout:
        """The layout of ``n`` ids: as many full batches as they fill (the rest is left out)."""
        if not fills_one_batch(n, streams, seq_len):
            raise CorpusError(f"{n} characters cannot fill one {streams} x {seq_len} batch")
        return cls(streams, seq_len, (n - 1) // (streams * seq_len))

    @classmethod
    def shifted(cls, n: int, streams: int, seq_len: int, rng: np.random.Generator) -> StreamLayout:
        """The layout of ``n`` ids begun a random 0 to ``seq_len - 1`` ids in (less when the ids leave no room past
        one batch), so that its windows, and where backpropagation through time is cut, fall elsewhere in the text.
        Every shift of the same ids has the same number of batches."""
        room = max(0, min(seq_len - 1, n - 1 - streams * seq_len))
        return dataclasses.replace(cls.of(n - room, streams, seq_len), first=int(rng.integers(room + 1)))

    @property
    def chars_per_batch(self) -> int:
        return self.streams * self.seq_len

    def stream_start(self, i: int) -> int:
        """Where stream ``i`` begins in the ids: the streams are consecutive slices of them."""
        return self.first + i * self.batches * self.seq_len

    def count_in_targets(self, ids: np.ndarray, value: int) -> int:
        """How many of the layout's targets (ids ``first`` + 1 to ``first`` + streams x batches x seq_len: the
        characters scored) are ``value``, read a chunk at a time: ``ids`` may be a memory map bigger than memory."""
        end = self.stream_start(self.streams) + 1
        return sum(
            int(np.count_nonzero(np.asarray(ids[a : min(a + COUNT_CHUNK, end)]) == value))
            for a in range(self.first + 1, end, COUNT_CHUNK)
        )

    def batch(self, ids: np.ndarray, k: int, rows: slice = slice(None)) -> tuple[np.ndarray, np.ndarray]:
        """Inputs and targets (int32, ``rows`` x ``seq_len``) of batch ``k``, read from ``ids``."""
        starts = np.array([self.stream_start(i) for i in range(self.streams)[rows]]) + k * self.seq_len
        window = np.asarray(ids[starts[:, None] + np.arange(self.seq_len + 1)], dtype=np.int32)
        return window[:, :-1], window[:, 1:]


def scoring_layout(n: int, streams: int, seq_len: int, source: str) -> StreamLayout:
    """How ``n`` ids of the text ``source`` are scored: ``streams`` x ``seq_len`` if they fill one such batch,
    else the largest layout they do fill (fewer streams first, then shorter ones)."""
    if n < 2:
        raise CorpusError(f"{source} has {n} characters; at least 2 are needed to score one")
    streams = max(1, min(streams, (n - 1) // seq_len))
    return StreamLayout.of(n, streams, min(seq_len, (n - 1) // streams))
