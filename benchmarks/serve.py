"""`textgen serve` under load, side by side with the offline sampler on the same weights, in one run.

``textgen serve --slots 64 --max-queue 128`` is started on a loopback port and driven by C asynchronous clients
(C = 1, 8, 64, 256) for ``--seconds`` each, arriving over its first second. Every client loops: a streamed
completion with a prompt of 10, 100 or 1,000 characters of the corpus and 50, 300 or 1,000 characters to generate,
picked at random (seeded); a 429 waits its Retry-After. The clients speak HTTP/1.1 on raw asyncio streams, so that
the client side costs little of the 2 cores the server needs, and each keeps its connection open from one request to
the next, as OpenAI's Python client does (``--connection close``: a new connection for every request).

Reported per C: the total characters per second (prompt characters read plus characters generated, as LLM serving
benchmarks count tokens: reading a character costs the model a step as generating one does) and the generated ones
alone, each with its ratio to the offline sampler (``textgen sample``'s ``Generator.generate``) at batch min(C, 64),
timed in this process just before and just after the load with the server idle (this machine's speed drifts by up to
25% over minutes, so one rate taken at the start would make the ratios noise); time to first character
(p50/p95/p99, and p95 for the 100-character prompts), the p95 gap between streamed chunks, and errors by kind.
It also reports the cores the server and the clients (this process) kept busy during each load. Last, 100 clients
open streams and leave after their first chunk: how long until every row is free.

With ``--shared-prefix N`` every prompt is one N-character stretch of the corpus, the same for all, plus 20 fresh
characters, and the loads are driven twice: against a server started with the flags given (its prompt cache on) and
against one started with ``--prompt-cache=0`` as well, one after the other in the same run.

    python benchmarks/serve.py --run wp --checkpoint-dir checkpoints --seconds 20
    python benchmarks/serve.py --run wp --checkpoint-dir checkpoints --seconds 20 --clients 64 --shared-prefix 2000
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import random
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROMPTS = (10, 100, 1000)
OUTPUTS = (50, 300, 1000)
MIX = {"prompts": PROMPTS, "outputs": OUTPUTS}  # what clients pick from (--prompts, --outputs)
# --shared-prefix N: every prompt is these N characters of the corpus plus FRESH characters picked at random
SHARED = {"prefix": ""}
FRESH = 20


@dataclass
class Load:
    """What C clients saw."""

    clients: int
    seconds: float = 0.0
    chars: int = 0
    prompt_chars: int = 0  # of the requests that got their first character: read by the model too
    completed: int = 0
    first_char: list[float] = field(default_factory=list)
    first_char_100: list[float] = field(default_factory=list)
    gaps: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)

    def error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1


@dataclass
class Connection:
    """A client's HTTP/1.1 connection to the server: kept open from one request to the next, as OpenAI's Python
    client (httpx's pool) keeps it, or opened for each request (``--connection close``)."""

    host: str
    port: int
    keep_alive: bool = True
    reader: asyncio.StreamReader | None = None
    writer: asyncio.StreamWriter | None = None

    async def post(self, body: dict[str, Any]) -> tuple[int, dict[str, str], asyncio.StreamReader]:
        """POST /v1/completions; the status, the headers and the reader of the body (unread)."""
        payload = json.dumps(body).encode()
        head = (
            f"POST /v1/completions HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\nConnection: {'keep-alive' if self.keep_alive else 'close'}\r\n\r\n"
        )
        reused = self.writer is not None
        if self.reader is None or self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        self.writer.write(head.encode() + payload)
        await self.writer.drain()
        status_line = await self.reader.readline()
        if not status_line and reused:  # the server closed the idle connection first: open another
            self.close()
            return await self.post(body)
        status = int(status_line.split()[1])
        headers = {}
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            headers[name.strip().lower()] = value.strip()
        return status, headers, self.reader

    async def skip_body(self, headers: dict[str, str]) -> None:
        """Read a whole (non-streamed) body, so the connection can take the next request."""
        assert self.reader is not None
        await self.reader.readexactly(int(headers.get("content-length", "0")))

    def done(self, whole: bool) -> None:
        """After a response: keep the connection only if its body was read to its end."""
        if not (self.keep_alive and whole):
            self.close()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


async def sse_texts(reader: asyncio.StreamReader) -> AsyncIterator[list[str]]:
    """The choice texts of a chunked server-sent-event body, a list per network chunk."""
    buffer = b""
    while True:
        size = int((await reader.readline()).strip() or b"0", 16)
        if size == 0:
            await reader.readline()  # the blank line that ends a chunked body
            return
        buffer += (await reader.readexactly(size + 2))[:-2]  # a chunk ends with CRLF; an event may span chunks
        *events, buffer = buffer.split(b"\n\n")
        texts = []
        for event in events:
            data = event.removeprefix(b"data: ")
            if data == b"[DONE]":
                continue
            texts.append(json.loads(data)["choices"][0]["text"])
        if texts:
            yield texts


async def client(connection: Connection, model: str, corpus: str, load: Load, end: float, rng: random.Random) -> None:
    # Clients arrive over the first second, as users do, not all in one instant: 64 requests at once would wait for
    # one another's prompts, and at 64 clients that burst alone is over 5% of the requests of a 20 s load.
    await asyncio.sleep(rng.random())
    while time.monotonic() < end:
        prompt_chars, out_chars = rng.choice(MIX["prompts"]), rng.choice(MIX["outputs"])
        if SHARED["prefix"]:
            start = rng.randrange(len(corpus) - FRESH)
            prompt = SHARED["prefix"] + corpus[start : start + FRESH]
            prompt_chars = len(prompt)
        else:
            start = rng.randrange(len(corpus) - prompt_chars)
            prompt = corpus[start : start + prompt_chars]
        body = {"model": model, "prompt": prompt, "max_tokens": out_chars, "stream": True}
        sent = time.monotonic()
        whole = False
        try:
            status, headers, reader = await asyncio.wait_for(connection.post(body), 30)
            if status != 200:
                load.error(str(status))
                await connection.skip_body(headers)
                whole = True
                if status == 429:
                    await asyncio.sleep(float(headers.get("retry-after", "1")))
                continue
            last = None
            async for texts in sse_texts(reader):
                now = time.monotonic()
                if now > end:
                    break
                chars = sum(len(t) for t in texts)
                load.chars += chars
                if last is None and chars:
                    load.prompt_chars += prompt_chars
                    load.first_char.append(now - sent)
                    if prompt_chars == 100:
                        load.first_char_100.append(now - sent)
                elif last is not None:
                    load.gaps.append(now - last)
                last = now
            else:
                load.completed += 1
                whole = True
        except asyncio.TimeoutError:
            load.error("hang (no answer in 30 s)")
        except (OSError, ValueError, asyncio.IncompleteReadError) as exc:
            load.error(type(exc).__name__)
        finally:
            connection.done(whole)
    connection.close()


async def drive(
    host: str, port: int, model: str, corpus: str, clients: int, seconds: float, keep_alive: bool = True
) -> Load:
    load = Load(clients)
    started = time.monotonic()
    end = started + seconds
    rngs = [random.Random(1000 * clients + i) for i in range(clients)]
    tasks = [client(Connection(host, port, keep_alive), model, corpus, load, end, rngs[i]) for i in range(clients)]
    await asyncio.wait_for(asyncio.gather(*tasks), seconds + 60)
    load.seconds = min(time.monotonic(), end) - started
    return load


async def leave_early(host: str, port: int, model: str, clients: int) -> None:
    """``clients`` streams that close after their first chunk."""

    async def one() -> None:
        body = {"model": model, "prompt": "The ", "max_tokens": 100_000, "stream": True}
        connection = Connection(host, port)
        _, _, reader = await connection.post(body)
        async for _ in sse_texts(reader):
            break
        connection.close()

    await asyncio.gather(*(one() for _ in range(clients)))


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) of process ``pid`` so far, from /proc."""
    import os

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def server_state(url: str) -> dict[str, Any]:
    import urllib.request

    with urllib.request.urlopen(url + "/ready", timeout=5) as response:
        return json.load(response)


def first_char_buckets(url: str) -> dict[str, float]:
    """The server's own count of requests by time to first character (cumulative, Prometheus buckets)."""
    import urllib.request

    with urllib.request.urlopen(url + "/metrics", timeout=5) as response:
        text = response.read().decode()
    found = re.findall(r'textgen_time_to_first_char_seconds_bucket\{le="([^"]+)"\} ([0-9.e+]+)', text)
    return {le: float(n) for le, n in found}


