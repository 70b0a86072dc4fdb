"""Fast batched generation from trained weights, in TensorFlow.

Two pieces, kept apart as in keras-hub's samplers:

* the next-token function (``Generator.step``): ids and explicit LSTM states in,
  logits and new states out, computed with plain TensorFlow ops from the weights
  of the trained Keras model;
* the sampling strategy (``choose_next``): a pure function of logits and uniform numbers
  (greedy, temperature, top-k, top-p). ``textgen.npsampling`` is its NumPy twin, for LiteRT,
  and makes the uniforms for both, so a seed draws the same ids in either.

``Generator.generate_steps`` runs the whole loop inside one compiled ``tf.while_loop`` per
chunk, so generating L characters costs L/chunk Python round trips, not L. The chunking,
prompts and streaming are ``textgen.generation.Sampler``'s, shared with the LiteRT runtime.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf

from textgen.checkpoint import Run
from textgen.config import ModelConfig, Weights
from textgen.errors import ConfigError, GenerationError, one_line
from textgen.generation import RowSettings, Sampler, States
from textgen.lstm import layer_norm, lstm_cell, run_unrolled
from textgen.model import LAYER_NORM_WEIGHTS, build_model
from textgen.npsampling import BAN, NEG_INF
from textgen.startstate import run_start, weights_checksum
from textgen.vocab import UNKNOWN_ID, Vocabulary

# Column blocks of each recurrent kernel (see _lstm_cell): 4 blocks took batch-64 sampling of
# the default model from ~38k to ~54k chars/s on 2 cores (benchmarks/sampling.py).
RECURRENT_BLOCKS = 4
# Characters per iteration of the generation loop: ~20% more chars/s at batch 1 than 1.
UNROLL = 4


# --- strategies: pure functions of logits -------------------------------------------


def mask_unknown(logits: tf.Tensor) -> tf.Tensor:
    """Logits with the unknown-character id made impossible."""
    vocab_size = tf.shape(logits)[-1]
    return tf.where(tf.range(vocab_size) == UNKNOWN_ID, tf.cast(NEG_INF, logits.dtype), logits)


class Penalty(NamedTuple):
    """``textgen.npsampling.penalize``'s inputs: counts (B, V), frequency and presence (B,), bias (B, V)."""

    counts: tf.Tensor
    frequency: tf.Tensor
    presence: tf.Tensor
    bias: tf.Tensor


def penalize(logits: tf.Tensor, p: Penalty) -> tf.Tensor:
    """OpenAI's penalties and bias on ``logits`` (B, V), as ``textgen.npsampling.penalize`` (the same operations in
    the same order, so the same floats); a bias of -100 bans."""
    penalty = p.counts * p.frequency[:, None] + tf.cast(p.counts > 0, tf.float32) * p.presence[:, None]
    return tf.where(p.bias <= BAN, tf.cast(NEG_INF, logits.dtype), logits + p.bias - penalty)


def top_k_filter(logits: tf.Tensor, k: tf.Tensor) -> tf.Tensor:
    """Keep the ``k`` largest logits of each row (``k`` (B,); 0 keeps them all)."""
    vocab = tf.shape(logits)[-1]
    k = tf.where(k > 0, tf.minimum(k, vocab), vocab)
    kth = tf.gather(tf.sort(logits, axis=-1, direction="DESCENDING"), k - 1, batch_dims=1)[:, None]
    return tf.where(logits < kth, tf.cast(NEG_INF, logits.dtype), logits)


def top_p_filter(logits: tf.Tensor, p: tf.Tensor) -> tf.Tensor:
    """Keep the smallest set of most likely ids whose probability mass reaches ``p`` (B,) (the likeliest always;
    a ``p`` of 1 keeps them all)."""
    sorted_logits = tf.sort(logits, axis=-1, direction="DESCENDING")
    mass_before = tf.cumsum(tf.nn.softmax(sorted_logits), axis=-1, exclusive=True)
    first = tf.range(tf.shape(logits)[-1]) == 0  # a p of 0 or less (a SavedModel caller's) would keep nothing
    kept = (mass_before < p[:, None]) | (p[:, None] >= 1.0) | first
    threshold = tf.reduce_min(tf.where(kept, sorted_logits, tf.cast(math.inf, logits.dtype)), axis=-1, keepdims=True)
    return tf.where(logits < threshold, tf.cast(NEG_INF, logits.dtype), logits)


