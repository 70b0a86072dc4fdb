"""The training loop: plan a run (new or resumed), train it epoch by epoch, report how it ended.

A custom loop rather than ``model.fit``, for four reasons:

* **mid-epoch resume**: a run stopped by Ctrl-C or a time budget continues at the batch where it
  stopped, with its optimizer state (``fit`` restarts the epoch; ``BackupAndRestore`` with
  ``save_freq`` restores the weights but restarts at batch 0);
* **a wall-clock budget**, checked after every batch, with a learning-rate schedule that anneals by its end;
* **the fast LSTM step** (``textgen.fastlstm``), a hand-written forward and backward pass that
  ``fit`` would need an overridden ``train_step`` for anyway;
* **tf.distribute**: under ``MultiWorkerMirroredStrategy`` Keras 3.15's ``fit`` fails while a loop
  over ``strategy.run`` works; the steps here already run that way with the per-replica batch.

Keras' callbacks (early stopping, the plateau schedule, CSV and TensorBoard logs, the run's
checkpoint) are driven by the loop through a ``CallbackList``; progress goes to a
``TrainingProgress`` that the caller passes in (the CLI's live display), so the library never prints.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import keras
import numpy as np
import tensorflow as tf

from textgen import config as cfgmod
from textgen.checkpoint import (
    Run,
    RunLock,
    check_corpus_unchanged,
    discard_reserved,
    ensure_writable,
    find_run,
    reserve_run,
    resume_hint,
)
from textgen.cluster import replica_sum
from textgen.config import (
    DataConfig,
    DeviceProfile,
    DistillConfig,
    ModelConfig,
    PruneConfig,
    RunConfig,
    TrainConfig,
    check_fits_in_memory,
    format_seconds,
    longer_budget,
    settings_given,
)
from textgen.corpus import corpus_fingerprint, corpus_stem, resolve_corpora, resolve_encoding, same_codec
from textgen.data import Splits, StreamLayout, distributed_batches, load_splits
from textgen.errors import ClusterError, ConfigError, TrainingDiverged, TrainingInterrupted
from textgen.files import atomic_write_text
from textgen.idcache import cache_root
from textgen.model import LAYER_NORM_WEIGHTS, build_model, lstm_layers, reset_states
from textgen.plot import loss_chart, read_history
from textgen.results import EpochLog, StopReason, TrainResult, bits
from textgen.scoring import EvalStep, compile_eval_step, model_logits, score, summed_cross_entropy


@dataclass
class TrainPlan:
    """What ``train`` will do: the run, its config, its data, and where it resumes."""

    run: Run
    config: RunConfig
    splits: Splits
    resume_state: dict[str, Any] | None = None
    lock: RunLock | None = None  # held from planning until ``train`` returns: one writer per run
    chief: bool = True  # False for the other workers of a multi-worker run: their run is a scratch copy

    def saved_note(self) -> str:
        """Where the run was saved and how to continue it, for messages."""
        if not self.chief:
            return "the chief worker saved the run; start every worker again with the same command and --resume"
        return f"saved {self.run.path}; {resume_hint(self.run)}"


class TrainingProgress(Protocol):
    """What the loop reports as it goes (the CLI's live display implements it)."""

    def start(self, plan: TrainPlan, steps: int) -> None: ...
    def epoch_begin(self, epoch: int, first_batch: int) -> None: ...
    def batch_end(self, batch: int, loss: float) -> None: ...
    def validating(self) -> None: ...
    def epoch_end(self, log: EpochLog) -> None: ...
    def end(self) -> None: ...  # also after Ctrl-C or an error


class InterimValidation(Protocol):
    """Validation between epochs' ends, for a caller that judges a run by its curve (``textgen tune``'s pruner):
    ``due`` is asked after each batch with the run's training seconds, and ``report`` may stop training by
    raising."""

    def due(self, seconds: float) -> bool: ...
    def report(self, seconds: float, val_loss: float) -> None: ...


class NoProgress:
    """A ``TrainingProgress`` that reports nothing."""

    def start(self, plan: TrainPlan, steps: int) -> None: ...
    def epoch_begin(self, epoch: int, first_batch: int) -> None: ...
    def batch_end(self, batch: int, loss: float) -> None: ...
    def validating(self) -> None: ...
    def epoch_end(self, log: EpochLog) -> None: ...
    def end(self) -> None: ...


# --- planning ---------------------------------------------------------------------------


def plan_training(
    corpus: str | list[str] | None,
    profile: DeviceProfile,
    *,
    checkpoint_dir: Path,
    run_name: str | None = None,
    resume: bool = False,
    download: bool = False,
    keep_boilerplate: bool = False,
    encoding: str = "auto",
    data: dict[str, Any] | None = None,
    model: dict[str, Any] | None = None,
    training: dict[str, Any] | None = None,
    cache_dir: Path | None = None,
    distill: dict[str, Any] | None = None,
    prune: dict[str, Any] | None = None,
) -> TrainPlan:
    """Resolve the corpus (files, directories, globs) and configs for a new run, or reload a run to resume;
    either way the run is locked for this process until ``train`` returns. With ``distill`` (``teacher``, a run
    name, and ``DistillConfig``'s settings) or ``prune`` (``source``, a run name, and ``PruneConfig``'s), the new
    run trains on that run's corpus, splits and vocabulary.

    ``data``, ``model`` and ``training`` hold only the settings the user gave (``None`` values are
    ignored). On resume, only epochs, time budget, save interval and strategy may change. Encoded
    corpora are cached in ``cache_dir`` (by default ``idcache.cache_root(checkpoint_dir)``).
    """
    cache_dir = cache_dir or cache_root(checkpoint_dir)
    names = [corpus] if isinstance(corpus, str) else list(corpus or [])
    data, model, training = (settings_given(d or {}) for d in (data, model, training))
    ensure_writable(checkpoint_dir)
    if resume:
        run = find_run(checkpoint_dir, run_name)
        lock = run.lock()  # before anything is read: a second trainer of the run stops here, at once
        try:
            return _plan_resume(run, lock, names, encoding, {**data, **model}, training, cache_dir)
        except BaseException:
            lock.release()
            raise
    if distill or prune:
        return _plan_derived(checkpoint_dir, run_name, profile, data, model, training, cache_dir, distill, prune)
    if not names:
        raise ConfigError("give a corpus to train on, e.g. textgen train 2600-0.txt")
    files = resolve_corpora(names, download=download)
    run, lock = reserve_run(checkpoint_dir, run_name, corpus_stem(names, files))  # before the corpus is encoded
    try:
        data_cfg = new_data_config(
            names, files, keep_boilerplate, encoding, **{"batch_size": profile.batch_size, **data}
        )
        splits = load_splits(data_cfg, cache_dir, train_streams=data_cfg.batch_size * _accumulate(training))
        model_cfg = ModelConfig(vocab_size=splits.vocab.size, **model)
        check_fits_in_memory(model_cfg)
        config = RunConfig(data_cfg, model_cfg, TrainConfig.of(**training), profile)
        run.create(config, splits.vocab)
    except BaseException:
        discard_reserved(run, lock)
        raise
    return TrainPlan(run, config, splits, lock=lock)


def new_data_config(
    names: list[str], files: list[Path], keep_boilerplate: bool, encoding: str, **data: Any
) -> DataConfig:
    """The data config of a new run on ``files`` (resolved from ``names``), fingerprinted, with each file's codec."""
    size, digest = corpus_fingerprint(files)
    codecs = {resolve_encoding(f, encoding) for f in files}
    return DataConfig(
        corpus=str(files[0]) if len(files) == 1 else " ".join(names),
        files=tuple(str(f) for f in files) if len(files) > 1 else (),
        strip_boilerplate=not keep_boilerplate,
        encoding=codecs.pop() if len(codecs) == 1 else "auto",
        corpus_size=size,
        corpus_hash=digest,
        **data,
    )


def _plan_derived(
    checkpoint_dir: Path,
    run_name: str | None,
    profile: DeviceProfile,
    data: dict[str, Any],
    model: dict[str, Any],
    training: dict[str, Any],
    cache_dir: Path,
    distill: dict[str, Any] | None,
    prune: dict[str, Any] | None,
) -> TrainPlan:
    """A new run made from another: a student of a teacher run (``distill``), or a pruned copy of a run
    (``prune``), on that run's corpus, splits and vocabulary."""
    settings = settings_given(distill or prune or {})
    base = find_run(checkpoint_dir, settings.pop("teacher" if distill else "source"), "best")
    base.weights_path("best")  # refused before a run is made from it, not by the first load
    saved = base.load_config()
    if data:
        raise ConfigError(f"a {'distilled' if distill else 'pruned'} run reads the streams of {base.name!r} as it did")
    if prune and model:
        raise ConfigError("a pruned run keeps its model; give --units, --layers and the like to textgen distill")
    if training.get("accumulate", 1) != 1 and distill:
        raise ConfigError("textgen distill does not combine with --accumulate (the teacher reads one batch at a time)")
    check_corpus_unchanged(base, saved.data)
    source = str(base.path.resolve())
    distill_cfg = (
        DistillConfig(teacher=source, teacher_val_loss=base.best_weights_loss(), **settings) if distill else None
    )
    prune_cfg = PruneConfig(source=source, **settings) if prune else None
    if distill_cfg:
        stem = f"{base.name}-{model.get('units', saved.model.units)}u"
    else:
        assert prune_cfg is not None
        stem = f"{base.name}-pruned{round(100 * prune_cfg.sparsity)}"
    run, lock = reserve_run(checkpoint_dir, run_name, stem)
    try:
        vocab = base.load_vocab()
        splits = load_splits(saved.data, cache_dir, vocab, train_streams=saved.data.batch_size * _accumulate(training))
        model_cfg = cfgmod.replace(saved.model, **model) if distill else saved.model
        check_fits_in_memory(model_cfg)
        config = RunConfig(saved.data, model_cfg, TrainConfig.of(**training), profile, distill_cfg, prune_cfg)
        run.create(config, vocab)
    except BaseException:
        discard_reserved(run, lock)
        raise
    return TrainPlan(run, config, splits, lock=lock)


def _accumulate(training: dict[str, Any]) -> int:
    return int(training.get("accumulate", TrainConfig.accumulate))


RESUMABLE_CHANGES = {"epochs", "time_budget", "save_every", "strategy"}


def _plan_resume(
    run: Run,
    lock: RunLock,
    corpus: list[str],
    encoding: str,
    given: dict[str, Any],
    training: dict[str, Any],
    cache_dir: Path,
) -> TrainPlan:
    """Reload a locked run to continue it; only its epochs, time budget, save interval and strategy may change.

    A run with no state.json (killed before its first save) starts again from scratch; a damaged one is
    reported.
    """
    saved = run.load_config()
    if corpus:
        given_files, saved_files = resolve_corpora(corpus), [Path(p).resolve() for p in saved.data.paths]
        if given_files != saved_files:
            added, removed = set(given_files) - set(saved_files), set(saved_files) - set(given_files)
            differ = (
                f" ({len(added)} file(s) added, {len(removed)} gone)" if added or removed else " (in another order)"
            )
            differ = differ if len(given_files) > 1 or len(saved_files) > 1 else ""
            raise ConfigError(
                f"run {run.name!r} trains on {saved.data.corpus_name}, not {' '.join(corpus)}{differ}; "
                "drop the corpus to resume it, or start a new run without --resume"
            )
    if encoding.lower() != "auto" and (saved.data.encoding == "auto" or not same_codec(encoding, saved.data.encoding)):
        given = {**given, "encoding": encoding}
    given = {**given, **{k: v for k, v in training.items() if k not in RESUMABLE_CHANGES}}
    saved_values = {**asdict(saved.data), **asdict(saved.model), **asdict(saved.training)}
    changed = sorted(k for k, v in given.items() if v != saved_values[k])
    if changed:
        flags = ", ".join(cfgmod.flag(k) for k in changed)
        was = ", ".join(cfgmod.flag_setting(k, saved_values[k]) for k in changed)
        raise ConfigError(
            f"{flags} cannot change when resuming run {run.name!r} (it has {was}); drop them or start a new run"
        )
    check_corpus_unchanged(run, saved.data)
    config = dataclasses.replace(saved, training=cfgmod.replace(saved.training, **training))
    splits = load_splits(config.data, cache_dir, run.load_vocab(), train_streams=config.train_streams)
    state = None
    if run.has_state():
        run.check_usable()  # a damaged resume point is reported, never silently replaced
        state = run.load_state()
        _check_room_to_train(run.name, config.training, state, saved.training.time_budget)
    else:  # stopped before its first save: start it cleanly
        run.start_over()
    return TrainPlan(run, config, splits, state, lock)


def _check_room_to_train(name: str, training: TrainConfig, state: dict[str, Any], saved_budget: float | None) -> None:
    """Refuse to resume a run that has done all its epochs, or has trained as long as its time budget, saying what
    to add. Only a run killed past its own budget before validating its last epoch resumes, to validate it; a
    budget given now that the run has already spent is refused, not saved."""
    trained, budget = float(state.get("seconds", 0.0)), training.time_budget
    what, add = [], []
    if state["epoch"] >= training.epochs:
        what.append(f"all {training.epochs} epochs")
        add.append(f"--epochs {state['epoch'] + 10} (or more)")
    if budget is not None and trained >= budget and (state.get("finished") is not None or budget != saved_budget):
        limit = f"--time-budget {format_seconds(budget)}"
        what.append(
            f"{format_seconds(trained)} of training, "
            + (f"its {limit}" if budget == saved_budget else f"more than the {limit} given")
        )
        add.append(f"--time-budget {longer_budget(trained)} (the run's in all)")
    if what:
        raise ConfigError(f"run {name!r} has done {' and '.join(what)}; add {' and '.join(add)} to train it further")


def _keep_extension(run: Run, config: RunConfig) -> None:
    """Save the epochs and time budget a resume gave with the run, so that a plain ``--resume`` after it keeps
    them (not its strategy or save interval: those say how one invocation runs, not what the run is)."""
    saved = run.load_config()
    kept = dataclasses.replace(saved.training, epochs=config.training.epochs, time_budget=config.training.time_budget)
    if kept != saved.training:
        run.save_config(dataclasses.replace(saved, training=kept))


# --- the model and its compiled steps -----------------------------------------------------


@dataclass
class Trainer:
    """A model with its optimizer and compiled steps, under a ``tf.distribute`` strategy."""

    model: keras.Model
    optimizer: keras.optimizers.Optimizer
    train_step: Callable[[Any, Any], tf.Tensor]  # (inputs, targets) per replica -> mean loss, after one update
    eval_step: EvalStep  # (inputs, targets) per replica -> summed loss
    strategy: tf.distribute.Strategy
    group_states: list[list[keras.Variable]]  # with --accumulate, each group's copy of the LSTM states
    teacher: keras.Model | None = None  # ``textgen distill``'s teacher, reading the same streams
    masks: list[tuple[keras.Variable, keras.Variable]] = field(default_factory=list)  # (kernel, mask) when pruning

    def stream_states(self) -> list[keras.Variable]:
        """Every LSTM state the streams carry from one batch to the next: the model's, the teacher's and each
        accumulation group's."""
        models = [self.model, *([self.teacher] if self.teacher is not None else [])]
        lstms = [layer for m in models for layer in lstm_layers(m)]
        return [v for layer in lstms for v in layer.states] + [v for group in self.group_states for v in group]

    def reset_states(self) -> None:
        """Zero the LSTM states, every accumulation group's and the teacher's included."""
        reset_states(self.model)
        if self.teacher is not None:
            reset_states(self.teacher)
        for group in self.group_states:
            for state in group:
                state.assign(tf.zeros_like(state))


def build_trainer(cfg: RunConfig, strategy: tf.distribute.Strategy | None = None) -> Trainer:
    """The model, optimizer and compiled train/eval steps that ``train`` uses (and the benchmarks time).

    Steps run through ``strategy.run`` on each replica's rows of a batch. With ``--accumulate N`` a
    replica's rows are N groups of streams, each with its own LSTM states (swapped into the model's in
    turn), whose gradients are summed into one update: the update of an N times bigger batch with the
    activation memory of one group. With the profile's ``fast_lstm`` the LSTM runs through
    ``textgen.fastlstm`` on the same variables. A distilled run (``cfg.distill``) also learns the teacher's
    softened predictions; a pruned run (``cfg.prune``) multiplies its kernels by their masks after every update.
    """
    strategy = strategy or tf.distribute.get_strategy()
    tcfg, profile, groups = cfg.training, cfg.profile, cfg.training.accumulate
    chars_per_update = cfg.data.batch_size * groups * cfg.data.seq_len
    replica_batch = cfg.data.batch_size // strategy.num_replicas_in_sync
    with strategy.scope():
        model = build_model(cfg.model, replica_batch, profile.precision)
        optimizer = make_optimizer(tcfg)
        if profile.precision == "mixed_float16":
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        model.compile(optimizer=optimizer)  # callbacks reach the optimizer through model.optimizer
        optimizer.build(model.trainable_variables)
        lstm_states = [v for layer in lstm_layers(model) for v in layer.states]
        group_states = [
            [keras.Variable(tf.zeros_like(v), trainable=False, name=f"group_{g}_state") for v in lstm_states]
            for g in range(groups if groups > 1 else 0)
        ]
        teacher = _teacher_model(cfg, replica_batch) if cfg.distill else None
        masks = [
            (kernel, keras.Variable(tf.ones_like(kernel), trainable=False, name=f"mask_{i}"))
            for i, kernel in enumerate(prunable_kernels(model) if cfg.prune else [])
        ]

    def group_gradients(x: tf.Tensor, y: tf.Tensor, group: int) -> tuple[tf.Tensor, list[tf.Tensor]]:
        # The fast LSTM draws its dropout masks from (seed, step, group): a resumed run draws what an
        # uninterrupted one would. (Keras' own LSTM, on the GPU profile, ignores it.)
        step = tf.cast(optimizer.iterations, tf.int64) * groups + group
        replica = tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group, tf.int64)
        seed = tf.stack([tf.constant(tcfg.seed, tf.int64) + replica * 2**32, step])  # each replica its own masks
        teacher_logits = model_logits(teacher, profile, x, False) if teacher is not None else None
        with tf.GradientTape() as tape:
            logits = model_logits(model, profile, x, True, seed)
            loss = summed_cross_entropy(y, logits) / chars_per_update
            if teacher_logits is not None and cfg.distill is not None:
                soft = soft_cross_entropy(teacher_logits, logits, cfg.distill.temperature) / chars_per_update
                objective = cfg.distill.alpha * loss + (1.0 - cfg.distill.alpha) * soft
            else:
                objective = loss
            scaled = optimizer.scale_loss(objective)
        return loss, tape.gradient(scaled, model.trainable_variables)

    def replica_train_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        if groups == 1:
            loss, gradients = group_gradients(x, y, 0)
        else:
            rows, loss, gradients = x.shape[0] // groups, tf.constant(0.0), None
            for g, states in enumerate(group_states):
                for state, saved in zip(lstm_states, states, strict=True):
                    state.assign(saved)
                part_loss, part = group_gradients(x[g * rows : (g + 1) * rows], y[g * rows : (g + 1) * rows], g)
                for state, saved in zip(lstm_states, states, strict=True):
                    saved.assign(state)
                part = [tf.convert_to_tensor(p) for p in part]  # the embedding's IndexedSlices, made dense
                loss += part_loss
                gradients = part if gradients is None else [a + b for a, b in zip(gradients, part, strict=True)]
        optimizer.apply(gradients, model.trainable_variables)
        return loss

    # Every textgen tf.function is traced without AutoGraph: their loops and branches are tf.while_loop and
    # tf.cond already, and converting the Python cost each process ~1 s (a fresh `textgen sample --length 1`:
    # 4.89 -> 4.19 s; a tiny one-epoch `textgen train`: 7.99 -> 6.60 s; medians of 5 alternating pairs).
    @tf.function(jit_compile=profile.jit_compile, autograph=False)
    def train_step(x: Any, y: Any) -> tf.Tensor:
        loss = strategy.reduce("SUM", strategy.run(replica_train_step, args=(x, y)), axis=None)
        for kernel, mask in masks:  # pruned weights stay exactly zero whatever the optimizer's moments say
            kernel.assign(kernel * mask)
        return loss

    eval_step = compile_eval_step(model, profile, strategy)
    return Trainer(model, optimizer, train_step, eval_step, strategy, group_states, teacher, masks)


