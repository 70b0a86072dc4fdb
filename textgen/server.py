"""``textgen serve``'s HTTP side: an OpenAI-compatible completions API over the continuous-batching engine, health
and Prometheus metrics, and the playground page; no TensorFlow here.

FastAPI (on Starlette, served by uvicorn) checks request bodies against typed models, so a wrong type or an
out-of-range value is a 422 naming the field; Starlette streams server-sent events and cancels a stream whose
client has gone, which gives the row back to the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hmac
import json
import math
import secrets
import signal
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, MutableMapping
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import quote

import prometheus_client as prom
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr
from starlette.exceptions import HTTPException

from textgen.artifact import ArtifactInfo
from textgen.config import MAX_REQUEST_CHARS, ModelConfig, SampleConfig, ServeConfig
from textgen.engine import Draining, Engine, Event, Finish, Job, QueueFull
from textgen.errors import ConfigError, FieldError
from textgen.plot import loss_svg, read_history
from textgen.results import RunSummary
from textgen.runs import run_summaries

DISCONNECT_CHECK = 0.5  # seconds between checks that a non-streamed request's client is still there
RETRY_AFTER = 1  # seconds a refused client is told to wait: rows free every few tens of milliseconds under load
MAX_PROMPTS = 64  # prompts in one request (each takes n rows)
# Time to first character: tens of milliseconds when a row is free, up to seconds when queued.
TTFC_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
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
    """An answer other than 200, as OpenAI's API words errors: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        kind: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.headers = status, message, param, kind, headers

    def response(self) -> JSONResponse:
        error = {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}
        return JSONResponse({"error": error}, self.status, headers=self.headers)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: StrictBool = False


Finite = Annotated[float, Field(allow_inf_nan=False, strict=True)]  # an integer is a number too; a string is not


class CompletionRequest(BaseModel):
    """``POST /v1/completions``' body: OpenAI's fields (``max_tokens`` counts characters), and textgen's ``top_k``.
    Fields of that API that a character model cannot honour are refused when set, not ignored."""

    model_config = ConfigDict(extra="forbid")

    model: StrictStr
    prompt: StrictStr | Annotated[list[StrictStr], Field(min_length=1, max_length=MAX_PROMPTS)] = ""
    max_tokens: Annotated[int, Field(strict=True, ge=1, le=MAX_REQUEST_CHARS)] = SampleConfig.length
    temperature: Finite = SampleConfig.temperature
    top_p: Finite = 1.0
    top_k: StrictInt = 0
    n: Annotated[int, Field(strict=True, ge=1)] = 1
    seed: StrictInt | None = None
    stop: StrictStr | Annotated[list[StrictStr], Field(max_length=4)] | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    user: StrictStr | None = None  # recorded by OpenAI for abuse reports; accepted and unused here
    echo: Literal[False] = False
    logprobs: None = None
    suffix: None = None
    best_of: Literal[1] | None = None
    presence_penalty: Literal[0] | None = None
    frequency_penalty: Literal[0] | None = None
    logit_bias: Annotated[dict[str, float], Field(max_length=0)] | None = None

    @property
    def prompts(self) -> tuple[str, ...]:
        return (self.prompt,) if isinstance(self.prompt, str) else tuple(self.prompt)

    @property
    def stops(self) -> tuple[str, ...]:
        return () if self.stop is None else (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


class Metrics:
    """The server's Prometheus metrics, in a registry of its own."""

    def __init__(self, engine: Engine) -> None:
        self.registry = prom.CollectorRegistry()
        self.requests = prom.Counter(
            "textgen_requests", "Completion requests by outcome", ["outcome"], registry=self.registry
        )
        prom.Gauge("textgen_queue_length", "Requests waiting for rows", registry=self.registry).set_function(
            lambda: engine.queue_length
        )
        prom.Gauge("textgen_rows_busy", "Rows generating or reading a prompt", registry=self.registry).set_function(
            lambda: engine.busy_rows
        )
        self.chars = prom.Counter("textgen_chars_generated", "Characters sent to clients", registry=self.registry)
        self.first_char = prom.Histogram(
            "textgen_time_to_first_char_seconds",
            "From a request's arrival to its first generated character",
            buckets=TTFC_BUCKETS,
            registry=self.registry,
        )
        self.duration = prom.Histogram(
            "textgen_request_duration_seconds",
            "From a request's arrival to its last event",
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )


class BodyLimit:
    """ASGI middleware: a request body over ``limit`` bytes is answered 413 before the app reads it."""

    def __init__(self, app: Callable[..., Awaitable[None]], limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"0")
        if not declared.isdigit():
            await _send(send, ApiError(400, "Content-Length is not a number").response())
            return
        if int(declared) > self.limit:
            await _send(send, self._too_large())
            return
        messages, size = [], 0
        while True:  # a chunked body has no Content-Length: count it as it arrives
            message = await receive()
            messages.append(message)
            size += len(message.get("body", b""))
            if size > self.limit:
                await _send(send, self._too_large())
                return
            if message["type"] != "http.request" or not message.get("more_body"):
                break

        async def replay() -> MutableMapping[str, Any]:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)

    def _too_large(self) -> JSONResponse:
        message = f"the request body is over {self.limit:,} bytes (the server's --max-body)"
        return ApiError(413, message).response()