def draw(logits: tf.Tensor, u: tf.Tensor) -> tf.Tensor:
    """The id of each row whose cumulative probability first exceeds ``u`` of the total (the unnormalised
    exponentials, as ``textgen.npsampling.draw``)."""
    cdf = tf.cumsum(tf.exp(logits - tf.reduce_max(logits, axis=-1, keepdims=True)), axis=-1)
    ids = tf.reduce_sum(tf.cast(cdf <= u[:, None] * cdf[:, -1:], tf.int32), axis=-1)
    return tf.minimum(ids, tf.shape(logits)[-1] - 1)


class StepStrategy(NamedTuple):
    """Each row's sampling settings as the loop uses them, with what holds for every row worked out once per call
    rather than once per character (per character it cost ~8% of batch-1 speed)."""

    divisor: tf.Tensor  # (B, 1): each row's temperature, 1 where it is greedy
    top_k: tf.Tensor  # (B,)
    top_p: tf.Tensor  # (B,)
    sampled: tf.Tensor  # (B,) bool: the rows that draw (temperature > 0)
    any_sampled: tf.Tensor
    all_sampled: tf.Tensor
    any_top_k: tf.Tensor
    any_top_p: tf.Tensor


def strategy(temperature: tf.Tensor, top_k: tf.Tensor, top_p: tf.Tensor) -> StepStrategy:
    """The strategy of rows with these settings (B,) each."""
    sampled = temperature > 0
    return StepStrategy(
        tf.where(sampled, temperature, 1.0)[:, None],
        top_k,
        top_p,
        sampled,
        tf.reduce_any(sampled),
        tf.reduce_all(sampled),
        tf.reduce_any(top_k > 0),
        tf.reduce_any(top_p < 1.0),
    )


def choose_next(logits: tf.Tensor, rows: StepStrategy, u: tf.Tensor, penalty: Penalty | None = None) -> tf.Tensor:
    """Next ids (int32, one per row): argmax where the row's temperature is 0, else a filtered draw at the
    uniforms ``u``, after the ``penalty`` if any; a filter no row asks for is not computed."""
    logits = tf.cast(logits, tf.float32)
    logits = mask_unknown(logits if penalty is None else penalize(logits, penalty))

    def greedy() -> tf.Tensor:
        return tf.argmax(logits, axis=-1, output_type=tf.int32)

    def filtered_draw() -> tf.Tensor:
        scaled = logits / rows.divisor
        scaled = tf.cond(rows.any_top_k, lambda: top_k_filter(scaled, rows.top_k), lambda: scaled)
        scaled = tf.cond(rows.any_top_p, lambda: top_p_filter(scaled, rows.top_p), lambda: scaled)
        ids = draw(scaled, u)
        return tf.cond(rows.all_sampled, lambda: ids, lambda: tf.where(rows.sampled, ids, greedy()))

    return tf.cond(rows.any_sampled, filtered_draw, greedy)


# --- the next-token function and the compiled loop ------------------------------------