def percentile(values: list[float], q: int) -> float | None:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) >= 2 else None


def open_sampler(run: str, checkpoint_dir: Path) -> Any:
    from textgen.api import open_generator

    return open_generator(checkpoint_dir=checkpoint_dir, run_name=run)[0]


def offline_rate(sampler: Any, batch: int, seconds: float) -> float:
    """``textgen sample``'s characters per second at ``batch``, on the weights the server serves."""
    from common import timed

    from textgen.genconfig import SampleConfig

    settings = SampleConfig(length=2000, num=batch, seed=0)
    calls, elapsed = timed(lambda: sampler.generate(["The "] * batch, settings), seconds, warmup=1)
    return calls * batch * settings.length / elapsed


def start_server(run: str, checkpoint_dir: Path, flags: list[str]) -> tuple[subprocess.Popen, str]:
    command = [sys.executable, "-m", "textgen", "serve", "--run", run, "--checkpoint-dir", str(checkpoint_dir), *flags]
    command += ["--port", "0", "--slots", "64", "--max-queue", "128"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if found := re.search(r"on (http://127\.0\.0\.1:\d+)", line):
            # Read the rest as it comes: the server logs a line per request, and a pipe nobody reads fills and
            # stalls it (64 clients hung once 64 KB of log lines were waiting).
            threading.Thread(target=collections.deque, args=(proc.stdout, 0), daemon=True).start()
            return proc, found.group(1)
    raise SystemExit(f"textgen serve did not start (exit {proc.wait()})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", required=True, help="the run to serve (a 1 x 512 model for the targets)")
    parser.add_argument("--checkpoint-dir", type=Path, default=Path("checkpoints"))
    parser.add_argument("--corpus", type=Path, default=Path("../shared/corpora/2600-0.txt"), help="prompts' text")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 64, 256])
    parser.add_argument("--seconds", type=float, default=20.0, help="load per concurrency")
    parser.add_argument("--prompts", type=int, nargs="+", default=list(PROMPTS), help="prompt lengths to pick from")
    parser.add_argument("--outputs", type=int, nargs="+", default=list(OUTPUTS), help="output lengths to pick from")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    parser.add_argument("--serve-flags", nargs="*", default=[], help="more flags for textgen serve, e.g. --prefill=128")
    parser.add_argument(
        "--connection",
        choices=["keep-alive", "close"],
        default="keep-alive",
        help="keep each client's connection open between its requests (as OpenAI's client does), or not",
    )
    parser.add_argument(
        "--shared-prefix",
        type=int,
        default=0,
        metavar="N",
        help=f"every prompt one shared N-character prefix plus {FRESH} fresh characters; served with the prompt "
        "cache and with --prompt-cache=0",
    )
    args = parser.parse_args()

    corpus = args.corpus.read_text(encoding="utf-8-sig")[:2_000_000]
    MIX.update(prompts=tuple(args.prompts), outputs=tuple(args.outputs))
    SHARED["prefix"] = corpus[10_000 : 10_000 + args.shared_prefix]
    sampler = open_sampler(args.run, args.checkpoint_dir)
    servers = [("flags given", args.serve_flags)]
    if args.shared_prefix:
        servers.append(("--prompt-cache=0", [*args.serve_flags, "--prompt-cache=0"]))
    reports: list[dict[str, Any]] = []
    for name, flags in servers:
        results, freed, exit_code = measure(args, sampler, corpus, flags)
        reports.append({"server": name, "loads": results, "leave_early_100_freed_s": freed, "exit_code": exit_code})
    if args.json:
        print(json.dumps(reports[0] if len(reports) == 1 else {"servers": reports}))
        return
    for report in reports:
        if len(reports) > 1:
            print(f"\nServer: {report['server']}\n")
        print_report(report["loads"], report["leave_early_100_freed_s"], report["exit_code"])


