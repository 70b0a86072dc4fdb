"""The training loop: a custom tf.distribute-ready loop that drives Keras callbacks.

``model.fit`` would do for one machine, but under MultiWorkerMirroredStrategy
Keras 3.15's ``fit`` fails while a custom loop works; this loop already runs its
step through ``strategy.run`` with the per-replica batch, so multi-worker training
is a matter of choosing the strategy.
"""

from __future__ import annotations

import contextlib
import math
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import keras
import tensorflow as tf

from textgen import config as cfgmod
from textgen.checkpoint import DEFAULT_CHECKPOINT_DIR, Run, check_run_name, ensure_writable, find_run, new_run_name
from textgen.config import DataConfig, DeviceProfile, ModelConfig, RunConfig, TrainConfig
from textgen.corpus import resolve_corpus
from textgen.data import Splits, load_splits, make_dataset
from textgen.errors import ConfigError, TrainingInterrupted
from textgen.fastlstm import stateful_logits
from textgen.files import atomic_write_text
from textgen.model import build_model, reset_states
from textgen.plot import loss_chart, read_history

LN2 = math.log(2.0)


def bits(nats: float) -> float:
    """Nats per character -> bits per character."""
    return nats / LN2


@dataclass
class TrainPlan:
    """What ``train`` will do: the run, its config, its data, and where it resumes."""

    run: Run
    config: RunConfig
    splits: Splits
    resume_state: dict[str, Any] | None = None


@dataclass
class TrainResult:
    """How a training run ended."""

    run: Run
    epochs_done: int
    best_val_loss: float
    stop_reason: str  # "epochs", "early_stopping" or "time_budget"
    seconds: float
    chars_per_sec: float  # training speed of the last epoch

    @property
    def best_val_bpc(self) -> float:
        return bits(self.best_val_loss)


def plan_training(
    corpus: str | None,
    profile: DeviceProfile,
    *,
    checkpoint_dir: Path,
    run_name: str | None = None,
    resume: bool = False,
    download: bool = False,
    keep_boilerplate: bool = False,
    data: dict[str, Any] | None = None,
    model: dict[str, Any] | None = None,
    training: dict[str, Any] | None = None,
) -> TrainPlan:
    """Resolve the corpus and configs for a new run, or reload a run to resume.

    ``data``, ``model`` and ``training`` hold only the settings the user gave
    (``None`` values are ignored). On resume, only epochs and time budget may change.
    """
    data, model, training = (
        {k: v for k, v in d.items() if v is not None} for d in (data or {}, model or {}, training or {})
    )
    ensure_writable(checkpoint_dir)
    if resume:
        run = find_run(checkpoint_dir, run_name)
        saved = run.load_config()
        if corpus is not None and resolve_corpus(corpus).resolve() != Path(saved.data.corpus).resolve():
            raise ConfigError(
                f"run {run.name!r} trains on {saved.data.corpus}, not {corpus}; "
                "drop the corpus to resume it, or start a new run without --resume"
            )
        given = {**data, **model, **{k: v for k, v in training.items() if k not in {"epochs", "time_budget"}}}
        saved_values = {**asdict(saved.data), **asdict(saved.model), **asdict(saved.training)}
        changed = sorted(k for k, v in given.items() if v != saved_values[k])
        if changed:
            flags = ", ".join(cfgmod.flag(k) for k in changed)
            was = ", ".join(f"{cfgmod.flag(k)} {saved_values[k]}" for k in changed)
            raise ConfigError(
                f"{flags} cannot change when resuming run {run.name!r} (it has {was}); drop them or start a new run"
            )
        config = RunConfig(saved.data, saved.model, cfgmod.replace(saved.training, **training), saved.profile)
        if not run.has_state():
            raise ConfigError(f"run {run.name!r} has no resume point yet; start it again without --resume")
        state = run.load_state()
        if state["epoch"] >= config.training.epochs:
            raise ConfigError(
                f"run {run.name!r} has done all {config.training.epochs} epochs; "
                f"add --epochs {state['epoch'] + 10} (or more) to train it further"
            )
        return TrainPlan(run, config, load_splits(config.data, run.load_vocab()), state)

    if corpus is None:
        raise ConfigError("give a corpus to train on, e.g. textgen train 2600-0.txt")
    path = resolve_corpus(corpus, download=download)
    name = check_run_name(run_name) if run_name else new_run_name(checkpoint_dir, path.stem)
    run = Run(Path(checkpoint_dir) / name)
    if run.path.exists() and any(run.path.iterdir()):  # checked before the corpus is read and encoded
        raise ConfigError(
            f"run {name!r} already exists in {checkpoint_dir}/; add --resume to continue it or pick another --run"
        )
    data_cfg = DataConfig(
        corpus=str(path.resolve()),
        strip_boilerplate=not keep_boilerplate,
        **{"batch_size": profile.batch_size, **data},
    )
    splits = load_splits(data_cfg)
    config = RunConfig(data_cfg, ModelConfig(vocab_size=splits.vocab.size, **model), TrainConfig(**training), profile)
    run.create(config, splits.vocab)
    return TrainPlan(run, config, splits)