def make_optimizer(tcfg: TrainConfig) -> keras.optimizers.Optimizer:
    """The run's optimizer, with global-norm clipping and decoupled weight decay on everything but the biases and
    layer normalization's gains and shifts (decay would pull a gain towards zero, not towards the identity)."""
    # Keras' other optimizers take None for no decay; AdamW insists on a number.
    decay = tcfg.weight_decay if tcfg.optimizer == "adamw" else tcfg.weight_decay or None
    settings = {"learning_rate": tcfg.lr, "global_clipnorm": tcfg.clip_norm, "weight_decay": decay}
    optimizer: keras.optimizers.Optimizer
    if tcfg.optimizer == "sgd":
        optimizer = keras.optimizers.SGD(momentum=tcfg.momentum, nesterov=tcfg.momentum > 0, **settings)
    else:
        kind = {"adam": keras.optimizers.Adam, "adamw": keras.optimizers.AdamW, "rmsprop": keras.optimizers.RMSprop}
        optimizer = kind[tcfg.optimizer](**settings)
    if tcfg.weight_decay:
        optimizer.exclude_from_weight_decay(var_names=["bias", *LAYER_NORM_WEIGHTS])
    return optimizer


def _teacher_model(cfg: RunConfig, batch: int) -> keras.Model:
    """The teacher of a distilled run, with its best weights, stateful on the student's streams."""
    assert cfg.distill is not None
    teacher_run = Run(Path(cfg.distill.teacher))
    recorded, now = cfg.distill.teacher_val_loss, teacher_run.best_weights_loss()
    if recorded is not None and now != recorded:  # its soft targets would change in the middle of the run
        raise ConfigError(
            f"the teacher run {teacher_run.name!r} has other best weights than when this student started "
            f"(validation loss {recorded:.4f} then, {now:.4f} now); start a new student: textgen distill --teacher "
            f"{teacher_run.name}"
        )
    teacher_cfg = teacher_run.load_config()
    teacher = build_model(teacher_cfg.model, batch, cfg.profile.precision)
    teacher_run.load_weights(teacher, "best")
    return teacher


