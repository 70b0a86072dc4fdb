"""The generation loop every sampler shares, with no TensorFlow in it.

A sampler supplies two steps, as keras-hub's samplers keep the next-token function apart from the
strategy: ``read`` (ids in, logits and LSTM states out) and ``generate_steps`` (draw ``steps``
characters with the sampling strategy, feeding each one back). This class turns them into prompts
read in bounded calls, text streamed piece by piece, and whole samples. ``textgen.sampling.Generator``
runs the steps as compiled TensorFlow loops (a run's weights, or an exported SavedModel's);
``textgen.litert.LiteRTGenerator`` runs them through the LiteRT interpreter with NumPy's strategy.
"""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from textgen.config import ModelConfig
from textgen.errors import FieldError
from textgen.genconfig import SampleConfig
from textgen.layout import MASKED, StreamLayout
from textgen.npsampling import BAN, uniforms
from textgen.tracking import Track, untracked
from textgen.vocab import UNKNOWN_ID, Vocabulary

# Characters per compiled call, reading or generating, all sequences together: Ctrl-C lands between
# calls, so it takes effect within one (~0.3 s for the default model at batch 1 and at batch 64). Per
# sequence at least 256 steps and at most 2048, so batch 1 keeps making few calls: 2,000 characters
# at batch 1 ran at 8,623 chars/s against 8,774 for the unbounded loop (alternating runs, 10 s each).
CHARS_PER_CALL = 16384

