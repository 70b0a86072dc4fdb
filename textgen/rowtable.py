"""A server's requests and the rows they hold: what a request asks for (``Job``), its ticket once submitted, its
events, and the ``RowTable`` that owns the rows, their state arrays and the one lock over them; no TensorFlow here."""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from textgen import promptcache
from textgen.generation import Penalties, RowSettings, Sampler, bias_row
from textgen.promptcache import PromptCache
from textgen.stops import StopScanner


class Finish(str, enum.Enum):
    """Why a row stopped generating (OpenAI's ``finish_reason`` and textgen's own)."""

    stop = "stop"  # a stop sequence was generated
    length = "length"  # max_tokens characters were generated
    timeout = "timeout"  # the request ran out of time
    cancelled = "cancelled"  # the client went away
    shutdown = "shutdown"  # the server is draining
    error = "error"  # the sampler failed


@dataclass(frozen=True)
class Job:
    """What a request asks for: ``n`` continuations of each prompt, each ``max_chars`` long at most."""

    prompts: tuple[str, ...]
    max_chars: int
    n: int = 1
    temperature: float = 0.8
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    stops: tuple[str, ...] = ()
    timeout: float | None = None  # seconds from submission
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: tuple[tuple[str, float], ...] = ()  # (character, bias): SampleConfig's, checked against the vocabulary

    @property
    def penalized(self) -> bool:
        return bool(self.frequency_penalty or self.presence_penalty or self.logit_bias)

    @property
    def rows(self) -> int:
        return len(self.prompts) * self.n


@dataclass(frozen=True)
class Event:
    """New text of one of a request's continuations (``index`` = prompt number x n + sample number); ``finish``
    is set on its last event."""

    index: int
    text: str
    finish: Finish | None = None


Listener = Callable[[Event], None]


@dataclass(eq=False)
class Ticket:
    """A submitted job: its listener, its deadline, and whether its client went away."""

    job: Job
    listener: Listener
    submitted: float = field(default_factory=time.monotonic)
    cancelled: bool = False
    cached: int = 0  # prompt characters its rows started past, from the prompt cache (set when it is claimed)

    @property
    def deadline(self) -> float:
        return self.submitted + self.job.timeout if self.job.timeout is not None else float("inf")


@dataclass(eq=False)
class Row:
    """One busy row: whose it is, what it still has to read, and where its generation stands."""

    ticket: Ticket
    lane: int  # the scheduler thread that advances it
    index: int  # the continuation's number in its request
    sample: int  # its number among the n of its prompt: the row number of its uniforms
    prompt: np.ndarray
    read: int = 0  # prompt ids read so far
    generated: int = 0  # ids drawn so far (the position of its uniforms)
    scanner: StopScanner = field(default_factory=lambda: StopScanner(()))  # the emitter's alone
    ended: bool = False  # its last event is out (set by the emitter): no more events, and its row is freed
    # Of a prompt's n rows the first reads it, and the others wait for a copy of its state at the prompt's end:
    follows: Row | None = None  # the row whose state this one waits for (None once it has it)
    followers: list[Row] = field(default_factory=list)  # the rows waiting for this one's (emptied as they get it)
    links: promptcache.Chain | None = None  # with the prompt cache on, its reader's prompt's digests (for its keys)
    branch: int = 0  # with the prompt cache on, where its prompt leaves the one it started from (0: nowhere kept)


Held = list[tuple[int, Row]]  # a lane's rows for a round: (slot, row)


