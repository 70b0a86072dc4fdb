"""OpenAI's completions API in textgen's terms, for ``textgen serve``: the request body and its checks, the engine job
it becomes, the answer built from the engine's events (whole, or streamed as server-sent events), the errors as
that API words them, and what the answers count in the metrics (``textgen.servemetrics``). No TensorFlow here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from textgen.config import flag
from textgen.engine import Engine
from textgen.errors import FieldError, shown
from textgen.genconfig import (
    MAX_LOGIT_BIAS,
    MAX_LOGPROB_ENTRIES,
    MAX_PROMPT_CHARS,
    MAX_PROMPTS,
    MAX_REQUEST_CHARS,
    MAX_STOP_CHARS,
    MAX_STOPS,
    MAX_WHOLE_CHARS,
    SampleConfig,
    ServeConfig,
)
from textgen.generation import Sampler, bias_row
from textgen.logprobs import MAX_LOGPROBS, CharScorer, Logprobs
from textgen.rowtable import Event, Finish, Job, Ticket
from textgen.servemetrics import Metrics

DISCONNECT_CHECK = 0.5  # seconds between checks that a non-streamed request's client is still there


# Our fields are named as the OpenAI API names them; SampleConfig's as the CLI does.
API_FIELDS = {"length": "max_tokens", "num": "n"}


@dataclass(frozen=True)
class ModelCard:
    """What the server says of its model: ``GET /info`` and ``GET /v1/models``."""

    model: str
    source: str  # "run", "litert" or "savedmodel"
    vocab_size: int
    units: int
    layers: int
    embedding_dim: int
    parameters: int
    training: dict[str, Any] = field(default_factory=dict)  # best_val_loss, best_val_bpc, epochs, ...
    created: int = field(default_factory=lambda: int(time.time()))


class ApiError(Exception):
    """An answer other than 200, as OpenAI's API words errors: ``{"error": {"message", "type", "param", "code"}}``,
    ``type`` a string (``invalid_request_error``, ``server_error``, ...) and ``code`` a string or null
    (``model_not_found``, ``invalid_api_key``, ``rate_limit_exceeded``, ...), as OpenAI's are."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind
        self.headers = headers

    def response(self) -> JSONResponse:
        error = {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}
        return JSONResponse({"error": error}, self.status, headers=self.headers)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: StrictBool = False


Finite = Annotated[float, Field(allow_inf_nan=False, strict=True)]  # an integer is a number too; a string is not
Stop = Annotated[str, Field(strict=True, max_length=MAX_STOP_CHARS)]