async def _send(send: Any, response: Response) -> None:
    async def nothing() -> MutableMapping[str, Any]:
        return {"type": "http.disconnect"}

    await response({"type": "http"}, nothing, send)


def create_app(engine: Engine, card: ModelCard, config: ServeConfig, checkpoint_dir: Path | None = None) -> Any:
    """The ASGI application serving ``engine``'s model (``checkpoint_dir``'s runs listed on the page)."""
    metrics = Metrics(engine)
    page = resources.files("textgen").joinpath("page.html").read_text(encoding="utf-8")
    app = FastAPI(title="textgen", docs_url=None, redoc_url=None)  # the docs pages fetch scripts from a CDN

    outcomes = {429: "rejected", 503: "unavailable", 401: "unauthorized"}

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        if request.url.path == "/v1/completions":
            metrics.requests.labels(outcomes.get(exc.status, "invalid")).inc()
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        metrics.requests.labels("invalid").inc()
        errors = exc.errors()
        field = _field(errors[0])  # a union's field fails once per member: say each reason once
        reasons = dict.fromkeys(e["msg"][:1].lower() + e["msg"][1:] for e in errors if _field(e) == field)
        return ApiError(422, f"{field or 'the body'}: {' or '.join(reasons)}", field).response()

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        return ApiError(
            exc.status_code, str(exc.detail), kind="not_found" if exc.status_code == 404 else "error"
        ).response()

    def authorized(request: Request) -> None:
        if config.api_key is None:
            return
        given = request.headers.get("authorization", "")
        token = given[7:] if given[:7].lower() == "bearer " else ""
        if not hmac.compare_digest(token.encode(), config.api_key.encode()):
            message = "a missing or wrong API key: send the header 'Authorization: Bearer <key>'"
            raise ApiError(401, message, kind="authentication_error", headers={"WWW-Authenticate": "Bearer"})

    api_key = [Depends(authorized)]
    dispatchers: list[Dispatcher] = []  # one, made on the event loop by the first request

    @app.get("/", response_class=HTMLResponse)
    async def playground() -> HTMLResponse:
        return HTMLResponse(page)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/ready")
    async def ready() -> JSONResponse:
        if engine.drain_deadline is not None:
            return JSONResponse({"status": "draining"}, 503)
        if not engine.ready.is_set():
            return JSONResponse({"status": "loading"}, 503)
        return JSONResponse({"status": "ready", "rows": engine.slots, "rows_busy": engine.busy_rows})

    @app.get("/metrics")
    async def metrics_text() -> Response:
        return Response(prom.generate_latest(metrics.registry), media_type=prom.CONTENT_TYPE_LATEST)

    @app.get("/info")
    async def info() -> dict[str, Any]:
        limits = {"max_tokens": MAX_REQUEST_CHARS, "max_n": engine.slots}
        return {**asdict(card), "limits": limits, "auth": config.api_key is not None}

    @app.get("/v1/models", dependencies=api_key)
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [_model_object(card)]}

    @app.get("/v1/models/{name}", dependencies=api_key)
    async def model(name: str) -> dict[str, Any]:
        _check_model(name, card)
        return _model_object(card)

    @app.get("/runs")
    async def runs() -> dict[str, Any]:
        if checkpoint_dir is None:
            raise ApiError(404, "this server serves an export: there are no runs to list", kind="not_found")
        summaries = await asyncio.to_thread(run_summaries, checkpoint_dir)
        listed = []
        for s in summaries:
            if s.problem:
                continue
            curve = (
                f"/runs/{quote(s.run, safe='')}/loss.svg"
                if (checkpoint_dir / s.run / "history.csv").is_file()
                else None
            )
            nats = None if s.best_val_bpc is None else s.best_val_bpc * math.log(2)
            listed.append({"name": s.run, "epochs": s.epochs, "best_val_loss": nats, "curve": curve})
        return {"runs": listed}

    @app.get("/runs/{name}/loss.svg")
    async def curve(name: str) -> Response:
        if checkpoint_dir is None:
            raise ApiError(404, "this server serves an export: there are no runs", kind="not_found")
        known = {s.run for s in await asyncio.to_thread(run_summaries, checkpoint_dir) if not s.problem}
        history = checkpoint_dir / name / "history.csv"
        if name not in known or not history.is_file():  # only a listed run's file: the name is never a path
            raise ApiError(404, f"no run {name!r} with a loss history here", kind="not_found")
        svg = loss_svg(await asyncio.to_thread(read_history, history), title=name)
        return Response(svg, media_type="image/svg+xml")

    @app.post("/v1/completions", dependencies=api_key)
    async def completions(body: CompletionRequest, request: Request) -> Response:
        arrived = time.monotonic()
        job, warnings = _job(body, card, engine, config)
        if not dispatchers or dispatchers[0].loop is not asyncio.get_running_loop():
            dispatchers[:] = [Dispatcher(asyncio.get_running_loop())]
        events: asyncio.Queue[Event] = asyncio.Queue()
        try:
            ticket = engine.submit(job, dispatchers[0].listener(events))
        except QueueFull:
            message = f"all {engine.slots} rows are busy and {engine.max_queue} requests are waiting; retry shortly"
            raise ApiError(429, message, kind="rate_limit_error", headers={"Retry-After": str(RETRY_AFTER)}) from None
        except Draining:
            raise ApiError(503, "the server is shutting down", kind="unavailable") from None
        completion = Completion(body, job, card, warnings, arrived, metrics)
        if body.stream:
            return StreamingResponse(
                completion.stream(events, lambda: engine.cancel(ticket)),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        if not await completion.collect(events, request, lambda: engine.cancel(ticket)):
            return Response(status_code=499)  # nobody is listening
        return JSONResponse(completion.whole())

    return BodyLimit(app, config.max_body)


def _model_object(card: ModelCard) -> dict[str, Any]:
    figures = {k: v for k, v in asdict(card).items() if k not in ("model", "created")}
    return {"id": card.model, "object": "model", "created": card.created, "owned_by": "textgen", **figures}


def _check_model(name: str, card: ModelCard) -> None:
    if name != card.model:
        message = f"the model {name!r} is not served here; this server serves {card.model!r} (GET /v1/models)"
        raise ApiError(404, message, "model", kind="not_found")


def _job(body: CompletionRequest, card: ModelCard, engine: Engine, config: ServeConfig) -> tuple[Job, list[str]]:
    """The engine's job for a checked request, and the warnings its answer carries."""
    _check_model(body.model, card)
    try:  # the sampling settings' bounds are the CLI's
        settings = SampleConfig(
            length=body.max_tokens,
            temperature=float(body.temperature),
            top_k=body.top_k,
            top_p=float(body.top_p),
            seed=body.seed,
        ).seeded()
    except FieldError as exc:
        param = API_FIELDS.get(exc.field, exc.field)
        raise ApiError(422, f"{param} must be {exc.rule}", param) from None
    rows = len(body.prompts) * body.n
    if rows > engine.slots:
        message = f"{rows} continuations (prompts x n) are more than the server's {engine.slots} rows"
        raise ApiError(422, message, "n")
    vocab = engine.sampler.vocab
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
    )
    return job, warnings


