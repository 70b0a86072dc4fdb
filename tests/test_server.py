"""`textgen serve`'s API on the session's tiny run: the official `openai` client, streamed and whole answers alike,
errors as JSON naming the field, the queue's 429, API keys, metrics, disconnects, the runs view."""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import uvicorn
from helpers import wait_until

from textgen import completion as completion_module
from textgen.engine import Engine
from textgen.genconfig import MAX_STOP_CHARS, MAX_WHOLE_CHARS, SampleConfig, ServeConfig
from textgen.promptcache import PromptCache
from textgen.rowtable import Job
from textgen.server import LogLines, card_of_run, create_app, listen


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

    engine = Engine(sampler, config.slots, config.max_queue, cache=PromptCache(config.prompt_cache))
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
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (4, 240)  # the prompt is read once

    stream = client.completions.create(
        model=served.model, prompt="The ", max_tokens=1000, seed=5, temperature=0.9, stream=True
    )
    chunks = list(stream)
    streamed = "".join(c.choices[0].text for c in chunks)
    assert streamed[:120] == expected[0]  # a longer answer begins with the shorter one
    assert streamed == sampler.generate(["The "], SampleConfig(length=1000, temperature=0.9, seed=5))[0]
    assert 1 < len(chunks) < 200, "several characters an event"
    assert chunks[-1].choices[0].finish_reason == "length"


def test_the_openai_client_reads_logprobs_and_echo(served) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=served.url + "/v1", api_key="unused")
    text = "the old fox sat on the mat"
    scored = client.completions.create(model=served.model, prompt=text, max_tokens=0, echo=True, logprobs=0)
    logprobs = scored.choices[0].logprobs
    assert scored.choices[0].text == text and logprobs is not None
    assert logprobs.tokens == list(text) and logprobs.text_offset == list(range(len(text)))
    assert logprobs.token_logprobs is not None and logprobs.token_logprobs[0] is None
    assert all(x is not None and x < 0 for x in logprobs.token_logprobs[1:])
    for prompt in ("", "\u263a"):  # nothing the model knows: it starts from the start state's logits
        empty = client.completions.create(model=served.model, prompt=prompt, max_tokens=3, echo=True, logprobs=1)
        choice = empty.choices[0]
        assert choice.logprobs is not None and choice.text.startswith(prompt) and len(choice.text) == len(prompt) + 3
        assert choice.logprobs.text_offset == [len(prompt) + i for i in range(3)]
        assert choice.logprobs.token_logprobs is not None and None not in choice.logprobs.token_logprobs
    answer = client.completions.create(model=served.model, prompt="the ", max_tokens=20, n=2, best_of=2, logprobs=3)
    for choice in answer.choices:
        assert choice.logprobs is not None and "".join(choice.logprobs.tokens or []) == choice.text


def test_penalties_and_bias_give_the_text_textgen_sample_gives(client, served, sampler) -> None:
    fields = {"frequency_penalty": 0.4, "presence_penalty": 0.3, "logit_bias": {"e": -100, " ": 1.5}}
    answer = completion(client, served, prompt="The ", max_tokens=150, seed=5, temperature=0, n=2, **fields).json()
    settings = SampleConfig(
        length=150, num=2, temperature=0, seed=5, frequency_penalty=0.4, presence_penalty=0.3,
        logit_bias=(("e", -100.0), (" ", 1.5)),
    )  # fmt: skip
    expected = sampler.generate(["The "] * 2, settings)
    assert [c["text"] for c in answer["choices"]] == expected
    assert "e" not in "".join(expected)
    plain = completion(client, served, prompt="The ", max_tokens=150, seed=5, temperature=0).json()
    assert plain["choices"][0]["text"] != expected[0]


def test_a_ban_of_every_character_is_refused(client, served, sampler) -> None:
    bans = {char: -100 for char in sampler.vocab.chars}
    error = completion(client, served, prompt="x", max_tokens=5, logit_bias=bans).json()["error"]
    assert error["param"] == "logit_bias" and "bans every character of the vocabulary" in error["message"]


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