class Generator(Sampler):
    """A generation model of any batch size built from a trained model's weights."""

    concurrent_calls = True  # TensorFlow runs concurrent calls of a function

    def __init__(
        self,
        cfg: ModelConfig,
        vocab: Vocabulary,
        weights: Sequence[np.ndarray],
        recurrent_blocks: int = RECURRENT_BLOCKS,
        input_table: bool = True,
    ) -> None:
        super().__init__(cfg, vocab)
        per_layer = 3 + (len(LAYER_NORM_WEIGHTS) if cfg.layer_norm else 0)
        expected = 1 + per_layer * cfg.layers + 2
        if len(weights) != expected:
            raise ValueError(f"expected {expected} weight arrays for {cfg}, got {len(weights)}")
        embedding, *lstm, dense_kernel, dense_bias = [tf.constant(w, tf.float32) for w in weights]
        by_layer = [lstm[n * per_layer : (n + 1) * per_layer] for n in range(cfg.layers)]
        self.kernels, recurrents, self.biases = ([w[k] for w in by_layer] for k in range(3))
        # Each layer's (input_gain, recurrent_gain, cell_gain, cell_shift) when layer-normalized.
        self.norms: list[tuple[tf.Tensor, ...] | None] = [tuple(w[3:]) if cfg.layer_norm else None for w in by_layer]
        # Layer 0's input projection for every character, precomputed: a gather replaces a matmul (and the
        # input's normalization, which is each row's own). An export keeps the embedding and the kernel instead:
        # the table is dense where a pruned kernel is mostly zeros (it was 0.86 of the 1.99 MB of a gzipped
        # 80%-pruned LiteRT file).
        self.embedding = embedding
        self.input_table = self._project(0, embedding) if input_table else None
        self.recurrent_blocks = [tf.split(r, recurrent_blocks, axis=1) for r in recurrents]
        self.dense_kernel, self.dense_bias = dense_kernel, dense_bias
        state_spec = tuple(tf.TensorSpec([None, cfg.units], tf.float32) for _ in range(2 * cfg.layers))
        rows = tf.TensorSpec([None], tf.float32)
        # Graph mode, not XLA: XLA recompiles for every batch size, prompt length and chunk
        # length (~0.8 s each) and was no faster per step here (benchmarks/sampling.py).
        self.feed_function = tf.function(
            self._feed_impl, input_signature=[tf.TensorSpec([None, None], tf.int32), state_spec], autograph=False
        )
        chunk_spec = [
            tf.TensorSpec([None, vocab.size], tf.float32),
            state_spec,
            tf.TensorSpec([None, None], tf.float32),  # uniforms (steps, B): one draw per step and row
            rows,  # temperature of each row
            tf.TensorSpec([None], tf.int32),  # top_k of each row
            rows,  # top_p of each row
        ]
        self.generate_function = tf.function(self._draw_impl, autograph=False, input_signature=chunk_spec)
        # A server's rows read their prompts inside the generation call: a forced id (steps, B), -1 where the row
        # draws. Its own function, so that textgen sample's loop does not pay the choice per character.
        forced_spec = tf.TensorSpec([None, None], tf.int32)
        self.forced_function = tf.function(
            self._forced_impl, autograph=False, input_signature=[*chunk_spec, forced_spec]
        )
        # Rows with penalties or a bias (textgen.npsampling.penalize) run a loop of their own, which counts each
        # row's characters (B, V) as it draws them: the plain loops above neither count nor penalize. Always with
        # forced ids (all -1 for textgen sample), for one more function rather than two.
        table = tf.TensorSpec([None, vocab.size], tf.float32)
        self.penalized_function = tf.function(
            self._penalized_impl, autograph=False, input_signature=[*chunk_spec, forced_spec, table, rows, rows, table]
        )
        # Called as concrete functions, not through the tf.function's dispatch: its cache raised a KeyError in one
        # suite run's REPL test (an entry found, then gone when popped; TensorFlow 2.21; three reruns passed), and
        # the sampler's one signature needs no dispatch.
        self.feed_concrete = self.feed_function.get_concrete_function()
        self.logits_concrete = tf.function(
            self._logits_impl, input_signature=[tf.TensorSpec([None], tf.int32), state_spec], autograph=False
        ).get_concrete_function()
        self.generate_concrete = self.generate_function.get_concrete_function()
        # Traced on first use (the server's engine warms the forced one up): it was 0.63-0.85 s of a 2 x 512
        # layer-normalized model's 1.27-1.70 s build, the penalized ~1 s, that textgen sample mostly never calls.
        self.traced: dict[str, Any] = {}
        self.trace_lock = threading.Lock()  # two lanes may ask for one at once

    @classmethod
    def from_run(
        cls, run: Run, which: Weights = Weights.best, recurrent_blocks: int | None = None, input_table: bool = True
    ) -> Generator:
        """Load a run's config, vocabulary and ``best`` or ``last`` weights, and the start state its prompts are read
        from (``textgen.startstate``: saved beside the weights, or computed from the training split; zeros if the
        corpus is gone too)."""
        cfg, vocab = run.load_config().model, run.load_vocab()
        model = build_model(cfg, batch_size=1, stateful=False)
        checksum = weights_checksum(run, which)  # before loading: a trainer may replace the file meanwhile
        run.load_weights(model, which)
        generator = cls(cfg, vocab, model.get_weights(), recurrent_blocks or RECURRENT_BLOCKS, input_table)
        generator.start = run_start(run, which, generator, checksum)
        return generator

    # The next-token function -----------------------------------------------------------

    def step(self, ids: tf.Tensor, states: tuple[tf.Tensor, ...]) -> tuple[tf.Tensor, tuple[tf.Tensor, ...]]:
        """Logits (B, V) after reading ``ids`` (B,), and the new states."""
        if self.input_table is not None:
            x_projection = tf.gather(self.input_table, ids)
        else:
            x_projection = self._project(0, tf.gather(self.embedding, ids))
        new_states: list[tf.Tensor] = []
        for layer in range(self.cfg.layers):
            if layer > 0:
                x_projection = self._project(layer, new_states[-2])
            h, c = _lstm_cell(
                x_projection, states[2 * layer], states[2 * layer + 1], self.recurrent_blocks[layer], self.norms[layer]
            )
            new_states += [h, c]
        return tf.matmul(new_states[-2], self.dense_kernel) + self.dense_bias, tuple(new_states)

    def _project(self, layer: int, x: tf.Tensor) -> tf.Tensor:
        """A layer's input projection (..., 4U) of its inputs ``x``, bias added (normalized first, if it is)."""
        projection = tf.matmul(x, self.kernels[layer])
        norm = self.norms[layer]
        return (projection if norm is None else layer_norm(projection, norm[0])) + self.biases[layer]

    def _feed_impl(self, ids: tf.Tensor, states: tuple[tf.Tensor, ...]) -> tuple[tf.Tensor, tuple[tf.Tensor, ...]]:
        steps = tf.shape(ids)[1]
        logits = tf.zeros([tf.shape(ids)[0], self.vocab.size])

        def body(t: tf.Tensor, logits: tf.Tensor, states: tuple) -> tuple:
            logits, states = self.step(ids[:, t], states)
            return t + 1, logits, states

        _, logits, states = tf.while_loop(lambda t, *_: t < steps, body, (tf.constant(0), logits, states))
        return logits, states

    def _logits_impl(self, ids: tf.Tensor, states: tuple[tf.Tensor, ...]) -> tuple[tf.Tensor, tuple[tf.Tensor, ...]]:
        """The logits after each of ``ids`` (T,), one sequence: (T, V), and the states after the last."""
        steps = tf.shape(ids)[0]

        def body(t: tf.Tensor, states: tuple, logits: tf.TensorArray) -> tuple:
            step, states = self.step(ids[t][None], states)
            return t + 1, states, logits.write(t, step[0])

        carry = (tf.constant(0), states, tf.TensorArray(tf.float32, size=steps))
        _, states, logits = tf.while_loop(lambda t, *_: t < steps, body, carry)
        return tf.reshape(logits.stack(), [steps, self.vocab.size]), states

    def _draw_impl(
        self,
        logits: tf.Tensor,
        states: tuple[tf.Tensor, ...],
        uniforms: tf.Tensor,
        temperature: tf.Tensor,
        top_k: tf.Tensor,
        top_p: tf.Tensor,
    ) -> tuple[tf.Tensor, tf.Tensor, tuple[tf.Tensor, ...]]:
        return self._generate_impl(logits, states, uniforms, temperature, top_k, top_p)

    def _forced_impl(
        self,
        logits: tf.Tensor,
        states: tuple[tf.Tensor, ...],
        uniforms: tf.Tensor,
        temperature: tf.Tensor,
        top_k: tf.Tensor,
        top_p: tf.Tensor,
        forced: tf.Tensor,
    ) -> tuple[tf.Tensor, tf.Tensor, tuple[tf.Tensor, ...]]:
        return self._generate_impl(logits, states, uniforms, temperature, top_k, top_p, forced)

    def _penalized_impl(
        self,
        logits: tf.Tensor,
        states: tuple[tf.Tensor, ...],
        uniforms: tf.Tensor,
        temperature: tf.Tensor,
        top_k: tf.Tensor,
        top_p: tf.Tensor,
        forced: tf.Tensor,
        counts: tf.Tensor,
        frequency: tf.Tensor,
        presence: tf.Tensor,
        bias: tf.Tensor,
    ) -> tuple[tf.Tensor, tf.Tensor, tuple[tf.Tensor, ...]]:
        penalty = Penalty(counts, frequency, presence, bias)
        return self._generate_impl(logits, states, uniforms, temperature, top_k, top_p, forced, penalty)

    def _generate_impl(
        self,
        logits: tf.Tensor,
        states: tuple[tf.Tensor, ...],
        uniforms: tf.Tensor,
        temperature: tf.Tensor,
        top_k: tf.Tensor,
        top_p: tf.Tensor,
        forced: tf.Tensor | None = None,
        penalty: Penalty | None = None,
    ) -> tuple[tf.Tensor, tf.Tensor, tuple[tf.Tensor, ...]]:
        steps = tf.shape(uniforms)[0]
        rows = strategy(temperature, top_k, top_p)

        # counts: the penalized loop's (B, V) characters drawn so far, one loop variable; none in the plain loops.
        def advance(
            t: tf.Tensor, logits: tf.Tensor, states: tuple, tokens: tf.TensorArray, *counts: tf.Tensor
        ) -> tuple:
            ids = choose_next(
                logits, rows, uniforms[t], None if penalty is None else penalty._replace(counts=counts[0])
            )
            if forced is not None:
                ids = tf.where(forced[t] >= 0, forced[t], ids)
            if counts:
                new = tf.one_hot(ids, self.vocab.size)
                if forced is not None:  # a prompt's forced ids are not counted
                    new *= tf.cast(forced[t] < 0, tf.float32)[:, None]
                counts = (counts[0] + new,)
            logits, states = self.step(ids, states)
            return t + 1, logits, states, tokens.write(t, ids), *counts

        counted = () if penalty is None else (penalty.counts,)
        carry = (tf.constant(0), logits, states, tf.TensorArray(tf.int32, size=steps), *counted)
        if forced is not None:
            prompt_ids = forced  # not None inside the closure, for the type checker

            def read(
                t: tf.Tensor, logits: tf.Tensor, states: tuple, tokens: tf.TensorArray, *counts: tf.Tensor
            ) -> tuple:
                logits, states = self.step(prompt_ids[t], states)
                return t + 1, logits, states, tokens.write(t, prompt_ids[t]), *counts

            # The first steps, in which every row reads its prompt, draw nothing: a lone request's prompt costs a
            # reading step, 72-80 us at batch 1 against 100-124 for a step that draws and discards (alternating runs).
            reading = tf.reduce_sum(tf.math.cumprod(tf.cast(tf.reduce_all(forced >= 0, axis=1), tf.int32)))
            carry = run_unrolled(read, carry, lambda t, *_: reading - t, UNROLL)
        _, logits, states, tokens, *_ = run_unrolled(advance, carry, lambda t, *_: steps - t, UNROLL)
        return tf.transpose(tokens.stack()), logits, states

    # Sampler's two steps, through the compiled functions --------------------------------

    def read(self, ids: np.ndarray, states: States) -> tuple[np.ndarray, States]:
        with _tensorflow_errors():
            return _numpy(self.feed_concrete(tf.constant(ids, tf.int32), _tensors(states)))

    def read_logits(self, ids: np.ndarray, states: States) -> tuple[np.ndarray, States]:
        with _tensorflow_errors():
            return _numpy(self.logits_concrete(tf.constant(ids, tf.int32), _tensors(states)))

    def generate_steps(
        self,
        logits: np.ndarray,
        states: States,
        uniforms: np.ndarray,
        settings: RowSettings,
        forced: np.ndarray | None = None,
        counts: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray, States]:
        with _tensorflow_errors():
            if settings.penalties is not None:
                penalized = self._traced("penalized", self.penalized_function)
                return _call_penalized(penalized, logits, states, uniforms, settings, forced, counts)
            if forced is None:
                return _call_generate(self.generate_concrete, logits, states, uniforms, settings)
            return _call_generate(self._traced("forced", self.forced_function), logits, states, uniforms, settings,
                                  forced)  # fmt: skip

    def _traced(self, name: str, function: Any) -> Any:
        """``function``'s concrete function, traced the first time a call needs it (kept as ``name``)."""
        with self.trace_lock:
            if name not in self.traced:
                self.traced[name] = function.get_concrete_function()
            return self.traced[name]