def measure(
    args: argparse.Namespace, sampler: Any, corpus: str, flags: list[str]
) -> tuple[list[dict[str, Any]], float, int]:
    """Each load of ``args.clients`` against a server started with ``flags``; how long 100 clients leaving early
    took to free their rows; the server's exit code after SIGTERM."""
    offline_seconds = min(args.seconds / 4, 5.0)
    proc, url = start_server(args.run, args.checkpoint_dir, flags)
    host, port = url.removeprefix("http://").split(":")
    results = []
    try:
        asyncio.run(drive(host, int(port), args.run, corpus, 1, 2.0))  # warm the server's paths
        for clients in args.clients:
            # The offline rate just before and just after each load, with the server idle: this machine's speed
            # drifts by up to 25% over minutes, so a rate taken once at the start makes the ratios noise.
            batch = min(clients, 64)
            offline_before = offline_rate(sampler, batch, offline_seconds)
            before = first_char_buckets(url)
            cpu_before = cpu_seconds(proc.pid), time.process_time()
            load = asyncio.run(
                drive(host, int(port), args.run, corpus, clients, args.seconds, args.connection == "keep-alive")
            )
            cpu_server, cpu_clients = cpu_seconds(proc.pid) - cpu_before[0], time.process_time() - cpu_before[1]
            time.sleep(0.5)
            after = first_char_buckets(url)
            counted = after["+Inf"] - before["+Inf"]
            within = {le: (after[le] - before[le]) / counted for le in ("0.1", "0.15", "0.25")} if counted else {}
            state = server_state(url)
            offline_after = offline_rate(sampler, batch, offline_seconds)
            offline = (offline_before + offline_after) / 2
            rate = load.chars / load.seconds
            results.append(
                {
                    "clients": clients,
                    "chars_per_s": rate,
                    "with_prompts_chars_per_s": (load.chars + load.prompt_chars) / load.seconds,
                    "offline_batch": batch,
                    "offline_chars_per_s": offline,
                    "offline_before_after": [offline_before, offline_after],
                    "ratio": rate / offline,
                    "completed": load.completed,
                    "first_char_p50_ms": _ms(percentile(load.first_char, 50)),
                    "first_char_p95_ms": _ms(percentile(load.first_char, 95)),
                    "first_char_p99_ms": _ms(percentile(load.first_char, 99)),
                    "first_char_p95_prompt100_ms": _ms(percentile(load.first_char_100, 95)),
                    "gap_p95_ms": _ms(percentile(load.gaps, 95)),
                    "errors": load.errors,
                    "rows_busy_after": state["rows_busy"],
                    # Cores busy during the load: the server's, and the clients' (this process) on the same 2.
                    "server_cores": cpu_server / load.seconds,
                    "client_cores": cpu_clients / load.seconds,
                    "server_first_char_within_s": within,
                }
            )
        left = time.monotonic()
        asyncio.run(leave_early(host, int(port), args.run, 100))
        while server_state(url)["rows_busy"] and time.monotonic() - left < 30:
            time.sleep(0.01)
        freed = time.monotonic() - left
    finally:
        proc.send_signal(signal.SIGTERM)
        exit_code = proc.wait(30)
    return results, freed, exit_code


