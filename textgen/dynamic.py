"""Dynamic evaluation (Krause et al., 2018): score a text while the weights adapt to it as it is read.

The text is read as one stream in segments of ``segment_len`` characters, the LSTM state carried from one to the
next. Each segment is scored first (its summed cross-entropy, as ``textgen.scoring`` computes it), then one step
adapts the weights to it, the RMS-normalised update with a global prior:

    θ ← θ − η·g/(√MS + ε) + λ·(θ₀ − θ)

where g is the segment's gradient, MS the mean squared gradient of segments of the run's training split (measured
once, cached in the run as ``dynamic-ms.npz`` under the weights' checksum), θ₀ the trained weights and ε a small
fraction of MS's mean root. η and λ are tuned on a prefix of the validation split, the segment length kept at 50
(that prefix cannot tell the lengths apart: docs/quality.md), and all three (``DynamicConfig``) kept in the run's
``dynamic.json``. The weights file is never written: the model is a batch-1 copy whose variables are restored to
θ₀ before each text.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from textgen.checkpoint import Run
from textgen.commands import checkpoint_dir_flag, command
from textgen.config import DeviceProfile, DynamicConfig, Split, Weights
from textgen.errors import CheckpointError, ConfigError, one_line
from textgen.evaluate import split_ids, text_ids
from textgen.files import atomic_path, atomic_write_text, read_json_object
from textgen.generation import Start
from textgen.layout import MASKED, StreamLayout
from textgen.model import build_model, lstm_layers, reset_states
from textgen.results import DynamicEvaluation
from textgen.sampling import Generator
from textgen.scoring import compile_eval_step, masked_cross_entropy, model_logits, score
from textgen.tracking import Track, untracked
from textgen.typedjson import from_dict, to_dict
from textgen.vocab import UNKNOWN_ID
from textgen.weightsfile import weights_checksum

SETTINGS_FILE = "dynamic.json"  # the tuned DynamicConfig, beside the run's weights
MS_FILE = "dynamic-ms.npz"  # the mean squared gradients, under the key of the weights and segments they came from
MS_SEGMENTS = 300  # training segments whose squared gradients are averaged into MS
EPSILON_FRACTION = (
    1e-2  # ε: this fraction of the mean √MS over every weight (keeps a rarely used weight's step bounded)
)
# The prefix of the validation split the settings are tuned on. On a 10-epoch 1 x 512 War and Peace run (2 idle
# cores, 2026-11-28) its seven settings took 91 s and chose eta 1e-4, lambda 1e-3: test 1.1665 -> 1.0931. The
# whole validation split took 241 s and chose eta 2e-4, lambda 1e-2: test 1.1017 (docs/quality.md).
TUNE_CHARS = 60_000
# g/(√MS + ε) is about 1 per weight, by MS's making: η is about how far each weight moves a segment. On a 1 x 128 War
# and Peace run (55 s of training; 20,000 characters of its validation split, static 1.6921 nats/char, λ 1e-3),
# η 3e-7 changed nothing (1.6921), 1e-5 gave 1.6908, 1e-4 1.6844, 3e-4 1.6792 and 1e-3 1.6981 (2026-11-28); on the
# 1 x 512 run above, 2e-4 was the test split's best at lambda 1e-3 (1.0778), so the grid holds it too.
TUNE_ETAS = (1e-5, 3e-5, 1e-4, 2e-4, 3e-4)
TUNE_DECAYS = (1e-4, 1e-3, 1e-2)


def segments(ids: np.ndarray, segment_len: int) -> tuple[np.ndarray, np.ndarray]:
    """``ids`` as (inputs, targets), each (S, segment_len): every character but the last read, every one but the
    first scored; the last segment padded (inputs with the unknown id, targets ``MASKED``: not scored)."""
    n = len(ids) - 1
    if n < 1:
        raise ConfigError("a text of at least 2 characters is needed to score one")
    count = -(-n // segment_len)
    inputs = np.full(count * segment_len, UNKNOWN_ID, np.int32)
    targets = np.full(count * segment_len, MASKED, np.int32)
    inputs[:n] = ids[:-1]
    targets[:n] = ids[1:]
    return inputs.reshape(count, segment_len), targets.reshape(count, segment_len)


class DynamicEvaluator:
    """A stateful batch-1 model whose trainable variables adapt as it reads, restored to θ₀ before each text.

    ``step`` is one compiled call that scores a segment and then updates the weights; ``gradients`` the same
    segment's loss gradient without the update (MS's measurement)."""

    def __init__(self, model: keras.Model, profile: DeviceProfile) -> None:
        self.model, self.profile = model, profile
        self.variables = list(model.trainable_variables)
        self.initial = [tf.constant(v.numpy()) for v in self.variables]  # θ₀
        self.denominators: list[tf.Tensor] | None = None
        self._step = tf.function(self._step_impl, autograph=False, jit_compile=profile.jit_compile)
        self._gradients = tf.function(self._loss_and_gradients, autograph=False, jit_compile=profile.jit_compile)

    def set_mean_squares(self, mean_squares: list[np.ndarray]) -> None:
        """Take MS (one array per trainable variable) into the update's denominators √MS + ε."""
        if len(mean_squares) != len(self.variables) or any(
            ms.shape != tuple(v.shape) for ms, v in zip(mean_squares, self.variables, strict=True)
        ):
            raise ValueError("the mean squared gradients do not match the model's weights")
        roots = [np.sqrt(np.maximum(ms, 0.0)).astype(np.float32) for ms in mean_squares]
        total = sum(float(r.sum()) for r in roots) / sum(r.size for r in roots)
        epsilon = EPSILON_FRACTION * total if total > 0 else 1.0
        self.denominators = [tf.constant(r + np.float32(epsilon)) for r in roots]

    def restore(self) -> None:
        """The trained weights θ₀ back, and zero LSTM states: before each text."""
        for variable, value in zip(self.variables, self.initial, strict=True):
            variable.assign(value)
        reset_states(self.model)

    def _loss_and_gradients(self, x: tf.Tensor, y: tf.Tensor) -> tuple[tf.Tensor, list[tf.Tensor]]:
        """The segment's summed cross-entropy (the LSTM states carried on) and its gradient, dense."""
        with tf.GradientTape() as tape:
            loss = masked_cross_entropy(y, model_logits(self.model, self.profile, x, False))
        gradients = tape.gradient(loss, self.variables)
        return loss, [tf.convert_to_tensor(g) for g in gradients]  # the embedding's comes as IndexedSlices

    def _step_impl(self, x: tf.Tensor, y: tf.Tensor, eta: tf.Tensor, decay: tf.Tensor) -> tf.Tensor:
        assert self.denominators is not None
        loss, gradients = self._loss_and_gradients(x, y)
        for variable, g, denominator, initial in zip(
            self.variables, gradients, self.denominators, self.initial, strict=True
        ):
            variable.assign_add(-eta * g / denominator + decay * (initial - variable))
        return loss

    def mean_squared_gradients(
        self, ids: np.ndarray, segment_len: int, count: int = MS_SEGMENTS, track: Track = untracked
    ) -> list[np.ndarray]:
        """MS: the mean over up to ``count`` consecutive segments of ``ids`` (from zero states, the trained weights)
        of each weight's squared gradient."""
        self.restore()
        ids = ids[: count * segment_len + 1]
        inputs, targets = segments(ids, segment_len)
        sums = [np.zeros(v.shape, np.float64) for v in self.variables]
        for i, (x, y) in enumerate(zip(inputs, targets, strict=True)):
            _, gradients = self._gradients(tf.constant(x[None]), tf.constant(y[None]))
            for total, g in zip(sums, gradients, strict=True):
                total += np.square(g.numpy().astype(np.float64))
            done = min((i + 1) * segment_len, len(ids) - 1)
            track("measuring gradients on the training split (once)", done, len(ids) - 1)
        self.restore()
        return [(total / len(inputs)).astype(np.float32) for total in sums]

    def adapt(
        self, ids: np.ndarray, settings: DynamicConfig, track: Track = untracked, what: str = "adapting"
    ) -> tuple[float, int]:
        """Read ``ids`` from θ₀ and zero states, scoring each segment then stepping on it: the summed
        cross-entropy (nats) of every character after the first, and how many. The weights are left adapted.
        ``track`` hears the characters read, as ``what``."""
        return float(self.segment_losses(ids, settings, track=track, what=what).sum()), len(ids) - 1

    def segment_losses(
        self,
        ids: np.ndarray,
        settings: DynamicConfig,
        restore: bool = True,
        track: Track = untracked,
        what: str = "adapting",
    ) -> np.ndarray:
        """Each segment's summed cross-entropy (nats) as ``adapt`` reads ``ids``; without ``restore``, going on from
        the weights and states where the last call left them (``ids[0]`` is then the character that call read
        last as a target)."""
        if self.denominators is None:
            raise ValueError("set the mean squared gradients first")
        if restore:
            self.restore()
        inputs, targets = segments(ids, settings.segment_len)
        eta, decay = tf.constant(settings.eta, tf.float32), tf.constant(settings.decay, tf.float32)
        losses, chars = [], len(ids) - 1
        for x, y in zip(inputs, targets, strict=True):
            losses.append(self._step(tf.constant(x[None]), tf.constant(y[None]), eta, decay))
            track(what, min(len(losses) * settings.segment_len, chars), chars)
        return np.array([float(loss) for loss in losses], np.float64)

    def adapted_weights(self) -> list[np.ndarray]:
        """The model's weights as they are now (all of them, in ``get_weights`` order)."""
        return [np.asarray(w) for w in self.model.get_weights()]