class CompletionRequest(BaseModel):
    """``POST /v1/completions``' body: OpenAI's fields (``max_tokens`` counts characters), and textgen's ``top_k``.
    Fields of that API that a character model cannot honour are refused when set, not ignored."""

    model_config = ConfigDict(extra="forbid")

    model: StrictStr
    prompt: StrictStr | Annotated[list[StrictStr], Field(min_length=1, max_length=MAX_PROMPTS)] = ""
    max_tokens: Annotated[int, Field(strict=True, ge=0, le=MAX_REQUEST_CHARS)] = SampleConfig.length  # 0: echo
    temperature: Finite = SampleConfig.temperature
    top_p: Finite = 1.0
    top_k: StrictInt = 0
    n: Annotated[int, Field(strict=True, ge=1)] = 1
    seed: StrictInt | None = None
    stop: Stop | Annotated[list[Stop], Field(max_length=MAX_STOPS)] | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    user: StrictStr | None = None  # recorded by OpenAI for abuse reports; accepted and unused here
    echo: StrictBool = False
    logprobs: Annotated[int, Field(strict=True, ge=0, le=MAX_LOGPROBS)] | None = None
    suffix: None = None
    best_of: Annotated[int, Field(strict=True, ge=1)] | None = None  # 1 or n: checked with n
    presence_penalty: Finite | None = None
    frequency_penalty: Finite | None = None
    logit_bias: Annotated[dict[str, Finite], Field(max_length=MAX_LOGIT_BIAS)] | None = None  # keyed by character

    @property
    def prompts(self) -> tuple[str, ...]:
        return (self.prompt,) if isinstance(self.prompt, str) else tuple(self.prompt)

    @property
    def stops(self) -> tuple[str, ...]:
        return () if self.stop is None else (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


def check_model(name: str, card: ModelCard) -> None:
    """404 unless ``name`` is the served model's, or the name of the run an export was made from (a client of the
    run's server goes on working when an export of it is served instead)."""
    if name not in (card.model, card.training.get("run", card.model)):
        message = f"The model {shown(name)} is not served here: send 'model' as {shown(card.model)} (GET /v1/models)."
        raise ApiError(404, message, "model", "model_not_found")


def completion_job(
    body: CompletionRequest, card: ModelCard, engine: Engine, config: ServeConfig
) -> tuple[Job, list[str]]:
    """The engine's job for a checked request, and the warnings its answer carries."""
    check_model(body.model, card)
    if body.max_tokens == 0 and not body.echo:
        message = (
            "The field 'max_tokens' must be from 1 to 1,000,000 (got 0): 0 only with 'echo' true, which scores the "
            "prompt without generating."
        )
        raise ApiError(422, message, "max_tokens", INVALID)
    settings = sample_settings(body)
    scored = body.logprobs is not None or body.echo
    if scored and not engine.sampler.concurrent_calls:
        field_name = "logprobs" if body.logprobs is not None else "echo"
        message = (
            f"This server's model runs one call at a time (a LiteRT export), which leaves no room to score "
            f"characters beside the generation: serve the run or a SavedModel export for '{field_name}', or leave it "
            f"out."
        )
        raise ApiError(422, message, field_name, "unsupported_parameter")
    if body.best_of not in (None, 1, body.n):
        message = (
            f"The field 'best_of' must be 1 or equal to 'n' ({body.n}), got {body.best_of}: textgen scores no "
            f"continuation to choose among, so it draws exactly the n it returns. Send 'best_of' as {body.n}, or "
            f"leave it out and choose among n yourself."
        )
        raise ApiError(422, message, "best_of", INVALID)
    check_size(body, engine)
    vocab = engine.sampler.vocab
    try:
        bias_row(settings.logit_bias, vocab)
    except FieldError as exc:
        raise ApiError(
            422, f"{exc}.".replace(flag("logit_bias"), "The field 'logit_bias'", 1), "logit_bias", INVALID
        ) from None
    warnings = [note for note in (vocab.unknown_note(p) for p in body.prompts) if note]
    job = Job(
        body.prompts,
        body.max_tokens,
        body.n,
        settings.temperature,
        settings.top_k,
        settings.top_p,
        settings.seed or 0,
        body.stops,
        config.request_timeout,
        settings.frequency_penalty,
        settings.presence_penalty,
        settings.logit_bias,
    )
    return job, warnings


def sample_settings(body: CompletionRequest) -> SampleConfig:
    """The request's sampling settings, within the CLI's bounds (a 422 naming the API's field otherwise)."""
    try:  # the sampling settings' bounds are the CLI's
        return SampleConfig(
            length=max(1, body.max_tokens),  # 0 with echo: nothing generated
            temperature=float(body.temperature),
            top_k=body.top_k,
            top_p=float(body.top_p),
            seed=body.seed,
            frequency_penalty=float(body.frequency_penalty or 0),
            presence_penalty=float(body.presence_penalty or 0),
            logit_bias=tuple((char, float(bias)) for char, bias in (body.logit_bias or {}).items()),
        ).seeded()
    except FieldError as exc:
        param = API_FIELDS.get(exc.field, exc.field)
        value = getattr(body, param)
        raise ApiError(422, f"The field '{param}' must be {exc.rule} (got {shown(value)}).", param, INVALID) from None


def check_size(body: CompletionRequest, engine: Engine) -> None:
    """A 422 for a request bigger than the server takes: rows, a whole answer's characters, log-probability
    entries, prompt characters."""
    rows = len(body.prompts) * body.n
    if rows > engine.slots:
        message = (
            f"The request asks for {rows} continuations (prompts x n), more than the server's {engine.slots} rows: "
            f"send fewer prompts or a smaller 'n'."
        )
        raise ApiError(422, message, "n", INVALID)
    if not body.stream and rows * body.max_tokens > MAX_WHOLE_CHARS:
        message = (
            f"A whole answer holds at most {MAX_WHOLE_CHARS:,} characters, and this one asks for "
            f"{rows * body.max_tokens:,} (max_tokens x n x prompts): send a smaller 'max_tokens', or 'stream' true."
        )
        raise ApiError(422, message, "max_tokens", INVALID)
    prompt_chars = sum(map(len, body.prompts))
    if body.logprobs is not None:
        chars = (prompt_chars * body.n if body.echo else 0) + rows * body.max_tokens
        entries = chars * (1 + body.logprobs)
        if entries > MAX_LOGPROB_ENTRIES:
            message = (
                f"A request's log-probabilities may hold at most {MAX_LOGPROB_ENTRIES:,} entries (characters scored "
                f"x (1 + logprobs)), and this one asks for {chars:,} x {1 + body.logprobs} = {entries:,} (the "
                f"prompts x n when echoed, plus max_tokens x n x prompts): send a smaller 'logprobs' or "
                f"'max_tokens', or shorter prompts."
            )
            raise ApiError(422, message, "logprobs", INVALID)
    if prompt_chars > MAX_PROMPT_CHARS:
        message = (
            f"The prompts hold {prompt_chars:,} characters, more than the {MAX_PROMPT_CHARS:,} allowed: send a "
            f"shorter 'prompt'."
        )
        raise ApiError(422, message, "prompt", INVALID)


class Completion:
    """One request's answer as it builds up: streamed as OpenAI's chunks, or whole."""

    def __init__(
        self,
        body: CompletionRequest,
        job: Job,
        card: ModelCard,
        warnings: list[str],
        arrived: float,
        metrics: Metrics,
        sampler: Sampler | None = None,  # needed for logprobs and echo
    ) -> None:
        self.body, self.job, self.warnings, self.arrived, self.metrics = body, job, warnings, arrived, metrics
        self.sampler = sampler
        self.ticket: Ticket | None = None  # the engine's, once submitted (its prompt cache hits)
        self.head = {
            "id": "cmpl-" + secrets.token_hex(12),
            "object": "text_completion",
            "created": int(time.time()),
            "model": card.model,
        }
        self.prefix = (json.dumps(self.head)[:-1] + ', "choices": [').encode()
        self.chars = 0  # generated, over all rows
        self.pieces: list[list[str]] = [[] for _ in range(job.rows)]  # a whole answer's texts: joined once, at the end
        self.finishes: list[str | None] = [None] * job.rows
        self.first_char: float | None = None
        # With logprobs or echo: each choice's scorer, its echoed prompt (sent with its first text) and logprobs.
        self.scorers: list[CharScorer] = []
        self.echoes = [""] * job.rows
        self.logprobs = [Logprobs() for _ in range(job.rows)]

    @property
    def scoring(self) -> bool:
        return self.body.logprobs is not None or self.body.echo

    def read_prompts(self) -> None:
        """(A thread's work: it reads text.) Each prompt read once by a scorer, whose state its n choices' scorers
        copy; with ``echo``, each choice's text starts with its prompt and its log-probabilities."""
        if self.sampler is None:
            raise RuntimeError("a completion with logprobs or echo needs the sampler")
        if self.body.logprobs is None:  # echo alone: the prompts' text, no scores
            self.echoes = [p for p in self.job.prompts for _ in range(self.job.n)] if self.body.echo else self.echoes
            return
        top = self.body.logprobs
        for prompt, ids in zip(self.job.prompts, self.sampler.encode_prompts(self.job.prompts), strict=True):
            scorer = CharScorer(self.sampler, top)
            if self.sampler.encode_prompts([prompt], fallback=False)[0].size:
                read = scorer.score(prompt)
            else:  # nothing the model knows: the engine starts at the start state's logits, or reads its fallback (a
                # newline, not echoed) where the start has none
                if ids.size:
                    scorer.score(self.sampler.vocab.decode(ids))
                else:
                    scorer.state = self.sampler.feed([ids])
                read = Logprobs()
            scorer.offset = len(prompt) if self.body.echo else 0  # where the continuation starts in the choice's text
            for _ in range(self.job.n):
                index = len(self.scorers)
                self.scorers.append(scorer.copy())
                if self.body.echo:
                    self.echoes[index] = prompt
                    self.logprobs[index] = Logprobs(*(list(part) for part in vars(read).values()))

    def score(self, events: list[Event]) -> list[Logprobs | None]:
        """(A thread's work.) The log-probabilities of each event's text, in order (None without ``logprobs``)."""
        if self.body.logprobs is None:
            return [None] * len(events)
        return [self.scorers[event.index].score(event.text) for event in events]

    def take(self, event: Event) -> None:
        """Record one of the engine's events (a whole answer's ``collect`` keeps its text too)."""
        if event.text:
            chars = len(event.text)
            self.chars += chars
            self.metrics.chars.inc(chars)
            if self.first_char is None:
                self.first_char = time.monotonic()
                self.metrics.first_char.observe(self.first_char - self.arrived)
        if event.finish is not None:
            self.finishes[event.index] = event.finish.value

    @property
    def open_rows(self) -> int:
        return sum(f is None for f in self.finishes)

    def end(self, outcome: str) -> None:
        self.metrics.requests.labels(outcome).inc()
        self.metrics.duration.observe(time.monotonic() - self.arrived)

    def outcome(self) -> str:
        reasons = set(self.finishes)
        for worst in (Finish.error, Finish.shutdown, Finish.timeout):
            if worst.value in reasons:
                return worst.value
        return "completed"

    def finish_reasons(self) -> str:
        """Its rows' finish reasons, each once ("cancelled" for a row its client left): for the log."""
        return ",".join(sorted({finish or "cancelled" for finish in self.finishes}))

    def usage(self) -> dict[str, Any]:
        prompt = sum(len(p) for p in self.job.prompts)  # each read once, whatever n
        cached = self.ticket.cached if self.ticket is not None else 0  # started past, from the prompt cache
        return {
            "prompt_tokens": prompt,
            "completion_tokens": self.chars,
            "total_tokens": prompt + self.chars,
            "prompt_tokens_details": {"cached_tokens": cached},
        }

    def score_whole(self) -> None:
        """(A thread's work.) Each choice's generated text scored, after its echoed prompt."""
        if self.body.logprobs is not None:
            for index, pieces in enumerate(self.pieces):
                self.logprobs[index].extend(self.scorers[index].score("".join(pieces)))

    def whole(self) -> dict[str, Any]:
        choices = [
            {
                "index": i,
                "text": self.echoes[i] + "".join(pieces),
                "logprobs": self.logprobs[i].as_json() if self.body.logprobs is not None else None,
                "finish_reason": finish,
            }
            for i, (pieces, finish) in enumerate(zip(self.pieces, self.finishes, strict=True))
        ]
        return {**self.head, "choices": choices, "usage": self.usage(), "seed": self.job.seed, **self._warnings()}

    async def echo_only(self) -> dict[str, Any]:
        """The answer to ``max_tokens`` 0 with ``echo``: each prompt scored, nothing generated."""
        await asyncio.to_thread(self.read_prompts)
        self.finishes = [Finish.length.value] * self.job.rows
        self.end("completed")
        return self.whole()

    async def echo_stream(self) -> AsyncIterator[bytes]:
        """``echo_only``'s answer as a stream: a chunk per choice, then the usage if asked, and ``[DONE]``."""
        whole = await self.echo_only()
        extra: dict[str, Any] = {"seed": self.job.seed, **self._warnings()}
        lines = [
            _sse({**self.head, "choices": [choice], **(extra if i == 0 else {})})
            for i, choice in enumerate(whole["choices"])
        ]
        if self.body.stream_options is not None and self.body.stream_options.include_usage:
            lines.append(_sse({**self.head, "choices": [], "usage": self.usage()}))
        yield b"".join([*lines, b"data: [DONE]\n\n"])

    def _warnings(self) -> dict[str, list[str]]:
        return {"warnings": self.warnings} if self.warnings else {}

    async def collect(self, events: asyncio.Queue[Event], request: Request, cancel: Callable[[], None]) -> bool:
        """Wait for every row's last event (True), or for the client to go away (False), checked every
        ``DISCONNECT_CHECK`` seconds."""
        checked = time.monotonic()
        try:
            if self.scoring:
                await asyncio.to_thread(self.read_prompts)
            while self.open_rows:
                with contextlib.suppress(asyncio.TimeoutError):
                    event = await asyncio.wait_for(events.get(), DISCONNECT_CHECK)
                    self.take(event)
                    self.pieces[event.index].append(event.text)
                if self.open_rows and time.monotonic() - checked >= DISCONNECT_CHECK:
                    checked = time.monotonic()
                    if await request.is_disconnected():
                        return False
            if self.scoring:
                await asyncio.to_thread(self.score_whole)
            return True
        finally:
            self._close(cancel)

    async def stream(self, events: asyncio.Queue[Event], cancel: Callable[[], None]) -> AsyncIterator[bytes]:
        """Server-sent events in OpenAI's chunk format: one per engine event (several characters), every event
        waiting at once sent in one write, ``data: [DONE]`` last."""
        extra: dict[str, Any] = {"seed": self.job.seed, **self._warnings()}
        unsent = set(range(self.job.rows)) if self.body.echo else set()  # choices whose echoed prompt is not yet out
        try:
            if self.scoring:
                await asyncio.to_thread(self.read_prompts)
            while self.open_rows:
                batch = [await events.get()]
                while not events.empty():
                    batch.append(events.get_nowait())
                scored_batch = self.body.logprobs is not None
                scores = await asyncio.to_thread(self.score, batch) if scored_batch else [None] * len(batch)
                lines = []
                for event, scored in zip(batch, scores, strict=True):
                    self.take(event)
                    choice = _choice(event)
                    if event.index in unsent:
                        unsent.discard(event.index)
                        echoed = self.logprobs[event.index]
                        if scored is not None:
                            echoed.extend(scored)
                        choice["text"] = self.echoes[event.index] + choice["text"]
                        scored = echoed if self.body.logprobs is not None else None
                    if scored is not None:
                        choice["logprobs"] = scored.as_json()
                    if extra:  # the first event says the seed used, and the warnings
                        lines.append(_sse({**self.head, "choices": [choice], **extra}))
                        extra = {}
                    else:  # the rest differ only in their choice: ~3x cheaper than encoding each whole
                        lines.append(b"data: " + self.prefix + json.dumps(choice).encode() + b"]}\n\n")
                yield b"".join(lines)
            tail = []
            if self.body.stream_options is not None and self.body.stream_options.include_usage:
                tail.append(_sse({**self.head, "choices": [], "usage": self.usage()}))
            yield b"".join([*tail, b"data: [DONE]\n\n"])
        finally:
            self._close(cancel)

    def _close(self, cancel: Callable[[], None]) -> None:
        """Count the request by its outcome; give its rows back if its client went away before its end."""
        if self.open_rows:
            cancel()
            self.end("cancelled")
        else:
            self.end(self.outcome())


def _choice(event: Event) -> dict[str, Any]:
    finish = None if event.finish is None else event.finish.value
    return {"index": event.index, "text": event.text, "logprobs": None, "finish_reason": finish}


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, ensure_ascii=False).encode() + b"\n\n"