class Completion:
    """One request's answer as it builds up: streamed as OpenAI's chunks, or whole."""

    def __init__(
        self, body: CompletionRequest, job: Job, card: ModelCard, warnings: list[str], arrived: float, metrics: Metrics
    ) -> None:
        self.body, self.job, self.warnings, self.arrived, self.metrics = body, job, warnings, arrived, metrics
        self.head = {
            "id": "cmpl-" + secrets.token_hex(12),
            "object": "text_completion",
            "created": int(time.time()),
            "model": card.model,
        }
        self.prefix = (json.dumps(self.head)[:-1] + ', "choices": [').encode()
        self.texts = [""] * job.rows
        self.finishes: list[str | None] = [None] * job.rows
        self.first_char: float | None = None

    def take(self, event: Event) -> None:
        """Record one of the engine's events."""
        if event.text:
            self.texts[event.index] += event.text
            self.metrics.chars.inc(len(event.text))
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

    def usage(self) -> dict[str, int]:
        prompt = sum(len(p) for p in self.job.prompts) * self.job.n
        completion = sum(len(t) for t in self.texts)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def whole(self) -> dict[str, Any]:
        choices = [
            {"index": i, "text": text, "logprobs": None, "finish_reason": finish}
            for i, (text, finish) in enumerate(zip(self.texts, self.finishes, strict=True))
        ]
        return {**self.head, "choices": choices, "usage": self.usage(), "seed": self.job.seed, **self._warnings()}

    def _warnings(self) -> dict[str, list[str]]:
        return {"warnings": self.warnings} if self.warnings else {}

    async def collect(self, events: asyncio.Queue[Event], request: Request, cancel: Callable[[], None]) -> bool:
        """Wait for every row's last event (True), or for the client to go away (False), checked every
        ``DISCONNECT_CHECK`` seconds."""
        checked = time.monotonic()
        try:
            while self.open_rows:
                with contextlib.suppress(asyncio.TimeoutError):
                    self.take(await asyncio.wait_for(events.get(), DISCONNECT_CHECK))
                if self.open_rows and time.monotonic() - checked >= DISCONNECT_CHECK:
                    checked = time.monotonic()
                    if await request.is_disconnected():
                        return False
            return True
        finally:
            self._close(cancel)

    async def stream(self, events: asyncio.Queue[Event], cancel: Callable[[], None]) -> AsyncIterator[bytes]:
        """Server-sent events in OpenAI's chunk format: one per engine event (several characters), every event
        waiting at once sent in one write, ``data: [DONE]`` last."""
        extra: dict[str, Any] = {"seed": self.job.seed, **self._warnings()}
        try:
            while self.open_rows:
                batch = [await events.get()]
                while not events.empty():
                    batch.append(events.get_nowait())
                lines = []
                for event in batch:
                    self.take(event)
                    if extra:  # the first event says the seed used, and the warnings
                        lines.append(_sse({**self.head, "choices": [_choice(event)], **extra}))
                        extra = {}
                    else:  # the rest differ only in their choice: ~3x cheaper than encoding each whole
                        lines.append(b"data: " + self.prefix + json.dumps(_choice(event)).encode() + b"]}\n\n")
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