def cosine_lr(peak: float, progress: float) -> float:
    """The learning rate ``progress`` (0 to 1) of the way through a cosine anneal from ``peak`` to 0."""
    return peak * 0.5 * (1.0 + math.cos(math.pi * min(max(progress, 0.0), 1.0)))


class CosineSchedule(keras.callbacks.Callback):
    """Set the learning rate before every batch from how far the run has got (see ``cosine_lr``)."""

    def __init__(
        self, optimizer: keras.optimizers.Optimizer, peak: float, progress: Callable[[int, int], float]
    ) -> None:
        super().__init__()
        self.optimizer, self.peak, self.progress = optimizer, peak, progress
        self.epoch = 0

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self.epoch = epoch

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        self.optimizer.learning_rate = cosine_lr(self.peak, self.progress(self.epoch, batch))


class ResetStatesCallback(keras.callbacks.Callback):
    """Reset every stateful layer at the start of each epoch and before validation."""

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        reset_states(self.model)

    def on_test_begin(self, logs: dict | None = None) -> None:
        reset_states(self.model)


@contextlib.contextmanager
def _sigint_flag() -> Iterator[threading.Event]:
    """An event set by the first Ctrl-C (a second one interrupts at once)."""
    flag = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return

    def handler(signum: int, frame: Any) -> None:
        if flag.is_set():
            raise KeyboardInterrupt
        flag.set()

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield flag
    finally:
        signal.signal(signal.SIGINT, previous)


@dataclass
class Trainer:
    """A model with its optimizer and compiled steps; each step returns a summed or mean loss."""

    model: keras.Model
    optimizer: keras.optimizers.Optimizer
    train_step: Callable[[tf.Tensor, tf.Tensor], tf.Tensor]  # (inputs, targets) -> mean loss, after one update
    eval_step: Callable[[tf.Tensor, tf.Tensor], tf.Tensor]  # (inputs, targets) -> summed loss