INVALID = "invalid_value"  # the code of a field's value out of its bounds, as OpenAI's API says it

# What each field takes, for the message that refuses another value.
RULES = {
    "model": "the served model's name, a string (GET /v1/models)",
    "prompt": f"a string or a list of 1 to {MAX_PROMPTS} strings",
    "max_tokens": f"an integer from 1 to {MAX_REQUEST_CHARS:,}: the characters to generate (0 with echo)",
    "temperature": "a number: 0 (the likeliest character) or from 0.001 to 1000",
    "top_p": "a number in (0, 1]",
    "top_k": "an integer: 0 (off) or how many of the likeliest characters to sample among",
    "n": "an integer of at least 1: the continuations of each prompt",
    "seed": "an integer in [0, 2**31), or null",
    "stop": f"a string or a list of up to {MAX_STOPS} strings, each of up to {MAX_STOP_CHARS} characters, or null",
    "stream": "true or false",
    "stream_options": 'an object {"include_usage": true or false}, or null',
    "user": "a string",
    "best_of": "an integer, 1 or equal to n, or null",
    "echo": "true or false: true returns the prompt before the continuation (with logprobs, its characters' too)",
    "logprobs": f"an integer from 0 to {MAX_LOGPROBS} (the likeliest characters returned beside each one), or null",
    "frequency_penalty": "a number from -2 to 2 (0 = off): subtracted from a character's logit per time generated",
    "presence_penalty": "a number from -2 to 2 (0 = off): subtracted from a character's logit once generated",
    "logit_bias": (
        f"an object of up to {MAX_LOGIT_BIAS} single characters, each to a number from -100 (a ban) to 100, such as "
        '{"e": -100, " ": 2}, or null'
    ),
}