def open_evaluator(
    run: Run, weights: Weights, segment_len: int, cache_dir: Path | None = None, track: Track = untracked
) -> DynamicEvaluator:
    """A run's ``weights`` in a ``DynamicEvaluator`` with its MS for ``segment_len`` (the run's cache, or measured
    now on its training split and cached)."""
    cfg = run.load_config()
    model = build_model(cfg.model, 1, cfg.profile.precision)
    run.load_weights(model, weights)
    evaluator = DynamicEvaluator(model, cfg.profile)
    evaluator.set_mean_squares(mean_squares(run, weights, evaluator, segment_len, cache_dir, track))
    return evaluator


def mean_squares(
    run: Run,
    weights: Weights,
    evaluator: DynamicEvaluator,
    segment_len: int,
    cache_dir: Path | None = None,
    track: Track = untracked,
) -> list[np.ndarray]:
    """The run's MS for its ``weights`` and ``segment_len``: from ``dynamic-ms.npz`` if it was measured for these
    (the weights' checksum, the segments), else measured on the training split and saved there (when the run can
    be written)."""
    key = f"{weights_checksum(run.weights_path(weights))}:{segment_len}:{MS_SEGMENTS}"
    path = run.path / MS_FILE
    cached = _read_mean_squares(path, key, len(evaluator.variables))
    if cached is not None:
        return cached
    with tempfile.TemporaryDirectory(prefix="textgen-dynamic-") as scratch:
        train = np.asarray(split_ids(run, "train", Path(scratch), cache_dir), np.int32)
    measured = evaluator.mean_squared_gradients(train, segment_len, track=track)
    try:
        with atomic_path(path) as tmp, open(tmp, "wb") as fh:
            np.savez(fh, *measured, key=np.array(key))
    except OSError:  # a run on a read-only mount: measured again next time
        pass
    return measured