def test_best_of_equal_to_n_is_n_continuations(client, served, sampler) -> None:
    fields = {"prompt": "The ", "max_tokens": 50, "seed": 3, "temperature": 0.9, "n": 3}
    answer = completion(client, served, best_of=3, **fields).json()
    expected = sampler.generate(["The "] * 3, SampleConfig(length=50, num=3, temperature=0.9, seed=3))
    assert [c["text"] for c in answer["choices"]] == expected
    assert completion(client, served, best_of=1, **fields).json()["choices"] == answer["choices"]
    error = completion(client, served, best_of=2, **fields).json()["error"]
    assert (error["param"], error["code"]) == ("best_of", "invalid_value")


def test_a_streamed_answer_can_end_with_its_usage(client, served) -> None:
    body = {"model": served.model, "prompt": "ab", "max_tokens": 30, "stream": True}
    with client.stream("POST", "/v1/completions", json={**body, "stream_options": {"include_usage": True}}) as r:
        streamed = events(r)
    assert streamed[-2]["choices"] == []
    usage = streamed[-2]["usage"]
    assert {k: usage[k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")} == {
        "prompt_tokens": 2,
        "completion_tokens": 30,
        "total_tokens": 32,
    }
    assert 0 <= usage["prompt_tokens_details"]["cached_tokens"] <= 2  # earlier tests may have sent "a" or "ab"


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
        ({"logprobs": 21}, 422, "logprobs"),
        ({"logprobs": -1}, 422, "logprobs"),
        ({"echo": "yes"}, 422, "echo"),
        ({"logprobs": 20, "max_tokens": 5_000}, 422, "logprobs"),  # over the entries allowed
        ({"colour": "red"}, 422, "colour"),
        ({"model": "gpt-4"}, 404, "model"),
        ({"stop": ["x" * (MAX_STOP_CHARS + 1)]}, 422, "stop"),
        ({"n": 2, "max_tokens": MAX_WHOLE_CHARS // 2 + 1}, 422, "max_tokens"),  # a whole answer's characters
        ({"presence_penalty": -3}, 422, "presence_penalty"),
        ({"logit_bias": {"": 1}}, 422, "logit_bias"),
    ],
)
def test_bad_requests_get_a_json_error_naming_the_field(client, served, fields, status, param) -> None:
    response = completion(client, served, **{"prompt": "x", "max_tokens": 5, **fields})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param
    assert error["type"] == "invalid_request_error" and (error["code"] is None or isinstance(error["code"], str))
    message = error["message"]
    assert message[0].isupper() and message.endswith(".") and f"'{param}'" in message, message


@pytest.mark.parametrize(
    ("fields", "code", "says"),
    [
        ({"model": "gpt-4"}, "model_not_found", "send 'model' as 'tiny'"),
        ({"colour": "red"}, "unknown_parameter", "the fields are model, prompt"),
        ({"temperature": "hot"}, "invalid_type", "must be a number"),
        ({"max_tokens": 0}, "invalid_value", "from 1 to 1,000,000"),
        ({"logprobs": 21}, "invalid_value", "from 0 to 20"),
        ({"logprobs": 1, "max_tokens": 30_000, "n": 2}, "invalid_value", "60,000 x 2 = 120,000"),
        ({"max_tokens": 0}, "invalid_value", "0 only with 'echo' true"),
        ({"presence_penalty": 2.5}, "invalid_value", "'presence_penalty' must be a number from -2 to 2 (0 = off)"),
        ({"frequency_penalty": "x"}, "invalid_type", "'frequency_penalty' must be a number from -2 to 2"),
        ({"logit_bias": {"ab": 1}}, "invalid_value", "'logit_bias' must be keyed by single characters (got"),
        ({"logit_bias": {"a": -101}}, "invalid_value", "'logit_bias' must be from -100 (a ban) to 100 for 'a'"),
        (
            {"logit_bias": {"Z": 1}},
            "invalid_value",
            "keyed by characters of the model's vocabulary: the model has no 'Z'",
        ),
        ({"logit_bias": {"a": "x"}}, "invalid_type", "'logit_bias' must be an object of up to"),
        ({"best_of": 3}, "invalid_value", "must be 1 or equal to 'n' (1), got 3: textgen scores no continuation"),
        ({"best_of": 0}, "invalid_value", "1 or equal to n"),
        ({"n": 9}, "invalid_value", "more than the server's 8 rows"),
    ],
)
def test_errors_carry_openai_s_codes_and_say_what_to_send(client, served, fields, code, says) -> None:
    error = completion(client, served, **{"prompt": "x", "max_tokens": 5, **fields}).json()["error"]
    assert error["code"] == code
    assert says in error["message"], error["message"]
    assert "Input should" not in error["message"]  # the validation library's wording


def test_the_prompts_characters_are_bounded_whatever_the_body_limit(client, served, monkeypatch) -> None:
    monkeypatch.setattr(completion_module, "MAX_PROMPT_CHARS", 10)
    error = completion(client, served, prompt=["x" * 6, "y" * 5], max_tokens=5).json()["error"]
    assert error["param"] == "prompt" and "11 characters, more than the 10 allowed" in error["message"]


def test_bodies_that_are_not_json_or_too_large_are_refused(client, served) -> None:
    nan = '{"model": "' + served.model + '", "prompt": "x", "temperature": NaN}'
    response = client.post("/v1/completions", content=nan, headers={"content-type": "application/json"})
    assert response.status_code == 422 and response.json()["error"]["param"] == "temperature"
    response = client.post("/v1/completions", content="{not json", headers={"content-type": "application/json"})
    assert response.status_code == 400
    assert response.json()["error"]["message"].startswith("The body is not valid JSON (")
    response = client.post("/v1/completions", json=["a", "list"])
    assert response.status_code == 422 and response.json()["error"]["message"].startswith(
        "The body must be a JSON object"
    )
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


def test_a_union_field_says_what_it_takes_once(client, served) -> None:
    error = completion(client, served, prompt="x", stop=["a", "b", "c", "d", "e"]).json()["error"]
    assert error["param"] == "stop"
    assert error["message"].count("up to 4 strings") == 1


def test_chat_completions_and_unknown_routes_get_a_json_404_saying_why(client) -> None:
    chat = client.post("/v1/chat/completions", json={"model": "tiny", "messages": []})
    assert chat.status_code == 404
    message = chat.json()["error"]["message"]
    assert "POST /v1/completions" in message and "no chat template" in message
    unknown = client.get("/nowhere")
    assert unknown.status_code == 404 and unknown.json()["error"]["message"].startswith("There is no GET /nowhere")
    wrong_method = client.get("/v1/completions")
    assert wrong_method.status_code == 405 and "send POST" in wrong_method.json()["error"]["message"]


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


@pytest.fixture
def access_lines() -> Iterator[list[logging.LogRecord]]:
    """The request log's records from now on."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("textgen.access")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)  # not .level =: the logger caches whether a level is on
    yield records
    logger.removeHandler(handler)
    logger.setLevel(level)


def test_every_request_leaves_one_log_line(client, served, access_lines) -> None:
    completion(client, served, prompt="abc", max_tokens=7)
    completion(client, served, prompt="abc", max_tokens=0)
    with client.stream(
        "POST", "/v1/completions", json={"model": served.model, "prompt": "ab", "max_tokens": 9, "stream": True}
    ) as r:
        events(r)
    client.get("/health")

    def lines() -> list[dict[str, Any]]:  # not those of earlier tests' streams, whose clients left
        return [f for f in (r.fields for r in access_lines) if f["finish"] != "cancelled"]  # type: ignore[attr-defined]

    wait_until(lambda: len(lines()) >= 4, "four requests did not leave four log lines")
    assert len(lines()) == 4
    # A stream's line is written as its generator closes, which may come after the next request's: found by content
    whole = next(f for f in lines() if f["status"] == 200 and f["chars_in"] == 3)
    invalid = next(f for f in lines() if f["status"] == 422)
    streamed = next(f for f in lines() if f["chars_in"] == 2)
    health = next(f for f in lines() if f["path"] == "/health")
    assert (whole["method"], whole["path"], whole["status"], whole["finish"]) == (
        "POST",
        "/v1/completions",
        200,
        "length",
    )
    assert (whole["chars_in"], whole["chars_out"]) == (3, 7)
    assert 0 < whole["first_char_s"] <= whole["duration_s"]
    assert (invalid["status"], invalid["chars_in"]) == (422, None)
    assert (streamed["chars_in"], streamed["chars_out"], streamed["finish"]) == (2, 9, "length")
    assert (health["path"], health["status"], health["first_char_s"]) == ("/health", 200, None)

    text, as_json = LogLines(as_json=False), LogLines(as_json=True)
    record_of_whole = next(r for r in access_lines if r.fields is whole)  # type: ignore[attr-defined]
    line = text.format(record_of_whole)
    assert re.fullmatch(
        r"\S+Z 127\.0\.0\.1 POST /v1/completions 200 in=3 out=7 first=\d\.\d{3}s took=\d+\.\d{3}s finish=length", line
    ), line
    record = json.loads(as_json.format(record_of_whole))
    assert {k: record[k] for k in ("event", "method", "status", "chars_out", "finish")} == {
        "event": "request",
        "method": "POST",
        "status": 200,
        "chars_out": 7,
        "finish": "length",
    }


def test_the_page_and_the_runs_view(client, served) -> None:
    page = client.get("/")
    assert page.status_code == 200 and 'id="prompt"' in page.text and "http" not in page.text.split("<script")[0]
    runs = client.get("/runs").json()["runs"]
    assert [r["name"] for r in runs] == [served.model]
    curve = client.get(runs[0]["curve"])
    assert curve.headers["content-type"] == "image/svg+xml" and curve.text.startswith("<svg")
    assert client.get("/runs/nope/loss.svg").status_code == 404
    assert client.get("/runs/..%2F..%2Fetc/loss.svg").status_code == 404


def test_the_runs_view_marks_the_served_run_and_a_fine_tune_s_base(trained_run, sampler, tmp_path) -> None:
    """/runs says which run is served and what a fine-tune was made from; the page carries /info's answer (a name
    with "</script>" in it cannot end its script element)."""
    from dataclasses import replace

    from starlette.testclient import TestClient

    from textgen.config import InitConfig, Weights
    from textgen.plot import BATCH_LABEL
    from textgen.runs import run_summary

    checkpoint_dir = tmp_path / "checkpoints"
    base, tuned = trained_run.copy_to(checkpoint_dir), trained_run.copy_to(checkpoint_dir, "tuned")
    cfg = tuned.load_config()
    init = InitConfig(str(base.path), base.name, Weights.best, "-", 0.9, "tiny.txt", cfg.model)
    tuned.save_config(replace(cfg, init_from=init))
    tuned.history_path.unlink()  # as in its first epoch: its training loss by batch is its curve
    card = card_of_run(run_summary(tuned), sampler.cfg, sampler.vocab.size)
    with TestClient(create_app(Engine(sampler, slots=1, max_queue=0), card, ServeConfig(), checkpoint_dir)) as client:
        runs = {r["name"]: r for r in client.get("/runs").json()["runs"]}
        info, page = client.get("/info").json(), client.get("/").text
        assert BATCH_LABEL in client.get(runs["tuned"]["curve"]).text
    assert runs["tuned"]["served"] is True and runs["tiny"]["served"] is False
    assert runs["tuned"]["made_from"] == "fine-tuned from tiny, 0 new characters" and runs["tiny"]["made_from"] is None
    assert info["training"]["made_from"] == runs["tuned"]["made_from"]
    assert json.loads(page.split('id="info-json">')[1].split("</script>")[0]) == info

    odd = replace(card, model="x</script><b>")
    with TestClient(create_app(Engine(sampler, slots=1, max_queue=0), odd, ServeConfig())) as client:
        page = client.get("/").text
    assert json.loads(page.split('id="info-json">')[1].split("</script>")[0])["model"] == "x</script><b>"


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
    assert response.json()["error"]["code"] == "rate_limit_exceeded"


def test_an_api_key_is_required_when_set(trained_run, sampler) -> None:
    from starlette.testclient import TestClient

    from textgen.runs import run_summary

    engine = Engine(sampler, slots=1, max_queue=1)
    card = card_of_run(run_summary(trained_run.run), sampler.cfg, sampler.vocab.size)
    config = ServeConfig(api_key="s3cret", max_body=100)
    with TestClient(create_app(engine, card, config, trained_run.checkpoint_dir)) as client:
        missing = client.get("/v1/models")
        assert missing.status_code == 401 and missing.json()["error"]["code"] is None
        wrong = client.get("/v1/models", headers={"Authorization": "Bearer wrong"})
        assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
        assert client.get("/v1/models", headers={"Authorization": "Bearer s3cret"}).status_code == 200
        for route in ("/metrics", "/v1/chat/completions", "/nowhere"):
            assert client.get(route).status_code == 401, route
        for route in ("/", "/health", "/ready", "/runs"):  # the page's and the probes'
            assert client.get(route).status_code in (200, 503), route
        assert client.get("/info").json()["auth"] is True


def test_without_the_key_any_body_gets_401_before_it_is_read(trained_run, sampler) -> None:
    from starlette.testclient import TestClient

    from textgen.runs import run_summary

    engine = Engine(sampler, slots=1, max_queue=1)
    card = card_of_run(run_summary(trained_run.run), sampler.cfg, sampler.vocab.size)
    read = []

    def endless() -> Iterator[bytes]:  # a chunked body past --max-body: 413 if it were read
        for _ in range(10):
            read.append(1)
            yield b"x" * 100

    with TestClient(create_app(engine, card, ServeConfig(api_key="s3cret", max_body=100))) as client:
        for body in ("{not json", '{"model": 5, "prompt": []}', "x" * 1000):
            response = client.post("/v1/completions", content=body, headers={"content-type": "application/json"})
            assert response.status_code == 401, (body, response.text)
        assert client.post("/v1/completions", content=endless()).status_code == 401
    assert len(read) <= 1  # at most what the client sent before the answer


def test_an_export_answers_to_its_run_s_name_too() -> None:
    """A client written against the run's server (model="wp") goes on working when the run's export is served."""
    from textgen.completion import ApiError, ModelCard, check_model

    card = ModelCard("wp-litert-int8", "litert", 90, 512, 1, 64, 1, {"run": "wp", "weights": "best"})
    check_model("wp-litert-int8", card)
    check_model("wp", card)
    with pytest.raises(ApiError, match="send 'model' as 'wp-litert-int8'"):
        check_model("gpt-4", card)


def test_echoed_prompt_log_probabilities_sum_to_what_textgen_evaluate_scores(client, served, trained_run, tmp_path):
    """max_tokens 0 with echo scores a text without generating: its characters' log-probabilities, the first null,
    sum to minus the cross-entropy `textgen evaluate --streams 1` gives the same text."""
    from textgen.evaluate import evaluate_run

    text = "the quick fox sat on the mat\nand the old dog ran over the river " * 6
    path = tmp_path / "scored.txt"
    path.write_text(text, encoding="utf-8")
    evaluation = evaluate_run(trained_run.run, file=str(path), streams=1)
    answer = completion(client, served, prompt=text, max_tokens=0, echo=True, logprobs=3).json()
    choice = answer["choices"][0]
    assert choice["text"] == text and choice["finish_reason"] == "length"
    scored = choice["logprobs"]
    assert scored["tokens"] == list(text) and scored["text_offset"] == list(range(len(text)))
    assert scored["token_logprobs"][0] is None and scored["top_logprobs"][0] is None
    assert -sum(scored["token_logprobs"][1:]) == pytest.approx(evaluation.nats_per_char * evaluation.chars, rel=1e-4)
    assert evaluation.chars == len(text) - 1
    for chosen, token, top in zip(scored["token_logprobs"][1:], text[1:], scored["top_logprobs"][1:], strict=True):
        assert len(top) in (3, 4) and top[token] == pytest.approx(chosen)
        assert max(top.values()) >= chosen
    assert answer["usage"]["completion_tokens"] == 0


def test_logprobs_of_a_continuation_whole_and_streamed_are_those_of_its_text_scored(client, served, sampler) -> None:
    # "the ": every character in the tiny run's vocabulary (a skipped one keeps its offset but has no token)
    fields = {"prompt": "the ", "max_tokens": 80, "seed": 2, "temperature": 0.9, "n": 2, "logprobs": 2}
    whole = completion(client, served, **fields).json()["choices"]
    expected = sampler.generate(["the "] * 2, SampleConfig(length=80, num=2, temperature=0.9, seed=2))
    assert [c["text"] for c in whole] == expected  # scoring leaves the text alone
    for choice in whole:
        scored = choice["logprobs"]
        assert "".join(scored["tokens"]) == choice["text"] and scored["text_offset"] == list(range(80))
        assert all(len(top) in (2, 3) for top in scored["top_logprobs"])
        # The same characters scored as an echoed text: the continuation's part of it, the same numbers.
        echoed = completion(client, served, prompt="the " + choice["text"], max_tokens=0, echo=True, logprobs=2)
        tail = echoed.json()["choices"][0]["logprobs"]["token_logprobs"][4:]
        assert scored["token_logprobs"] == pytest.approx(tail, abs=1e-4)
    body = {"model": served.model, "stream": True, "echo": True, **fields}
    with client.stream("POST", "/v1/completions", json=body) as response:
        chunks = [e for e in events(response) if e != "[DONE]"]
    for index, choice in enumerate(whole):
        parts = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == index]
        assert "".join(p["text"] for p in parts) == "the " + choice["text"]
        tokens = [t for p in parts for t in p["logprobs"]["tokens"]]
        offsets = [o for p in parts for o in p["logprobs"]["text_offset"]]
        logprobs = [x for p in parts for x in p["logprobs"]["token_logprobs"]]
        assert tokens == list("the " + choice["text"]) and offsets == list(range(84))
        assert logprobs[0] is None
        assert logprobs[4:] == pytest.approx(choice["logprobs"]["token_logprobs"], abs=1e-4)


def test_echo_without_logprobs_returns_the_prompt_before_the_text(client, served) -> None:
    answer = completion(client, served, prompt="ab", max_tokens=5, echo=True).json()["choices"][0]
    assert answer["text"].startswith("ab") and len(answer["text"]) == 7 and answer["logprobs"] is None
    streamed_body = {"model": served.model, "prompt": "ab", "max_tokens": 0, "echo": True, "stream": True, "n": 2}
    with client.stream("POST", "/v1/completions", json=streamed_body) as response:
        streamed = events(response)
    assert streamed[-1] == "[DONE]"
    assert [(e["choices"][0]["text"], e["choices"][0]["finish_reason"]) for e in streamed[:-1]] == [
        ("ab", "length")
    ] * 2


def metric(text: str, name: str) -> float:
    return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(name + " ")))


def test_a_prompt_read_before_starts_from_its_cached_state(client, served, sampler) -> None:
    """The second time a prompt comes, its rows start at its end (OpenAI's ``cached_tokens`` says so, and the
    metrics count it), with the text `textgen sample` gives; a prompt extending it starts there too."""
    prompt = ("qz prompt the cache keeps for the next one " * 8)[:300]  # no earlier test sent "q"
    before = client.get("/metrics").text
    answers = [
        completion(client, served, prompt=text, max_tokens=40, seed=9).json()
        for text in (prompt, prompt, prompt + " and on")
    ]
    cached = [a["usage"]["prompt_tokens_details"]["cached_tokens"] for a in answers]
    assert cached == [0, 300, 300]
    for answer, text in zip(answers, (prompt, prompt, prompt + " and on"), strict=True):
        assert answer["choices"][0]["text"] == sampler.generate([text], SampleConfig(length=40, seed=9))[0]
    after = client.get("/metrics").text
    assert metric(after, "textgen_prompt_cache_hits_total") - metric(before, "textgen_prompt_cache_hits_total") == 2
    characters = "textgen_prompt_cache_characters_total"
    assert metric(after, characters) - metric(before, characters) == 600
    assert metric(after, "textgen_prompt_cache_entries") >= 3  # 256, 300 and 307 characters in
    assert metric(after, "textgen_prompt_cache_bytes") > 0


def test_prompt_cache_0_keeps_no_states(trained_run, sampler) -> None:
    for served in start_server(trained_run, sampler, ServeConfig(slots=2, max_queue=2, prompt_cache=0)):
        with httpx.Client(base_url=served.url, timeout=30) as client:
            answers = [completion(client, served, prompt="the same prompt", max_tokens=10).json() for _ in "ab"]
            assert [a["usage"]["prompt_tokens_details"]["cached_tokens"] for a in answers] == [0, 0]
            metrics = client.get("/metrics").text
            assert metric(metrics, "textgen_prompt_cache_hits_total") == 0
            assert metric(metrics, "textgen_prompt_cache_entries") == 0


def test_the_openai_client_reads_cached_tokens(served, sampler) -> None:
    """Two prompts sharing a 600-character preamble: the second starts at its last multiple of 256 (512)."""
    from openai import OpenAI

    client = OpenAI(base_url=served.url + "/v1", api_key="unused")
    preamble = ("qz a preamble that many questions share and the cache keeps " * 10)[:600]
    answers = [
        client.completions.create(model=served.model, prompt=preamble + question, max_tokens=30, seed=2)
        for question in ("what is one", "what is two")
    ]
    cached = [a.usage.prompt_tokens_details.cached_tokens for a in answers]  # type: ignore[union-attr]
    assert cached == [0, 512]
    expected = sampler.generate([preamble + "what is two"], SampleConfig(length=30, seed=2))
    assert answers[1].choices[0].text == expected[0]