# Fields of OpenAI's API that a character model cannot honour: what may be sent, and why.
UNSUPPORTED = {
    "suffix": ("null", "a character model writes left to right and cannot aim at a given ending"),
}

EXAMPLE = '{"model": "...", "prompt": "Once upon a time", "max_tokens": 100}'


def _field(error: Any) -> str | None:
    """The request field a validation error is about (None: the body as a whole, e.g. its JSON)."""
    location = error["loc"]
    return str(location[1]) if len(location) > 1 and isinstance(location[1], str) else None


def _json_shown(value: Any) -> str:
    """A value of a request as JSON, cut short."""
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def validation_error(errors: Sequence[Any]) -> ApiError:
    """The answer to a body FastAPI's checks refused, from the first of pydantic's ``errors``: a sentence naming the
    field (or the body) and what to send instead."""
    error, field = errors[0], _field(errors[0])
    kind = error["type"]
    if kind == "json_invalid":
        message = f"The body is not valid JSON ({error['ctx']['error']}): send a JSON object such as {EXAMPLE}."
        return ApiError(400, message)
    if field is None:
        message = f"The body must be a JSON object of the request's fields, such as {EXAMPLE}."
        return ApiError(400 if kind == "missing" else 422, message)
    if field in UNSUPPORTED:
        allowed, why = UNSUPPORTED[field]
        message = f"This server does not support '{field}': {why}. Send {allowed}, or leave it out."
        return ApiError(422, message, field, "unsupported_parameter")
    if kind == "extra_forbidden" and len(error["loc"]) == 2:
        known = ", ".join(RULES)
        message = f"Unknown field '{field}': the fields are {known} (a misspelt field is refused, not ignored)."
        return ApiError(422, message, field, "unknown_parameter")
    if kind == "missing":
        return ApiError(
            422, f"The field '{field}' is required: send {RULES[field]}.", field, "missing_required_parameter"
        )
    got = _json_shown(error["input"])
    code = "invalid_type" if kind.endswith("_type") or kind.endswith("_parsing") else INVALID
    return ApiError(422, f"The field '{field}' must be {RULES[field]} (got {got}).", field, code)


class Dispatcher:
    """Hands the engine's events (from its thread) to the requests' queues on the event loop, waking the loop once
    for all the events of a scheduler round rather than once per event."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.lock = threading.Lock()
        self.pending: list[tuple[asyncio.Queue[Event], Event]] = []

    def listener(self, queue: asyncio.Queue[Event]) -> Callable[[Event], None]:
        def listen(event: Event) -> None:
            with self.lock:
                self.pending.append((queue, event))
                first = len(self.pending) == 1
            if first:
                self.loop.call_soon_threadsafe(self.flush)

        return listen

    def flush(self) -> None:
        with self.lock:
            pending, self.pending = self.pending, []
        for queue, event in pending:
            queue.put_nowait(event)
