"""The serving engine's prompt-state cache: the LSTM state (and logits) one row reached after reading a prompt's first
characters, kept so that a later prompt starting with them starts there and reads only the rest. No TensorFlow here.

Entries are kept at checkpoints: every ``EVERY`` characters of a prompt, and at its end. Each is keyed by a digest of
the ids read up to it (a chain of BLAKE2b digests, one per ``EVERY`` ids, so that a prompt's keys cost one pass over
it) and its length. The cache is bounded in entries and in bytes, the least recently used entry leaving first, and
holds its own lock: the engine's lanes look entries up and store them from their own threads.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

EVERY = 256  # characters between a prompt's checkpoints (a read of its own reads at most this many at a time)
ENTRIES = 4096  # the default bound in entries (--prompt-cache)
MAX_BYTES = 256 * 2**20  # the bound in bytes: a 1 x 512 model's entry is ~4 KB of state, ~1 KB of logits


def checkpoints(length: int) -> list[int]:
    """The lengths at which a prompt of ``length`` ids has entries: every ``EVERY`` ids, and its end."""
    marks = list(range(EVERY, length, EVERY))
    return [*marks, length] if length else marks


def prefix_keys(ids: np.ndarray) -> list[tuple[int, bytes]]:
    """(length, digest) for each of ``ids``'s checkpoints, shortest first."""
    data = np.ascontiguousarray(ids, np.int32)
    chain, keys, start = hashlib.blake2b(digest_size=16), [], 0
    for end in checkpoints(len(data)):
        if end - start == EVERY:  # a whole stretch: the chain goes on from it
            chain.update(data[start:end].tobytes())
            keys.append((end, chain.digest()))
            start = end
        else:  # the prompt's end, within a stretch: a branch off the chain
            tail = chain.copy()
            tail.update(data[start:end].tobytes())
            keys.append((end, tail.digest()))
    return keys


@dataclass(frozen=True)
class Entry:
    """One row's logits and LSTM states after reading ``length`` ids."""

    length: int
    logits: np.ndarray  # [vocab]
    states: tuple[np.ndarray, ...]  # each one row's state, without the batch axis

    @property
    def nbytes(self) -> int:
        return self.logits.nbytes + sum(s.nbytes for s in self.states)


class PromptCache:
    """At most ``entries`` entries and ``max_bytes`` bytes of prompt states, least recently used out first.
    ``entries`` 0 keeps nothing (every lookup misses)."""

    def __init__(self, entries: int = ENTRIES, max_bytes: int = MAX_BYTES) -> None:
        self.max_entries, self.max_bytes = entries, max_bytes
        self.lock = threading.Lock()
        self._entries: OrderedDict[tuple[int, bytes], Entry] = OrderedDict()
        self.bytes = 0
        self.hits = 0  # lookups that found a prefix
        self.characters = 0  # prompt characters those hits did not read again

    @property
    def enabled(self) -> bool:
        return self.max_entries > 0

    def __len__(self) -> int:
        return len(self._entries)

    def longest(self, ids: np.ndarray) -> Entry | None:
        """The entry for the longest of ``ids``'s checkpoints held (counted as a hit), or None."""
        if not self.enabled or not len(ids):
            return None
        keys = prefix_keys(ids)
        with self.lock:
            for key in reversed(keys):
                entry = self._entries.get(key)
                if entry is not None:
                    self._entries.move_to_end(key)
                    self.hits += 1
                    self.characters += entry.length
                    return entry
        return None

    def put(self, ids: np.ndarray, logits: np.ndarray, states: tuple[np.ndarray, ...]) -> None:
        """Keep the state of one row (``logits`` [vocab], ``states`` without the batch axis, copied here) after
        reading all of ``ids``, which ends at one of its checkpoints."""
        if not self.enabled or not len(ids):
            return
        length, digest = prefix_keys(ids)[-1]
        key = (length, digest)
        entry = Entry(length, np.array(logits, copy=True), tuple(np.array(s, copy=True) for s in states))
        if entry.nbytes > self.max_bytes:
            return
        with self.lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.bytes -= old.nbytes
            self._entries[key] = entry
            self.bytes += entry.nbytes
            while len(self._entries) > self.max_entries or self.bytes > self.max_bytes:
                _, evicted = self._entries.popitem(last=False)
                self.bytes -= evicted.nbytes
