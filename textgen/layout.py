"""The stateful stream layout: which ids of a text a stateful model reads in which batch, as pure arithmetic.

A text's ids, from the layout's ``first``, are cut into ``streams`` contiguous streams, and batch ``k`` holds
characters ``[k*seq_len, (k+1)*seq_len)`` of every stream, so row ``i`` of batch ``k+1`` continues row ``i`` of
batch ``k`` exactly. Targets are the inputs shifted by one character. Training reads full batches only
(``StreamLayout.of``); scoring reads every character (``StreamLayout.covering``: after the full batches, the
rest in batches of the same shape, padded with ``MASKED`` targets). ``textgen.data`` reads the full batches
through tf.data. No TensorFlow here: an exported model scores without it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from textgen.errors import CorpusError

COUNT_CHUNK = 1 << 24  # ids per read when counting: 16 MB of a uint8 memory map
MASKED = -1  # the target of a padding position: not scored


def fills_one_batch(n: int, streams: int, seq_len: int) -> bool:
    """Whether ``n`` ids fill one batch of ``streams`` x ``seq_len`` inputs and their targets (one id further)."""
    return n >= streams * seq_len + 1


# The smallest batch layout a small text is given when the default one does not fit it: fewer streams than 4 make
# too noisy a gradient, and sequences shorter than 32 characters cut backpropagation through time within words.
MIN_STREAMS, MIN_SEQ_LEN = 4, 32


def fitting_layout(
    train: int, val: int, streams: int, seq_len: int, accumulate: int = 1, *, keep_streams: bool, keep_seq_len: bool
) -> tuple[int, int] | None:
    """The biggest batch layout of at most ``streams`` x ``seq_len`` (halving the streams down to ``MIN_STREAMS``,
    the sequence down to ``MIN_SEQ_LEN``; longer sequences first when two hold as many characters) whose batch the
    validation split (``val`` ids) fills and whose ``accumulate`` batches the training split fills; None if none
    does. A ``keep_`` setting stays as given."""
    stream_options = [streams] if keep_streams else [streams >> k for k in range(8) if streams >> k >= MIN_STREAMS]
    length_options = [seq_len] if keep_seq_len else sorted({seq_len, max(seq_len // 2, MIN_SEQ_LEN), MIN_SEQ_LEN})
    fits = [
        (b, n)
        for b in stream_options or [streams]
        for n in length_options
        if n <= seq_len and fills_one_batch(val, b, n) and fills_one_batch(train, b * accumulate, n)
    ]
    return max(fits, key=lambda layout: (layout[0] * layout[1], layout[1]), default=None)


@dataclass(frozen=True)
class StreamLayout:
    """``streams`` contiguous streams of ``batches * seq_len + tail`` characters each, read ``seq_len`` at a time,
    the first beginning at id ``first``; the last stream has ``extra`` characters more (fewer than ``streams``:
    what equal streams leave over)."""

    streams: int
    seq_len: int
    batches: int
    first: int = 0
    tail: int = 0  # characters of each stream after its full batches, fewer than seq_len
    extra: int = 0

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

    @classmethod
    def covering(cls, n: int, streams: int, seq_len: int) -> StreamLayout:
        """The layout of ``n`` ids that reads every one of them, for scoring: ``streams`` streams of
        ``(n - 1) // streams`` targets each, and what that leaves over at the end of the last stream (the streams
        are contiguous, so the text's end is the last stream's)."""
        length, extra = divmod(n - 1, streams)
        if length < 1:
            raise CorpusError(f"{n} characters cannot give each of {streams} streams one to score")
        batches, tail = divmod(length, seq_len)
        return cls(streams, seq_len, batches, tail=tail, extra=extra)

    @property
    def chars_per_batch(self) -> int:
        return self.streams * self.seq_len

    @property
    def stream_len(self) -> int:
        """Characters in each stream but the last (which has ``extra`` more)."""
        return self.batches * self.seq_len + self.tail

    @property
    def scored(self) -> int:
        """How many targets the layout reads: the characters it scores."""
        return self.streams * self.stream_len + self.extra

    def stream_start(self, i: int) -> int:
        """Where stream ``i`` begins in the ids: the streams are consecutive slices of them."""
        return self.first + i * self.stream_len

    def count_in_targets(self, ids: np.ndarray, value: int) -> int:
        """How many of the layout's targets (ids ``first`` + 1 to ``first`` + ``scored``: the characters scored)
        are ``value``, read a chunk at a time: ``ids`` may be a memory map bigger than memory."""
        end = self.first + self.scored + 1
        return sum(
            int(np.count_nonzero(np.asarray(ids[a : min(a + COUNT_CHUNK, end)]) == value))
            for a in range(self.first + 1, end, COUNT_CHUNK)
        )

    def batch(self, ids: np.ndarray, k: int, rows: slice = slice(None)) -> tuple[np.ndarray, np.ndarray]:
        """Inputs and targets (int32, ``rows`` x ``seq_len``) of batch ``k``, read from ``ids``."""
        starts = np.array([self.stream_start(i) for i in range(self.streams)[rows]]) + k * self.seq_len
        window = np.asarray(ids[starts[:, None] + np.arange(self.seq_len + 1)], dtype=np.int32)
        return window[:, :-1], window[:, 1:]

    def last_batches(self, ids: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        """Inputs and targets (int32, streams x seq_len) of what follows the full batches: each stream's ``tail``
        and the last stream's ``extra``, padded to whole batches (as many as the last stream's rest needs), so that
        they have the full batches' shape. A padding position reads id 0, its target is
        ``MASKED``; it comes after its row's last character, so it changes nothing that is scored."""
        lengths = np.full(self.streams, self.tail)
        lengths[-1] += self.extra
        width = -(-int(lengths[-1]) // self.seq_len) * self.seq_len
        starts = np.array([self.stream_start(i) for i in range(self.streams)]) + self.batches * self.seq_len
        live = np.arange(width) < lengths[:, None]
        positions = np.where(live, starts[:, None] + np.arange(width), self.first)  # padding reads a valid id
        inputs = np.where(live, np.asarray(ids[positions], dtype=np.int32), 0)
        targets = np.where(live, np.asarray(ids[positions + 1], dtype=np.int32), MASKED)
        return [
            (inputs[:, a : a + self.seq_len], targets[:, a : a + self.seq_len]) for a in range(0, width, self.seq_len)
        ]


def scoring_layout(n: int, streams: int, seq_len: int, source: str) -> StreamLayout:
    """How ``n`` ids of the text ``source`` are scored, every character after the first: in ``streams`` x
    ``seq_len`` batches if they fill one, else in the largest batch they do fill (fewer streams first, then
    shorter ones)."""
    if n < 2:
        raise CorpusError(f"{source} has {n} characters; at least 2 are needed to score one")
    streams = max(1, min(streams, (n - 1) // seq_len))
    return StreamLayout.covering(n, streams, min(seq_len, (n - 1) // streams))
