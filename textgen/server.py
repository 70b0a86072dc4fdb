"""``textgen serve``'s HTTP side: the routes of the OpenAI-compatible completions API (``textgen.completion``) over the
continuous-batching engine, health and Prometheus metrics, the playground page and the runs view, and the uvicorn
server that drains on SIGTERM; no TensorFlow here.

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
import logging
import math
import signal
import socket
import time
from collections.abc import Iterator, MutableMapping
from dataclasses import asdict
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import quote

import prometheus_client as prom
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp

from textgen.artifact import ArtifactInfo
from textgen.checkpoint import Run
from textgen.completion import (
    ApiError,
    Completion,
    CompletionRequest,
    Dispatcher,
    ModelCard,
    check_model,
    completion_job,
    validation_error,
)
from textgen.config import ModelConfig
from textgen.engine import Draining, Engine, QueueFull
from textgen.errors import ConfigError, shown
from textgen.genconfig import MAX_LOGPROB_ENTRIES, MAX_REQUEST_CHARS, ServeConfig
from textgen.plot import loss_svg, read_batch_losses, read_history
from textgen.results import RunSummary
from textgen.rowtable import Event
from textgen.runs import run_summaries
from textgen.servemetrics import Metrics

RETRY_AFTER = 1  # seconds a refused client is told to wait: rows free every few tens of milliseconds under load
PAGE_INFO = '<script type="application/json" id="info-json">null</script>'  # page.html's place for /info
OPEN_ROUTES = ("/", "/health", "/ready", "/info", "/runs")  # the page's and the probes': no API key asked
SHUTDOWN_GRACE = 5  # seconds after the drain for the streams it ended to send their last events
REFUSALS = {401: "unauthorized", 429: "rejected", 503: "unavailable"}  # a refused completion's outcome (else invalid)

access_log = logging.getLogger("textgen.access")
serve_log = logging.getLogger("textgen.serve")


class AccessLog:
    """ASGI middleware: one log line per request once it is answered (a stream once it ends), and the completion
    requests refused (401, 413, 422, 429, 503, ...) counted by outcome. Its only work while a response is sent is
    noting its status."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started, status = time.monotonic(), 500  # 500: the app failed before answering (uvicorn's answer)

        async def noting(message: MutableMapping[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, noting)
        finally:
            completion: Completion | None = scope.get("state", {}).get("completion")
            if scope["path"] == "/v1/completions" and status >= 400 and status != 499:  # 499: counted as cancelled
                self.metrics.requests.labels(REFUSALS.get(status, "invalid")).inc()
            access_log.info("request", extra={"fields": _access_fields(scope, status, started, completion)})


def _access_fields(
    scope: MutableMapping[str, Any], status: int, started: float, completion: Completion | None
) -> dict[str, Any]:
    """A request's log line: what was asked, how it was answered, and for a completion its characters and times."""
    client = scope.get("client")
    path = scope.get("raw_path", scope["path"].encode())[:200].decode("latin-1")  # still %-encoded: one line
    fields: dict[str, Any] = {
        "client": client[0] if client else None,
        "method": scope["method"],
        "path": path,
        "status": status,
        "chars_in": None,
        "chars_out": None,
        "first_char_s": None,
        "duration_s": round(time.monotonic() - started, 4),
        "finish": None,
    }
    if completion is not None:
        first = completion.first_char
        fields["chars_in"] = sum(map(len, completion.job.prompts))
        fields["chars_out"] = completion.chars
        fields["first_char_s"] = None if first is None else round(first - started, 4)
        fields["finish"] = completion.finish_reasons()
    return fields


class KeyCheck:
    """ASGI middleware: with an API key set, a request for a route other than ``OPEN_ROUTES`` and the runs' loss
    curves is answered 401 unless it carries the key, before any of its body is read (the key compared in constant
    time)."""

    def __init__(self, app: ASGIApp, api_key: str | None) -> None:
        self.app, self.key = app, None if api_key is None else api_key.encode()

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if self.key is None or scope["type"] != "http" or path in OPEN_ROUTES or path.startswith("/runs/"):
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"authorization")
        if given is not None and given[:7].lower() == b"bearer " and hmac.compare_digest(given[7:], self.key):
            await self.app(scope, receive, send)
            return
        send_it = "send the header 'Authorization: Bearer <key>' with the key textgen serve was given"
        if given is None:
            error = ApiError(401, f"This server needs an API key: {send_it}.", headers={"WWW-Authenticate": "Bearer"})
        else:
            message = f"The API key sent is not this server's: {send_it} (--api-key or TEXTGEN_API_KEY)."
            error = ApiError(401, message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
        await _send(send, error.response())


class BodyLimit:
    """ASGI middleware: a request body over ``limit`` bytes is answered 413 before the app reads it."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"0")
        if not declared.isdigit():
            message = "The Content-Length header is not a number: send the body's length in bytes, or no header."
            await _send(send, ApiError(400, message).response())
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
        message = f"The request body is over {self.limit:,} bytes (the server's --max-body): send a smaller one."
        return ApiError(413, message).response()


async def _send(send: Any, response: Response) -> None:
    async def nothing() -> MutableMapping[str, Any]:
        return {"type": "http.disconnect"}

    await response({"type": "http"}, nothing, send)


def create_app(engine: Engine, card: ModelCard, config: ServeConfig, checkpoint_dir: Path | None = None) -> Any:
    """The ASGI application serving ``engine``'s model (``checkpoint_dir``'s runs listed on the page)."""
    metrics = Metrics(engine)
    app = FastAPI(title="textgen", docs_url=None, redoc_url=None)  # the docs pages fetch scripts from a CDN
    _add_error_handlers(app)
    _add_model_routes(app, engine, card, config, metrics)
    _add_run_routes(app, card, checkpoint_dir)
    _add_completions(app, engine, card, config, metrics)
    return AccessLog(KeyCheck(BodyLimit(app, config.max_body), config.api_key), metrics)


def _add_error_handlers(app: FastAPI) -> None:
    """Every error as OpenAI's JSON (``AccessLog`` counts the refused completion requests)."""

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return validation_error(exc.errors()).response()

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        asked = f"{request.method} {request.url.path[:100]}"
        if exc.status_code == 404 and request.url.path.rstrip("/") == "/v1/chat/completions":
            message = (
                "This server speaks OpenAI's completions API, not chat completions: a character model continues "
                "text and has no chat template to turn messages into a prompt. Send "
                '{"model": ..., "prompt": "..."} to POST /v1/completions instead.'
            )
        elif exc.status_code == 404:
            message = f"There is no {asked} here: the API is POST /v1/completions and GET /v1/models; / is the page."
        elif exc.status_code == 405:
            message = f"{asked} is not allowed here: send {(exc.headers or {}).get('Allow', 'another method')}."
        else:
            message = f"{asked} failed: {exc.detail}."
        return ApiError(exc.status_code, message, headers=dict(exc.headers or {})).response()