def _field(error: Any) -> str | None:
    """The request field a validation error is about (None: the body as a whole, e.g. its JSON)."""
    location = error["loc"]
    return str(location[1]) if len(location) > 1 and isinstance(location[1], str) else None


def _choice(event: Event) -> dict[str, Any]:
    finish = None if event.finish is None else event.finish.value
    return {"index": event.index, "text": event.text, "logprobs": None, "finish_reason": finish}


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


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, ensure_ascii=False).encode() + b"\n\n"


def card_of_run(summary: RunSummary, model: ModelConfig, vocab_size: int) -> ModelCard:
    """The card of a run's model, with its training figures."""
    nats = None if summary.best_val_bpc is None else summary.best_val_bpc * math.log(2)
    training = {
        "best_val_loss": nats,
        "best_val_bpc": summary.best_val_bpc,
        "epochs": summary.epochs,
        "train_seconds": summary.seconds,
        "corpus": summary.corpus,
    }
    return ModelCard(
        summary.run, "run", vocab_size, model.units, model.layers, model.embedding_dim, model.parameters, training
    )


def card_of_export(name: str, info: ArtifactInfo) -> ModelCard:
    """The card of an exported model (its run's training figures stay with the run)."""
    model = info.model
    training = {"run": info.run, "weights": info.weights, "quantize": info.quantize}
    return ModelCard(
        name, info.format, info.vocab.size, model.units, model.layers, model.embedding_dim, model.parameters, training
    )


def listen(host: str, port: int) -> socket.socket:
    """A socket listening on ``host:port`` (``port`` 0: one the system picks), bound before the model loads so that a
    port in use is said at once."""
    try:
        sock = socket.create_server(
            (host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET, backlog=2048
        )
    except OSError as exc:
        reason = "is in use" if exc.errno == errno.EADDRINUSE else f"cannot be listened on ({exc.strerror})"
        raise ConfigError(f"{host}:{port} {reason}; choose another with --port (or --host)") from None
    return sock


def run(app: Any, sock: socket.socket, engine: Engine, drain_seconds: float) -> None:
    """Serve ``app`` on ``sock`` until SIGTERM or Ctrl-C, which drain: new requests are refused (503), running
    streams go on for ``drain_seconds`` and then end with a last event, and the call returns."""
    import uvicorn

    class DrainingServer(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            # uvicorn's own raises the signal again once it has stopped, so that the process dies of it; a drained
            # server has finished its work, and exits 0.
            previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

        def handle_exit(self, sig: int, frame: Any) -> None:
            engine.drain(drain_seconds)
            self.force_exit = self.should_exit and sig == signal.SIGINT  # a second Ctrl-C stops at once
            self.should_exit = True

    config = uvicorn.Config(
        app, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=int(drain_seconds) + 5
    )
    DrainingServer(config).run(sockets=[sock])
