"""The continuous-batching engine on the session's tiny run: texts as `textgen sample` draws them, alone or among
many, stop sequences, the queue, cancellation, time limits and draining."""

from __future__ import annotations

import itertools
import sys
import threading
import time
from collections import defaultdict

import numpy as np
import pytest
from helpers import wait_until
from hypothesis import example, given
from hypothesis import strategies as st

from textgen import engine as engine_module
from textgen import promptcache
from textgen.engine import FIRST_CHARS, Draining, Engine, QueueFull
from textgen.genconfig import MAX_STOP_CHARS, SampleConfig
from textgen.promptcache import PromptCache
from textgen.rowtable import Event, Finish, Job
from textgen.stops import StopScanner


@pytest.fixture(scope="module")
def sampler(trained_run):
    from textgen.sampling import Generator

    return Generator.from_run(trained_run.run)


class Collector:
    """A request's listener: its events, each continuation's text, and whether all of them have finished."""

    def __init__(self, rows: int) -> None:
        self.events: list[Event] = []
        self.texts: dict[int, str] = defaultdict(str)
        self.finishes: dict[int, Finish] = {}
        self.rows = rows
        self.done = threading.Event()

    def __call__(self, event: Event) -> None:
        self.events.append(event)
        self.texts[event.index] += event.text
        if event.finish is not None:
            self.finishes[event.index] = event.finish
            if len(self.finishes) == self.rows:
                self.done.set()

    def wait(self, timeout: float = 60.0) -> Collector:
        assert self.done.wait(timeout), f"not finished after {timeout} s: {self.finishes}"
        return self


def submit(engine: Engine, job: Job) -> Collector:
    collector = Collector(job.rows)
    engine.submit(job, collector)
    return collector


def record_fed_calls(sampler, monkeypatch) -> list[tuple[int, int]]:
    """(rows, steps) of each of ``sampler``'s generate calls that feeds prompt ids, from now on."""
    fed: list[tuple[int, int]] = []
    generate = sampler.generate_steps

    def spy(logits, states, uniforms, settings, forced=None, counts=None):
        if forced is not None:
            fed.append((forced.shape[1], forced.shape[0]))
        return generate(logits, states, uniforms, settings, forced, counts)

    monkeypatch.setattr(sampler, "generate_steps", spy)
    return fed


@pytest.fixture
def engine(sampler):
    engine = Engine(sampler, slots=64, max_queue=16)
    engine.start()
    assert engine.ready.wait(60)
    yield engine
    engine.close()


def test_a_seeded_request_gives_the_text_textgen_sample_gives(engine, sampler) -> None:
    job = Job(("The ",), max_chars=300, n=3, temperature=0.9, top_k=12, seed=42)
    texts = submit(engine, job).wait().texts
    expected = sampler.generate(["The "] * 3, SampleConfig(length=300, num=3, temperature=0.9, top_k=12, seed=42))
    assert [texts[i] for i in range(3)] == expected


def test_penalized_rows_beside_plain_ones_each_get_the_text_textgen_sample_gives(engine, sampler) -> None:
    """Each row counts its own characters from zero (rows reclaimed by later requests too), and a plain request in
    the same batch is drawn as without penalties."""
    penalized = dict(frequency_penalty=0.5, presence_penalty=0.2, logit_bias=(("e", -100.0), (" ", 1.0)))
    jobs = [
        Job(("The ", "the fox "), max_chars=200, n=2, temperature=0.0, seed=3, **penalized),
        Job(("The ",), max_chars=150, n=2, temperature=0.9, seed=3),
        Job(("a",), max_chars=250, temperature=1.0, top_k=8, seed=5, frequency_penalty=-0.5),
    ]
    for _ in range(2):  # the second time in rows the first left
        collectors = [submit(engine, job) for job in jobs]
        for job, collector in zip(jobs, collectors, strict=True):
            texts = collector.wait().texts
            settings = SampleConfig(
                length=job.max_chars, num=job.n, temperature=job.temperature, top_k=job.top_k, seed=job.seed,
                frequency_penalty=job.frequency_penalty, presence_penalty=job.presence_penalty,
                logit_bias=job.logit_bias,
            )  # fmt: skip
            expected = [t for p in job.prompts for t in sampler.generate([p] * job.n, settings)]
            assert [texts[i] for i in range(job.rows)] == expected
    assert "e" not in "".join(collectors[0].texts.values())