def _add_model_routes(app: FastAPI, engine: Engine, card: ModelCard, config: ServeConfig, metrics: Metrics) -> None:
    """The page, the probes, the metrics, and what is served."""
    limits = {"max_tokens": MAX_REQUEST_CHARS, "max_n": engine.slots, "max_logprob_entries": MAX_LOGPROB_ENTRIES}
    served = {**asdict(card), "limits": limits, "auth": config.api_key is not None}
    page = resources.files("textgen").joinpath("page.html").read_text(encoding="utf-8")
    # The page carries /info's answer, so that its figures are there at its first paint ("<" escaped: the JSON
    # cannot end the script element it is in).
    page = page.replace(PAGE_INFO, PAGE_INFO.replace("null", json.dumps(served).replace("<", "\\u003c")))

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
        return served

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [_model_object(card)]}

    @app.get("/v1/models/{name}")
    async def model(name: str) -> dict[str, Any]:
        check_model(name, card)
        return _model_object(card)


def _add_run_routes(app: FastAPI, card: ModelCard, checkpoint_dir: Path | None) -> None:
    """The checkpoint directory's runs and their loss curves, for the page's second view; the run ``card`` describes
    is the one served."""

    @app.get("/runs")
    async def runs() -> dict[str, Any]:
        if checkpoint_dir is None:
            raise ApiError(404, "This server serves an export: there are no runs to list.")
        summaries = await asyncio.to_thread(run_summaries, checkpoint_dir)
        listed = []
        for s in summaries:
            if s.problem:
                continue
            run = Run(checkpoint_dir / s.run)
            drawn = run.history_path.is_file() or run.batch_losses_path.is_file()
            curve = f"/runs/{quote(s.run, safe='')}/loss.svg" if drawn else None
            nats = None if s.best_val_bpc is None else s.best_val_bpc * math.log(2)
            listed.append(
                {
                    "name": s.run,
                    "epochs": s.epochs,
                    "batches_into_epoch": s.batches_into_epoch,
                    "best_val_loss": nats,
                    "made_from": s.made_from or None,  # a fine-tune's base run, say
                    "served": card.source == "run" and s.run == card.model,
                    "curve": curve,
                }
            )
        return {"runs": listed}

    @app.get("/runs/{name}/loss.svg")
    async def curve(name: str) -> Response:
        if checkpoint_dir is None:
            raise ApiError(404, "This server serves an export: there are no runs.")
        known = {s.run for s in await asyncio.to_thread(run_summaries, checkpoint_dir) if not s.problem}
        run = Run(checkpoint_dir / name)  # only a listed run's files: the name is never a path
        if name not in known or not (run.history_path.is_file() or run.batch_losses_path.is_file()):
            raise ApiError(404, f"There is no run {shown(name)} with a loss history here: GET /runs lists them.")
        history = await asyncio.to_thread(read_history, run.history_path)
        batches = await asyncio.to_thread(read_batch_losses, run.batch_losses_path)
        return Response(loss_svg(history, title=name, batches=batches), media_type="image/svg+xml")


