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
import math
import signal
import socket
import time
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from dataclasses import asdict
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import quote

import prometheus_client as prom
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from textgen.artifact import ArtifactInfo
from textgen.completion import (
    ApiError,
    Completion,
    CompletionRequest,
    Dispatcher,
    Metrics,
    ModelCard,
    check_model,
    completion_job,
    validation_error,
)
from textgen.config import MAX_REQUEST_CHARS, ModelConfig, ServeConfig
from textgen.engine import Draining, Engine, Event, QueueFull
from textgen.errors import ConfigError
from textgen.plot import loss_svg, read_history
from textgen.results import RunSummary
from textgen.runs import run_summaries

RETRY_AFTER = 1  # seconds a refused client is told to wait: rows free every few tens of milliseconds under load


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
    app = FastAPI(title="textgen", docs_url=None, redoc_url=None)  # the docs pages fetch scripts from a CDN
    _add_error_handlers(app, metrics)
    api_key = [Depends(_key_check(config.api_key))]
    _add_model_routes(app, engine, card, config, metrics, api_key)
    _add_run_routes(app, checkpoint_dir)
    _add_completions(app, engine, card, config, metrics, api_key)
    return BodyLimit(app, config.max_body)


def _add_error_handlers(app: FastAPI, metrics: Metrics) -> None:
    """Every error as OpenAI's JSON, and counted when it answers a completion request."""
    outcomes = {429: "rejected", 503: "unavailable", 401: "unauthorized"}

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        if request.url.path == "/v1/completions":
            metrics.requests.labels(outcomes.get(exc.status, "invalid")).inc()
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        metrics.requests.labels("invalid").inc()
        return validation_error(exc.errors()).response()

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        return ApiError(
            exc.status_code, str(exc.detail), kind="not_found" if exc.status_code == 404 else "error"
        ).response()


def _key_check(api_key: str | None) -> Callable[[Request], Awaitable[None]]:
    """The dependency that refuses a request without ``api_key`` (none when it is None). Async, so FastAPI runs it on
    the event loop rather than handing every request to a worker thread and back."""

    async def authorized(request: Request) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        token = given[7:] if given[:7].lower() == "bearer " else ""
        if not hmac.compare_digest(token.encode(), api_key.encode()):
            message = "a missing or wrong API key: send the header 'Authorization: Bearer <key>'"
            raise ApiError(401, message, kind="authentication_error", headers={"WWW-Authenticate": "Bearer"})

    return authorized


def _add_model_routes(
    app: FastAPI, engine: Engine, card: ModelCard, config: ServeConfig, metrics: Metrics, api_key: list[Any]
) -> None:
    """The page, the probes, the metrics, and what is served."""
    page = resources.files("textgen").joinpath("page.html").read_text(encoding="utf-8")

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
        check_model(name, card)
        return _model_object(card)


def _add_run_routes(app: FastAPI, checkpoint_dir: Path | None) -> None:
    """The checkpoint directory's runs and their loss curves, for the page's second view."""

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
            listed.append(
                {
                    "name": s.run,
                    "epochs": s.epochs,
                    "batches_into_epoch": s.batches_into_epoch,
                    "best_val_loss": nats,
                    "curve": curve,
                }
            )
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


def _add_completions(
    app: FastAPI, engine: Engine, card: ModelCard, config: ServeConfig, metrics: Metrics, api_key: list[Any]
) -> None:
    """``POST /v1/completions``: a request becomes an engine job; its events are streamed or gathered."""
    dispatchers: list[Dispatcher] = []  # made on the event loop by the first request

    @app.post("/v1/completions", dependencies=api_key)
    async def completions(body: CompletionRequest, request: Request) -> Response:
        arrived = time.monotonic()
        job, warnings = completion_job(body, card, engine, config)
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