def build_trainer(cfg: RunConfig, strategy: tf.distribute.Strategy | None = None) -> Trainer:
    """The model, optimizer and compiled train/eval steps that ``train`` uses (and the benchmark times).

    Steps run through ``strategy.run`` with the per-replica batch. With the profile's
    ``fast_lstm`` the LSTM runs through ``textgen.fastlstm`` on the same variables.
    """
    strategy = strategy or tf.distribute.get_strategy()
    tcfg, profile = cfg.training, cfg.profile
    chars_per_step = cfg.data.batch_size * cfg.data.seq_len
    with strategy.scope():
        model = build_model(cfg.model, cfg.data.batch_size // strategy.num_replicas_in_sync, profile.precision)
        optimizer: keras.optimizers.Optimizer = keras.optimizers.Adam(
            learning_rate=tcfg.lr, global_clipnorm=tcfg.clip_norm
        )
        if profile.precision == "mixed_float16":
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        model.compile(optimizer=optimizer)  # callbacks reach the optimizer through model.optimizer
        optimizer.build(model.trainable_variables)

    def loss_sum(x: tf.Tensor, y: tf.Tensor, training: bool) -> tf.Tensor:
        if profile.fast_lstm:
            seed = tf.stack([tf.constant(tcfg.seed, tf.int64), tf.cast(optimizer.iterations, tf.int64)])
            logits = stateful_logits(model, x, training, seed)
        else:
            logits = model(x, training=training)
        return tf.reduce_sum(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))

    def replica_train_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_sum(x, y, True) / chars_per_step
            scaled = optimizer.scale_loss(loss)
        optimizer.apply(tape.gradient(scaled, model.trainable_variables), model.trainable_variables)
        return loss

    @tf.function(jit_compile=profile.jit_compile)
    def train_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        return strategy.reduce("SUM", strategy.run(replica_train_step, args=(x, y)), axis=None)

    @tf.function(jit_compile=profile.jit_compile)
    def eval_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        return strategy.reduce("SUM", strategy.run(loss_sum, args=(x, y, False)), axis=None)

    return Trainer(model, optimizer, train_step, eval_step)


@contextlib.contextmanager
def _end_callbacks_on_error(callback_list: keras.callbacks.CallbackList) -> Iterator[None]:
    """On Ctrl-C or an error, still end the callbacks: a live progress display stops (and shows the
    terminal's cursor again), the history and TensorBoard files are closed."""
    try:
        yield
    except BaseException:
        with contextlib.suppress(Exception):  # never hide the original error
            callback_list.on_train_end({})
        raise