States = tuple[np.ndarray, ...]  # (h, c) of every layer, each (B, units) float32
READING_PROMPT = "reading the prompt"  # what a ``Track`` hears while prompts are read


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Log-probabilities (float64) of every id under ``logits`` (..., V): the one place a sampler turns logits into
    them (``Sampler.score``, and the server's ``logprobs``)."""
    shifted = logits.astype(np.float64) - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def steps_per_call(batch: int) -> int:
    """Generation or prompt steps per call for ``batch`` sequences."""
    return min(2048, max(256, CHARS_PER_CALL // max(batch, 1)))


def bias_row(logit_bias: Sequence[tuple[str, float]], vocab: Vocabulary) -> np.ndarray:
    """``logit_bias``' (character, bias) pairs as a bias per id (V,) float32; a character the vocabulary lacks, or
    bans of every character, are a ``FieldError`` naming it."""
    row = np.zeros(vocab.size, np.float32)
    for char, bias in logit_bias:
        char_id = int(vocab.encode(char)[0])
        if char_id == UNKNOWN_ID:
            rule = "keyed by characters of the model's vocabulary"
            raise FieldError(f"--logit-bias must be {rule}: the model has no {char!r}", "logit_bias", rule)
        row[char_id] = bias
    if (row[UNKNOWN_ID + 1 :] <= BAN).all():
        rule = "leave at least one character unbanned"
        raise FieldError(f"--logit-bias must {rule}: it bans every character of the vocabulary", "logit_bias", rule)
    return row


def count_drawn(counts: np.ndarray, ids: np.ndarray, drawn: np.ndarray) -> np.ndarray:
    """``counts`` (B, V) plus each row's ``ids`` (B, steps) where ``drawn`` (B, steps) is true (not a prompt's)."""
    counts = counts.copy()
    rows = np.broadcast_to(np.arange(len(ids))[:, None], ids.shape)
    np.add.at(counts, (rows[drawn], ids[drawn]), 1)
    return counts


@dataclass(frozen=True)
class Penalties:
    """OpenAI's frequency and presence penalties (B,) and logit bias (B, V), per row (``npsampling.penalize``)."""

    frequency: np.ndarray  # float32
    presence: np.ndarray  # float32
    bias: np.ndarray  # float32; -100 bans


@dataclass(frozen=True)
class RowSettings:
    """The sampling strategy's settings, one value per row (B,): ``textgen sample`` gives every row the same,
    a server's rows each have their request's."""

    temperature: np.ndarray  # float32; 0 is greedy
    top_k: np.ndarray  # int32; 0 is off
    top_p: np.ndarray  # float32; 1 is off
    penalties: Penalties | None = None  # None when no row has any: the plain loop, which counts nothing

    @classmethod
    def of(cls, settings: SampleConfig, batch: int, vocab: Vocabulary) -> RowSettings:
        """``settings``' strategy for every one of ``batch`` rows."""
        penalties = None
        if settings.penalized:
            penalties = Penalties(
                np.full(batch, settings.frequency_penalty, np.float32),
                np.full(batch, settings.presence_penalty, np.float32),
                np.repeat(bias_row(settings.logit_bias, vocab)[None], batch, axis=0),
            )
        return cls(
            np.full(batch, settings.temperature, np.float32),
            np.full(batch, settings.top_k, np.int32),
            np.full(batch, settings.top_p, np.float32),
            penalties,
        )

    def groups(self) -> list[np.ndarray]:
        """The row numbers of each set of rows with the same settings."""
        keys = np.stack([self.temperature, self.top_k.astype(np.float32), self.top_p], axis=1)
        _, group = np.unique(keys, axis=0, return_inverse=True)
        return [np.flatnonzero(group.ravel() == g) for g in range(group.max() + 1)]


@dataclass(frozen=True)
class GenerationState:
    """Where a generation stands: next-character logits (B, V) and the LSTM states (h, c of every layer)."""

    logits: np.ndarray
    states: States


@dataclass(frozen=True)
class Piece:
    """The next characters of every sequence, and the state after the last of them."""

    texts: list[str]
    state: GenerationState


@dataclass(frozen=True)
class Start:
    """Where every prompt is read from (``textgen.startstate``): a state (one row per array), and the logits there
    (1, V), from which a prompt with nothing to read draws its first character; None in a file from before they were
    kept (such a prompt then reads a newline first)."""

    states: States
    logits: np.ndarray | None = None


class Sampler(ABC):
    """Prompts in, continuations out, over a next-token ``read`` and a strategy's ``generate_steps``."""

    concurrent_calls = False  # whether two threads may call generate_steps at once (a server's lanes)

    def __init__(self, cfg: ModelConfig, vocab: Vocabulary, start: Start | None = None) -> None:
        self.cfg, self.vocab = cfg, vocab
        self.start = start  # where every prompt is read from; None: zeros

    @abstractmethod
    def read(self, ids: np.ndarray, states: States) -> tuple[np.ndarray, States]:
        """Logits (B, V) after reading ``ids`` (B, T) on top of ``states``, and the new states."""

    @abstractmethod
    def generate_steps(
        self,
        logits: np.ndarray,
        states: States,
        uniforms: np.ndarray,
        settings: RowSettings,
        forced: np.ndarray | None = None,
        counts: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray, States]:
        """Draw one id per row for each row of ``uniforms`` (steps, B) from ``logits`` on, with each row's
        ``settings``, feeding each back (B, steps); the logits and states after the last. Where ``forced``
        (steps, B) is not -1, its id is fed (and returned) instead of a drawn one: a prompt read in the call.
        With ``settings.penalties``, ``counts`` (B, V) are each row's characters drawn before the call (the
        caller adds the call's with ``count_drawn``)."""

    def read_logits(self, ids: np.ndarray, states: States) -> tuple[np.ndarray, States]:
        """The logits after each of ``ids`` (T,), one sequence read on top of ``states`` (batch 1): (T, V), and the
        states after the last. (A step at a time through ``read``; a sampler may compile it.)"""
        logits = np.zeros([len(ids), self.vocab.size], np.float32)
        for t in range(len(ids)):
            step, states = self.read(ids[None, t : t + 1].astype(np.int32), states)
            logits[t] = step[0]
        return logits, states

    def zero_states(self, batch: int) -> States:
        """All-zero (h, c) for every layer: the state at the start of training's epochs."""
        return tuple(np.zeros([batch, self.cfg.units], np.float32) for _ in range(2 * self.cfg.layers))

    def start_states(self, batch: int) -> States:
        """The state ``batch`` prompts are read from: the start state (``textgen.startstate``), a paragraph's start
        the model knows, or zeros for a sampler without one (scoring always reads from zeros, as training does)."""
        if self.start is None:
            return self.zero_states(batch)
        return tuple(np.repeat(s, batch, axis=0) for s in self.start.states)

    @property
    def start_logits(self) -> np.ndarray | None:
        """The logits (1, V) at the start state, if it has them: a prompt with nothing to read starts from them."""
        return None if self.start is None else self.start.logits

    def encode_prompts(self, prompts: Sequence[str], fallback: bool = True) -> list[np.ndarray]:
        """Each prompt's ids, without characters outside the vocabulary (``Vocabulary.unknown_chars`` names them).

        With ``fallback``, an empty prompt (or one with no known character) becomes a newline, as if at the start
        of a paragraph: reading nothing from zero states would leave all-zero logits, a uniform (greedy: always
        id 1) first character. Not with a start state that has its logits: such a prompt starts from them, at a
        paragraph's start. (On a carried state, reading nothing goes on from that state's logits.)
        """
        newline = self.vocab.encode_known("\n ")[:1]
        if not newline.size:  # neither a newline nor a space in the vocabulary
            newline = np.array([1], np.int32)
        encoded = [self.vocab.encode_known(p) for p in prompts]
        fallback = fallback and self.start_logits is None
        return [newline if fallback and not ids.size else ids for ids in encoded]

    def feed(
        self, encoded: Sequence[np.ndarray], state: GenerationState | None = None, track: Track = untracked
    ) -> GenerationState:
        """Read one encoded prompt per sequence, on top of ``state`` (or from the start state): where generation
        starts. An empty prompt on a ``state`` goes on from it. ``track`` hears the characters read, call by call."""
        logits, states = (
            (state.logits, state.states) if state is not None else (self.start_logits, self.start_states(1))
        )
        batch = len(encoded)
        if states[0].shape[0] == 1 and all(np.array_equal(ids, encoded[0]) for ids in encoded):
            # One prompt from one state: read it once, then copy the result to every row.
            logits, states = self._read_in_chunks([encoded[0]], [states], [logits], track)[0]
            return GenerationState(np.repeat(logits, batch, axis=0), tuple(np.repeat(s, batch, axis=0) for s in states))
        if states[0].shape[0] == 1:
            states = tuple(np.repeat(s, batch, axis=0) for s in states)
            logits = None if logits is None else np.repeat(logits, batch, axis=0)
        rows = self._read_in_chunks(
            encoded,
            [tuple(s[i : i + 1] for s in states) for i in range(batch)],
            [None if logits is None else logits[i : i + 1] for i in range(batch)],
            track,
        )
        return GenerationState(
            np.concatenate([r[0] for r in rows], axis=0),
            tuple(np.concatenate([r[1][j] for r in rows]) for j in range(len(states))),
        )

    def _read_in_chunks(
        self, encoded: Sequence[np.ndarray], states: Sequence[States], logits: Sequence[np.ndarray | None], track: Track
    ) -> list[tuple[np.ndarray, States]]:
        """Read each sequence's ids in bounded calls on top of its ``states``: for each, the logits after its last id
        (its ``logits``, the state's own, if it has none) and its states."""
        steps, done, total = steps_per_call(1), 0, sum(len(ids) for ids in encoded)
        rows = []
        for ids, row_states, row_logits in zip(encoded, states, logits, strict=True):
            for first in range(0, len(ids), steps):
                row_logits, row_states = self.read(ids[None, first : first + steps].astype(np.int32), row_states)
                done += len(ids[first : first + steps])
                track(READING_PROMPT, done, total)
            if row_logits is None:
                raise ValueError("nothing to read from zero states: encode the prompts with a fallback")
            rows.append((row_logits, row_states))
        return rows

    def stream(
        self,
        prompts: Sequence[str],
        settings: SampleConfig,
        chunk: int = 64,  # at most steps_per_call(len(prompts))
        first_chunk: int = 8,
        state: GenerationState | None = None,
        track: Track = untracked,
    ) -> Iterator[Piece]:
        """Yield the continuations of ``prompts`` piece by piece (``settings.length`` characters each).

        The first piece is short so text appears at once. Each piece carries the state after its
        last character: pass the last one back as ``state`` to carry a conversation on. ``track`` hears the prompts
        read.
        """
        seed = settings.seeded().seed or 0
        limit = steps_per_call(len(prompts))
        strategy = RowSettings.of(settings, len(prompts), self.vocab)
        state = self.feed(self.encode_prompts(prompts, fallback=state is None), state, track)
        # The penalties count this call's characters only: a carried conversation's earlier answers are a prompt.
        counts = np.zeros([len(prompts), self.vocab.size], np.float32) if settings.penalized else None
        produced = 0
        while produced < settings.length:
            steps = min(first_chunk if produced == 0 else chunk, limit, settings.length - produced)
            # Drawn at uniforms of (seed, absolute position, row): the text does not depend on chunk sizes.
            draws = uniforms(seed, produced, steps, len(prompts))
            ids, logits, states = self.generate_steps(state.logits, state.states, draws, strategy, counts=counts)
            if counts is not None:
                counts = count_drawn(counts, ids, np.ones(ids.shape, bool))
            produced += steps
            state = GenerationState(logits, states)
            yield Piece([self.vocab.decode(row) for row in ids], state)

    def generate(self, prompts: Sequence[str], settings: SampleConfig, track: Track = untracked) -> list[str]:
        """The full continuations of ``prompts`` (one per prompt); ``track`` hears the prompts read."""
        chunk = steps_per_call(len(prompts))
        pieces = [piece.texts for piece in self.stream(prompts, settings, chunk=chunk, track=track)]
        return ["".join(row) for row in zip(*pieces, strict=True)]

    def score(self, ids: np.ndarray, layout: StreamLayout, track: Track = untracked) -> tuple[float, int]:
        """Summed cross-entropy (nats) of every character of ``ids`` after the first, read in ``layout``'s streams
        and ``seq_len`` from zero states, and how many that is: what ``textgen.scoring.score`` computes for a run,
        here through ``read`` one character at a time (``track`` hears them, batch by batch)."""
        layout = StreamLayout.covering(len(ids), layout.streams, layout.seq_len)
        states, nats, done = self.zero_states(layout.streams), 0.0, 0
        rows = np.arange(layout.streams)
        full = (layout.batch(ids, k) for k in range(layout.batches))
        for inputs, targets in itertools.chain(full, layout.last_batches(ids)):
            for t in range(layout.seq_len):
                scored = targets[:, t] != MASKED
                if not scored.any():  # padding, to the end of every row
                    break
                logits, states = self.read(inputs[:, t : t + 1], states)
                nats -= float(np.sum(log_softmax(logits)[rows, targets[:, t]][scored]))
            done = min(done + inputs.size, layout.scored)
            track("scoring", done, layout.scored)
        return nats, layout.scored