def _add_completions(app: FastAPI, engine: Engine, card: ModelCard, config: ServeConfig, metrics: Metrics) -> None:
    """``POST /v1/completions``: a request becomes an engine job; its events are streamed or gathered."""
    dispatchers: list[Dispatcher] = []  # made on the event loop by the first request

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        arrived = time.monotonic()
        job, warnings = completion_job(body, card, engine, config)
        if body.max_tokens == 0:  # echo alone: the prompts scored, nothing generated, no rows taken
            completion = Completion(body, job, card, warnings, arrived, metrics, engine.sampler)
            request.state.completion = completion
            if body.stream:
                return StreamingResponse(completion.echo_stream(), media_type="text/event-stream")
            return JSONResponse(await completion.echo_only())
        if not dispatchers or dispatchers[0].loop is not asyncio.get_running_loop():
            dispatchers[:] = [Dispatcher(asyncio.get_running_loop())]
        events: asyncio.Queue[Event] = asyncio.Queue()
        try:
            ticket = engine.submit(job, dispatchers[0].listener(events))
        except QueueFull:
            message = (
                f"All {engine.slots} rows are busy and {engine.max_queue} requests are waiting: "
                f"retry in {RETRY_AFTER} s (the Retry-After header)."
            )
            retry = {"Retry-After": str(RETRY_AFTER)}
            raise ApiError(429, message, code="rate_limit_exceeded", kind="requests", headers=retry) from None
        except Draining:  # closing the connection sends a load balancer's retry to another server
            message = "The server is shutting down: send the request to another one, or retry once it is back."
            headers = {"Retry-After": str(RETRY_AFTER), "Connection": "close"}
            raise ApiError(503, message, kind="server_error", headers=headers) from None
        completion = Completion(body, job, card, warnings, arrived, metrics, engine.sampler)
        completion.ticket = ticket
        request.state.completion = completion  # for the request's log line
        if body.stream:
            return StreamingResponse(
                completion.stream(events, lambda: engine.cancel(ticket)),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        if not await completion.collect(events, request, lambda: engine.cancel(ticket)):
            return Response(status_code=499)  # nobody is listening
        return JSONResponse(completion.whole())


def _model_object(card: ModelCard) -> dict[str, Any]:
    figures = {k: v for k, v in asdict(card).items() if k not in ("model", "created")}
    return {"id": card.model, "object": "model", "created": card.created, "owned_by": "textgen", **figures}


def card_of_run(summary: RunSummary, model: ModelConfig, vocab_size: int) -> ModelCard:
    """The card of a run's model, with its training figures."""
    nats = None if summary.best_val_bpc is None else summary.best_val_bpc * math.log(2)
    training = {
        "best_val_loss": nats,
        "best_val_bpc": summary.best_val_bpc,
        "epochs": summary.epochs,  # complete ones, and the batches of one cut short: as textgen runs shows them
        "batches_into_epoch": summary.batches_into_epoch,
        "train_seconds": summary.seconds,
        "corpus": summary.corpus,
        "made_from": summary.made_from or None,  # a fine-tune's base run, say
    }
    return ModelCard(
        summary.run, "run", vocab_size, model.units, model.layers, model.embedding_dim, model.parameters, training
    )


def card_of_export(name: str, info: ArtifactInfo, base: bool = False) -> ModelCard:
    """The card of an exported model (its run's training figures stay with the run); ``base``: the package's base
    model, labelled as such."""
    model = info.model
    training: dict[str, Any] = {"run": info.run, "weights": info.weights, "quantize": info.quantize}
    if base:
        training["base_model"] = True
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


class LogLines(logging.Formatter):
    """Log records one line each, on stderr: text for people, or (``json``) one strict JSON object per line for
    machines. A request's line (``AccessLog``) and the start-up record carry their figures as ``fields``."""

    def __init__(self, as_json: bool) -> None:
        super().__init__()
        self.as_json = as_json

    def format(self, record: logging.LogRecord) -> str:
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.created))
        fields: dict[str, Any] = getattr(record, "fields", {})
        error = self.formatException(record.exc_info) if record.exc_info else None
        if self.as_json:
            entry = {"time": when, "level": record.levelname.lower(), "event": record.getMessage(), **fields}
            return json.dumps(entry if error is None else {**entry, "error": error}, allow_nan=False)
        text = _request_line(fields) if record.name == access_log.name else record.getMessage()
        return f"{when} {text}" if error is None else f"{when} {text}\n{error}"


