"""`textgen serve` as a user runs it: a real process on a loopback port, the page in a real browser (headless
Chromium driven by Playwright), SIGTERM draining running streams, a port in use."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from helpers import assert_one_line_error, invoke, subprocess_env, wait_until


@dataclass
class ServerProcess:
    proc: subprocess.Popen
    url: str
    output: Path


def start(trained_run, tmp_path: Path, *flags: str) -> ServerProcess:
    output = tmp_path / "serve.out"
    with output.open("w") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "textgen",
                "serve",
                "--port",
                "0",
                "--checkpoint-dir",
                str(trained_run.checkpoint_dir),
                *flags,
            ],
            env=subprocess_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 120
    while not (found := re.search(r"on (http://127\.0\.0\.1:\d+)", output.read_text())):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"textgen serve did not start:\n{output.read_text()}")
        time.sleep(0.1)
    return ServerProcess(proc, found.group(1), output)


@pytest.fixture
def server(trained_run, tmp_path) -> Iterator[ServerProcess]:
    served = start(trained_run, tmp_path, "--drain", "1")
    yield served
    if served.proc.poll() is None:
        served.proc.kill()
        served.proc.wait()


def rows_busy(url: str) -> int:
    return httpx.get(url + "/ready", timeout=5).json()["rows_busy"]


def test_sigterm_drains_running_streams_and_exits_0(server) -> None:
    body = {"model": "tiny", "prompt": "x", "max_tokens": 10**6, "stream": True}
    with httpx.Client(timeout=30) as client, client.stream("POST", server.url + "/v1/completions", json=body) as r:
        lines = r.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        assert json.loads(first[6:])["choices"][0]["text"]
        server.proc.send_signal(signal.SIGTERM)
        sent_at = time.monotonic()
        rest = [line[6:] for line in lines if line.startswith("data: ")]
    assert time.monotonic() - sent_at < 10, "the stream did not end soon after --drain's 3 s"
    assert rest[-1] == "[DONE]"
    assert json.loads(rest[-2])["choices"][0]["finish_reason"] == "shutdown"
    assert server.proc.wait(15) == 0, server.output.read_text()
    assert "Traceback" not in server.output.read_text()


def test_the_page_streams_text_and_stop_frees_the_row(server) -> None:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        pytest.fail(f"the browser test needs Playwright ({exc}); install the dev extra")
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.fail("the browser test needs Chromium: apt-get install chromium (.ci/run installs it)")
    with sync_playwright() as playwright:
        try:
            browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        except Exception as exc:
            pytest.fail(f"Chromium ({chromium}) did not start: {exc}")
        page = browser.new_page()
        page.goto(server.url + "/")
        page.wait_for_function("document.querySelector('#model-info').textContent.includes('tiny')")
        page.fill("#prompt", "the fox ")
        page.fill("#length", "100000")
        page.click("#generate")
        page.wait_for_function("document.querySelector('#output').textContent.length > 50")
        first = len(page.text_content("#output") or "")
        page.wait_for_function(f"document.querySelector('#output').textContent.length > {first}")  # still arriving
        assert rows_busy(server.url) == 1
        page.click("#stop")
        wait_until(lambda: not rows_busy(server.url), "the row was not freed after Stop")
        assert "stopped" in (page.text_content("#status") or "")
        page.click("#tab-runs")
        page.wait_for_selector("#run-list img")
        browser.close()


def test_a_port_in_use_is_one_line(trained_run, tmp_path) -> None:
    from textgen.server import listen

    with listen("127.0.0.1", 0) as taken:
        port = taken.getsockname()[1]
        result = invoke("serve", "--port", str(port), "--checkpoint-dir", str(trained_run.checkpoint_dir))
    assert_one_line_error(result, f"127.0.0.1:{port} is in use", "--port")
