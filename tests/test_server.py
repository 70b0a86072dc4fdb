"""`textgen serve`'s API on the session's tiny run: the official `openai` client, streamed and whole answers alike,
errors as JSON naming the field, the queue's 429, API keys, metrics, disconnects, the runs view."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import uvicorn
from helpers import wait_until

from textgen.config import SampleConfig, ServeConfig
from textgen.engine import Engine, Job
from textgen.server import card_of_run, create_app, listen


@pytest.fixture(scope="module")
def sampler(trained_run):
    from textgen.sampling import Generator

    return Generator.from_run(trained_run.run)


@dataclass
class Served:
    url: str
    engine: Engine
    model: str


def start_server(trained_run, sampler, config: ServeConfig) -> Iterator[Served]:
    """The app on a loopback port, uvicorn in a thread of this process."""
    from textgen.runs import run_summary

    engine = Engine(sampler, config.slots, config.max_queue)
    engine.start()
    card = card_of_run(run_summary(trained_run.run), sampler.cfg, sampler.vocab.size)
    app = create_app(engine, card, config, trained_run.checkpoint_dir)
    sock = listen("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    yield Served(f"http://127.0.0.1:{sock.getsockname()[1]}", engine, card.model)
    server.should_exit = True
    thread.join(10)
    engine.close()
    sock.close()


@pytest.fixture(scope="module")
def served(trained_run, sampler) -> Iterator[Served]:
    yield from start_server(trained_run, sampler, ServeConfig(slots=8, max_queue=4, max_body=4096))


@pytest.fixture
def client(served) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=served.url, timeout=30) as client:
        yield client


def completion(client: httpx.Client, served: Served, **fields: Any) -> httpx.Response:
    return client.post("/v1/completions", json={"model": served.model, **fields})


def events(response: httpx.Response) -> list[Any]:
    """The server-sent events of a streamed answer, ``[DONE]`` as the string."""
    data = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    return [d if d == "[DONE]" else json.loads(d) for d in data]


def test_the_openai_client_gets_the_text_textgen_sample_gives(served, sampler) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=served.url + "/v1", api_key="unused")
    assert [m.id for m in client.models.list()] == [served.model]
    answer = client.completions.create(model=served.model, prompt="The ", max_tokens=120, seed=5, temperature=0.9, n=2)
    expected = sampler.generate(["The "] * 2, SampleConfig(length=120, num=2, temperature=0.9, seed=5))
    assert [c.text for c in answer.choices] == expected
    assert [c.finish_reason for c in answer.choices] == ["length", "length"]
    assert answer.usage is not None
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (8, 240)

    stream = client.completions.create(
        model=served.model, prompt="The ", max_tokens=1000, seed=5, temperature=0.9, stream=True
    )
    chunks = list(stream)
    streamed = "".join(c.choices[0].text for c in chunks)
    assert streamed[:120] == expected[0]  # a longer answer begins with the shorter one
    assert streamed == sampler.generate(["The "], SampleConfig(length=1000, temperature=0.9, seed=5))[0]
    assert 1 < len(chunks) < 200, "several characters an event"
    assert chunks[-1].choices[0].finish_reason == "length"


def test_stop_sequences_are_trimmed_alike_streamed_and_whole(client, served, sampler) -> None:
    whole = sampler.generate(["a"], SampleConfig(length=300, temperature=0.0))[0]
    stop = whole[100:104]
    fields = {"prompt": "a", "max_tokens": 300, "temperature": 0, "stop": [stop]}
    answer = completion(client, served, **fields).json()
    assert answer["choices"][0]["text"] == whole[: whole.find(stop)]
    assert answer["choices"][0]["finish_reason"] == "stop"
    with client.stream("POST", "/v1/completions", json={"model": served.model, "stream": True, **fields}) as response:
        streamed = events(response)
    assert streamed[-1] == "[DONE]"
    assert "".join(e["choices"][0]["text"] for e in streamed[:-1]) == answer["choices"][0]["text"]
    assert streamed[-2]["choices"][0]["finish_reason"] == "stop"


def test_a_streamed_answer_can_end_with_its_usage(client, served) -> None:
    body = {"model": served.model, "prompt": "ab", "max_tokens": 30, "stream": True}
    with client.stream("POST", "/v1/completions", json={**body, "stream_options": {"include_usage": True}}) as r:
        streamed = events(r)
    assert streamed[-2]["choices"] == []
    assert streamed[-2]["usage"] == {"prompt_tokens": 2, "completion_tokens": 30, "total_tokens": 32}


@pytest.mark.parametrize(
    ("fields", "status", "param"),
    [
        ({"temperature": "hot"}, 422, "temperature"),
        ({"temperature": -1}, 422, "temperature"),
        ({"temperature": 1e6}, 422, "temperature"),
        ({"max_tokens": 0}, 422, "max_tokens"),
        ({"max_tokens": 1.5}, 422, "max_tokens"),
        ({"max_tokens": "10"}, 422, "max_tokens"),
        ({"max_tokens": 10**9}, 422, "max_tokens"),
        ({"top_p": 0}, 422, "top_p"),
        ({"top_k": -2}, 422, "top_k"),
        ({"n": 9}, 422, "n"),
        ({"seed": -1}, 422, "seed"),
        ({"stream": "yes"}, 422, "stream"),
        ({"logprobs": 2}, 422, "logprobs"),
        ({"echo": True}, 422, "echo"),
        ({"colour": "red"}, 422, "colour"),
        ({"model": "gpt-4"}, 404, "model"),
    ],
)
def test_bad_requests_get_a_json_error_naming_the_field(client, served, fields, status, param) -> None:
    response = completion(client, served, **{"prompt": "x", "max_tokens": 5, **fields})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param
    assert error["message"] and "Traceback" not in response.text


def test_bodies_that_are_not_json_or_too_large_are_refused(client, served) -> None:
    nan = '{"model": "' + served.model + '", "prompt": "x", "temperature": NaN}'
    response = client.post("/v1/completions", content=nan, headers={"content-type": "application/json"})
    assert response.status_code == 422 and response.json()["error"]["param"] == "temperature"
    response = client.post("/v1/completions", content="{not json", headers={"content-type": "application/json"})
    assert response.status_code == 422
    response = completion(client, served, prompt="x" * 5000)
    assert response.status_code == 413
    assert "4,096 bytes" in response.json()["error"]["message"]

    def chunked() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        yield b'{"model": "m", "prompt": "'
        yield b"x" * 5000
        yield b'"}'

    assert client.post("/v1/completions", content=chunked()).status_code == 413


def test_characters_the_model_never_saw_are_reported(client, served) -> None:
    answer = completion(client, served, prompt="the \u263a fox", max_tokens=5).json()
    assert answer["warnings"] == ["skipping characters the model has never seen: '\u263a'"]
    assert len(answer["choices"][0]["text"]) == 5


def test_a_client_that_goes_away_frees_its_row(client, served) -> None:
    body = {"model": served.model, "prompt": "x", "max_tokens": 10**6, "stream": True}
    with client.stream("POST", "/v1/completions", json=body) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                break
        assert served.engine.busy_rows == 1
    wait_until(lambda: not served.engine.busy_rows, "the row was not freed after the client left")


def test_a_client_that_stops_waiting_for_a_whole_answer_frees_its_row(client, served) -> None:
    body = {"model": served.model, "prompt": "x", "max_tokens": 10**6}
    with pytest.raises(httpx.ReadTimeout):
        client.post("/v1/completions", json=body, timeout=0.3)
    wait_until(lambda: not served.engine.busy_rows, "the row was not freed after its client left")
    assert 'textgen_requests_total{outcome="cancelled"}' in client.get("/metrics").text


def test_a_union_field_says_each_reason_once(client, served) -> None:
    error = completion(client, served, prompt="x", stop=["a", "b", "c", "d", "e"]).json()["error"]
    assert error["param"] == "stop"
    assert "at most 4" in error["message"] and error["message"].count("stop:") == 1


def test_health_ready_metrics_and_info(client, served) -> None:
    completion(client, served, prompt="x", max_tokens=7)
    assert client.get("/health").json() == {"status": "ok"}
    assert client.get("/ready").json()["status"] == "ready"
    metrics = client.get("/metrics").text
    for name in (
        'textgen_requests_total{outcome="completed"}',
        "textgen_queue_length 0.0",
        "textgen_rows_busy 0.0",
        "textgen_chars_generated_total",
        "textgen_time_to_first_char_seconds_bucket",
        "textgen_request_duration_seconds_count",
    ):
        assert name in metrics
    info = client.get("/info").json()
    assert info["model"] == served.model and info["vocab_size"] == served.engine.sampler.vocab.size
    assert info["training"]["epochs"] == 4 and info["limits"]["max_tokens"] >= 100_000


def test_the_page_and_the_runs_view(client, served) -> None:
    page = client.get("/")
    assert page.status_code == 200 and 'id="prompt"' in page.text and "http" not in page.text.split("<script")[0]
    runs = client.get("/runs").json()["runs"]
    assert [r["name"] for r in runs] == [served.model]
    curve = client.get(runs[0]["curve"])
    assert curve.headers["content-type"] == "image/svg+xml" and curve.text.startswith("<svg")
    assert client.get("/runs/nope/loss.svg").status_code == 404
    assert client.get("/runs/..%2F..%2Fetc/loss.svg").status_code == 404


def test_requests_beyond_the_rows_and_the_queue_get_429(trained_run, sampler) -> None:
    from starlette.testclient import TestClient

    from textgen.runs import run_summary

    engine = Engine(sampler, slots=1, max_queue=0)  # not started: what is submitted stays
    card = card_of_run(run_summary(trained_run.run), sampler.cfg, sampler.vocab.size)
    with TestClient(create_app(engine, card, ServeConfig(slots=1, max_queue=0))) as client:
        engine.submit(Job(("x",), 10), lambda event: None)  # takes the one row
        response = client.post("/v1/completions", json={"model": card.model, "prompt": "y"})
    assert response.status_code == 429
    assert response.headers["retry-after"] == "1"
    assert response.json()["error"]["type"] == "rate_limit_error"


def test_an_api_key_is_required_when_set(trained_run, sampler) -> None:
    from starlette.testclient import TestClient

    from textgen.runs import run_summary

    engine = Engine(sampler, slots=1, max_queue=1)
    card = card_of_run(run_summary(trained_run.run), sampler.cfg, sampler.vocab.size)
    with TestClient(create_app(engine, card, ServeConfig(api_key="s3cret"))) as client:
        assert client.get("/v1/models").status_code == 401
        assert client.get("/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert client.get("/v1/models", headers={"Authorization": "Bearer s3cret"}).status_code == 200
        assert client.get("/health").status_code == 200  # probes need no key
        assert client.get("/info").json()["auth"] is True


def test_an_export_answers_to_its_run_s_name_too() -> None:
    """A client written against the run's server (model="wp") goes on working when the run's export is served."""
    from textgen.completion import ApiError, ModelCard, check_model

    card = ModelCard("wp-litert-int8", "litert", 90, 512, 1, 64, 1, {"run": "wp", "weights": "best"})
    check_model("wp-litert-int8", card)
    check_model("wp", card)
    with pytest.raises(ApiError, match="this server serves 'wp-litert-int8'"):
        check_model("gpt-4", card)
