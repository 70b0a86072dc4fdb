"""Frozen configs of generating text from a trained model: how ``sample``, ``repl`` and the server's requests draw
(``SampleConfig``, with ``--logit-bias``'s forms), and how ``textgen serve`` listens and bounds what one request may
ask (``ServeConfig`` and the ``MAX_*`` limits). Field names match CLI flags and JSON keys, as in ``textgen.config``.
"""

from __future__ import annotations

import dataclasses
import re
import secrets
from typing import Any

from textgen.config import (
    INT32_MAX,
    MAX_SAMPLES,
    is_finite,
    physical_memory,
    require,
    require_positive_ints,
)
from textgen.errors import ConfigError, shown


@dataclasses.dataclass(frozen=True)
class SampleConfig:
    """How text is generated from a trained model."""

    length: int = 500
    num: int = 1
    temperature: float = 0.8  # 0 means greedy (argmax)
    top_k: int = 0  # 0 means no top-k filter
    top_p: float = 1.0  # 1 means no nucleus filter
    seed: int | None = None  # None picks a fresh seed (reported with --json)
    # OpenAI's, over the characters generated so far (not the prompt), each sample its own: a character's logit
    # loses count x frequency_penalty, and presence_penalty once it has appeared; logit_bias adds to one's logit.
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: tuple[tuple[str, float], ...] = ()  # (character, bias) pairs; a bias of -100 bans the character

    def __post_init__(self) -> None:
        require_positive_ints(self, "length", "num")
        # Each sample is a row of the sampler's batch, with its own LSTM states and logits.
        require(self.num <= MAX_SAMPLES, "num", f"at most {MAX_SAMPLES:,} (one batch row each)", self.num)
        total, most = self.length * self.num, max_generated_chars()
        require(total <= most, "length", f"such that --length x --num is at most {most:,} characters here", total)
        temperature_ok = is_finite(self.temperature) and (self.temperature == 0 or 1e-3 <= self.temperature <= 1e3)
        require(temperature_ok, "temperature", "0 (greedy) or between 0.001 and 1000", self.temperature)
        ok = isinstance(self.top_k, int) and 0 <= self.top_k <= INT32_MAX
        require(ok, "top_k", "0 (off) or a positive integer", self.top_k)
        require(is_finite(self.top_p) and 0 < self.top_p <= 1, "top_p", "in (0, 1]", self.top_p)
        seed_ok = self.seed is None or 0 <= self.seed < 2**31
        require(seed_ok, "seed", "an integer in [0, 2**31)", self.seed)
        for name in ("frequency_penalty", "presence_penalty"):
            value = getattr(self, name)
            require(is_finite(value) and -2 <= value <= 2, name, "a number from -2 to 2 (0 = off)", value)
        for char, bias in self.logit_bias:
            require(len(char) == 1, "logit_bias", "keyed by single characters", char)
            require(
                is_finite(bias) and -100 <= bias <= 100, "logit_bias", f"from -100 (a ban) to 100 for {char!r}", bias
            )

    @property
    def penalized(self) -> bool:
        """Whether a penalty or a bias changes the logits (else the sampler runs its plain loop)."""
        return bool(self.frequency_penalty or self.presence_penalty or self.logit_bias)

    def seeded(self) -> SampleConfig:
        """This config with a fresh random seed if it has none, so the output can be reproduced."""
        return self if self.seed is not None else dataclasses.replace(self, seed=secrets.randbelow(2**31))


BIAS_FORMS = {"space": " ", "\\n": "\n", "\\t": "\t", "\\r": "\r", "\\\\": "\\"}


def bias_form(char: str) -> str:
    """A character as ``parse_logit_bias`` takes it back (``space``, ``\\n``, ...)."""
    shown = {char: form for form, char in BIAS_FORMS.items()}
    return shown.get(char, char if char.isprintable() else f"\\u{ord(char):04x}")


def parse_logit_bias(specs: list[str], name: str = "--logit-bias") -> tuple[tuple[str, float], ...]:
    """``C=V`` strings as (character, bias) pairs: C is one character, ``space``, ``\\n``, ``\\t``, ``\\r``, ``\\\\`` or
    ``\\uXXXX`` (split at the last ``=``, so ``==-100`` is ``=``'s). A later pair for a character replaces an earlier."""
    pairs: dict[str, float] = {}
    for spec in specs:
        key, sep, value = spec.rpartition("=")
        if not sep or not key:
            raise ConfigError(f"{name} takes CHAR=BIAS, e.g. e=-100 or space=2 (got {shown(spec)})")
        char = chr(int(key[2:], 16)) if re.fullmatch(r"\\u[0-9a-fA-F]{4}", key) else BIAS_FORMS.get(key, key)
        if len(char) != 1:
            raise ConfigError(
                f"{name} takes one character before '=', or space, \\n, \\t, \\r, \\\\ or \\uXXXX (got {shown(key)})"
            )
        try:
            pairs[char] = float(value)
        except ValueError:
            raise ConfigError(f"{name} needs a number after '=' (got {shown(spec)})") from None
    return tuple(pairs.items())


