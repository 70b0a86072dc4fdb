"""The REPL: ``Session.handle`` line by line, and ``textgen repl`` driven through a pseudo-terminal."""

from __future__ import annotations

import io
import os
import pty
import re
import select
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import subprocess_env

from textgen.checkpoint import Run
from textgen.genconfig import SampleConfig
from textgen.generation import Piece
from textgen.repl import HELP, Session
from textgen.vocab import Vocabulary

# --- Session with a fake generator -----------------------------------------------------------


class FakeGenerator:
    """Streams fixed pieces and records how it was called; ``interrupt_at`` raises Ctrl-C before that piece."""

    def __init__(self, pieces: tuple[str, ...] = ("ab", "c "), interrupt_at: int | None = None) -> None:
        self.vocab = Vocabulary(tuple("abc \n"))
        self.pieces, self.interrupt_at = pieces, interrupt_at
        self.calls: list[tuple[list[str], SampleConfig, object]] = []

    def stream(
        self, prompts: list[str], settings: SampleConfig, state: object = None, track: object = None
    ) -> Iterator[Piece]:
        self.calls.append((list(prompts), settings, state))
        for i, piece in enumerate(self.pieces):
            if i == self.interrupt_at:
                raise KeyboardInterrupt
            yield Piece([piece], f"states after call {len(self.calls)}")


def make_session(generator: object | None = None, **settings: object) -> tuple[Session, io.StringIO, list[str]]:
    out, warnings = io.StringIO(), []
    defaults = {"length": 10, "temperature": 0.8, "top_p": 0.9, "seed": 5}
    session = Session(generator or FakeGenerator(), SampleConfig(**{**defaults, **settings}), out, warnings.append)
    return session, out, warnings


def test_a_prompt_streams_its_continuation() -> None:
    session, out, warnings = make_session()
    assert session.handle("ab") is True
    assert out.getvalue() == "abc \n"
    assert warnings == []
    prompts, settings, states = session.generator.calls[0]
    assert prompts == ["ab"] and states is None and settings.top_p == 0.9


def test_context_is_carried_on_then_reset_by_context_off() -> None:
    session, out, _ = make_session()
    generator = session.generator
    session.handle("a")
    session.handle("b")
    assert generator.calls[1][2] == "states after call 1"  # the second prompt continues the first
    assert session.state == "states after call 2"
    assert session.handle(":context off") is True
    assert session.state is None and not session.carry_context
    assert "context off" in out.getvalue()
    session.handle("c")
    session.handle("a")
    assert generator.calls[2][2] is None and generator.calls[3][2] is None
    session.handle(":context on")
    session.handle("b")
    assert generator.calls[4][2] is None  # a fresh start after switching back on
    session.handle("c")
    assert generator.calls[5][2] == "states after call 5"


def test_set_commands_echo_the_settings() -> None:
    session, out, warnings = make_session()
    for line in (":temp 0.5", ":len 20", ":topk 3", ":topp 0.7", ":num 2", ":seed 11"):
        assert session.handle(line) is True
    assert warnings == []
    s = session.settings
    assert (s.temperature, s.length, s.top_k, s.top_p, s.num, s.seed) == (0.5, 20, 3, 0.7, 2, 11)
    assert out.getvalue().splitlines()[0].startswith("temp 0.5  len 10")
    assert (
        out.getvalue().splitlines()[-1]
        == "temp 0.5  len 20  topk 3  topp 0.7  freq 0.0  presence 0.0  bias none  seed 11  num 2  context on"
    )


def test_seed_none_means_a_random_seed() -> None:
    session, out, _ = make_session(seed=5)
    session.handle(":seed none")
    assert session.settings.seed is None
    assert "seed random" in out.getvalue()
    session.handle("ab")
    assert session.generator.calls[0][1].seed is None  # the generator picks a fresh one


@pytest.mark.parametrize(
    ("line", "warning"),
    [
        (":topp 2", ":topp must be in (0, 1] (got 2.0)"),
        (":topp 0", ":topp must be in (0, 1] (got 0.0)"),
        (":temp -1", ":temp must be 0 (greedy) or between 0.001 and 1000 (got -1.0)"),
        (":temp hot", ":temp needs a number (got 'hot')"),
        (":len 0", ":len must be a positive integer up to 2,147,483,647 (got 0)"),
        (":num 1.5", ":num needs a number (got '1.5')"),
        (":topk -2", ":topk must be 0 (off) or a positive integer (got -2)"),
        (":seed -1", ":seed must be an integer in [0, 2**31) (got -1)"),
    ],
)
def test_a_bad_value_warns_and_keeps_the_old_one(line: str, warning: str) -> None:
    session, out, warnings = make_session()
    before = session.settings
    assert session.handle(line) is True
    assert warnings == [warning]
    assert session.settings == before
    assert out.getvalue() == ""