class SavedModelGenerator(Sampler):
    """A ``Generator`` loaded from a SavedModel that ``textgen export --format savedmodel`` wrote: the
    same compiled functions, kept in the SavedModel beside its serving signatures."""

    concurrent_calls = True  # TensorFlow runs concurrent calls of a function

    def __init__(self, cfg: ModelConfig, vocab: Vocabulary, path: Path) -> None:
        super().__init__(cfg, vocab)
        self.path = path
        self.loaded = tf.saved_model.load(str(path))
        self.feed_concrete = self.loaded.feed.get_concrete_function()  # see Generator.__init__
        self.generate_concrete = self.loaded.generate_chunk.get_concrete_function()
        # An export from before the server took one setting for all rows (scalars, not one per row).
        self.per_row = self.generate_concrete.structured_input_signature[0][3].shape.rank == 1
        forced = getattr(self.loaded, "generate_forced", None)  # an export from before textgen serve has none
        self.forced_concrete = None if forced is None else forced.get_concrete_function()
        penalized = getattr(self.loaded, "generate_penalized", None)  # nor one from before the penalties
        self.penalized_concrete = None if penalized is None else penalized.get_concrete_function()

    def read(self, ids: np.ndarray, states: States) -> tuple[np.ndarray, States]:
        with _tensorflow_errors(self.path):
            return _numpy(self.feed_concrete(tf.constant(ids, tf.int32), _tensors(states)))

    def generate_steps(
        self,
        logits: np.ndarray,
        states: States,
        uniforms: np.ndarray,
        settings: RowSettings,
        forced: np.ndarray | None = None,
        counts: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray, States]:
        with _tensorflow_errors(self.path):
            if settings.penalties is not None:
                if self.penalized_concrete is None:
                    raise ConfigError(
                        "this SavedModel was exported before textgen had penalties and logit bias; export it again"
                    )
                return _call_penalized(self.penalized_concrete, logits, states, uniforms, settings, forced, counts)
            if forced is not None:
                if self.forced_concrete is None:
                    raise ConfigError(
                        "this SavedModel was exported before textgen serve could serve one; export it again"
                    )
                return _call_generate(self.forced_concrete, logits, states, uniforms, settings, forced)
            if self.per_row:
                return _call_generate(self.generate_concrete, logits, states, uniforms, settings)
            ids = np.empty([len(logits), len(uniforms)], np.int32)
            new_logits, new_states = np.empty_like(logits), tuple(np.empty_like(s) for s in states)
            for rows in settings.groups():  # rows alike, one call each, with scalar settings
                first = rows[0]
                scalars = (settings.temperature[first], settings.top_k[first], settings.top_p[first])
                ids[rows], new_logits[rows], part = _call_generate(
                    self.generate_concrete, logits[rows], tuple(s[rows] for s in states), uniforms[:, rows], scalars
                )
                for whole, piece in zip(new_states, part, strict=True):
                    whole[rows] = piece
            return ids, new_logits, new_states