def soft_cross_entropy(teacher_logits: tf.Tensor, logits: tf.Tensor, temperature: float) -> tf.Tensor:
    """Distillation's soft-target term, summed over characters: T^2 x the cross-entropy of the student's
    predictions against the teacher's, both at temperature T (Hinton et al., 2015; T^2 keeps its gradients on
    the scale of the hard term's as T changes). The teacher gets no gradient."""
    soft_targets = tf.stop_gradient(tf.nn.softmax(teacher_logits / temperature))
    return temperature**2 * tf.reduce_sum(tf.nn.softmax_cross_entropy_with_logits(soft_targets, logits / temperature))


def prunable_kernels(model: keras.Model) -> list[keras.Variable]:
    """The weights ``textgen prune`` masks: every LSTM's input and recurrent kernels and the output kernel
    (the embedding and the biases, ~1% of the default model, stay dense)."""
    lstms = [layer.cell for layer in lstm_layers(model)]
    return [v for cell in lstms for v in (cell.kernel, cell.recurrent_kernel)] + [model.get_layer("logits").kernel]


def update_masks(masks: list[tuple[keras.Variable, keras.Variable]], sparsity: float) -> None:
    """Mask the ``sparsity`` fraction of smallest-magnitude weights of each kernel, and zero them.

    Masked weights are exactly zero and stay the smallest, so as the sparsity rises the masked set only grows,
    and masks recomputed from the weights after a resume are the masks that were in force.
    """
    for kernel, mask in masks:
        weights = kernel.numpy()
        pruned = round(sparsity * weights.size)
        keep = np.ones(weights.size, np.float32)
        if pruned:
            keep[np.argpartition(np.abs(weights).ravel(), pruned - 1)[:pruned]] = 0.0
        keep = keep.reshape(weights.shape)
        mask.assign(keep)
        kernel.assign(weights * keep)