@pytest.mark.parametrize("line", [":bogus", ":temp", ":temp 1 2", ":context maybe"])
def test_unknown_commands_warn_and_go_on(line: str) -> None:
    session, _, warnings = make_session()
    assert session.handle(line) is True
    assert len(warnings) == 1 and warnings[0].startswith("unknown command :") and ":help" in warnings[0]
    assert session.generator.calls == []


@pytest.mark.parametrize("line", [":quit", ":q", ":exit"])
def test_quit(line: str) -> None:
    session, _, _ = make_session()
    assert session.handle(line) is False
    assert session.generator.calls == []


@pytest.mark.parametrize("line", [":help", ":", ":?"])
def test_help(line: str) -> None:
    session, out, _ = make_session()
    assert session.handle(line) is True
    assert out.getvalue().strip() == HELP


def test_settings_command() -> None:
    session, out, _ = make_session()
    session.handle(":settings")
    assert (
        out.getvalue()
        == "temp 0.8  len 10  topk 0  topp 0.9  freq 0.0  presence 0.0  bias none  seed 5  num 1  context on\n"
    )


def test_ctrl_c_stops_the_answer_and_keeps_the_session() -> None:
    generator = FakeGenerator(pieces=("ab", "c ", "never"), interrupt_at=3)
    session, out, warnings = make_session(generator)
    session.handle("a")  # context on: the first answer finishes
    assert session.state == "states after call 1"
    generator.interrupt_at = 2  # Ctrl-C during the second answer, before its third piece
    assert session.handle("b") is True
    assert out.getvalue() == "abc never\n" + "abc \n"  # the pieces before Ctrl-C, then a newline
    assert warnings == ["stopped"]
    assert session.state == "states after call 1"  # an interrupted answer does not become context


def test_each_turn_and_each_sample_gets_its_own_seed() -> None:
    """Turn t's sample i draws at seed S + t x 4,096 + i: never a seed of another turn (--num is at most 4,096)."""
    session, out, _ = make_session(seed=5, num=2)
    session.handle("a")
    session.handle("b")
    assert [call[1].seed for call in session.generator.calls] == [5, 6, 5 + 4096, 6 + 4096]
    text = out.getvalue()
    assert text.count("--- sample 1/2 ---") == 2 and text.count("--- sample 2/2 ---") == 2
    session.handle(":seed 5")  # the next turn draws what seed 5 drew first
    session.handle("c")
    assert [call[1].seed for call in session.generator.calls[-2:]] == [5, 6]


def test_the_largest_seed_wraps_around_instead_of_crashing() -> None:
    session, _, warnings = make_session(seed=2**31 - 1, num=2)
    assert session.handle("a") is True
    assert warnings == []
    assert [call[1].seed for call in session.generator.calls] == [2**31 - 1, 0]


def test_unknown_prompt_characters_are_named() -> None:
    session, out, warnings = make_session()
    session.handle("aXbé")
    assert out.getvalue() == "abc \n"
    assert warnings == ["skipping characters the model has never seen: 'X' 'é'"]
    assert session.generator.calls[0][0] == ["aXbé"]  # the generator skips them itself


# --- Session with the tiny trained generator ---------------------------------------------------