@contextlib.contextmanager
def _tensorflow_errors(export: Path | None = None) -> Iterator[None]:
    """TensorFlow's errors while a sampler's functions run, as one line (its own can hold a graph's nodes): out of
    memory, for a batch too big for this machine; from an ``export``'s SavedModel, any other too (one this
    TensorFlow runs otherwise, or damage its manifest cannot see)."""
    try:
        yield
    except tf.errors.ResourceExhaustedError as exc:
        raise GenerationError(
            f"TensorFlow ran out of memory while generating ({one_line(exc)}); generate fewer samples at once"
        ) from None
    except tf.errors.OpError as exc:
        if export is None:
            raise
        raise GenerationError(f"TensorFlow failed running {export} ({one_line(exc)}); export the run again") from None


def _tensors(states: States) -> tuple[tf.Tensor, ...]:
    return tuple(tf.constant(s, tf.float32) for s in states)


def _numpy(result: tuple[tf.Tensor, tuple[tf.Tensor, ...]]) -> tuple[np.ndarray, States]:
    logits, states = result
    return logits.numpy(), tuple(s.numpy() for s in states)


def _call_generate(
    function: Any,
    logits: np.ndarray,
    states: States,
    uniforms: np.ndarray,
    settings: RowSettings | tuple[np.generic, np.generic, np.generic],
    forced: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, States]:
    ids, new_logits, new_states = function(*_generate_arguments(logits, states, uniforms, settings, forced))
    return ids.numpy(), new_logits.numpy(), tuple(s.numpy() for s in new_states)


