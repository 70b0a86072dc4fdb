"""Fast batched generation from trained weights.

Two pieces, kept apart as in keras-hub's samplers:

* the next-token function (``Generator.step``): ids and explicit LSTM states in,
  logits and new states out, computed with plain TensorFlow ops from the weights
  of the trained Keras model;
* the sampling strategy (``choose_next``): a pure function of logits (greedy,
  temperature, top-k, top-p).

``Generator.stream`` runs the whole loop inside one compiled ``tf.while_loop`` per
chunk, so generating L characters costs L/chunk Python round trips, not L.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf

from textgen.checkpoint import Run
from textgen.config import ModelConfig, SampleConfig
from textgen.lstm import lstm_cell
from textgen.model import build_model
from textgen.vocab import UNKNOWN_ID, Vocabulary

# Column blocks of each recurrent kernel (see _lstm_cell): 4 blocks took batch-64 sampling of
# the default model from ~38k to ~54k chars/s on 2 cores (benchmarks/sampling.py).
RECURRENT_BLOCKS = 4
# Characters per iteration of the generation loop: ~20% more chars/s at batch 1 than 1.
UNROLL = 4
# Characters per compiled call, reading or generating, all sequences together: Ctrl-C lands between
# calls, so it takes effect within one (~0.3 s for the default model at batch 1 and at batch 64). Per
# sequence at least 256 steps and at most 2048, so batch 1 keeps making few calls: 2,000 characters
# at batch 1 ran at 8,623 chars/s against 8,774 for the unbounded loop (alternating runs, 10 s each).
CHARS_PER_CALL = 16384


def steps_per_call(batch: int) -> int:
    """Generation or prompt steps per compiled call for ``batch`` sequences."""
    return min(2048, max(256, CHARS_PER_CALL // max(batch, 1)))


NEG_INF = -1e9  # large enough to zero a probability, finite so softmax stays defined


# --- strategies: pure functions of logits -------------------------------------------


def mask_unknown(logits: tf.Tensor) -> tf.Tensor:
    """Logits with the unknown-character id made impossible."""
    vocab_size = tf.shape(logits)[-1]
    return tf.where(tf.range(vocab_size) == UNKNOWN_ID, tf.cast(NEG_INF, logits.dtype), logits)


def top_k_filter(logits: tf.Tensor, k: tf.Tensor) -> tf.Tensor:
    """Keep the ``k`` largest logits of each row."""
    k = tf.clip_by_value(k, 1, tf.shape(logits)[-1])
    kth = tf.gather(tf.sort(logits, axis=-1, direction="DESCENDING"), k - 1, axis=-1)[:, None]
    return tf.where(logits < kth, tf.cast(NEG_INF, logits.dtype), logits)


def top_p_filter(logits: tf.Tensor, p: tf.Tensor) -> tf.Tensor:
    """Keep the smallest set of most likely ids whose probability mass reaches ``p``."""
    sorted_logits = tf.sort(logits, axis=-1, direction="DESCENDING")
    mass_before = tf.cumsum(tf.nn.softmax(sorted_logits), axis=-1, exclusive=True)
    kept = tf.where(mass_before < p, sorted_logits, tf.cast(math.inf, logits.dtype))
    threshold = tf.reduce_min(kept, axis=-1, keepdims=True)
    return tf.where(logits < threshold, tf.cast(NEG_INF, logits.dtype), logits)


def choose_next(
    logits: tf.Tensor, temperature: tf.Tensor, top_k: tf.Tensor, top_p: tf.Tensor, seed: tf.Tensor
) -> tf.Tensor:
    """Next ids (int32, one per row): argmax at temperature 0, else a filtered, seeded draw."""
    logits = mask_unknown(tf.cast(logits, tf.float32))

    def greedy() -> tf.Tensor:
        return tf.argmax(logits, axis=-1, output_type=tf.int32)

    def draw() -> tf.Tensor:
        scaled = logits / temperature
        scaled = tf.cond(top_k > 0, lambda: top_k_filter(scaled, top_k), lambda: scaled)
        scaled = tf.cond(top_p < 1.0, lambda: top_p_filter(scaled, top_p), lambda: scaled)
        return tf.random.stateless_categorical(scaled, 1, seed=seed, dtype=tf.int32)[:, 0]

    return tf.cond(temperature > 0, draw, greedy)


# --- the next-token function and the compiled loop ------------------------------------


class Generator:
    """A generation model of any batch size built from a trained model's weights."""

    def __init__(self, cfg: ModelConfig, vocab: Vocabulary, weights: Sequence[np.ndarray]) -> None:
        self.cfg, self.vocab = cfg, vocab
        expected = 1 + 3 * cfg.layers + 2
        if len(weights) != expected:
            raise ValueError(f"expected {expected} weight arrays for {cfg}, got {len(weights)}")
        embedding, *lstm, dense_kernel, dense_bias = [tf.constant(w, tf.float32) for w in weights]
        kernels, recurrents, biases = lstm[0::3], lstm[1::3], lstm[2::3]
        # Layer 0's input projection for every character, precomputed: a gather replaces a matmul.
        self.input_table = tf.matmul(embedding, kernels[0]) + biases[0]
        self.kernels, self.biases = kernels, biases
        self.recurrent_blocks = [tf.split(r, RECURRENT_BLOCKS, axis=1) for r in recurrents]
        self.dense_kernel, self.dense_bias = dense_kernel, dense_bias
        state_spec = tuple(tf.TensorSpec([None, cfg.units], tf.float32) for _ in range(2 * cfg.layers))
        scalar = tf.TensorSpec([], tf.float32)
        # Graph mode, not XLA: XLA recompiles for every batch size, prompt length and chunk
        # length (~0.8 s each) and was no faster per step here (benchmarks/sampling.py).
        self._feed = tf.function(self._feed_impl, input_signature=[tf.TensorSpec([None, None], tf.int32), state_spec])
        self._generate = tf.function(
            self._generate_impl,
            input_signature=[
                tf.TensorSpec([None, vocab.size], tf.float32),
                state_spec,
                tf.TensorSpec([], tf.int32),  # steps
                tf.TensorSpec([2], tf.int32),  # seed, position of the first step
                scalar,  # temperature
                tf.TensorSpec([], tf.int32),  # top_k
                scalar,  # top_p
            ],
        )

    @classmethod
    def from_run(cls, run: Run, which: str = "best") -> Generator:
        """Load a run's config, vocabulary and ``best`` or ``last`` weights; no corpus needed."""
        cfg, vocab = run.load_config().model, run.load_vocab()
        model = build_model(cfg, batch_size=1, stateful=False)
        run.load_weights(model, which)
        return cls(cfg, vocab, model.get_weights())

    # The next-token function -----------------------------------------------------------

    def zero_states(self, batch: int) -> tuple[tf.Tensor, ...]:
        """All-zero (h, c) for every layer: the state at the start of training's epochs."""
        return tuple(tf.zeros([batch, self.cfg.units]) for _ in range(2 * self.cfg.layers))

    def step(self, ids: tf.Tensor, states: tuple[tf.Tensor, ...]) -> tuple[tf.Tensor, tuple[tf.Tensor, ...]]:
        """Logits (B, V) after reading ``ids`` (B,), and the new states."""
        x_projection = tf.gather(self.input_table, ids)
        new_states: list[tf.Tensor] = []
        for layer in range(self.cfg.layers):
            if layer > 0:
                x_projection = tf.matmul(new_states[-2], self.kernels[layer]) + self.biases[layer]
            h, c = _lstm_cell(x_projection, states[2 * layer], states[2 * layer + 1], self.recurrent_blocks[layer])
            new_states += [h, c]
        return tf.matmul(new_states[-2], self.dense_kernel) + self.dense_bias, tuple(new_states)

    def _feed_impl(self, ids: tf.Tensor, states: tuple[tf.Tensor, ...]) -> tuple[tf.Tensor, tuple[tf.Tensor, ...]]:
        steps = tf.shape(ids)[1]
        logits = tf.zeros([tf.shape(ids)[0], self.vocab.size])

        def body(t: tf.Tensor, logits: tf.Tensor, states: tuple) -> tuple:
            logits, states = self.step(ids[:, t], states)
            return t + 1, logits, states

        _, logits, states = tf.while_loop(lambda t, *_: t < steps, body, (tf.constant(0), logits, states))
        return logits, states

    def _generate_impl(
        self,
        logits: tf.Tensor,
        states: tuple[tf.Tensor, ...],
        steps: tf.Tensor,
        seed: tf.Tensor,
        temperature: tf.Tensor,
        top_k: tf.Tensor,
        top_p: tf.Tensor,
    ) -> tuple[tf.Tensor, tf.Tensor, tuple[tf.Tensor, ...]]:
        def advance(t: tf.Tensor, logits: tf.Tensor, states: tuple, tokens: tf.TensorArray) -> tuple:
            # Seeded by (seed, absolute position): the text does not depend on chunk sizes.
            ids = choose_next(logits, temperature, top_k, top_p, tf.stack([seed[0], seed[1] + t]))
            logits, states = self.step(ids, states)
            return t + 1, logits, states, tokens.write(t, ids)

        def advance_unrolled(*carry: Any) -> tuple:
            for _ in range(UNROLL):
                carry = advance(*carry)
            return carry

        # UNROLL characters per loop iteration (fewer loop-control ops per character), then the rest.
        carry = (tf.constant(0), logits, states, tf.TensorArray(tf.int32, size=steps))
        carry = tf.while_loop(lambda t, *_: t + UNROLL <= steps, advance_unrolled, carry)
        _, logits, states, tokens = tf.while_loop(lambda t, *_: t < steps, advance, carry)
        return tf.transpose(tokens.stack()), logits, states

    # The public API --------------------------------------------------------------------

    def encode_prompts(self, prompts: Sequence[str]) -> list[np.ndarray]:
        """Each prompt's ids, without characters outside the vocabulary (``Vocabulary.unknown_chars`` names them).

        An empty prompt (or one with no known character) becomes a newline, as if at the start of a
        paragraph: reading nothing would leave all-zero logits, a uniform (greedy: always id 1) first character.
        """
        fallback = self.vocab.encode("\n ")
        fallback = fallback[fallback != UNKNOWN_ID][:1]
        if not fallback.size:  # neither a newline nor a space in the vocabulary
            fallback = np.array([1], np.int32)
        encoded = [ids[ids != UNKNOWN_ID] for ids in (self.vocab.encode(p) for p in prompts)]
        return [ids if ids.size else fallback for ids in encoded]

    def feed(self, encoded: Sequence[np.ndarray], state: GenerationState | None = None) -> GenerationState:
        """Read one encoded prompt per sequence, on top of ``state`` (or from zero states): where generation starts."""
        states = state.states if state is not None else self.zero_states(1)
        batch = len(encoded)
        if states[0].shape[0] == 1 and all(np.array_equal(ids, encoded[0]) for ids in encoded):
            # One prompt from one state: read it once, then copy the result to every row.
            logits, states = self._feed_in_chunks(encoded[0], states)
            return GenerationState(tf.tile(logits, [batch, 1]), tuple(tf.tile(s, [batch, 1]) for s in states))
        if states[0].shape[0] == 1:
            states = tuple(tf.tile(s, [batch, 1]) for s in states)
        rows = [self._feed_in_chunks(ids, tuple(s[i : i + 1] for s in states)) for i, ids in enumerate(encoded)]
        logits = tf.concat([r[0] for r in rows], axis=0)
        return GenerationState(logits, tuple(tf.concat([r[1][j] for r in rows], axis=0) for j in range(len(states))))

    def _feed_in_chunks(
        self, ids: np.ndarray, states: tuple[tf.Tensor, ...]
    ) -> tuple[tf.Tensor, tuple[tf.Tensor, ...]]:
        """Read one sequence's ids (at least one) in bounded calls; the logits after the last, and the states."""
        steps = steps_per_call(1)
        for start in range(0, len(ids), steps):
            logits, states = self._feed(tf.constant(ids[None, start : start + steps], tf.int32), states)
        return logits, states

    def stream(
        self,
        prompts: Sequence[str],
        settings: SampleConfig,
        chunk: int = 64,  # at most steps_per_call(len(prompts))
        first_chunk: int = 8,
        state: GenerationState | None = None,
    ) -> Iterator[Piece]:
        """Yield the continuations of ``prompts`` piece by piece (``settings.length`` characters each).

        The first piece is short so text appears at once. Each piece carries the state after its
        last character: pass the last one back as ``state`` to carry a conversation on.
        """
        seed = settings.seeded().seed
        limit = steps_per_call(len(prompts))
        state = self.feed(self.encode_prompts(prompts), state)
        produced = 0
        while produced < settings.length:
            steps = min(first_chunk if produced == 0 else chunk, limit, settings.length - produced)
            ids, logits, states = self._generate(
                state.logits,
                state.states,
                tf.constant(steps),
                tf.constant([seed, produced], tf.int32),
                tf.constant(float(settings.temperature)),
                tf.constant(settings.top_k),
                tf.constant(float(settings.top_p)),
            )
            produced += steps
            state = GenerationState(logits, states)
            yield Piece([self.vocab.decode(row) for row in ids.numpy()], state)

    def generate(self, prompts: Sequence[str], settings: SampleConfig) -> list[str]:
        """The full continuations of ``prompts`` (one per prompt)."""
        pieces = [piece.texts for piece in self.stream(prompts, settings, chunk=steps_per_call(len(prompts)))]
        return ["".join(row) for row in zip(*pieces, strict=True)]


@dataclass(frozen=True)
class GenerationState:
    """Where a generation stands: next-character logits (B, V) and the LSTM states (h, c of every layer)."""

    logits: tf.Tensor
    states: tuple[tf.Tensor, ...]


@dataclass(frozen=True)
class Piece:
    """The next characters of every sequence, and the state after the last of them."""

    texts: list[str]
    state: GenerationState


def _lstm_cell(
    x_projection: tf.Tensor, h: tf.Tensor, c: tf.Tensor, recurrent_blocks: Sequence[tf.Tensor]
) -> tuple[tf.Tensor, tf.Tensor]:
    """One step of Keras' LSTM cell, the recurrent kernel given as column blocks: independent matmuls
    the executor runs on both cores at once, each block small enough to stay in one core's L2 cache."""
    z = x_projection + tf.concat([tf.matmul(h, block) for block in recurrent_blocks], axis=-1)
    h, c, _ = lstm_cell(z, c)
    return h, c
