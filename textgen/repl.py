"""The interactive loop of ``textgen repl``: prompts in, continuations streamed out."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol, TextIO

from textgen.config import MAX_SAMPLES, flag
from textgen.errors import ConfigError
from textgen.genconfig import SampleConfig, bias_form, parse_logit_bias
from textgen.generation import bias_row
from textgen.tracking import Track, untracked
from textgen.vocab import Vocabulary, for_display

if TYPE_CHECKING:
    from textgen.generation import GenerationState, Piece

HELP = """\
Type a prompt and press Enter; the continuation streams in. Ctrl-C stops it, Ctrl-D exits.
Commands:
  :temp T       temperature (0 = greedy)        :len N     characters per answer
  :topk K       keep the K likeliest (0 = off)  :topp P    nucleus mass in (0, 1] (1 = off)
  :freq F       frequency penalty (0 = off)     :presence P  presence penalty (0 = off)
  :bias C=V     add V to C's logit (-100 bans C; C may be space, \\n, \\t or \\uXXXX)
  :bias clear   remove every bias
  :seed S       fixed seed (or 'none')          :num N     samples per prompt
  :context on|off   on (the default): go on from the last answer; off: each prompt alone
  :settings     show the settings               :help      this text      :quit  exit"""

GREETING = f"{HELP.splitlines()[0]} Type :help for commands."

_SETTINGS = {
    "temp": "temperature",
    "len": "length",
    "topk": "top_k",
    "topp": "top_p",
    "freq": "frequency_penalty",
    "presence": "presence_penalty",
    "seed": "seed",
    "num": "num",
}


class TextGenerator(Protocol):
    """What the REPL needs of a ``textgen.generation.Sampler`` (a run's, or an export's)."""

    @property
    def vocab(self) -> Vocabulary: ...

    def stream(
        self, prompts: Sequence[str], settings: SampleConfig, *, state: GenerationState | None = None, track: Track
    ) -> Iterator[Piece]: ...


class Session:
    """Settings and conversation state for one REPL; ``handle`` takes one input line."""

    def __init__(
        self,
        generator: TextGenerator,
        settings: SampleConfig,
        out: TextIO,
        warn: Callable[[str], None],
        tracker: Callable[[], AbstractContextManager[Track]] = lambda: contextlib.nullcontext(untracked),
    ) -> None:
        self.generator, self.settings, self.out, self.warn = generator, settings, out, warn
        self.tracker = tracker  # a Track for each answer, that hears its prompt read (a long paste, --prime-file)
        self.carry_context = True
        self.state: GenerationState | None = None  # after the last answer, when carrying the context on
        self.turn = 0

    def run(self, prompt: str) -> None:
        """Read and handle lines until :quit or the end of input."""
        for line in read_lines(prompt):
            if not self.handle(line):
                return

    def handle(self, line: str) -> bool:
        """Run one line (a command or a prompt); return False to quit."""
        if line.startswith(":"):
            return self.command(line[1:].split())
        self.generate(line)
        return True

    def command(self, words: list[str]) -> bool:
        if not words or words[0] in ("help", "h", "?"):
            print(HELP, file=self.out)
        elif words[0] in ("quit", "q", "exit"):
            return False
        elif words[0] == "settings":
            print(self.describe(), file=self.out)
        elif words[0] == "context" and len(words) == 2 and words[1] in ("on", "off"):
            self.carry_context = words[1] == "on"
            self.state = None
            print(self.describe(), file=self.out)  # as every setting: the whole line
        elif words[0] in _SETTINGS and len(words) == 2:
            self.set(words[0], words[1])
        elif words[0] == "bias" and len(words) == 2:
            self.set_bias(words[1])
        else:
            self.warn(f"unknown command :{' '.join(words)}; type :help")
        return True

    def set(self, command: str, text: str) -> None:
        """``:command text``, e.g. ``:temp 0.7``; a bad value is named by its command, as the REPL's help does."""
        field = _SETTINGS[command]
        try:
            value: Any
            if field == "seed" and text.lower() == "none":
                value = None
            elif field in ("temperature", "top_p", "frequency_penalty", "presence_penalty"):
                value = float(text)
            else:
                value = int(text)
            self.settings = dataclasses.replace(self.settings, **{field: value})
            if field == "seed":  # :seed S: the next turn draws what S drew first
                self.turn = 0
        except ValueError:
            self.warn(f":{command} needs a number (got {text!r})")
            return
        except ConfigError as exc:
            self.warn(str(exc).replace(flag(field), f":{command}", 1))
            return
        print(self.describe(), file=self.out)

    def set_bias(self, text: str) -> None:
        """``:bias C=V`` adds (or replaces) one character's bias, ``:bias clear`` removes them all."""
        try:
            pairs = () if text == "clear" else (*self.settings.logit_bias, *parse_logit_bias([text], ":bias"))
            settings = dataclasses.replace(self.settings, logit_bias=tuple(dict(pairs).items()))
            bias_row(settings.logit_bias, self.generator.vocab)
        except ConfigError as exc:
            self.warn(str(exc).replace(flag("logit_bias"), ":bias", 1))
            return
        self.settings = settings
        print(self.describe(), file=self.out)

    def describe(self) -> str:
        s = self.settings
        bias = " ".join(f"{bias_form(char)}={value:g}" for char, value in s.logit_bias) or "none"
        return (
            f"temp {s.temperature}  len {s.length}  topk {s.top_k}  topp {s.top_p}  "
            f"freq {s.frequency_penalty}  presence {s.presence_penalty}  bias {bias}  "
            f"seed {s.seed if s.seed is not None else 'random'}  num {s.num}  "
            f"context {'on' if self.carry_context else 'off'}"
        )

    def generate(self, prompt: str) -> None:
        """Stream the continuation of ``prompt``; Ctrl-C stops it and keeps the REPL going."""
        note = self.generator.vocab.unknown_note(prompt)
        if note:
            self.warn(note)
        settings = self.settings
        if settings.seed is not None:  # a fixed seed still gives each turn, and each sample of a turn, its own text
            settings = dataclasses.replace(settings, seed=(settings.seed + self.turn * MAX_SAMPLES) % 2**31)
        self.turn += 1
        start = self.state if self.carry_context else None
        after = start
        num = settings.num
        try:
            with self.tracker() as track:  # the bar, if any, is down before a Ctrl-C's message
                for i in range(num):
                    if num > 1:
                        print(f"--- sample {i + 1}/{num} ---", file=self.out)
                    for piece in self.generator.stream([prompt], settings, state=start, track=track):
                        self.out.write(for_display(piece.texts[0]))
                        self.out.flush()
                        after = piece.state
                    self.out.write("\n")
                    next_seed = None if settings.seed is None else (settings.seed + 1) % 2**31
                    settings = dataclasses.replace(settings, seed=next_seed)
        except KeyboardInterrupt:
            self.out.write("\n")
            self.warn("stopped")
            return
        finally:
            self.out.flush()
        if self.carry_context:
            self.state = after


def read_lines(prompt: str) -> Iterator[str]:
    """Lines typed at ``prompt`` until Ctrl-D; Ctrl-C at the prompt gives a fresh prompt."""
    with contextlib.suppress(ImportError):  # not on every platform
        import readline  # noqa: F401 - line editing and history for input()
    if isinstance(sys.stdin, io.TextIOWrapper):  # bytes the locale cannot decode become U+FFFD, an unknown character
        sys.stdin.reconfigure(errors="replace")
    while True:
        try:
            yield input(prompt)
        except EOFError:
            print()
            return
        except KeyboardInterrupt:
            print()