def _generate_arguments(
    logits: np.ndarray,
    states: States,
    uniforms: np.ndarray,
    settings: RowSettings | tuple[np.generic, np.generic, np.generic],
    forced: np.ndarray | None = None,
) -> list[Any]:
    """A generation function's arguments as tensors (``forced`` last, if given)."""
    temperature, top_k, top_p = (
        (settings.temperature, settings.top_k, settings.top_p) if isinstance(settings, RowSettings) else settings
    )
    arguments = [
        tf.constant(logits, tf.float32),
        _tensors(states),
        tf.constant(uniforms, tf.float32),
        tf.constant(temperature, tf.float32),
        tf.constant(top_k, tf.int32),
        tf.constant(top_p, tf.float32),
    ]
    if forced is not None:
        arguments.append(tf.constant(forced, tf.int32))
    return arguments


def _call_penalized(
    function: Any,
    logits: np.ndarray,
    states: States,
    uniforms: np.ndarray,
    settings: RowSettings,
    forced: np.ndarray | None,
    counts: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray, States]:
    """``_call_generate`` for the penalized loop: forced ids (all -1 without), the counts so far and the penalties."""
    penalties = settings.penalties
    if penalties is None or counts is None:
        raise ValueError("the penalized loop needs the rows' penalties and their counts so far")
    if forced is None:
        forced = np.full(uniforms.shape, -1, np.int32)
    extra = (counts, penalties.frequency, penalties.presence, penalties.bias)
    ids, new_logits, new_states = function(
        *_generate_arguments(logits, states, uniforms, settings, forced), *(tf.constant(a, tf.float32) for a in extra)
    )
    return ids.numpy(), new_logits.numpy(), tuple(s.numpy() for s in new_states)


def _lstm_cell(
    x_projection: tf.Tensor,
    h: tf.Tensor,
    c: tf.Tensor,
    recurrent_blocks: Sequence[tf.Tensor],
    norm: tuple[tf.Tensor, ...] | None,
) -> tuple[tf.Tensor, tf.Tensor]:
    """One step of Keras' LSTM cell (layer-normalized with ``norm``'s gains and shift), the recurrent kernel given
    as column blocks: independent matmuls the executor runs on both cores at once, each block small enough to stay
    in one core's L2 cache."""
    recurrent_projection = tf.concat([tf.matmul(h, block) for block in recurrent_blocks], axis=-1)
    if norm is None:
        h, c, _ = lstm_cell(x_projection + recurrent_projection, c)
    else:
        _, recurrent_gain, cell_gain, cell_shift = norm
        z = x_projection + layer_norm(recurrent_projection, recurrent_gain)
        h, c, _ = lstm_cell(z, c, (cell_gain, cell_shift))
    return h, c
