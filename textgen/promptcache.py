"""The serving engine's prompt-state cache: the LSTM state (and logits) one row reached after reading a prompt's first
characters, kept so that a later prompt starting with them starts there and reads only the rest. No TensorFlow here.

Entries are kept at checkpoints: every ``EVERY`` characters of a prompt, at its end, and where it leaves the prompt
that kept the entry it started from (its branch point: the end of a prefix many prompts share, such as a few-shot
preamble, which is rarely a multiple of ``EVERY``). Each is keyed by a digest of
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
# A branch point is kept only this many ids or more past the entry a prompt starts from: a nearer one would save the
# prompts after it fewer steps than the read it splits off costs (the same bound a batch call's checkpoint has).
BRANCH_MIN = 32


def next_checkpoint(read: int, branch: int = 0) -> int:
    """The next length past ``read`` at which a prompt's state is kept: the next multiple of ``EVERY``, or its
    ``branch`` point (0: none) when that comes first."""
    mark = (read // EVERY + 1) * EVERY
    return min(mark, branch) if read < branch else mark


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
    after: np.ndarray  # the ids that followed in the prompt that kept it (up to EVERY): where others branch off it

    @property
    def nbytes(self) -> int:
        return self.logits.nbytes + sum(s.nbytes for s in self.states) + self.after.nbytes

    def branch(self, ids: np.ndarray) -> int:
        """Where ``ids``, which starts with this entry's prefix, leaves the prompt that kept it: a length to keep
        ``ids``'s state at, so that the prompts after it that share as much start there. 0 when that is within
        ``BRANCH_MIN`` ids of this entry, or is ``ids``'s end (kept anyway), or ``ids`` goes on as far as the ids kept
        (the other prompt's next checkpoint or its end: kept there, if at all)."""
        rest = ids[self.length : self.length + len(self.after)]
        differ = np.flatnonzero(rest != self.after[: len(rest)])
        if not len(differ):
            return 0
        point = self.length + int(differ[0])
        return point if point - self.length >= BRANCH_MIN else 0


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
        self,
        ids: np.ndarray,
        logits: np.ndarray,
        states: tuple[np.ndarray, ...],
        links: Chain | None = None,
        after: np.ndarray | None = None,
    ) -> None:
        """Keep the state of one row (``logits`` [vocab], ``states`` without the batch axis, copied here) after
        reading all of ``ids``. ``links``: the chain of ``ids`` or of a prompt it starts, if made (a prompt's
        states kept at each of its checkpoints then cost no pass over it each). ``after``: the prompt's ids that
        follow (the first ``EVERY`` are kept, for ``Entry.branch``)."""
        if not self.enabled or not len(ids):
            return
        links = chain(ids) if links is None else links
        found = key(ids, links, len(ids))
        following = np.array([] if after is None else after[:EVERY], np.int32)
        entry = Entry(len(ids), np.array(logits, copy=True), tuple(np.array(s, copy=True) for s in states), following)
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