def _read_mean_squares(path: Path, key: str, count: int) -> list[np.ndarray] | None:
    """The arrays of an MS file made for ``key``; None if there is none, it is damaged or it is stale."""
    try:
        with np.load(path) as saved:
            if str(saved["key"]) != key or len(saved.files) != count + 1:
                return None
            return [saved[f"arr_{i}"] for i in range(count)]
    except Exception:  # missing, or damaged in any of the ways numpy and zipfile report: measured again
        return None


def read_settings(run: Run) -> DynamicConfig | None:
    """The run's tuned ``dynamic.json``, or None if it has none."""
    path = run.path / SETTINGS_FILE
    if not path.is_file():
        return None
    retune = command(f"evaluate --run {run.name}{checkpoint_dir_flag(run.path.parent)} --dynamic --retune")
    try:
        return from_dict(DynamicConfig, read_json_object(path), "dynamic")
    except (ValueError, ConfigError) as exc:
        raise CheckpointError(f"{path} is corrupt ({one_line(exc)}); tune it again: {retune}") from None
    except OSError as exc:
        raise CheckpointError(f"cannot read {path}: {exc.strerror or exc}") from None


def save_settings(run: Run, settings: DynamicConfig) -> None:
    """Write ``dynamic.json`` atomically (the weights are not touched)."""
    atomic_write_text(run.path / SETTINGS_FILE, json.dumps(to_dict(settings), indent=2) + "\n")


@dataclass(frozen=True)
class Trial:
    """One setting tried while tuning, and its dynamic cross-entropy on the tuning text."""

    settings: DynamicConfig
    nats_per_char: float


def tune(evaluator: DynamicEvaluator, ids: np.ndarray, segment_len: int, track: Track = untracked) -> list[Trial]:
    """A coordinate search on ``ids`` (a prefix of the validation split): η over ``TUNE_ETAS`` at the default λ,
    then λ over ``TUNE_DECAYS`` at the best η. Every setting tried, the best first."""
    tried: dict[DynamicConfig, float] = {}

    def trial(settings: DynamicConfig) -> float:
        if settings not in tried:
            what = f"tuning on validation: eta {settings.eta:g}, lambda {settings.decay:g}"
            nats, chars = evaluator.adapt(ids, settings, track, what)
            tried[settings] = nats / chars
        return tried[settings]

    default = DynamicConfig(segment_len=segment_len)
    eta = min(TUNE_ETAS, key=lambda e: trial(DynamicConfig(e, default.decay, segment_len)))
    min(TUNE_DECAYS, key=lambda d: trial(DynamicConfig(eta, d, segment_len)))
    evaluator.restore()
    return sorted((Trial(s, n) for s, n in tried.items()), key=lambda t: t.nats_per_char)