# --- the loop ------------------------------------------------------------------------------


def train(
    plan: TrainPlan,
    progress: TrainingProgress | None = None,
    strategy: tf.distribute.Strategy | None = None,
    interim: InterimValidation | None = None,
) -> TrainResult:
    """Train ``plan.run`` until its epochs are done, validation stalls, its time budget ends, or a stop
    signal (Ctrl-C, SIGTERM, SIGHUP; under a multi-worker strategy, on any worker); the run's lock is
    released when it returns. ``interim`` validates mid-epoch when it asks (on one replica only: several
    replicas' stream states cannot be put back)."""
    lock, plan.lock = plan.lock, None  # the lock is this call's: a second train(plan) takes it again
    lock = lock or plan.run.lock()
    strategy = strategy or tf.distribute.get_strategy()
    unsaved: list[Callable[[], None]] = []  # saves where training got, if it got past the last commit
    try:
        with _lost_peers(plan, unsaved) if isinstance(strategy, _MULTI_WORKER) else contextlib.nullcontext():
            interim = interim if strategy.num_replicas_in_sync == 1 else None
            return _train(plan, progress or NoProgress(), strategy, unsaved, interim)
    finally:
        lock.release()


def _train(
    plan: TrainPlan,
    progress: TrainingProgress,
    strategy: tf.distribute.Strategy,
    unsaved: list[Callable[[], None]],
    interim: InterimValidation | None,
) -> TrainResult:
    cfg, run = plan.config, plan.run
    keras.utils.set_random_seed(cfg.training.seed)
    if cfg.data.batch_size % strategy.num_replicas_in_sync:
        raise ConfigError(
            f"--batch-size {cfg.data.batch_size} must divide evenly over {strategy.num_replicas_in_sync} replicas"
        )
    check_same_plan(plan, strategy)
    if plan.chief:
        _keep_extension(run, cfg)
    trainer = build_trainer(cfg, strategy)
    resume = plan.resume_state or {}
    if resume:
        run.load_weights(trainer.model, "last")
        run.load_optimizer(trainer.optimizer)
    elif cfg.prune:  # a pruned run starts from the run it prunes
        Run(Path(cfg.prune.source)).load_weights(trainer.model, "best")
    clock = Clock(before=resume.get("seconds", 0.0), budget=cfg.training.time_budget, agree=compile_agreement(strategy))
    start_epoch, start_batch = resume.get("epoch", 0), resume.get("batch", 0)
    steps = training_layout(plan, start_epoch).batches  # every epoch's, shifted or not
    checkpoint, callbacks = build_callbacks(plan, trainer, steps, clock)

    def after_batch(epoch: int, position: EpochProgress) -> None:
        """Note where training got (for a save if another worker is lost); save it if ``--save-every`` is due."""
        unsaved[:] = [lambda: checkpoint.save_resume_point(epoch, position.batch, clock.elapsed(), position)]
        if time.monotonic() - checkpoint.saved_at >= cfg.training.save_every:
            unsaved.pop()()

    def between_batches() -> None:
        """Validate if ``interim`` asks, then put the training streams' states back for the next batch."""
        if interim is None or not interim.due(clock.elapsed()):
            return
        states = [np.asarray(v) for v in trainer.stream_states()]
        # No callbacks: to them (TensorBoard's logs, say) validation is the epoch's.
        val_loss = validate(trainer, plan.splits.val, cfg.data, keras.callbacks.CallbackList(), progress)
        for variable, value in zip(trainer.stream_states(), states, strict=True):
            variable.assign(value)
        clock.synchronise(stop)
        if not clock.stopping:  # a stop during validation is answered first: the report may end the run
            interim.report(clock.elapsed(), val_loss)  # with its validation's time, as an epoch's is

    stop_reason, epochs_done = StopReason.EPOCHS, start_epoch
    last: EpochLog | None = None
    with _stop_requests() as stop, _end_on_error(callbacks, progress):
        progress.start(plan, steps)
        callbacks.on_train_begin()
        checkpoint.restore(resume)
        for epoch in range(start_epoch, cfg.training.epochs):
            start = (
                EpochProgress(**resume.get("epoch_progress") or {"batch": start_batch})
                if epoch == start_epoch
                else EpochProgress()
            )
            carried = run.load_stream_states() if epoch == start_epoch and resume and checkpoint.stream_states else None
            layout = training_layout(plan, epoch)
            done = run_epoch(
                trainer,
                plan.splits.train,
                layout,
                epoch,
                start,
                callbacks,
                progress,
                stop,
                clock,
                after_batch,
                between_batches,
                carried,
            )
            # Commit the training before validating: a kill during validation costs only the validation.
            checkpoint.save_resume_point(epoch, done.batch, clock.elapsed(), done)
            unsaved.clear()
            if clock.stopping and done.batch < steps:  # after the last batch: end the epoch first
                raise TrainingInterrupted(
                    f"stopped at epoch {epoch + 1}, batch {done.batch}/{steps} ({stop.requested}); {plan.saved_note()}",
                    exit_code=stop.exit_code,
                )
            val_loss = validate(trainer, plan.splits.val, cfg.data, callbacks, progress)
            clock.synchronise(stop)  # every worker decides the same from here on
            last = EpochLog(
                epoch=epoch + 1,
                loss=done.loss,
                bpc=bits(done.loss),
                val_loss=val_loss,
                val_bpc=bits(val_loss),
                chars_per_sec=done.batches * layout.chars_per_batch / max(done.seconds, 1e-9),
                learning_rate=float(tf.convert_to_tensor(trainer.optimizer.learning_rate.value)),
                batches=done.batches,
                seconds=clock.elapsed(),
                improved=val_loss < checkpoint.best_val_loss and checkpoint.eligible(),
                partial=done.batch < steps,
            )
            if not math.isfinite(val_loss):
                raise TrainingDiverged(
                    f"training diverged: the validation loss of epoch {epoch + 1} is {val_loss}; nothing of it was "
                    "saved. Start a new run with a lower --lr or --clip-norm"
                )
            # A time budget that cut the epoch resumes where training stopped, not at the next epoch.
            checkpoint.resume_at = (epoch, done.batch, done) if last.partial else (epoch + 1, 0, None)
            callbacks.on_epoch_end(epoch, last.metrics())  # the checkpoint commits the epoch there
            unsaved.clear()
            epochs_done = epoch + 1
            if clock.expired():  # during the epoch, or validation ran past it: start no epoch just to stop it
                stop_reason = StopReason.TIME_BUDGET
            if trainer.model.stop_training:
                stop_reason = StopReason.EARLY_STOPPING
            more = stop_reason is StopReason.EPOCHS and epoch + 1 < cfg.training.epochs
            interrupted = TrainingInterrupted(  # a stop during validation: the epoch is saved; a last epoch just ends
                f"stopped after epoch {epoch + 1} ({stop.requested}); {plan.saved_note()}", exit_code=stop.exit_code
            )
            try:
                progress.epoch_end(last)
            except Exception:  # an observer ending training (tune's pruner): a stop signal that came first wins
                if clock.stopping and more:
                    raise interrupted from None
                raise
            if clock.stopping and more:
                raise interrupted
            if stop_reason is not StopReason.EPOCHS:
                break
    callbacks.on_train_end(last.metrics() if last else {})
    progress.end()
    checkpoint.mark_finished(stop_reason)
    atomic_write_text(run.loss_curve_path, loss_chart(read_history(run.history_path)))
    return TrainResult(
        run=run.name,
        path=run.path,
        epochs=epochs_done,
        best_val_loss=checkpoint.best_val_loss,
        stop_reason=stop_reason,
        seconds=clock.elapsed(),
        chars_per_sec=last.chars_per_sec if last else 0.0,
        max_epochs=cfg.training.epochs,
        documents=plan.splits.encoded.documents,
        chief=plan.chief,
        unknown_chars=plan.splits.encoded.unknown,
        stop_requested=stop.requested,
    )