def train(plan: TrainPlan, callbacks: Sequence[keras.callbacks.Callback] = ()) -> TrainResult:
    """Train ``plan.run`` to its epoch count, early stop, time budget or Ctrl-C.

    ``callbacks`` (e.g. a progress display) see ``on_train_batch_end`` logs with
    ``loss`` and ``bpc`` and ``on_epoch_end`` logs with ``val_loss``, ``val_bpc``,
    ``chars_per_sec`` and ``learning_rate``; ``params`` holds ``steps``,
    ``chars_per_step``, ``epochs``, ``initial_epoch`` and ``initial_batch``.
    """
    cfg, run = plan.config, plan.run
    tcfg, dcfg = cfg.training, cfg.data
    keras.utils.set_random_seed(tcfg.seed)
    strategy = tf.distribute.get_strategy()
    replicas = strategy.num_replicas_in_sync
    if dcfg.batch_size % replicas:
        raise ConfigError(f"--batch-size {dcfg.batch_size} must divide evenly over {replicas} replicas")

    train_ds = make_dataset(plan.splits.train, dcfg.batch_size, dcfg.seq_len)
    val_ds = make_dataset(plan.splits.val, dcfg.batch_size, dcfg.seq_len)
    steps = int(train_ds.cardinality())
    chars_per_step = dcfg.batch_size * dcfg.seq_len

    trainer = build_trainer(cfg, strategy)
    model, optimizer, train_step, eval_step = trainer.model, trainer.optimizer, trainer.train_step, trainer.eval_step

    start_epoch, start_batch, elapsed_before = 0, 0, 0.0
    resume = plan.resume_state
    if resume:
        run.load_weights(model, "last")
        run.load_optimizer(optimizer)
        start_epoch, start_batch, elapsed_before = resume["epoch"], resume["batch"], resume.get("seconds", 0.0)

    started = time.monotonic()
    deadline = started + tcfg.time_budget if tcfg.time_budget else math.inf  # per invocation

    def elapsed() -> float:
        return elapsed_before + time.monotonic() - started

    def progress(epoch: int, batch: int) -> float:
        """How far through its schedule the run is: through its epochs, or through its time budget
        if that is further on, so the anneal ends with whichever limit stops the run first."""
        by_batches = (epoch * steps + batch) / (tcfg.epochs * steps)
        if tcfg.time_budget:  # a resumed run anneals over what it has done plus its new budget
            return max(by_batches, elapsed() / (elapsed_before + tcfg.time_budget))
        return by_batches

    early_stopping = keras.callbacks.EarlyStopping(
        monitor="val_loss", patience=tcfg.patience, restore_best_weights=True
    )
    stateful_callbacks: dict[str, keras.callbacks.Callback] = {"early_stopping": early_stopping}
    if tcfg.lr_schedule == "plateau":
        stateful_callbacks["lr_schedule"] = keras.callbacks.ReduceLROnPlateau(
            monitor="val_loss", factor=tcfg.lr_factor, patience=tcfg.lr_patience, min_lr=tcfg.lr / 64
        )
        lr_schedule: keras.callbacks.Callback = stateful_callbacks["lr_schedule"]
    else:
        lr_schedule = CosineSchedule(optimizer, tcfg.lr, progress)
    checkpoint = RunCheckpoint(run, optimizer, stateful_callbacks)
    callback_list = keras.callbacks.CallbackList(
        [
            ResetStatesCallback(),
            lr_schedule,
            early_stopping,
            keras.callbacks.CSVLogger(str(run.history_path), append=bool(resume)),
            keras.callbacks.TensorBoard(str(run.tensorboard_dir), write_graph=False),
            checkpoint,
            *callbacks,
        ],
        model=model,
        epochs=tcfg.epochs,
        steps=steps,
        chars_per_step=chars_per_step,
        initial_epoch=start_epoch,
        initial_batch=start_batch,
        run_name=run.name,
    )

    stop_reason, epochs_done, logs = "epochs", start_epoch, {}
    callback_list.on_train_begin()
    if resume:
        checkpoint.restore(resume, model)

    with _sigint_flag() as interrupted, _end_callbacks_on_error(callback_list):
        for epoch in range(start_epoch, tcfg.epochs):
            callback_list.on_epoch_begin(epoch)
            skip = start_batch if epoch == start_epoch else 0
            epoch_started, loss_total, batches = time.monotonic(), 0.0, 0
            for batch, (x, y) in enumerate(train_ds.skip(skip), start=skip):
                callback_list.on_train_batch_begin(batch)
                loss_total += float(train_step(x, y))
                batches += 1
                mean = loss_total / batches
                callback_list.on_train_batch_end(batch, {"loss": mean, "bpc": bits(mean)})
                if interrupted.is_set():
                    checkpoint.save_resume_point(epoch, batch + 1, elapsed())
                    raise TrainingInterrupted(
                        f"stopped at epoch {epoch + 1}, batch {batch + 1}/{steps}; saved {run.path}; {resume_hint(run)}"
                    )
                if time.monotonic() >= deadline:
                    stop_reason = "time_budget"
                    break
            train_seconds = time.monotonic() - epoch_started

            callback_list.on_test_begin()
            val_total, val_batches = 0.0, 0
            for x, y in val_ds:
                val_total += float(eval_step(x, y))
                val_batches += 1
            val_loss = val_total / (val_batches * chars_per_step)
            callback_list.on_test_end({"loss": val_loss})
            logs = {
                "loss": loss_total / max(batches, 1),
                "bpc": bits(loss_total / max(batches, 1)),
                "val_loss": val_loss,
                "val_bpc": bits(val_loss),
                "chars_per_sec": batches * chars_per_step / max(train_seconds, 1e-9),
                "learning_rate": float(optimizer.learning_rate),
                "batches": batches,
                "seconds": elapsed(),
            }
            callback_list.on_epoch_end(epoch, logs)
            epochs_done = epoch + 1
            if time.monotonic() >= deadline:  # validation ran past it: start no epoch just to stop it
                stop_reason = "time_budget"
            if stop_reason == "time_budget" and skip + batches < steps:
                # Stopped mid-epoch: resume where training stopped, not at the next epoch.
                checkpoint.save_resume_point(epoch, skip + batches, elapsed())
            if interrupted.is_set():
                raise TrainingInterrupted(f"stopped after epoch {epoch + 1}; saved {run.path}; {resume_hint(run)}")
            if model.stop_training:
                stop_reason = "early_stopping"
            if stop_reason != "epochs":
                break
    callback_list.on_train_end(logs)
    checkpoint.mark_finished(stop_reason)
    atomic_write_text(run.loss_curve_path, loss_chart(read_history(run.history_path)))
    return TrainResult(
        run=run,
        epochs_done=epochs_done,
        best_val_loss=checkpoint.best_val_loss,
        stop_reason=stop_reason,
        seconds=elapsed(),
        chars_per_sec=logs.get("chars_per_sec", 0.0),
    )