def test_a_seeded_request_gives_the_same_text_alone_and_among_63_others(engine) -> None:
    job = Job(("the fox ",), max_chars=400, temperature=1.0, top_p=0.9, seed=7)
    alone = submit(engine, job).wait().texts[0]
    others = [
        submit(
            engine,
            Job(
                (f"prompt {i} " * (i % 5 + 1),),
                max_chars=50 + 13 * i,
                temperature=[0.0, 0.5, 1.2][i % 3],
                top_k=i % 4,
                top_p=[1.0, 0.8][i % 2],
                seed=i,
            ),
        )
        for i in range(40)
    ]
    among = submit(engine, job)
    others += [submit(engine, Job(("x",), max_chars=300, seed=100 + i)) for i in range(23)]
    assert among.wait().texts[0] == alone
    for other in others:
        other.wait()
    assert engine.busy_rows == 0


def test_a_long_prompt_is_read_in_pieces_while_others_stream(engine) -> None:
    long = submit(engine, Job(("a long prompt " * 400,), max_chars=20, seed=1))
    short = submit(engine, Job(("hi",), max_chars=20, seed=2))
    short.wait()
    assert not long.events, "the short request finished before the long prompt was read"
    assert long.wait().finishes == {0: Finish.length}


@given(
    text=st.text(alphabet="abc", max_size=40),
    stops=st.lists(st.text(alphabet="abc", min_size=1, max_size=4), max_size=3),
    cuts=st.lists(st.integers(0, 40), max_size=6),
)
@example(text="aca", stops=["c", "aca"], cuts=[2])  # "c" is completed first, whether "aca" comes whole or not
@example(text="a" * 30 + "abab", stops=["abab"], cuts=[29, 31])  # more possible starts than are checked
def test_stop_sequences_are_trimmed_alike_however_the_stream_is_split(text, stops, cuts) -> None:
    # The first stop sequence to be completed, the earlier-starting of two completed together: (end, start).
    first = min(((start + len(s), start) for s in stops if (start := text.find(s)) >= 0), default=None)
    expected = text if first is None else text[: first[1]]
    scanner, sent, stopped = StopScanner(tuple(stops)), "", False
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    for start, end in itertools.pairwise(bounds):
        piece, stopped = scanner.push(text[start:end])
        sent += piece
        if stopped:
            break
    if not stopped:
        sent += scanner.flush()
    assert sent == expected
    assert stopped == (first is not None)


