"""Characters' log-probabilities for the completions API's ``logprobs`` and ``echo``, in OpenAI's format; no TensorFlow
here.

A ``CharScorer`` reads one continuation's characters as they come (the echoed prompt, then each event's text),
carrying the LSTM state from one piece to the next, and says of each character its log-probability under the model
(the raw distribution: temperature, top-k and top-p leave it alone, as vLLM's logprobs by default) and the K likeliest
characters in its place. A piece costs a batch-1 read of its characters and, per character, a log-softmax and a
partial sort over the vocabulary: linear in the characters scored, whatever K (at most ``MAX_LOGPROBS``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from textgen.generation import GenerationState, Sampler, log_softmax
from textgen.vocab import UNKNOWN_ID

MAX_LOGPROBS = 20  # alternatives per character, as OpenAI's completions API allows
CHUNK = 2048  # characters read and scored at once: bounds the (chunk, V) arrays of a long text


@dataclass
class Logprobs:
    """OpenAI's completions ``logprobs`` object, built up piece by piece."""

    tokens: list[str] = field(default_factory=list)
    token_logprobs: list[float | None] = field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = field(default_factory=list)
    text_offset: list[int] = field(default_factory=list)

    def extend(self, other: Logprobs) -> None:
        self.tokens += other.tokens
        self.token_logprobs += other.token_logprobs
        self.top_logprobs += other.top_logprobs
        self.text_offset += other.text_offset

    def as_json(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "token_logprobs": self.token_logprobs,
            "top_logprobs": self.top_logprobs,
            "text_offset": self.text_offset,
        }


class CharScorer:
    """One continuation's characters scored as they come, from ``state`` (None: zero states, where the first
    character has no log-probability: OpenAI's null for an echoed prompt's first token). ``top`` alternatives per
    character: the ``top`` likeliest characters and the one that came, each with its log-probability."""

    def __init__(self, sampler: Sampler, top: int, state: GenerationState | None = None) -> None:
        self.sampler, self.top, self.state = sampler, top, state
        self.offset = 0  # characters of the choice's text so far
        self.names = [sampler.vocab.decode([i]) for i in range(sampler.vocab.size)]

    def copy(self) -> CharScorer:
        """A scorer that goes on from here on its own (the n continuations of one prompt, after it)."""
        twin = CharScorer.__new__(CharScorer)
        twin.__dict__.update(self.__dict__)
        return twin

    def score(self, text: str) -> Logprobs:
        """The log-probabilities of ``text``'s characters, read on from where the last piece ended. Characters the
        model never saw are skipped (they are not read, as a prompt's are not) but keep their place in the offsets."""
        ids = self.sampler.vocab.encode(text)
        known = np.flatnonzero(ids != UNKNOWN_ID)
        result = Logprobs()
        for first in range(0, len(known), CHUNK):
            positions = known[first : first + CHUNK]
            result.extend(self._score_ids(ids[positions].astype(np.int32), [text[p] for p in positions], positions))
        self.offset += len(text)
        return result

    def _score_ids(self, ids: np.ndarray, chars: list[str], positions: np.ndarray) -> Logprobs:
        states = self.state.states if self.state is not None else self.sampler.zero_states(1)
        after, states = self.sampler.read_logits(ids, states)
        scored = Logprobs(chars, text_offset=[self.offset + int(p) for p in positions])
        before = after[:-1] if self.state is None else np.concatenate([self.state.logits, after[:-1]])
        logprobs = log_softmax(before)
        chosen = logprobs[np.arange(len(before)), ids[len(ids) - len(before) :]]
        tops = self._tops(logprobs, ids[len(ids) - len(before) :], chosen)
        if self.state is None:  # the first character of a text read from zero states: nothing predicted it
            scored.token_logprobs.append(None)
            scored.top_logprobs.append(None)
        scored.token_logprobs += chosen.tolist()
        scored.top_logprobs += tops
        self.state = GenerationState(after[-1:], states)
        return scored

    def _tops(self, logprobs: np.ndarray, ids: np.ndarray, chosen: np.ndarray) -> list[dict[str, float]]:
        """Each position's ``top`` likeliest characters (the unknown id, which decodes to nothing, left out) and the
        one that came, with their log-probabilities."""
        names = self.names
        known = logprobs[:, UNKNOWN_ID + 1 :]
        k = min(self.top, known.shape[1])
        if k:
            best = np.argpartition(-known, k - 1, axis=1)[:, :k]
            best = np.take_along_axis(best, np.argsort(-np.take_along_axis(known, best, axis=1), axis=1), axis=1)
        tops = []
        for t in range(len(ids)):
            entry = {names[i + UNKNOWN_ID + 1]: float(known[t, i]) for i in (best[t] if k else ())}
            entry.setdefault(names[ids[t]], float(chosen[t]))
            tops.append(entry)
        return tops