def _callback_state(callback: Any) -> dict[str, float]:
    keys = ("wait", "best", "cooldown_counter")
    # Keras' callbacks hold best=None until their first epoch end (Ctrl-C in epoch 1).
    return {k: float(getattr(callback, k)) for k in keys if getattr(callback, k, None) is not None}


def resume_hint(run: Run) -> str:
    """How to continue ``run`` from the command line."""
    where = "" if run.path.parent == DEFAULT_CHECKPOINT_DIR else f" --checkpoint-dir {run.path.parent}"
    return f"continue with: textgen train --resume --run {run.name}{where}"


class RunCheckpoint(keras.callbacks.Callback):
    """Saves the best weights and an atomic resume point at every epoch end."""

    def __init__(self, run: Run, optimizer: keras.optimizers.Optimizer, stateful_callbacks: dict[str, Any]) -> None:
        super().__init__()
        self.run, self.optimizer, self.stateful_callbacks = run, optimizer, stateful_callbacks
        self.best_val_loss = math.inf

    def restore(self, state: dict[str, Any], model: keras.Model) -> None:
        """Continue from a saved state: best loss, schedule counters, early stopping's best weights."""
        self.best_val_loss = state.get("best_val_loss", math.inf)
        for name, values in state.get("callbacks", {}).items():
            for key, value in values.items():
                setattr(self.stateful_callbacks[name], key, value)
        if self.run.best_weights_path.is_file():
            # Load into a scratch copy: the weights file also holds the optimizer variables of the
            # best epoch, and loading it into the compiled training model would roll its optimizer
            # (step count, Adam moments, learning rate) back to that epoch.
            scratch = keras.models.clone_model(model)
            self.run.load_weights(scratch, "best")
            self.stateful_callbacks["early_stopping"].best_weights = scratch.get_weights()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        logs = logs or {}
        if logs["val_loss"] < self.best_val_loss:
            self.best_val_loss = logs["val_loss"]
            self.run.save_best(self.model)
        self.save_resume_point(epoch + 1, 0, logs["seconds"])

    def save_resume_point(self, epoch: int, batch: int, seconds: float) -> None:
        """Commit weights, optimizer and loop position: training resumes at ``epoch``, ``batch``."""
        state = {
            "epoch": epoch,
            "batch": batch,
            "step": int(self.optimizer.iterations.numpy()),
            "seconds": seconds,
            "best_val_loss": self.best_val_loss,
            "callbacks": {name: _callback_state(cb) for name, cb in self.stateful_callbacks.items()},
            "finished": None,
        }
        self.run.save_resume_point(self.model, self.optimizer, state)

    def mark_finished(self, reason: str) -> None:
        """Record why training stopped; the resume point stays usable for more epochs."""
        self.run.update_state(finished=reason)