def print_report(results: list[dict[str, Any]], freed: float, exit_code: int) -> None:
    print(
        "| clients | total chars/s (prompts read + generated) | vs offline | generated chars/s | vs offline | "
        "offline chars/s before / after (batch) | completed | first char p50/p95/p99 ms | p95, 100-char prompts | "
        "gap p95 ms | errors | rows busy after | cores: server / clients |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|")
    for r in results:
        errors = ", ".join(f"{k}: {v}" for k, v in r["errors"].items()) or "none"
        before, after = r["offline_before_after"]
        print(
            f"| {r['clients']} | {r['with_prompts_chars_per_s']:,.0f} | "
            f"{r['with_prompts_chars_per_s'] / r['offline_chars_per_s']:.2f} | "
            f"{r['chars_per_s']:,.0f} | {r['ratio']:.2f} | {before:,.0f} / {after:,.0f} ({r['offline_batch']}) | "
            f"{r['completed']} | "
            f"{r['first_char_p50_ms']} / {r['first_char_p95_ms']} / {r['first_char_p99_ms']} | "
            f"{r['first_char_p95_prompt100_ms']} | {r['gap_p95_ms']} | {errors} | {r['rows_busy_after']} | "
            f"{r['server_cores']:.2f} / {r['client_cores']:.2f} |"
        )
    for r in results:
        shares = ", ".join(
            f"{float(le) * 1000:.0f} ms: {share:.0%}" for le, share in r["server_first_char_within_s"].items()
        )
        print(f"{r['clients']} clients: first character within (server's own clock) {shares}")
    print(f"100 clients leaving after their first chunk: every row free {freed:.2f} s after the last left")
    print(f"SIGTERM: exit {exit_code}")


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{1000 * seconds:.0f}"


if __name__ == "__main__":
    main()