@dataclass
class EpochProgress:
    """How far an epoch's training has got, and the sums its history row is made of. Saved with every
    mid-epoch resume point, so the row of an epoch that was resumed covers all of it."""

    batch: int = 0  # the next batch to train
    loss_sum: float = 0.0
    batches: int = 0
    seconds: float = 0.0

    @property
    def loss(self) -> float:
        return self.loss_sum / self.batches if self.batches else math.nan


def training_layout(plan: TrainPlan, epoch: int) -> StreamLayout:
    """The training split's layout in ``epoch``: ``--batch-size`` x ``--accumulate`` streams; with
    ``--shift-windows``, shifted by a draw of the run's seed and the epoch (the same on a resume, on every worker)."""
    n, streams, seq_len = len(plan.splits.train), plan.config.train_streams, plan.config.data.seq_len
    if not plan.config.data.shift_windows:
        return StreamLayout.of(n, streams, seq_len)
    return StreamLayout.shifted(n, streams, seq_len, np.random.default_rng([plan.config.training.seed, epoch]))


def run_epoch(
    trainer: Trainer,
    ids: np.ndarray,
    layout: StreamLayout,
    epoch: int,
    start: EpochProgress,
    callbacks: keras.callbacks.CallbackList,
    progress: TrainingProgress,
    stop: StopRequests,
    clock: Clock,
    after_batch: Callable[[int, EpochProgress], None],
    between_batches: Callable[[], None],
    stream_states: list[np.ndarray] | None = None,
) -> EpochProgress:
    """Train on the epoch's batches from ``start`` on, until they end, a stop is asked for (on any worker),
    or time is up; a mid-epoch resume point is saved whenever ``--save-every`` has passed (``after_batch``), and
    ``between_batches`` runs when the epoch goes on (an interim validation). A resumed epoch's streams go on from
    ``stream_states``, saved with its resume point."""
    callbacks.on_epoch_begin(epoch)
    if stream_states is not None:
        for variable, value in zip(trainer.stream_states(), stream_states, strict=True):
            variable.assign(value)
    progress.epoch_begin(epoch, start.batch)
    done = dataclasses.replace(start)
    if clock.expired():  # a run killed past its budget before validating resumes only to validate
        return done
    batches = distributed_batches(trainer.strategy, ids, layout, start.batch)
    for batch, (x, y) in enumerate(batches, start=start.batch):
        started = time.monotonic()
        callbacks.on_train_batch_begin(batch)
        loss = float(trainer.train_step(x, y))
        if not math.isfinite(loss):  # the update already happened: save nothing from here on
            raise TrainingDiverged(
                f"training diverged: the loss became {loss} at epoch {epoch + 1}, batch {batch + 1}; nothing after "
                "the last resume point was saved. Start a new run with a lower --lr or --clip-norm"
            )
        done = EpochProgress(
            batch + 1, done.loss_sum + loss, done.batches + 1, done.seconds + time.monotonic() - started
        )
        after_batch(epoch, done)
        callbacks.on_train_batch_end(batch, {"loss": done.loss, "bpc": bits(done.loss)})
        progress.batch_end(batch, done.loss)
        clock.synchronise(stop)
        if clock.stopping or clock.expired():
            break
        if batch + 1 < layout.batches:
            between_batches()
            if clock.stopping:
                break
    return done