class RowTable:
    """The engine's rows: which are free, which lane owns each busy one, their state arrays (logits, LSTM states,
    strategy, seed), and the one lock over all of it (the engine's queue shares it).

    A lane works on the rows ``hand`` gives it for a round, and on their slots of the state arrays, and on nothing
    else; it gives a row back through ``release``, and from then on the slot may be claimed by any lane: a lane never
    looks a slot up again. (Rounds did, after freeing a finished row, and advanced a row the other lane had claimed
    in between.) A claim writes its slots' arrays under the lock, before any lane is handed them."""

    def __init__(self, sampler: Sampler, slots: int, lanes: int, cache: PromptCache | None = None) -> None:
        self.slots, self.lanes = slots, lanes
        self.cache = cache if cache is not None else PromptCache(0)
        self.lock = threading.Condition()
        self.logits = np.zeros([slots, sampler.vocab.size], np.float32)
        self.states = sampler.start_states(slots)
        self.start = sampler.start_states(1)  # each new row's state, before its prompt (``textgen.startstate``)
        # ... and its logits, which a row with no prompt to read draws from (zeros: every prompt has something)
        self.start_logits = sampler.start_logits if sampler.start_logits is not None else self.logits[:1].copy()
        self.temperature = np.zeros(slots, np.float32)
        self.top_k = np.zeros(slots, np.int32)
        self.top_p = np.ones(slots, np.float32)
        self.seeds = np.zeros(slots, np.uint64)
        self.vocab = sampler.vocab
        # Each row's penalties and bias (zeros for a row without): a call runs the penalized loop only when one of
        # its rows has some. counts: each row's characters drawn so far, zeroed when a request claims the row.
        self.penalized = np.zeros(slots, bool)
        self.frequency = np.zeros(slots, np.float32)
        self.presence = np.zeros(slots, np.float32)
        self.bias = np.zeros([slots, sampler.vocab.size], np.float32)
        self.counts = np.zeros([slots, sampler.vocab.size], np.float32)
        self._rows: list[Row | None] = [None] * slots

    @property
    def rows(self) -> list[Row | None]:
        """The rows as they stand, a copy (to look at: a lane works on what ``hand`` gives it)."""
        return list(self._rows)

    def free(self) -> int:
        return sum(row is None for row in self._rows)

    def held(self) -> list[int]:
        """Busy rows of each lane."""
        held = [0] * self.lanes
        for row in self._rows:
            if row is not None:
                held[row.lane] += 1
        return held

    def claim(self, ticket: Ticket, lane: int, prompts: list[np.ndarray]) -> None:
        """Under the lock: give ``ticket`` free rows in ``lane``, n for each of its encoded ``prompts``, their states
        set to the start state and its strategy set. The first of a prompt's rows reads it; the others follow it
        (``Row.follows``). A reader whose prompt starts with a prefix the prompt cache holds starts from its state,
        its ``read`` at the prefix's length."""
        free = (i for i, row in enumerate(self._rows) if row is None)
        job = ticket.job
        bias = bias_row(job.logit_bias, self.vocab) if job.logit_bias else 0.0
        for p, prompt in enumerate(prompts):
            reader: Row | None = None
            for sample in range(job.n):
                slot = next(free)
                for state, start in zip(self.states, self.start, strict=True):
                    state[slot] = start[0]
                self.logits[slot] = self.start_logits[0]
                self.temperature[slot], self.top_k[slot], self.top_p[slot] = job.temperature, job.top_k, job.top_p
                self.seeds[slot] = job.seed
                self.penalized[slot], self.bias[slot], self.counts[slot] = job.penalized, bias, 0.0
                self.frequency[slot], self.presence[slot] = job.frequency_penalty, job.presence_penalty
                scanner = StopScanner(job.stops)
                row = Row(ticket, lane, p * job.n + sample, sample, prompt, scanner=scanner, follows=reader)
                if reader is None:
                    reader = row
                    row.links = promptcache.chain(prompt) if self.cache.enabled else None
                    if (entry := self.cache.longest(prompt, row.links)) is not None:
                        for state, cached in zip(self.states, entry.states, strict=True):
                            state[slot] = cached
                        self.logits[slot] = entry.logits
                        row.read, row.branch = entry.length, entry.branch(prompt)
                        ticket.cached += entry.length
                else:
                    reader.followers.append(row)
                self._rows[slot] = row

    def hand(self, lane: int, now: float, drain_deadline: float | None) -> tuple[Held, list[tuple[Row, Finish]]]:
        """Under the lock: ``lane``'s rows for its round, once those that are done are given back: those cancelled
        or ended (no event due), and those out of time or past the drain's deadline, returned with their reason."""
        mine: Held = []
        ended: list[tuple[Row, Finish]] = []
        for slot, row in enumerate(self._rows):
            if row is None or row.lane != lane:
                continue
            if row.ticket.cancelled or row.ended:
                pass
            elif now >= row.ticket.deadline:
                ended.append((row, Finish.timeout))
            elif drain_deadline is not None and now >= drain_deadline:
                ended.append((row, Finish.shutdown))
            else:
                mine.append((slot, row))
                continue
            self._rows[slot] = None
            self.lock.notify_all()
        return mine, ended

    def release(self, lane: int, rows: Held) -> None:
        """Give back ``lane``'s ``rows`` (takes the lock): their slots are any lane's to claim from now on."""
        if not rows:
            return
        with self.lock:
            for slot, row in rows:
                if self._rows[slot] is not row or row.lane != lane:
                    raise RuntimeError(f"lane {lane} gave back row {slot}, which is not its own")
                self._rows[slot] = None
            self.lock.notify_all()

    def settings(self, slots: list[int]) -> RowSettings:
        penalties = None
        if self.penalized[slots].any():
            penalties = Penalties(self.frequency[slots], self.presence[slots], self.bias[slots])
        return RowSettings(self.temperature[slots], self.top_k[slots], self.top_p[slots], penalties)

    def store(self, slots: list[int], logits: np.ndarray, states: tuple[np.ndarray, ...]) -> None:
        self.logits[slots] = logits
        for whole, part in zip(self.states, states, strict=True):
            whole[slots] = part