@pytest.fixture(scope="module")
def run_copy(trained_run, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """A private copy of the session's tiny run, alone in its checkpoint directory."""
    return trained_run.copy_to(tmp_path_factory.mktemp("repl") / "checkpoints", "tiny")


@pytest.fixture(scope="module")
def generator(run_copy: Run):
    from textgen.sampling import Generator

    return Generator.from_run(run_copy)


def test_context_on_continues_the_conversation(generator) -> None:
    session, out, warnings = make_session(generator, length=30, temperature=0.0)
    session.handle("the ")
    first = out.getvalue()[:-1]
    session.handle("a ")
    second = out.getvalue()[len(first) + 1 : -1]
    assert len(first) == len(second) == 30
    greedy = SampleConfig(length=30, temperature=0.0, seed=0)
    # Greedy, the second answer is what the model says after the whole conversation so far.
    assert generator.generate(["the " + first + "a "], greedy) == [second]
    assert warnings == []


def test_an_empty_line_with_context_on_continues_the_text(generator) -> None:
    """Enter on an empty line (or only unknown characters) reads nothing on top of the conversation, rather than a
    newline nobody typed: greedy, the answer goes on exactly where the last one stopped."""
    session, out, _ = make_session(generator, length=30, temperature=0.0)
    session.handle("the ")
    first = out.getvalue()[:-1]
    session.handle("")
    second = out.getvalue()[len(first) + 1 : -1]
    greedy = SampleConfig(length=60, temperature=0.0, seed=0)
    assert first + second == generator.generate(["the "], greedy)[0]


def test_context_off_starts_each_prompt_fresh(generator) -> None:
    session, out, _ = make_session(generator, length=30, temperature=0.0)
    session.handle(":context off")
    session.handle("the ")
    session.handle("a ")
    greedy = SampleConfig(length=30, temperature=0.0, seed=0)
    expected = generator.generate(["the "], greedy)[0] + "\n" + generator.generate(["a "], greedy)[0] + "\n"
    assert out.getvalue() == session.describe() + "\n" + expected
    assert session.describe().endswith("context off")


# --- textgen repl in a pseudo-terminal ----------------------------------------------------------

ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[()][0-9A-Za-z]|\x1b[=>]|\r")
READ_TIMEOUT = 60.0


class Terminal:
    """A child process on a pseudo-terminal, read with select and timeouts (never blocks forever)."""

    def __init__(self, argv: list[str], cwd: Path, env: dict[str, str]) -> None:
        pid, fd = pty.fork()
        if pid == 0:  # the child: become the program
            try:
                os.chdir(cwd)
                os.execve(argv[0], argv, env)
            finally:
                os._exit(127)
        self.pid, self.fd = pid, fd
        self.raw = b""
        self.pos = 0  # in the cleaned text: everything before it was matched already
        self.closed = False

    @property
    def text(self) -> str:
        return ANSI.sub("", self.raw.decode("utf-8", errors="replace"))

    def send(self, data: bytes | str) -> None:
        os.write(self.fd, data.encode() if isinstance(data, str) else data)

    def wait_until_reading(self, timeout: float = READ_TIMEOUT) -> None:
        """Until the REPL sleeps, blocked reading the terminal. A Ctrl-C that lands between its prompt and that read
        is lost until the next key (CPython's readline checks for signals only when its select() is interrupted):
        one CI run with two test processes sent it in that window. No person at a terminal is that quick."""
        deadline = time.monotonic() + timeout
        while Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "S":
            if time.monotonic() > deadline:
                raise AssertionError(f"the REPL did not wait for input within {timeout:.0f}s")
            time.sleep(0.01)

    def _read(self, timeout: float) -> None:
        if self.closed:
            raise EOFError
        ready, _, _ = select.select([self.fd], [], [], max(timeout, 0))
        if not ready:
            return
        try:
            data = os.read(self.fd, 1 << 16)
        except OSError:  # EIO once the child has closed the terminal
            data = b""
        if not data:
            self.closed = True
            raise EOFError
        self.raw += data

    def _wait(self, found, what: str, timeout: float):
        deadline = time.monotonic() + timeout
        while True:
            result = found()
            if result is not None:
                return result
            left = deadline - time.monotonic()
            tail = self.text[self.pos :][-1500:]
            if left <= 0:
                raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last output: {tail!r}")
            try:
                self._read(min(left, 1.0))
            except EOFError:
                raise AssertionError(f"the REPL exited while waiting for {what}; last output: {tail!r}") from None

    def expect(self, pattern: str, timeout: float = READ_TIMEOUT) -> str:
        """Wait for ``pattern`` (a regex) after the last match; return the text up to and including it."""
        regex = re.compile(pattern)

        def found() -> str | None:
            text = self.text
            match = regex.search(text, self.pos)
            if not match:
                return None
            before, self.pos = text[self.pos : match.end()], match.end()
            return before

        return self._wait(found, repr(pattern), timeout)

    def expect_chars(self, n: int, timeout: float = READ_TIMEOUT) -> str:
        """Wait until ``n`` more characters have arrived."""
        return self._wait(
            lambda: self.text[self.pos :] if len(self.text) - self.pos >= n else None, f"{n} chars", timeout
        )

    def exit_code(self, timeout: float = READ_TIMEOUT) -> int:
        """Drain the output until the child exits; its exit code."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.pid = 0
                return os.waitstatus_to_exitcode(status)
            try:
                self._read(0.2)
            except EOFError:
                time.sleep(0.05)
        raise AssertionError(f"the REPL did not exit within {timeout:.0f}s; last output: {self.text[-1500:]!r}")

    def close(self) -> None:
        if self.pid:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
            self.pid = 0
        os.close(self.fd)


@pytest.fixture
def repl(run_copy: Run, tmp_path: Path) -> Iterator[Terminal]:
    # A length that takes far longer than the test: only Ctrl-C can end the first answer early.
    argv = [sys.executable, "-m", "textgen", "repl", "--checkpoint-dir", str(run_copy.path.parent)]
    terminal = Terminal([*argv, "--length", "2000000"], tmp_path, subprocess_env(TERM="dumb"))
    try:
        yield terminal
    finally:
        terminal.close()


def test_repl_in_a_terminal(repl: Terminal, generator) -> None:
    banner = repl.expect(r"> ")
    assert "tiny loaded" in banner and ":help" in banner
    assert "Traceback" not in banner

    repl.send(":temp 0.5\r")
    echoed = repl.expect(
        r"temp 0\.5  len 2000000  topk 0  topp 1\.0  freq 0\.0  presence 0\.0  bias none  seed random  num 1  context on\n"
    )
    assert "Traceback" not in echoed
    repl.expect(r"> ")

    repl.send("the \r")
    repl.expect(r"the \n")
    streamed = repl.expect_chars(300)  # text arrives while the answer is still being generated
    assert not generator.vocab.unknown_chars(streamed.replace("\n", ""))
    repl.send(b"\x03")
    answer = repl.expect(r"stopped\n")
    assert 300 <= len(answer) < 2_000_000
    repl.expect(r"> ")
    repl.send(":settings\r")
    after = repl.expect(r"context on\n")  # nothing from the stopped answer comes in between
    assert (
        after
        == ":settings\ntemp 0.5  len 2000000  topk 0  topp 1.0  freq 0.0  presence 0.0  bias none  seed random  num 1  context on\n"
    )
    repl.expect(r"> ")

    repl.wait_until_reading()
    repl.send(b"\x03")  # Ctrl-C at the prompt: a fresh prompt, the REPL goes on
    repl.expect(r"> ")

    repl.send(":num 2\r")
    repl.expect(r"num 2  context on\n")
    repl.expect(r"> ")
    repl.send(":len 20\r")
    repl.expect(r"len 20 ")
    repl.expect(r"> ")
    repl.send("the \r")
    repl.expect(r"--- sample 1/2 ---\n")
    samples = repl.expect(r"--- sample 2/2 ---\n")
    assert len(samples) >= 20
    repl.expect(r"\n> ")

    repl.send(":bogus\r")
    repl.expect(r"unknown command :bogus; type :help\n")
    repl.expect(r"> ")
    repl.send(":len 5\r")  # still running and listening
    repl.expect(r"len 5 ")
    repl.expect(r"> ")

    repl.send(b"\x04")  # Ctrl-D
    assert repl.exit_code() == 0
    assert "Traceback" not in repl.text


# --- NO_COLOR in a terminal -------------------------------------------------------------------------

SGR = re.compile(r"\x1b\[([0-9;]*)m")


def colour_escapes(raw: bytes) -> set[str]:
    """The SGR escapes in ``raw`` that set a colour (a foreground, background or extended one): not bold, dim or a
    reset, which NO_COLOR leaves alone."""
    colours = {*range(30, 38), *range(40, 48), *range(90, 98), *range(100, 108), 38, 48}
    return {
        params
        for params in SGR.findall(raw.decode("utf-8", errors="replace"))
        if colours & {int(code) for code in params.split(";") if code}
    }


@pytest.mark.parametrize(
    ("args", "last"),
    [
        (["train", "--help"], r"Show this message and exit"),
        (["evaluate", "--checkpoint-dir", "nowhere"], r"error: .*\n"),
    ],
    ids=["help on stdout", "error on stderr"],
)
def test_no_color_takes_the_colours_out_of_a_terminal(tmp_path: Path, args: list[str], last: str) -> None:
    """On a terminal, help and an error are in colour; with NO_COLOR set (https://no-color.org), in none."""
    env = {k: v for k, v in subprocess_env(TERM="xterm-256color").items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    seen = {}
    for no_color in ({}, {"NO_COLOR": "1"}):
        terminal = Terminal([sys.executable, "-m", "textgen", *args], tmp_path, {**env, **no_color})
        try:
            terminal.expect(last)
            assert terminal.exit_code() == (0 if args[-1] == "--help" else 1)
        finally:
            terminal.close()
        seen["NO_COLOR" in no_color] = colour_escapes(terminal.raw)
    assert seen[False], "no colour on a terminal without NO_COLOR: this test would prove nothing"
    assert seen[True] == set()