def validate(
    trainer: Trainer,
    ids: np.ndarray,
    data: DataConfig,
    callbacks: keras.callbacks.CallbackList,
    progress: TrainingProgress,
) -> float:
    """Validation loss (nats/char) by ``textgen.scoring.score``, the routine ``textgen evaluate`` uses."""
    callbacks.on_test_begin()
    progress.validating()
    nats, chars = score(
        trainer.eval_step,
        trainer.model,
        ids,
        StreamLayout.of(len(ids), data.batch_size, data.seq_len),
        trainer.strategy,
    )
    callbacks.on_test_end({"loss": nats / chars})
    return nats / chars


@dataclass
class Clock:
    """A run's training time across invocations, and its ``--time-budget`` (for the whole run: a run resumed after
    a stop trains for what is left of it, on the same schedule, as ``--epochs`` counts the run's epochs).

    Under a multi-worker strategy every decision taken from the time (the schedule, the budget) or from a
    stop signal must be the same on every worker, or one would wait for another forever: ``synchronise``
    makes the workers agree on this invocation's seconds (their mean) and on whether any worker was asked
    to stop, and the loop decides only from what they agreed (a signal that lands after an agreement
    counts at the next one).
    """

    before: float  # seconds trained by earlier invocations
    budget: float | None  # seconds for the whole run
    agree: Callable[[bool, float], tuple[bool, float]]  # (stop asked here, seconds here) -> (anywhere, agreed)
    started: float = field(default_factory=lambda: time.monotonic())  # looked up when called: tests fake it
    agreed: float = 0.0  # this invocation's seconds at the last synchronise
    stopping: bool = False  # whether some worker had been asked to stop at the last synchronise

    def synchronise(self, stop: StopRequests) -> None:
        requested = stop.requested  # read once: the signal handler may set it at any moment
        self.stopping, self.agreed = self.agree(requested is not None, time.monotonic() - self.started)
        if self.stopping and requested is None and stop.requested is None:
            stop.requested, stop.exit_code = "a stop on another worker", 143

    def elapsed(self) -> float:
        return self.before + self.agreed

    def expired(self) -> bool:
        return self.budget is not None and self.elapsed() >= self.budget


def compile_agreement(strategy: tf.distribute.Strategy) -> Callable[[bool, float], tuple[bool, float]]:
    """``Clock.agree`` through one all-reduce over ``strategy``'s replicas (~0.1 ms on one device)."""
    replicas, reduce = strategy.num_replicas_in_sync, replica_sum(strategy)

    def agree(stop: bool, seconds: float) -> tuple[bool, float]:
        stops, total = reduce(tf.constant([float(stop), seconds], tf.float32)).numpy()
        return bool(stops > 0), float(total) / replicas

    return agree


# --- callbacks ------------------------------------------------------------------------------


def build_callbacks(
    plan: TrainPlan, trainer: Trainer, steps: int, clock: Clock
) -> tuple[RunCheckpoint, keras.callbacks.CallbackList]:
    """The run's checkpoint and the Keras callbacks the loop drives: state reset, learning-rate
    schedule, the pruning schedule, early stopping, TensorBoard logs, and the checkpoint (which also writes
    the history)."""
    tcfg, run, prune = plan.config.training, plan.run, plan.config.prune

    def schedule_progress(epoch: int, batch: int) -> float:
        """How far through its schedules the run is: through its epochs, or through its time budget if that
        is further on, so the schedules end with whichever limit stops the run first."""
        by_batches = (epoch * steps + batch) / (tcfg.epochs * steps)
        if clock.budget:
            return max(by_batches, clock.elapsed() / clock.budget)
        return by_batches

    # A pruned run's loss rises by design while its sparsity ramps up: it does not stop early, and its best
    # weights are the best at the full sparsity.
    patience = tcfg.epochs if prune else tcfg.patience
    anneal = tcfg.anneal if tcfg.lr_schedule == "hold" else 1.0
    # Not restore_best_weights: best.weights.h5 already holds them, and restoring them in memory at the end of
    # training would put them under a save made after it (a lost worker's), as if training had got there.
    early_stopping = EarlyStoppingAfterHold(
        patience, holding=lambda epoch: schedule_progress(epoch + 1, 0) < 1 - anneal
    )
    stateful: dict[str, keras.callbacks.Callback] = {"early_stopping": early_stopping}
    lr_schedule: keras.callbacks.Callback
    if tcfg.lr_schedule == "plateau":
        lr_schedule = keras.callbacks.ReduceLROnPlateau(
            monitor="val_loss", factor=tcfg.lr_factor, patience=tcfg.lr_patience, min_lr=tcfg.lr / 64
        )
        stateful["lr_schedule"] = lr_schedule
    else:
        lr_schedule = CosineSchedule(trainer.optimizer, tcfg.lr, schedule_progress, anneal)
    pruning = PruneSchedule(trainer.masks, prune.sparsity, prune.ramp, schedule_progress) if prune else None
    checkpoint = RunCheckpoint(
        run,
        trainer.optimizer,
        stateful,
        eligible=lambda: pruning is None or pruning.at_target,
        # One replica's: a replica's states are its own, which a mirrored variable's value does not show (several
        # replicas restart their streams cold after a mid-epoch resume).
        stream_states=trainer.stream_states() if trainer.strategy.num_replicas_in_sync == 1 else None,
    )
    callbacks = keras.callbacks.CallbackList(
        [
            ResetStatesCallback(trainer),
            lr_schedule,
            *([pruning] if pruning else []),
            early_stopping,
            keras.callbacks.TensorBoard(str(run.tensorboard_dir), write_graph=False),
            checkpoint,
        ],
        model=trainer.model,
        epochs=tcfg.epochs,
        steps=steps,
    )
    return checkpoint, callbacks