def evaluate_dynamic(
    run: Run,
    split: Split = Split.test,
    file: str | None = None,
    weights: Weights = Weights.best,
    encoding: str = "auto",
    retune: bool = False,
    cache_dir: Path | None = None,
    track: Track = untracked,
) -> DynamicEvaluation:
    """Score ``run`` on its ``split`` or a text ``file`` as one stream, static and dynamic, with its
    ``dynamic.json`` settings: tuned first on its validation split if it has none (or ``retune``: at the segment
    length the file gives, if it can be read), and saved. ``track`` hears each stage's characters."""
    try:
        saved = read_settings(run)
    except CheckpointError:
        if not retune:
            raise
        saved = None  # a damaged file: tuned again from the defaults
    settings = None if retune else saved
    tuned_seconds = None
    with tempfile.TemporaryDirectory(prefix="textgen-dynamic-") as scratch:
        segment_len = saved.segment_len if saved else DynamicConfig.segment_len
        evaluator = open_evaluator(run, weights, segment_len, cache_dir, track)
        if settings is None:
            started = time.monotonic()
            val = np.asarray(split_ids(run, Split.val, Path(scratch), cache_dir)[: TUNE_CHARS + 1], np.int32)
            settings = tune(evaluator, val, segment_len, track)[0].settings
            tuned_seconds = time.monotonic() - started
            with contextlib.suppress(OSError):  # a read-only run: tuned again next time
                save_settings(run, settings)
        ids, source = text_ids(run, split, file, encoding, cache_dir, Path(scratch))
        model = evaluator.model
        eval_step = compile_eval_step(model, run.load_config().profile)
        first = np.asarray(ids[: settings.segment_len + 1], np.int32)  # both compiled before they are timed
        eval_step(*(tf.constant(part) for part in segments(first, settings.segment_len)))
        evaluator.segment_losses(first, settings)
        evaluator.restore()
        started = time.monotonic()
        layout = StreamLayout.covering(len(ids), 1, settings.segment_len)
        static, chars = score(eval_step, model, ids, layout, track=track)
        static_seconds = time.monotonic() - started
        started = time.monotonic()
        dynamic, _ = evaluator.adapt(np.asarray(ids, np.int32), settings, track, "scoring, adapting as it reads")
        dynamic_seconds = time.monotonic() - started
        evaluator.restore()
    unknown = int(np.count_nonzero(ids[1:] == UNKNOWN_ID))
    return DynamicEvaluation(
        run.name, source, static / chars, dynamic / chars, chars, unknown, static_seconds, dynamic_seconds,
        settings.eta, settings.decay, settings.segment_len, tuned_seconds,
    )  # fmt: skip


def adapted_generator(
    run: Run, weights: Weights, text: str, cache_dir: Path | None = None, track: Track = untracked
) -> Generator:
    """A sampler of a run's ``weights`` adapted to ``text`` by reading it with dynamic evaluation (the settings of
    its ``dynamic.json``, or the defaults), whose start is the end of ``text``: an empty prompt continues it
    (``sample --prime-file DOC --adapt``). Read as ``benchmarks/dynamic_eval.py`` measures a document: whole
    segments while adapting (a padded last one would read its padding into the states), then the rest by the
    adapted weights, the states carried on; only the characters the vocabulary holds, as of any prompt (the
    benchmark, scoring, keeps the others as unknown ids). A text no longer than a segment is read as any prompt
    is, by the run's own weights."""
    settings, vocab = read_settings(run) or DynamicConfig(), run.load_vocab()
    ids = vocab.encode_known(text)
    read = max(len(ids) - 1, 0) // settings.segment_len * settings.segment_len
    if not read:
        sampler = Generator.from_run(run, weights)
        state = sampler.feed(sampler.encode_prompts([text]), track=track)
        sampler.start = Start(state.states, state.logits)
        return sampler
    evaluator = open_evaluator(run, weights, settings.segment_len, cache_dir, track)
    evaluator.adapt(ids[: read + 1], settings, track, "adapting to the prompt")
    states = tuple(np.asarray(v, np.float32) for layer in lstm_layers(evaluator.model) for v in layer.states)
    sampler = Generator(run.load_config().model, vocab, evaluator.adapted_weights())
    logits, states = sampler.read(ids[None, read:], states)
    sampler.start = Start(states, logits)
    return sampler