def _request_line(f: dict[str, Any]) -> str:
    words = [f["client"] or "-", f["method"], f["path"], str(f["status"])]
    if f["chars_in"] is not None:
        first = "-" if f["first_char_s"] is None else f"{f['first_char_s']:.3f}s"
        words += [f"in={f['chars_in']}", f"out={f['chars_out']}", f"first={first}"]
    words.append(f"took={f['duration_s']:.3f}s")
    return " ".join(words if f["finish"] is None else [*words, f"finish={f['finish']}"])


def configure_logs(log_format: str) -> None:
    """textgen's and uvicorn's log records to stderr, in ``log_format`` ("text" or "json"): a line per request, the
    drain, and any error."""
    handler = logging.StreamHandler()
    handler.setFormatter(LogLines(log_format == "json"))
    for name, level in (("textgen", logging.INFO), ("uvicorn", logging.WARNING)):
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.setLevel(level)
        logger.propagate = False


def log_start(url: str, serving: str, config: ServeConfig) -> None:
    """The start-up record of ``--log-format json``: where the server listens, what it serves, which limits apply."""
    serve_log.info("start", extra={"fields": {"url": url, "serving": serving, **config.limits()}})


def run(app: Any, sock: socket.socket, engine: Engine, drain_seconds: float) -> None:
    """Serve ``app`` on ``sock`` until SIGTERM or Ctrl-C, which drain: for ``drain_seconds`` the socket stays open,
    new requests get 503 with Retry-After and ``/ready`` says draining (a load balancer's cue to send them elsewhere)
    while running streams go on; then the streams still running end (finish_reason "shutdown") and the call returns.
    Ctrl-C, a person at a terminal rather than a load balancer, ends the drain as soon as no request runs; a second
    Ctrl-C stops at once."""
    import uvicorn

    class DrainingServer(uvicorn.Server):
        drain_ends: float | None = None
        drain_said = False
        interactive = False  # drained by Ctrl-C: nobody waits for /ready to fail, so idle ends it

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
            # uvicorn stops listening as soon as should_exit is set: it is set when the drain ends (on_tick).
            if self.drain_ends is None:
                engine.drain(drain_seconds)
                self.drain_ends = time.monotonic() + drain_seconds
                self.interactive = sig == signal.SIGINT
            elif sig == signal.SIGINT:
                self.should_exit = self.force_exit = True

        async def on_tick(self, counter: int) -> bool:
            if self.drain_ends is None:
                return await super().on_tick(counter)
            if not self.drain_said:  # said here, not in the signal handler, which may interrupt a log write
                self.drain_said = True
                message = "draining: new requests get 503 for %g s, then running streams end (Ctrl-C again: now)"
                serve_log.info(message, drain_seconds)
            idle = self.interactive and engine.busy_rows == 0 and engine.queue_length == 0
            return await super().on_tick(counter) or idle or time.monotonic() >= self.drain_ends

    config = uvicorn.Config(
        app,
        log_config=None,
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=SHUTDOWN_GRACE,
    )
    DrainingServer(config).run(sockets=[sock])