class PruneSchedule(keras.callbacks.Callback):
    """Raise the masked fraction of every pruned kernel from 0 to ``target`` over the first ``ramp`` of the run,
    on Zhu and Gupta's cubic curve (fast at first, while the weights can recover), in steps of 1% of the run
    (numpy.argpartition over the default model's 1.3M weights takes ~30 ms)."""

    STEPS = 100

    def __init__(
        self,
        masks: list[tuple[keras.Variable, keras.Variable]],
        target: float,
        ramp: float,
        progress: Callable[[int, int], float],
    ) -> None:
        super().__init__()
        self.masks, self.target, self.ramp, self.progress = masks, target, ramp, progress
        self.epoch = 0
        self.reached = 0.0  # the sparsity the weights already have (a resumed run's)
        self.sparsity = -1.0  # the masks' sparsity; none yet: the first batch (of a new or a resumed run) sets them

    def sparsity_at(self, progress: float) -> float:
        quantised = math.floor(min(max(progress, 0.0), 1.0) * self.STEPS) / self.STEPS
        return self.target * (1.0 - (1.0 - min(quantised / self.ramp, 1.0)) ** 3)

    @property
    def at_target(self) -> bool:
        """Whether the weights are at the full sparsity (a run resumed only to validate sets no masks)."""
        return max(self.sparsity, self.reached) >= self.target

    def on_train_begin(self, logs: dict | None = None) -> None:
        """A resumed run's pruned weights are exactly zero: its sparsity goes on from theirs, never below. (More
        --epochs or --time-budget move the schedule back; unmasking would train pruned weights again.)"""
        zeros = [(int(np.count_nonzero(kernel.numpy() == 0)), int(np.prod(kernel.shape))) for kernel, _ in self.masks]
        if zeros and all(n >= round(self.target * size) for n, size in zeros):
            self.reached = self.target  # exactly, for at_target
        else:
            self.reached = min((n / size for n, size in zeros), default=0.0)

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self.epoch = epoch

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        sparsity = max(self.sparsity_at(self.progress(self.epoch, batch)), self.reached)
        if sparsity != self.sparsity:
            update_masks(self.masks, sparsity)
            self.sparsity = sparsity


def cosine_lr(peak: float, progress: float, anneal: float = 1.0) -> float:
    """The learning rate ``progress`` (0 to 1) of the way through a run that holds ``peak``, then anneals it to 0
    along a cosine over the run's last ``anneal`` (all of it by default)."""
    annealed = (progress - (1.0 - anneal)) / anneal
    return peak * 0.5 * (1.0 + math.cos(math.pi * min(max(annealed, 0.0), 1.0)))


class CosineSchedule(keras.callbacks.Callback):
    """Set the learning rate before every batch from how far the run has got (see ``cosine_lr``)."""

    def __init__(
        self,
        optimizer: keras.optimizers.Optimizer,
        peak: float,
        progress: Callable[[int, int], float],
        anneal: float = 1.0,
    ) -> None:
        super().__init__()
        self.optimizer, self.peak, self.progress, self.anneal = optimizer, peak, progress, anneal
        self.epoch = 0

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self.epoch = epoch

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        self.optimizer.learning_rate = cosine_lr(self.peak, self.progress(self.epoch, batch), self.anneal)


class EarlyStoppingAfterHold(keras.callbacks.EarlyStopping):
    """Keras' early stopping on validation loss, except that the epochs that end before the learning rate anneals
    (``holding``) do not count against the patience: at the hold schedule's peak rate validation stalls by design,
    and the anneal after it is what takes the most off. Counted, a stall there stopped a run before its anneal
    (War and Peace, 60 minutes, seed 1: stopped at 52 minutes, three epochs after its best one at the peak rate)."""

    def __init__(self, patience: int, holding: Callable[[int], bool]) -> None:
        super().__init__(monitor="val_loss", patience=patience)
        self.holding = holding

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        super().on_epoch_end(epoch, logs)  # a new best still counts as one
        if self.holding(epoch):
            self.wait, self.model.stop_training = 0, False


class ResetStatesCallback(keras.callbacks.Callback):
    """Zero every LSTM state at the start of each epoch (``validate`` does so before validation)."""

    def __init__(self, trainer: Trainer) -> None:
        super().__init__()
        self.trainer = trainer

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self.trainer.reset_states()