def test_a_push_costs_the_same_however_long_the_stops_and_the_stream(monkeypatch) -> None:
    """The scanner's work per push, counted in the calls it makes (each over at most its text and the longest
    stop): bounded by a constant, for stops of 2 characters or of the most allowed, at the first push or the
    thousandth, on text made to look like the start of a stop sequence everywhere."""

    def calls_per_push(stops: tuple[str, ...], text: str) -> list[int]:
        scanner, counts = StopScanner(stops), []
        for start in range(0, len(text), 64):
            calls = [0]

            def count(frame, event, arg, calls=calls) -> None:
                calls[0] += event == "c_call"

            sys.setprofile(count)
            scanner.push(text[start : start + 64])
            sys.setprofile(None)
            counts.append(calls[0])
            assert len(scanner.held) < max(map(len, stops))
        return counts

    for length in (2, MAX_STOP_CHARS):
        stops = ("a" * (length - 1) + "c", "ab" * (length // 2), "ba" * (length // 2), "b" * length)
        for text in ("a" * 64_000, "ab" * 32_000):
            counts = calls_per_push(stops, text)
            assert max(counts) <= 40, (length, text[:4], max(counts))


def test_a_stop_sequence_ends_the_row(engine, sampler) -> None:
    whole = sampler.generate(["The "], SampleConfig(length=200, temperature=0.0, seed=0))[0]
    stop = whole[60:63]
    result = submit(engine, Job(("The ",), max_chars=200, temperature=0.0, stops=(stop, "\x00never")))
    result.wait()
    assert result.texts[0] == whole[: whole.find(stop)]
    assert result.finishes == {0: Finish.stop}
    assert [e.finish for e in result.events][-1] is Finish.stop and all(e.finish is None for e in result.events[:-1])
    wait_until(lambda: engine.busy_rows == 0, "the row was not freed after its stop sequence")


def test_requests_beyond_the_rows_and_the_queue_are_refused_at_once(sampler) -> None:
    engine = Engine(sampler, slots=2, max_queue=1)  # not started: nothing leaves the queue
    job = Job(("x",), max_chars=10)
    submit(engine, job)
    submit(engine, job)  # the two fit the free rows
    submit(engine, job)  # waits
    assert engine.queue_length == 1
    with pytest.raises(QueueFull):
        submit(engine, job)
    with pytest.raises(ValueError, match="more rows than the server's 2"):
        submit(engine, Job(("x",), max_chars=10, n=3))


def test_a_cancelled_request_frees_its_row_by_the_next_round(engine, monkeypatch) -> None:
    calls = []
    generate_steps = engine.sampler.generate_steps
    monkeypatch.setattr(engine.sampler, "generate_steps", lambda *a, **k: calls.append(1) or generate_steps(*a, **k))
    collector = Collector(1)
    ticket = engine.submit(Job(("x",), max_chars=10**6), collector)
    wait_until(lambda: collector.events, "no event came")
    engine.cancel(ticket)
    after_cancel = len(calls)
    wait_until(lambda: engine.busy_rows == 0, "the cancelled request's row was not freed")
    # At most the call that was starting as it was cancelled; the round after it frees the row.
    assert len(calls) - after_cancel <= 1
    assert not collector.done.is_set()


def test_a_request_out_of_time_ends_saying_so(engine, monkeypatch) -> None:
    """Its deadline passes once it has text: the engine's clock is moved past it then (a real 0.3 s deadline
    raced the first call on a busy machine)."""
    ahead = [0.0]

    class Clock:  # the engine's time, real time plus what the test moves it on by
        @staticmethod
        def monotonic() -> float:
            return time.monotonic() + ahead[0]

    monkeypatch.setattr(engine_module, "time", Clock)
    collector = submit(engine, Job(("x",), max_chars=10**6, timeout=3600))
    wait_until(lambda: collector.events, "no event came", timeout=60)
    ahead[0] = 3601.0
    result = collector.wait()
    assert result.finishes == {0: Finish.timeout}
    assert result.texts[0]
    assert engine.busy_rows == 0


def test_draining_ends_running_and_queued_requests_and_refuses_new_ones(sampler) -> None:
    engine = Engine(sampler, slots=1, max_queue=4)
    engine.start()
    assert engine.ready.wait(60)
    running = submit(engine, Job(("x",), max_chars=10**6))
    queued = submit(engine, Job(("y",), max_chars=10))
    wait_until(lambda: running.events, "the running request got no event")
    engine.drain(grace=0.2)
    with pytest.raises(Draining):
        submit(engine, Job(("z",), max_chars=10))
    assert queued.wait(5).finishes == {0: Finish.shutdown}
    assert running.wait(5).finishes == {0: Finish.shutdown}
    assert engine.busy_rows == 0
    engine.close()
    assert not any(thread.is_alive() for thread in engine.threads)


def test_prompts_read_on_arrival_give_the_same_text(sampler, monkeypatch) -> None:
    # Calls of 4 steps: a prompt of 4 or more ids is read on arrival, a shorter one by the call itself; every batch
    # call is too slow to read one within the goal.
    monkeypatch.setattr(engine_module, "CALL_CHARS", 4)
    monkeypatch.setattr(engine_module, "MIN_STEPS", 4)
    monkeypatch.setattr(engine_module, "FIRST_CHAR_GOAL", 0.0)
    fed = record_fed_calls(sampler, monkeypatch)
    engine = Engine(sampler, slots=8, max_queue=8, prefill=64)
    engine.start()
    try:
        short = submit(engine, Job(("The old ", "The dog "), max_chars=200, temperature=0.9, seed=4))
        long = submit(engine, Job(("a prompt longer than the prefill " * 4,), max_chars=100, seed=5))
        tiny = submit(engine, Job(("He ",), max_chars=50, seed=6))
        texts = short.wait().texts
        long_text = long.wait().texts[0]
        tiny_text = tiny.wait().texts[0]
    finally:
        engine.close()
    # The two rows of the first request read their prompts in a call of their own and drew their first characters in
    # it; every other call is one of the batch's, of 4 steps. (A prompt's n rows read it once: another test.)
    newcomers = (2, sampler.encode_prompts(["The old "])[0].size + engine_module.FIRST_CHARS)
    assert fed.count(newcomers) == 1 and all(steps <= 4 for rows, steps in fed if (rows, steps) != newcomers)
    for index, prompt in enumerate(["The old ", "The dog "]):
        assert texts[index] == sampler.generate([prompt], SampleConfig(length=200, temperature=0.9, seed=4))[0]
    assert long_text == sampler.generate(["a prompt longer than the prefill " * 4], SampleConfig(length=100, seed=5))[0]
    assert tiny_text == sampler.generate(["He "], SampleConfig(length=50, seed=6))[0]


def test_a_prompt_the_batch_reads_soon_enough_is_not_read_on_arrival(sampler, monkeypatch) -> None:
    monkeypatch.setattr(engine_module, "CALL_CHARS", 4)
    monkeypatch.setattr(engine_module, "MIN_STEPS", 4)
    monkeypatch.setattr(engine_module, "FIRST_CHAR_GOAL", 3600.0)  # any call is quick enough
    fed = record_fed_calls(sampler, monkeypatch)
    engine = Engine(sampler, slots=8, max_queue=8, prefill=64, lanes=1)
    engine.start()
    try:
        running = submit(engine, Job(("x",), max_chars=10**6))
        wait_until(lambda: running.events, "the running request got no event")  # the lane has timed a call
        text = submit(engine, Job(("The old ",), max_chars=50, seed=4)).wait().texts[0]
        engine.cancel(next(row.ticket for row in engine.rows if row is not None))
    finally:
        engine.close()
    assert all(steps <= 4 for rows, steps in fed)  # no call of its own: the batch's 4-step calls read the prompt
    assert text == sampler.generate(["The old "], SampleConfig(length=50, seed=4))[0]


def test_two_lanes_share_the_rows(sampler) -> None:
    engine = Engine(sampler, slots=4, max_queue=4, lanes=2)
    engine.start()
    try:
        running = [submit(engine, Job((f"{i}",), max_chars=10**6)) for i in range(4)]
        wait_until(lambda: all(r.events for r in running), "not every request got an event")
        lanes = sorted(row.lane for row in engine.rows if row is not None)
        seeded = submit(engine, Job(("The old ",), max_chars=1, seed=3))
        assert engine.queue_length == 1  # every row busy
        for row in list(engine.rows):
            if row is not None:
                engine.cancel(row.ticket)
        assert seeded.wait().texts[0]
        wait_until(lambda: engine.busy_rows == 0, "rows still busy after every request ended")
    finally:
        engine.close()
    assert lanes == [0, 0, 1, 1]  # each lane at most half of the rows


class PausingLock:
    """An engine lock's inner lock that, once armed, holds the thread of ``lane`` just after it lets go of the lock
    with ``busy`` rows busy, until the test says go: the gap in which another lane may claim a row the first freed."""

    def __init__(self, engine: Engine, lane: int, busy: int) -> None:
        self.engine, self.inner, self.name, self.busy = engine, engine.lock._lock, f"textgen-engine-{lane}", busy
        self.armed, self.paused, self.go = False, threading.Event(), threading.Event()

    def __enter__(self):
        return self.inner.__enter__()

    def __exit__(self, *args):
        released = self.inner.__exit__(*args)
        here = threading.current_thread().name == self.name
        if self.armed and here and self.engine.busy_rows == self.busy:
            self.armed = False
            self.paused.set()
            assert self.go.wait(30), "the test never let the lane go on"
        return released

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_row_freed_and_claimed_by_the_other_lane_is_advanced_by_that_lane_alone(sampler) -> None:
    """Lane 0 frees a cancelled request's row and is held just after; lane 1 claims that row for a newcomer; lane 0
    goes on. The newcomer's text is still the one `textgen sample` gives: lane 0 did not advance a row it no longer
    owns (it did, when its round re-read the rows after freeing one)."""
    engine = Engine(sampler, slots=4, max_queue=4, lanes=2)
    pausing = PausingLock(engine, lane=0, busy=1)
    engine.lock._lock = pausing
    engine.start()
    try:
        freed = engine.submit(Job(("a",), max_chars=10**6), Collector(1))  # lane 0, row 0
        kept = submit(engine, Job(("b",), max_chars=10**6))  # lane 0, row 1 (each lane holds up to 2)
        wait_until(lambda: kept.events, "the second request got no event")
        pausing.armed = True
        engine.cancel(freed)
        assert pausing.paused.wait(30), "lane 0 did not free the cancelled row"
        # Two rows do not fit lane 0 beside its one: lane 1 takes them, the first being the row lane 0 just freed.
        job = Job(("The old ",), max_chars=300, n=2, temperature=0.9, seed=11)
        newcomer = submit(engine, job)
        wait_until(lambda: engine.busy_rows == 3, "lane 1 did not claim the freed row")
        pausing.go.set()
        texts = newcomer.wait().texts
        engine.cancel(next(row.ticket for row in engine.rows if row is not None))
    finally:
        pausing.go.set()
        engine.close()
    expected = sampler.generate(["The old "] * 2, SampleConfig(length=300, num=2, temperature=0.9, seed=11))
    assert [texts[0], texts[1]] == expected


@pytest.mark.parametrize("cached", [0, 12])
def test_many_short_requests_over_two_lanes_each_get_the_text_textgen_sample_gives(
    sampler, monkeypatch, cached
) -> None:
    """Rows freed and claimed all the time: 150 requests of 1 to 3 rows, 1 to 40 characters each, some cut by a stop
    sequence, some read on arrival, over 8 rows in two lanes whose calls are a few steps long (over a thousand calls).
    Every row's text is the one `textgen sample` gives for its seed. With a prompt cache of 12 entries, checkpoints
    every 4 characters: most prompts start from a cached state, and entries leave all the time."""
    monkeypatch.setattr(promptcache, "EVERY", 4)
    monkeypatch.setattr(engine_module, "CALL_CHARS", 8)
    monkeypatch.setattr(engine_module, "MIN_STEPS", 2)
    monkeypatch.setattr(engine_module, "MAX_STEPS", 8)
    monkeypatch.setattr(engine_module, "FIRST_CHAR_GOAL", 0.0)  # prompts of 2 to 16 ids read on arrival
    calls = []
    generate_steps = sampler.generate_steps
    monkeypatch.setattr(sampler, "generate_steps", lambda *a, **k: calls.append(1) or generate_steps(*a, **k))
    words = ["a", "The ", "the old fox ", "sat on the mat and ", "x" * 30]
    jobs = [
        Job(
            (words[i % len(words)],),
            max_chars=1 + (i * 7) % 40,
            n=1 + i % 3,
            temperature=[0.0, 0.7, 1.0][i % 3 if i % 4 else 1],
            top_k=[0, 5][i % 2],
            seed=i,
            stops=("e",) if i % 5 == 0 else (),
        )
        for i in range(150)
    ]
    engine = Engine(sampler, slots=8, max_queue=len(jobs), prefill=16, lanes=2, cache=PromptCache(cached))
    engine.start()
    try:
        results = [submit(engine, job) for job in jobs]
        for result in results:
            result.wait()
        wait_until(lambda: engine.busy_rows == 0, "rows still busy after every request ended")
    finally:
        engine.close()
    assert len(calls) > (600 if cached else 800), len(calls)  # 1,176 in one run (787 with the cache: reads apart)
    assert engine.cache.hits > (100 if cached else -1) and len(engine.cache) <= cached
    for job, result in zip(jobs, results, strict=True):
        settings = SampleConfig(
            length=job.max_chars, num=job.n, temperature=job.temperature, top_k=job.top_k, seed=job.seed
        )
        whole = sampler.generate(list(job.prompts) * job.n, settings)
        expected = [text[: text.find("e")] if job.stops and "e" in text else text for text in whole]
        assert [result.texts[i] for i in range(job.n)] == expected, job
        stopped = [Finish.stop if job.stops and "e" in text else Finish.length for text in whole]
        assert [result.finishes[i] for i in range(job.n)] == stopped, job


@pytest.mark.parametrize("prefill", [0, 64])
def test_a_prompt_s_n_continuations_read_it_once(sampler, monkeypatch, prefill) -> None:
    """n rows of one prompt: its ids are fed once (in the batch's calls, read on arrival, or the rest of it read
    apart), and each row's text is still the one `textgen sample` gives, which each row reading the prompt gave."""
    monkeypatch.setattr(engine_module, "CALL_CHARS", 16)
    monkeypatch.setattr(engine_module, "MIN_STEPS", 4)
    monkeypatch.setattr(engine_module, "MAX_STEPS", 16)
    monkeypatch.setattr(engine_module, "FIRST_CHAR_GOAL", 0.0)
    fed: list[int] = []
    generate_steps, read = sampler.generate_steps, sampler.read

    def count_generate(logits, states, uniforms, settings, forced=None, counts=None):
        fed.append(0 if forced is None else int((forced >= 0).sum()))
        return generate_steps(logits, states, uniforms, settings, forced, counts)

    def count_read(ids, states):
        fed.append(ids.size)
        return read(ids, states)

    monkeypatch.setattr(sampler, "generate_steps", count_generate)
    monkeypatch.setattr(sampler, "read", count_read)
    prompts = ("the old fox sat on the mat and the dog ran " * 2, "The old ")
    jobs = [Job((prompt,), max_chars=120, n=4, temperature=0.9, seed=9) for prompt in prompts]
    engine = Engine(sampler, slots=8, max_queue=4, prefill=prefill, lanes=1)
    engine.start()
    try:
        results = [submit(engine, job).wait().texts for job in jobs]  # one at a time: each one's ids counted apart
    finally:
        engine.close()
    monkeypatch.setattr(sampler, "generate_steps", generate_steps)
    monkeypatch.setattr(sampler, "read", read)
    assert sum(fed) == sum(sampler.encode_prompts(prompts)[i].size for i in range(2))
    for prompt, texts in zip(prompts, results, strict=True):
        expected = sampler.generate([prompt] * 4, SampleConfig(length=120, num=4, temperature=0.9, seed=9))
        assert [texts[i] for i in range(4)] == expected


def test_the_compiled_read_of_every_step_s_logits_is_the_step_by_step_one(sampler) -> None:
    """``Generator.read_logits`` (the server's logprobs) against ``Sampler.read_logits``, a ``read`` call a step."""
    from textgen.generation import Sampler

    ids = sampler.encode_prompts(["the old fox sat on the mat"])[0]
    start = tuple(s + 0.1 for s in sampler.zero_states(1))  # on top of a state, not only from zero
    compiled, compiled_states = sampler.read_logits(ids, start)
    stepped, stepped_states = Sampler.read_logits(sampler, ids, start)
    assert compiled.shape == (len(ids), sampler.vocab.size)
    np.testing.assert_allclose(compiled, stepped, atol=1e-5)
    for a, b in zip(compiled_states, stepped_states, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)


def cached_engine(sampler, entries: int = 64, lanes: int = 1) -> Engine:
    engine = Engine(sampler, slots=8, max_queue=8, lanes=lanes, cache=PromptCache(entries))
    engine.start()
    assert engine.ready.wait(60)
    return engine


def run_job(engine: Engine, job: Job) -> tuple[dict[int, str], int]:
    """Each continuation's text, and the prompt characters its rows started past (from the cache)."""
    collector = Collector(job.rows)
    ticket = engine.submit(job, collector)
    return collector.wait().texts, ticket.cached


@pytest.mark.parametrize("lanes", [1, 2])
def test_a_cached_start_gives_the_text_an_uncached_one_gives(sampler, monkeypatch, lanes) -> None:
    """Checkpoints every 100 characters: a 350-character prompt is read in the batch's call (ended at 100,
    kept) and its rest apart (200, 300 and its end, kept). The same prompt again starts at its end, one extending it
    there, one sharing 250 characters of it at 200, one sharing 150 at 100; each gives `textgen sample`'s text, with
    n 1 or 2, as with the cache off."""
    monkeypatch.setattr(promptcache, "EVERY", 100)
    prompt = ("the quick brown fox jumps over the lazy dog " * 9)[:350]
    assert len(sampler.encode_prompts([prompt])[0]) == 350  # every character known
    jobs = [
        (Job((prompt,), max_chars=60, seed=3), 0),
        (Job((prompt,), max_chars=60, seed=3), 350),
        (Job((prompt + " and then",), max_chars=60, n=2, temperature=1.0, seed=4), 350),
        (Job((prompt[:250] + "xyz",), max_chars=60, seed=5), 200),
        (Job((prompt[:150] + "xyz",), max_chars=60, seed=6), 100),  # kept from the batch's call
    ]
    engine, plain = cached_engine(sampler, lanes=lanes), cached_engine(sampler, entries=0, lanes=lanes)
    try:
        for job, cached in jobs:
            texts, started_past = run_job(engine, job)
            assert started_past == cached
            config = SampleConfig(length=60, num=job.n, temperature=job.temperature, seed=job.seed)
            expected = sampler.generate(list(job.prompts) * job.n, config)
            assert [texts[i] for i in range(job.n)] == expected
            assert run_job(plain, job) == (texts, 0)
        assert (engine.cache.hits, engine.cache.characters) == (4, 1000)
        assert len(plain.cache) == 0 and plain.cache.hits == 0
    finally:
        engine.close()
        plain.close()


@pytest.mark.parametrize("lanes", [1, 2])
def test_prompts_sharing_a_preamble_start_where_it_ends(sampler, monkeypatch, lanes) -> None:
    """Checkpoints every 100 characters, a shared preamble of 250: the first prompt keeps 100 and 200; the second
    starts at 200 and keeps its state at 250, where it leaves the first; the third starts at 250. Each gives
    `textgen sample`'s text."""
    monkeypatch.setattr(promptcache, "EVERY", 100)
    preamble = ("the quick brown fox jumps over the lazy dog " * 6)[:250]
    jobs = [(f"{preamble}{tail}", cached) for tail, cached in (("one", 0), ("two", 200), ("three", 250))]
    engine = cached_engine(sampler, lanes=lanes)
    try:
        for seed, (prompt, cached) in enumerate(jobs):
            texts, started_past = run_job(engine, Job((prompt,), max_chars=40, temperature=1.0, seed=seed))
            assert started_past == cached
            assert texts[0] == sampler.generate([prompt], SampleConfig(length=40, temperature=1.0, seed=seed))[0]
        assert engine.cache.longest(sampler.encode_prompts([preamble + "four"])[0]).length == 250  # type: ignore[union-attr]
    finally:
        engine.close()


def test_a_prompt_the_cache_holds_whole_draws_its_first_characters_at_once(sampler, monkeypatch) -> None:
    """A request whose whole prompt the cache holds is ready to draw: its first FIRST_CHARS characters come from a
    call of their own, before the batch's call of many steps, and its text is `textgen sample`'s."""
    monkeypatch.setattr(promptcache, "EVERY", 100)
    prompt = ("the quick brown fox jumps over the lazy dog " * 9)[:300]
    job = Job((prompt,), max_chars=120, temperature=1.0, seed=7)
    engine = cached_engine(sampler)
    try:
        run_job(engine, job)  # read, and kept at its end
        calls: list[tuple[int, int]] = []
        generate = sampler.generate_steps

        def spy(logits, states, uniforms, settings, forced=None, counts=None):
            calls.append((len(logits), len(uniforms)))
            return generate(logits, states, uniforms, settings, forced, counts)

        monkeypatch.setattr(sampler, "generate_steps", spy)
        texts, started_past = run_job(engine, job)
    finally:
        engine.close()
    assert started_past == 300
    assert calls[:2] == [(1, FIRST_CHARS), (1, 120 - FIRST_CHARS)]
    assert texts[0] == sampler.generate([prompt], SampleConfig(length=120, temperature=1.0, seed=7))[0]


def test_the_cache_keeps_its_bound_in_entries(sampler, monkeypatch) -> None:
    monkeypatch.setattr(promptcache, "EVERY", 16)
    engine = cached_engine(sampler, entries=5)
    try:
        for word in ("one", "two", "six", "ten"):  # 4 checkpoints each: 16, 32, 48 and 54
            run_job(engine, Job((f"prompt number {word} " * 3,), max_chars=5))
        assert len(engine.cache) == 5
        last = engine.cache.longest(sampler.encode_prompts(["prompt number ten " * 3])[0])
        assert last is not None and last.length == 54
        assert engine.cache.bytes == sum(e.nbytes for e in engine.cache._entries.values())
        assert engine.cache.longest(sampler.encode_prompts(["prompt number six " * 3])[0]) is not None  # its end
        assert engine.cache.longest(sampler.encode_prompts(["prompt number two " * 3])[0]) is None
    finally:
        engine.close()