# What one request to `textgen serve` may ask for: each bounds work on the threads every request shares (the event
# loop, the engine's lanes and emitter), so that no request's fields can slow the others' streams.
MAX_REQUEST_CHARS = 1_000_000  # characters one continuation may ask for (max_tokens: streamed, they cost as they go)
MAX_WHOLE_CHARS = 1_000_000  # characters of a non-streamed answer over all its continuations: built and encoded at once
MAX_PROMPT_CHARS = 1_000_000  # characters of a request's prompts together, whatever --max-body allows
MAX_PROMPTS = 64  # prompts in one request (each takes n rows)
MAX_STOPS = 4  # stop sequences of one request, as OpenAI's API allows
MAX_LOGIT_BIAS = 1024  # characters one request's logit_bias may name (OpenAI's allows 300 tokens)
MAX_STOP_CHARS = 256  # characters of one stop sequence: each row holds back, and checks, up to this many
# Log-probabilities one request may ask for: characters scored (echoed prompts x n, and the continuations) x (1 +
# logprobs), each an entry of the answer's JSON, which the event loop encodes: 20,000 characters with 20
# alternatives each took ~1 s to encode, 100,000 entries take ~0.25 s.
MAX_LOGPROB_ENTRIES = 100_000
LOG_FORMATS = ("text", "json")  # textgen serve --log-format: a line per request, for people or for machines


@dataclasses.dataclass(frozen=True)
class ServeConfig:
    """How ``textgen serve`` listens, shares its rows and bounds its requests."""

    host: str = "127.0.0.1"
    port: int = 8000  # 0 lets the system choose a free port
    slots: int = 64  # rows of LSTM state: continuations generated at once
    max_queue: int = 256  # requests that may wait for rows; beyond them the answer is 429
    api_key: str | None = None  # when set, every route but the page's and the probes' needs "Authorization: Bearer"
    max_body: int = 2**20  # bytes of a request body
    request_timeout: float = 600.0  # seconds a request may run, queued or generating
    drain_seconds: float = 3.0  # on SIGTERM or Ctrl-C, how long running streams may go on before they are ended
    prefill: int = 128  # prompts up to this many characters may be read on arrival, first characters drawn, apart
    log_format: str = "text"  # one of LOG_FORMATS
    prompt_cache: int = 4096  # prompt states kept (textgen.promptcache; 0: none)

    def __post_init__(self) -> None:
        require(isinstance(self.port, int) and 0 <= self.port <= 65535, "port", "in 0..65535", self.port)
        require_positive_ints(self, "slots", "max_body")
        require(self.slots <= MAX_SAMPLES, "slots", f"at most {MAX_SAMPLES:,}", self.slots)
        for name in ("max_queue", "prefill", "prompt_cache"):
            value = getattr(self, name)
            require(isinstance(value, int) and value >= 0, name, "0 or more", value)
        require(self.api_key is None or bool(self.api_key.strip()), "api_key", "a non-empty key", "")
        require(self.log_format in LOG_FORMATS, "log_format", " or ".join(LOG_FORMATS), self.log_format)
        for name in ("request_timeout", "drain_seconds"):
            value = getattr(self, name)
            require(is_finite(value) and value > 0, name, "a positive number of seconds", value)

    def limits(self) -> dict[str, Any]:
        """What the server holds and what one request may ask, as its start-up lines say them."""
        return {
            "rows": self.slots,
            "max_queue": self.max_queue,
            "max_body_bytes": self.max_body,
            "request_timeout_s": self.request_timeout,
            "drain_s": self.drain_seconds,
            "auth": self.api_key is not None,
            "max_tokens": MAX_REQUEST_CHARS,
            "max_whole_chars": MAX_WHOLE_CHARS,
            "max_prompt_chars": MAX_PROMPT_CHARS,
            "max_stops": MAX_STOPS,
            "max_stop_chars": MAX_STOP_CHARS,
            "max_logprob_entries": MAX_LOGPROB_ENTRIES,
            "prompt_cache_entries": self.prompt_cache,
        }


def max_generated_chars() -> int:
    """How many characters one sample or REPL call may generate in total: about 32 bytes each (ids,
    decoded pieces, the joined text) within an eighth of this machine's memory."""
    return min(INT32_MAX, physical_memory() // 8 // 32)