class RunCheckpoint(keras.callbacks.Callback):
    """Saves the best weights and an atomic resume point at every epoch end."""

    def __init__(
        self,
        run: Run,
        optimizer: keras.optimizers.Optimizer,
        stateful_callbacks: dict[str, Any],
        eligible: Callable[[], bool] = lambda: True,
        stream_states: list[keras.Variable] | None = None,
    ) -> None:
        super().__init__()
        self.run, self.optimizer, self.stateful_callbacks = run, optimizer, stateful_callbacks
        self.eligible = eligible  # whether the weights may be the run's best (a pruned run's: at full sparsity)
        self.stream_states = stream_states  # saved with mid-epoch resume points, if given
        self.streams_at: list[np.ndarray] | None = None  # their values at the last mid-epoch resume point
        self.best_val_loss = math.inf
        self.history: list[dict[str, Any]] = []  # one row per epoch, committed with every resume point
        self.saved_at = time.monotonic()
        self.resume_at: tuple[int, int, EpochProgress | None] = (0, 0, None)  # set by the loop before an epoch end

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from a saved state (empty for a new run): best loss, history, schedule counters."""
        if not state:
            return
        # The best weights file carries its own loss: if a kill came between replacing it and the next
        # commit, it is better than the state says, and a worse epoch must not replace it.
        self.best_val_loss = min(state.get("best_val_loss", math.inf), self.run.best_weights_loss())
        self.history = state["history"] if "history" in state else _csv_rows(self.run.history_path)
        for name, values in state.get("callbacks", {}).items():
            for key, value in values.items():
                setattr(self.stateful_callbacks[name], key, value)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        logs = logs or {}
        if logs["val_loss"] < self.best_val_loss and self.eligible():
            self.best_val_loss = logs["val_loss"]
            self.run.save_best(self.model, self.best_val_loss)
        # A row per epoch: an epoch a time budget cut and a resumed run finished replaces its partial row.
        self.history = [row for row in self.history if row["epoch"] != epoch] + [{"epoch": epoch, **logs}]
        resume_epoch, resume_batch, position = self.resume_at
        self.save_resume_point(resume_epoch, resume_batch, logs["seconds"], position, validated=True)

    def save_resume_point(
        self, epoch: int, batch: int, seconds: float, position: EpochProgress | None = None, validated: bool = False
    ) -> None:
        """Commit weights, optimizer and loop position: training resumes at ``epoch``, ``batch`` (with the
        epoch's progress so far and the streams' states when that is mid-epoch). Validation resets the states:
        ``validated`` commits those of the last resume point, made before validating at the same batch.
        Weights that are no longer finite are never committed."""
        if not all(np.isfinite(w).all() for w in self.model.get_weights()):
            raise TrainingDiverged(
                f"training diverged: the weights became NaN or infinite at epoch {epoch + 1}; nothing after the last "
                "resume point was saved. Start a new run with a lower --lr or --clip-norm"
            )
        state = {
            "epoch": epoch,
            "batch": batch,
            "step": int(self.optimizer.iterations.numpy()),
            "seconds": seconds,
            "best_val_loss": self.best_val_loss,
            "callbacks": {name: _callback_state(cb) for name, cb in self.stateful_callbacks.items()},
            "finished": None,
            "history": self.history,
            "epoch_progress": dataclasses.asdict(position) if position else None,
        }
        streams = None
        if batch > 0 and self.stream_states is not None:
            if not validated:
                self.streams_at = [np.asarray(v) for v in self.stream_states]
            streams = self.streams_at
        self.run.save_resume_point(self.model, self.optimizer, state, streams)
        self.saved_at = time.monotonic()

    def mark_finished(self, reason: StopReason) -> None:
        """Record why training stopped; the resume point stays usable for more epochs."""
        self.run.update_state(finished=reason.value)


def _csv_rows(path: Path) -> list[dict[str, Any]]:
    """History rows of a run from before they were kept in state.json."""
    columns = read_history(path)
    return [
        {"epoch": int(e), **{k: columns[k][i] for k in columns if k != "epoch"}}
        for i, e in enumerate(columns.get("epoch", []))
    ]


def _callback_state(callback: Any) -> dict[str, float]:
    keys = ("wait", "best", "cooldown_counter")
    # Keras' callbacks hold best=None until their first epoch end (Ctrl-C in epoch 1).
    return {k: float(getattr(callback, k)) for k in keys if getattr(callback, k, None) is not None}


# --- stopping cleanly --------------------------------------------------------------------------


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@dataclass
class StopRequests:
    """The first stop signal received (the loop finishes its batch, saves and stops)."""

    requested: str | None = None  # e.g. "SIGTERM"
    exit_code: int = 130

    def handle(self, signum: int, frame: Any) -> None:
        if self.requested:  # a second signal: stop now (the last commit stays intact)
            raise KeyboardInterrupt
        self.requested, self.exit_code = signal.Signals(signum).name, 128 + signum


@contextlib.contextmanager
def _stop_requests() -> Iterator[StopRequests]:
    """Ctrl-C, SIGTERM (``kill``, ``timeout``, a job scheduler) and SIGHUP (a closed terminal) all ask the
    loop to stop cleanly; a second one interrupts at once."""
    stop = StopRequests()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    previous = {signum: signal.signal(signum, stop.handle) for signum in STOP_SIGNALS}
    try:
        yield stop
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


_MULTI_WORKER = tf.distribute.MultiWorkerMirroredStrategy
# What a collective raises when a peer is gone: a dead process resets its connections (the survivor's step fails
# within 0.1 s), a frozen one misses the coordination service's heartbeats (~10 s).
_PEER_ERRORS = (
    tf.errors.UnavailableError,
    tf.errors.DeadlineExceededError,
    tf.errors.AbortedError,
    tf.errors.CancelledError,
)


@contextlib.contextmanager
def _lost_peers(plan: TrainPlan, unsaved: list[Callable[[], None]]) -> Iterator[None]:
    """When another worker stops or becomes unreachable, commit where this one got, if past the last commit
    (the weights hold every finished update: a failed all-reduce applies none), and say how to go on."""
    try:
        yield
    except _PEER_ERRORS as exc:
        if unsaved:
            with contextlib.suppress(Exception):  # the error to report is the lost worker
                unsaved.pop()()
        reason = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise ClusterError(f"another worker stopped or cannot be reached ({reason}); {plan.saved_note()}") from None


def check_same_plan(plan: TrainPlan, strategy: tf.distribute.Strategy) -> None:
    """Refuse to start unless every worker planned the same run from the same place: a worker whose
    corpus, settings, device profile or resume point differ would hang the others or silently diverge."""
    if not isinstance(strategy, _MULTI_WORKER):
        return
    resume = plan.resume_state or {}
    settings = plan.config.to_dict()
    settings["data"] = {k: v for k, v in settings["data"].items() if k not in ("corpus", "files")}  # paths may differ
    described = json.dumps([settings, [resume.get(k) for k in ("epoch", "batch", "step")]])
    # 16 bytes of digest, one per value: sums of values and of their squares stay exact in float32, and
    # n * sum(v^2) == sum(v)^2 holds only when all n workers hold the same v.
    digest = np.frombuffer(hashlib.blake2b(described.encode(), digest_size=16).digest(), np.uint8)
    values = tf.constant(np.concatenate([digest, digest.astype(np.float32) ** 2]), tf.float32)
    sums = replica_sum(strategy)(values).numpy().astype(np.float64)
    n = strategy.num_replicas_in_sync
    if not np.array_equal(n * sums[16:], sums[:16] ** 2):
        raise ConfigError(
            "the workers planned different runs (corpus files, settings, device profile or resume point differ); "
            "give every worker the same command, the same corpus files and --device, and one shared --checkpoint-dir"
        )


@contextlib.contextmanager
def _end_on_error(callbacks: keras.callbacks.CallbackList, progress: TrainingProgress) -> Iterator[None]:
    """On Ctrl-C or an error, still end the progress display (it shows the terminal's cursor again)
    and the callbacks (the history and TensorBoard files are closed)."""
    try:
        yield
    except BaseException:
        with contextlib.suppress(Exception):  # never hide the original error
            progress.end()
        with contextlib.suppress(Exception):
            callbacks.on_train_end({})
        raise
