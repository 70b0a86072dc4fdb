"""Continuous batching: many requests share one sampler's batched step; no TensorFlow here.

The engine's ``RowTable`` holds ``slots`` rows of LSTM state, advanced by ``lanes`` scheduler threads. Each busy
row belongs to the lane that admitted it; each round the table hands a lane its rows, and the lane touches no other
row, nor one it has given back. Each lane repeats a round over its own rows:

* requests that were cancelled or ran out of time leave their rows (or the queue);
* waiting requests take free rows, their states set to the start state (``textgen.startstate``); a prompt's n rows
  read it once (the first reads it, the others copy its state at its end);
* newcomers that started from the prompt cache and have read the rest of their prompt draw their first characters
  in a call of their own, at their small batch (a quick first character; the others wait the few ms it takes); so
  do those with a prompt of up to ``prefill`` ids, which they read in that call;
* every busy row advances in one ``Sampler.generate_steps`` call: a row still reading its prompt is fed its next
  ids in the call (and starts drawing in it once the prompt ends), the others draw. The batch is the busy rows
  only (one request runs at the single-stream speed), and a call is short (``CALL_CHARS`` characters over all
  rows), so that text streams out, newcomers join within tens of milliseconds, and a 100 KB prompt is read a
  call's steps at a time beside the others' streams;
* rows that have drawn all they were asked for are given back at once; the call's ids go to the ``Emitter``, which
  turns them into each request's text (cut at its stop sequences) and tells its listener while the next call runs.
  A row whose stop sequence the emitter finds is freed by the round after.

Two lanes keep the cores busy: while one lane's call computes, the other turns its last call into events, admits
newcomers and starts its next call, so the machine is never idle for a lane's Python (and its waits for the GIL,
which the HTTP server holds much of the time). A newcomer goes to the first lane with room, and a lane holds at
most half of the rows (unless one request needs more): a few streams share one batch, 64 run as two of 32.

Each row draws at the uniforms of (its request's seed, its position, its number in the request), the numbers
``textgen sample`` draws at: a seeded request gives the same text alone or among 63 others, and the text
``textgen sample --seed`` gives for its prompt.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque

import numpy as np

from textgen import promptcache
from textgen.emitter import Emitter
from textgen.generation import Sampler, count_drawn
from textgen.npsampling import row_uniforms
from textgen.promptcache import PromptCache
from textgen.rowtable import Finish, Held, Job, Listener, Row, RowTable, Ticket

log = logging.getLogger(__name__)

# Characters per generate call over a lane's busy rows, per row at least MIN_STEPS and at most MAX_STEPS: at 64
# clients, 32 rows a lane, 64 steps a call, ~30 ms for the default model (1 x 512) on 2 cores with the other
# lane's call beside it; at 8 clients, 8 rows in one lane, 128 steps. A newcomer waits about one call to join.
# Against 2,048 characters and at least 32 steps (benchmarks/serve.py, mixed load, 20 s each, alternating): 8
# clients 51.9k and 56.5k chars/s against 53.1k and 39.6k, first character p50 35-38 ms against 52-70; 64 clients
# 119.4k and 122.0k against 116.4k and 119.0k. And 64-step calls at 32 rows against 32-step ones: 112.1k and
# 112.5k chars/s against 100.5k and 109.2k, the 100-character prompts' first character p95 112-117 ms against
# 101-110.
CALL_CHARS = 1024
MIN_STEPS, MAX_STEPS = 64, 256
FIRST_CHARS = 8  # characters a newcomer draws in the call that reads its prompt on arrival
# A newcomer's prompt is read on arrival only when reading it in the batch's calls would keep its first character
# longer than this (at the lane's recent time per step): a read on arrival costs the other streams ~8% of the
# throughput at 64 clients (100.6k-105.3k chars/s without, 87.4k-94.7k with), and a machine where the batch reads a
# 100-character prompt within this needs none.
FIRST_CHAR_GOAL = 0.1  # seconds
IDLE_WAIT = 0.05  # seconds a round with nothing to do waits for a request (or a drain's deadline)
# Scheduler threads with calls in flight at once. At 64 clients the one lane spent 17% of its time outside
# TensorFlow (its Python, and waits for the GIL while the HTTP server's event loop held it), with the cores idle.
# In isolation, with 2 ms of Python after every 32-step call: one lane of 64 rows 92.9k chars/s, two of 32 rows
# 116.6k (and 133.5k against 122.1k with no Python between calls).
LANES = 2


class QueueFull(Exception):
    """More requests than free rows and queue places."""


class Draining(Exception):
    """The engine is draining and takes no new requests."""


class Engine:
    """Rows of LSTM state shared by many requests (a ``RowTable``), advanced by ``lanes`` scheduler threads (1 for a
    sampler whose calls may not overlap); their events are made by one ``Emitter``."""

    def __init__(
        self,
        sampler: Sampler,
        slots: int = 64,
        max_queue: int = 256,
        prefill: int = 0,
        lanes: int = LANES,
        cache: PromptCache | None = None,
    ) -> None:
        self.sampler, self.slots, self.max_queue, self.prefill = sampler, slots, max_queue, prefill
        self.lanes = lanes if sampler.concurrent_calls else 1
        self.step_seconds: list[float | None] = [None] * self.lanes  # each lane's recent time per step of its calls
        self.cache = cache if cache is not None else PromptCache(0)  # off unless given one
        self.table = RowTable(sampler, slots, self.lanes, self.cache)
        self.lock = self.table.lock  # the queue's too: submit counts the free rows under it
        self.waiting: deque[Ticket] = deque()
        self.drain_deadline: float | None = None
        self.stopping = False
        self.ready = threading.Event()
        self.emitter: Emitter | None = None
        self.threads = [
            threading.Thread(target=self._run, args=(lane,), name=f"textgen-engine-{lane}", daemon=True)
            for lane in range(self.lanes)
        ]
        self.lanes_running = self.lanes

    # --- the caller's side (any thread) -------------------------------------------------------

    def start(self) -> None:
        """Make a first call of the sampler's steps (any error is raised here), then start scheduling."""
        self._warm_up()
        self.emitter = Emitter(self.sampler.vocab)
        self.ready.set()
        for thread in self.threads:
            thread.start()

    def submit(self, job: Job, listener: Listener) -> Ticket:
        """Queue ``job``; its events go to ``listener`` from the engine's emitter thread. Raises ``QueueFull`` or
        ``Draining``; a job with more rows than the engine has is a ``ValueError``."""
        if job.rows > self.slots:
            raise ValueError(f"{job.rows} continuations need more rows than the server's {self.slots}")
        ticket = Ticket(job, listener)
        with self.lock:
            if self.drain_deadline is not None or self.stopping:
                raise Draining
            would_wait = self._queued() > 0 or self._rows_waiting() + job.rows > self.free_rows()
            if would_wait and self._queued() >= self.max_queue:
                raise QueueFull
            self.waiting.append(ticket)
            self.lock.notify_all()
        return ticket

    def cancel(self, ticket: Ticket) -> None:
        """Give ``ticket``'s rows back by the next round (its client went away); no more events reach it."""
        with self.lock:
            ticket.cancelled = True
            self.lock.notify_all()

    def drain(self, grace: float) -> None:
        """Take no new requests; end queued ones now and running ones after ``grace`` seconds."""
        with self.lock:
            if self.drain_deadline is None:
                self.drain_deadline = time.monotonic() + grace
            self.lock.notify_all()

    def close(self, timeout: float = 10.0) -> None:
        """Stop the scheduler (requests still open end as ``shutdown``)."""
        with self.lock:
            self.stopping = True
            self.lock.notify_all()
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            if thread.is_alive():
                thread.join(max(0.0, deadline - time.monotonic()))

    @property
    def rows(self) -> list[Row | None]:
        """The rows as they stand (a copy)."""
        return self.table.rows

    def free_rows(self) -> int:
        return self.table.free()

    @property
    def busy_rows(self) -> int:
        return self.slots - self.free_rows()

    @property
    def queue_length(self) -> int:
        """Requests waiting for rows: those the free rows cannot take at once."""
        return self._queued()

    def _rows_waiting(self) -> int:
        return sum(t.job.rows for t in self.waiting)

    def _queued(self) -> int:
        free, queued = self.free_rows(), 0
        for ticket in list(self.waiting):
            if not queued and ticket.job.rows <= free:
                free -= ticket.job.rows
            else:
                queued += 1
        return queued

    # --- the scheduler's threads --------------------------------------------------------------

    def _run(self, lane: int) -> None:
        while True:
            with self.lock:
                stopping = self.stopping
                now = time.monotonic()
                self._take_waiting(now, lane)
                mine, ended = self.table.hand(lane, now, self.drain_deadline)
                if not mine and not ended and not stopping:
                    self.lock.wait(IDLE_WAIT)
                    continue
            for row, reason in ended:
                self._emit().end(row, reason)
            if stopping:
                self._end_rows(lane, mine, Finish.shutdown)
                with self.lock:
                    self.lanes_running -= 1
                    last = self.lanes_running == 0
                if last:  # the other lanes' rows have had their last events posted
                    self._emit().close()
                return
            try:
                self._round(lane, mine)
            except Exception:  # one failed call ends the requests it served, not the server
                log.exception("a sampler call failed")
                self._end_rows(lane, mine, Finish.error)

    def _warm_up(self) -> None:
        logits, states = self.table.logits[:1], self.sampler.zero_states(1)
        uniforms, forced = row_uniforms(np.zeros(1), np.zeros(1), np.zeros(1), 2), np.full([2, 1], -1, np.int32)
        self.sampler.generate_steps(logits, states, uniforms, self.table.settings([0]), forced)  # as rounds call it

    def _take_waiting(self, now: float, lane: int) -> None:
        """Under the lock: drop queued tickets that were cancelled or timed out, end them all when draining, and
        give ``lane`` those that fit the free rows, in order, when it is the first lane with room for them: a lane
        holds at most its share of the rows (a request with more rows than that only a lane that has none). Filling
        the first lane first keeps a few streams in one batch: at 8 clients, two lanes of 4 rows ran at 0.53 of
        ``textgen sample``'s batch-8 rate."""
        ended = [t for t in self.waiting if t.cancelled or now >= t.deadline]
        draining = self.drain_deadline is not None or self.stopping
        if draining:
            ended = list(self.waiting)
        for ticket in ended:
            self.waiting.remove(ticket)
            reason = Finish.shutdown if draining else Finish.cancelled if ticket.cancelled else Finish.timeout
            self._emit().end_queued(ticket, reason)
        free = self.free_rows()
        share = -(-self.slots // self.lanes)
        held = self.table.held()
        while self.waiting and self.waiting[0].job.rows <= free:
            rows = self.waiting[0].job.rows
            if next((n for n in range(self.lanes) if held[n] + rows <= max(share, rows)), None) != lane:
                break  # the first lane with room takes it: a few streams run in one lane, as one batch
            ticket = self.waiting.popleft()
            free -= rows
            held[lane] += rows
            # Rows are claimed now, under the lock, so submit's queue check counts them.
            self.table.claim(ticket, lane, self.sampler.encode_prompts(ticket.job.prompts))

    def _round(self, lane: int, mine: Held) -> None:
        """One round of ``lane`` over the rows the table handed it (``mine``: those it gives back leave the list)."""
        steps = self._call_steps(len(mine))
        self._share_prompts(lane, mine, steps)
        self._start_newcomers(lane, mine)
        self._advance(lane, mine, steps, timed=True)

    def _slow_in_batch(self, lane: int, length: int, steps: int) -> bool:
        """Whether the lane's calls of ``steps`` would take longer than ``FIRST_CHAR_GOAL`` to read a prompt of
        ``length`` ids and draw its first character, at the lane's recent time per step."""
        step_seconds = self.step_seconds[lane]
        calls = -(-(length + 1) // steps)  # the call that draws its first character
        return step_seconds is None or calls * steps * step_seconds > FIRST_CHAR_GOAL

    def _on_arrival(self, lane: int, row: Row, steps: int) -> bool:
        """Whether ``row``, which has drawn nothing yet, reads its prompt apart from the batch on arrival: one of up to
        ``prefill`` ids that the batch's calls would be slow to read, and longer than the next call reads."""
        length = len(row.prompt)
        return row.generated == 0 and steps <= length <= self.prefill and self._slow_in_batch(lane, length, steps)

    def _share_prompts(self, lane: int, mine: Held, steps: int) -> None:
        """The n rows of a prompt read it once: its first row reads it, in the batch's calls while the rest is longer
        than a call, then the rest in a read of its own (a call would draw on past the prompt's end, where its
        state is wanted), and the rows that follow it take copies of its logits and states. A prompt read on
        arrival is read so at once. The read costs one batch-1 step per id it has left, at most a call's steps.

        With the prompt cache on, the rest of every prompt of ``promptcache.EVERY`` ids or more is read so (a row of
        its own too), in reads that end at its checkpoints, and the state at each is kept in the cache: at the
        prompt's end it is wanted before any draw. A shorter prompt is read in the batch's calls and not kept: it
        costs at most a call's steps to read again, shared with the batch, against a batch-1 read of its own.
        (A prompt's n rows share their read apart anyway, and keep its state.)"""
        slot_of = {id(row): slot for slot, row in mine}
        caching = self.cache.enabled
        for slot, row in mine:
            left = len(row.prompt) - row.read
            keep = caching and row.generated == 0 and len(row.prompt) >= promptcache.EVERY
            if row.follows is not None or not (row.followers or keep):
                continue
            if (left > steps and not (row.read == 0 and self._on_arrival(lane, row, steps))) or not (
                left or row.followers
            ):
                continue
            logits, states = self.table.logits[[slot]], tuple(s[[slot]] for s in self.table.states)
            first = row.read
            while first < len(row.prompt):
                end = min(len(row.prompt), promptcache.next_checkpoint(first, row.branch))
                logits, states = self.sampler.read(row.prompt[None, first:end].astype(np.int32), states)
                if caching:
                    after = row.prompt[end:]
                    self.cache.put(row.prompt[:end], logits[0], tuple(s[0] for s in states), row.links, after)
                first = end
            targets = [slot, *(slot_of[id(f)] for f in row.followers)]
            copies = len(targets)
            logits, states = np.asarray(logits), tuple(np.asarray(s) for s in states)
            self.table.store(targets, np.repeat(logits, copies, 0), tuple(np.repeat(s, copies, 0) for s in states))
            for follower in (row, *row.followers):
                follower.read, follower.follows = len(follower.prompt), None
            row.followers = []

    def _start_newcomers(self, lane: int, mine: Held) -> None:
        """Rows that have drawn nothing yet and are ready to, or nearly, draw their first characters in a call of
        their own, at their small batch, where a step costs a fraction of one at the full batch: those characters go
        out while the batch's call runs, and the lane's other rows wait for this call. They are the rows that
        started from the prompt cache and have read the rest of their prompt (a cached prefix is for a quick first
        character; in the mixed load, where hits are rare, giving every prompt read apart such a call raised the
        100-character prompts' first character p95 by 36-44 ms), and rows that have just arrived with a prompt of
        at most ``prefill`` ids which the lane's calls would take longer than ``FIRST_CHAR_GOAL`` to read, read in
        that call. A prompt the batch's next call reads whole is left to it: reading it apart would cost a small
        batch's steps and gain little."""
        steps = self._call_steps(len(mine))
        newcomers = [
            (slot, row)
            for slot, row in mine
            if row.generated == 0
            and row.follows is None
            and not row.followers
            and (
                (row.read == len(row.prompt) and row.ticket.cached > 0)
                or (row.read in (0, len(row.prompt)) and self._on_arrival(lane, row, steps))
            )
        ]
        if newcomers:
            longest = max(len(row.prompt) - row.read for _, row in newcomers)
            done = self._advance(lane, newcomers, longest + FIRST_CHARS)
            mine[:] = [held for held in mine if held not in done]

    def _to_checkpoint(self, rows: list[Row], steps: int) -> int:
        """With the prompt cache on, the steps that end the call at the next checkpoint of a row that reads a long
        prompt in it (so that its state there is kept), when that is at least half ``MIN_STEPS`` away (else it is
        passed: after one call so ended a row reads up to its checkpoints); ``steps`` otherwise."""
        if not self.cache.enabled:
            return steps
        marks = [(promptcache.next_checkpoint(r.read, r.branch), r) for r in rows]
        near = [mark - r.read for mark, r in marks if mark < len(r.prompt) and MIN_STEPS // 2 <= mark - r.read < steps]
        return min(near, default=steps)

    def _call_steps(self, rows: int) -> int:
        """Steps per row of a lane's next generate call for ``rows`` rows: ``CALL_CHARS`` over them, within the
        bounds."""
        return max(MIN_STEPS, min(MAX_STEPS, CALL_CHARS // max(1, rows)))

    def _advance(self, lane: int, mine: Held, steps: int, timed: bool = False) -> Held:
        """One generate call of at most ``steps`` for ``mine``: rows still reading their prompt are fed its next ids
        (forced), and draw once it ends, in the same call; the rest draw. Rows that have drawn all they were asked for
        are given back to the table and leave ``mine`` (returned). A lane's batch call (``timed``) updates its time
        per step."""
        waiting = [held for held in mine if held[1].follows is not None]  # for a copy of their prompt's state
        calling = [held for held in mine if held[1].follows is None]
        if not calling:
            return []
        slots, rows = [slot for slot, _ in calling], [row for _, row in calling]
        left = max(len(r.prompt) - r.read + r.ticket.job.max_chars - r.generated for r in rows)
        steps = min(left, steps, self._to_checkpoint(rows, steps))
        forced = np.full([steps, len(rows)], -1, np.int32)
        reads = np.array([min(steps, len(r.prompt) - r.read) for r in rows])
        for b, (row, n) in enumerate(zip(rows, reads, strict=True)):
            forced[:n, b] = row.prompt[row.read : row.read + n]
        # A row's draws after its prompt are at positions generated, generated + 1, ...: as textgen sample's.
        positions = (np.array([r.generated for r in rows], np.int64) - reads).astype(np.uint64)
        uniforms = row_uniforms(self.table.seeds[slots], positions, np.array([r.sample for r in rows]), steps)
        # Without prompt ids to feed, the plain drawing loop: the forced one's gather and select per step cost 9% at
        # batch 1 and 4% at batch 64 (alternating A/B, 3 x 3 s each).
        settings = self.table.settings(slots)
        counts = None if settings.penalties is None else self.table.counts[slots]
        started = time.monotonic()
        ids, logits, states = self.sampler.generate_steps(
            self.table.logits[slots],
            tuple(s[slots] for s in self.table.states),
            uniforms,
            settings,
            forced if reads.any() else None,
            counts=counts,
        )
        if timed:
            measured, recent = (time.monotonic() - started) / steps, self.step_seconds[lane]
            self.step_seconds[lane] = measured if recent is None else 0.8 * recent + 0.2 * measured
        self.table.store(slots, logits, states)
        if counts is not None:  # what each row drew after its prompt (a finished row's surplus too: it is freed)
            self.table.counts[slots] = count_drawn(counts, ids, np.arange(steps)[None, :] >= reads[:, None])
        drawn = np.minimum(steps - reads, [r.ticket.job.max_chars - r.generated for r in rows])
        last = []
        for b, (row, n, k) in enumerate(zip(rows, reads, drawn, strict=True)):
            row.read += int(n)
            kept = row.read % promptcache.EVERY == 0 or row.read == row.branch
            if self.cache.enabled and n and kept and row.read < len(row.prompt):
                state = tuple(np.asarray(s[b]) for s in states)
                self.cache.put(row.prompt[: row.read], np.asarray(logits[b]), state, row.links, row.prompt[row.read :])
            row.generated += int(k)
            last.append(row.generated >= row.ticket.job.max_chars)
        # Rows whose text is all drawn are given back for the next claim; the emitter says the rest.
        done = [held for held, is_last in zip(calling, last, strict=True) if is_last]
        self.table.release(lane, done)
        mine[:] = waiting + [held for held, is_last in zip(calling, last, strict=True) if not is_last]
        self._emit().drawn(rows, ids, reads, drawn, last)
        return done

    def _end_rows(self, lane: int, mine: Held, reason: Finish) -> None:
        """Give back ``lane``'s rows ``mine`` now; the emitter ends their streams after the text already posted."""
        self.table.release(lane, mine)
        for _, row in mine:
            self._emit().end(row, reason)
        mine.clear()

    def _emit(self) -> Emitter:
        if self.emitter is None:
            raise RuntimeError("the engine has not been started")
        return self.emitter
