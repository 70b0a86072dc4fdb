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
from collections import Counter, OrderedDict
from dataclasses import dataclass

import numpy as np

EVERY = 256  # characters between a prompt's checkpoints (a read of its own reads at most this many at a time)
ENTRIES = 4096  # the default bound in entries (--prompt-cache)
MAX_BYTES = 256 * 2**20  # the bound in bytes: a 1 x 512 model's entry is ~4 KB of state, ~1 KB of logits


def checkpoints(length: int) -> list[int]:
    """The lengths at which a prompt of ``length`` ids has entries: every ``EVERY`` ids, and its end."""
    marks = list(range(EVERY, length, EVERY))
    return [*marks, length] if length else marks


Chain = list[hashlib.blake2b]  # a prompt's digests so far at 0, EVERY, 2 x EVERY, ... ids


def chain(ids: np.ndarray) -> Chain:
    """The running digest of ``ids`` at each multiple of ``EVERY`` up to its length (0 included)."""
    data = np.ascontiguousarray(ids, np.int32)
    links = [hashlib.blake2b(digest_size=16)]
    for start in range(0, len(data) - EVERY + 1, EVERY):
        link = links[-1].copy()
        link.update(data[start : start + EVERY].tobytes())
        links.append(link)
    return links


def key(ids: np.ndarray, links: Chain, length: int) -> tuple[int, bytes]:
    """The key of ``ids``'s first ``length`` ids: the chain's digest at the multiple of ``EVERY`` below, on
    which the ids after it are hashed."""
    base = length // EVERY
    if base * EVERY == length:
        return length, links[base].digest()
    branch = links[base].copy()
    branch.update(np.ascontiguousarray(ids[base * EVERY : length], np.int32).tobytes())
    return length, branch.digest()


def prefix_keys(ids: np.ndarray) -> list[tuple[int, bytes]]:
    """(length, digest) for each of ``ids``'s checkpoints, shortest first."""
    links = chain(ids)
    return [key(ids, links, length) for length in checkpoints(len(ids))]


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
        # Under each multiple of EVERY's chain digest, the lengths of entries that end past it (before the next):
        # where a longer prompt looks for an earlier prompt's end.
        self._ends: dict[bytes, Counter[int]] = {}  # (entries of that length: their tails may differ)
        self._bases: dict[tuple[int, bytes], bytes] = {}
        self.bytes = 0
        self.hits = 0  # lookups that found a prefix
        self.characters = 0  # prompt characters those hits did not read again

    @property
    def enabled(self) -> bool:
        return self.max_entries > 0

    def __len__(self) -> int:
        return len(self._entries)

    def longest(self, ids: np.ndarray, links: Chain | None = None) -> Entry | None:
        """The entry for the longest prefix of ``ids`` held (counted as a hit), or None: one at a multiple of
        ``EVERY``, or the whole of an earlier prompt that ``ids`` extends. ``links``: ``chain(ids)``, if made."""
        if not self.enabled or not len(ids):
            return None
        links = chain(ids) if links is None else links
        with self.lock:
            candidates = list(range(EVERY, len(ids) + 1, EVERY))
            for link in links:  # earlier prompts' ends past each multiple of EVERY
                candidates.extend(n for n in self._ends.get(link.digest(), ()) if n <= len(ids))
            if len(ids) % EVERY:
                candidates.append(len(ids))
            for length in sorted(set(candidates), reverse=True):
                entry = self._entries.get(found := key(ids, links, length))
                if entry is not None:
                    self._entries.move_to_end(found)
                    self.hits += 1
                    self.characters += entry.length
                    return entry
        return None

    def put(
        self, ids: np.ndarray, logits: np.ndarray, states: tuple[np.ndarray, ...], links: Chain | None = None
    ) -> None:
        """Keep the state of one row (``logits`` [vocab], ``states`` without the batch axis, copied here) after
        reading all of ``ids``. ``links``: the chain of ``ids`` or of a prompt it starts, if made (a prompt's
        states kept at each of its checkpoints then cost no pass over it each)."""
        if not self.enabled or not len(ids):
            return
        links = chain(ids) if links is None else links
        found = key(ids, links, len(ids))
        entry = Entry(len(ids), np.array(logits, copy=True), tuple(np.array(s, copy=True) for s in states))
        if entry.nbytes > self.max_bytes:
            return
        base = links[len(ids) // EVERY].digest()
        with self.lock:
            self._drop(found)
            self._entries[found] = entry
            self._bases[found] = base
            self._ends.setdefault(base, Counter())[len(ids)] += 1
            self.bytes += entry.nbytes
            while len(self._entries) > self.max_entries or self.bytes > self.max_bytes:
                self._drop(next(iter(self._entries)))

    def _drop(self, found: tuple[int, bytes]) -> None:
        entry = self._entries.pop(found, None)
        if entry is None:
            return
        self.bytes -= entry.nbytes
        base = self._bases.pop(found)
        lengths = self._ends[base]
        lengths[found[0]] -= 1
        if not lengths[found[0]]:
            del lengths[found[0]]
            if not lengths:
                del self._ends[base]
