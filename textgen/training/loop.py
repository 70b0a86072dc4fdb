"""The training loop: train a planned run epoch by epoch until one of its stop reasons, and report how it ended.

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
Every reason to stop goes through one ``Stopper`` (``textgen.training.stopping``).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from textgen.checkpoint import EpochProgress, Run
from textgen.config import DataConfig, Weights
from textgen.data import distributed_batches
from textgen.errors import ConfigError, IdFileError, TrainingDiverged, TrainingInterrupted
from textgen.layout import StreamLayout
from textgen.plot import write_loss_charts
from textgen.results import EpochLog, StopReason, TrainResult, bits
from textgen.scoring import score
from textgen.signals import stop_signals
from textgen.training.callbacks import build_callbacks
from textgen.training.plan import TrainPlan, keep_extension, training_layout
from textgen.training.preview import SAMPLE_SECONDS, write_sample
from textgen.training.progress import CurveJudge, NoProgress, TrainingProgress
from textgen.training.resume_point import RunCheckpoint
from textgen.training.step import Trainer, build_trainer
from textgen.training.stopping import (
    EPOCH_END,
    MID_EPOCH,
    Clock,
    Stopper,
    check_same_plan,
    compile_agreement,
    is_multi_worker,
    lost_peers,
)
from textgen.training.warmstart import start_from_base


def train(
    plan: TrainPlan,
    progress: TrainingProgress | None = None,
    strategy: tf.distribute.Strategy | None = None,
    judge: CurveJudge | None = None,
) -> TrainResult:
    """Train ``plan.run`` until its epochs are done, validation stalls, its time budget ends, ``judge`` ends it, or
    a stop signal (Ctrl-C, SIGTERM, SIGHUP; under a multi-worker strategy, on any worker); the run's lock is
    released when it returns. ``judge`` also validates mid-epoch when it asks (on one replica only: several
    replicas' stream states cannot be put back)."""
    # The plan's lock is released when this call returns: a second train(plan) takes the run's lock again.
    lock = plan.lock if plan.lock is not None and plan.lock.held else plan.run.lock()
    strategy = strategy or tf.distribute.get_strategy()
    unsaved: list[Callable[[], None]] = []  # saves where training got, if it got past the last commit
    try:
        with lost_peers(plan, unsaved) if is_multi_worker(strategy) else contextlib.nullcontext():
            return _train(plan, progress or NoProgress(), strategy, unsaved, judge)
    finally:
        lock.release()


def _train(
    plan: TrainPlan,
    progress: TrainingProgress,
    strategy: tf.distribute.Strategy,
    unsaved: list[Callable[[], None]],
    judge: CurveJudge | None,
) -> TrainResult:
    cfg, run = plan.config, plan.run
    keras.utils.set_random_seed(cfg.training.seed)
    if cfg.data.batch_size % strategy.num_replicas_in_sync:
        raise ConfigError(
            f"--batch-size {cfg.data.batch_size} must divide evenly over {strategy.num_replicas_in_sync} replicas"
        )
    check_same_plan(plan, strategy)
    if plan.chief:
        keep_extension(plan)
    trainer = build_trainer(cfg, strategy)
    resume = plan.resume_state
    if resume:
        run.load_weights(trainer.model, Weights.last)
        run.load_optimizer(trainer.optimizer)
    elif cfg.prune:  # a pruned run starts from the run it prunes
        Run(Path(cfg.prune.source)).load_weights(trainer.model, Weights.best)
    elif cfg.init_from:  # a fine-tuned run starts from its base run's weights, kept in the run
        start_from_base(trainer.model, run, cfg)
    started = plan.started
    clock = Clock(before=resume.seconds if resume else 0.0, budget=cfg.training.time_budget,
                  agree=compile_agreement(strategy), started=started)  # fmt: skip
    steps = training_layout(plan, resume.epoch if resume else 0).batches  # every epoch's, shifted or not
    with stop_signals() as signals:
        stopper = Stopper(clock, signals)
        # The schedules end where training does: at the budget less what its end holds back.
        checkpoint, callbacks = build_callbacks(
            plan, trainer, steps, lambda: clock.elapsed() + clock.reserve, stopper.request, unsaved
        )
        session = _Session(plan, trainer, progress, judge, stopper, checkpoint, callbacks, steps)
        with _end_on_error(callbacks, progress), _keep_resume_point(plan):
            reason, last = session.run_epochs()
    callbacks.on_train_end(last.metrics() if last else {})
    progress.end()
    checkpoint.mark_finished(reason)
    write_loss_charts(run.history_path, run.batch_losses_path, run.loss_curve_path, run.loss_svg_path)
    return TrainResult(
        run=run.name,
        path=run.path,
        epochs=session.epochs_done,
        batches_into_epoch=session.batches_into_epoch,
        best_val_loss=checkpoint.best_val_loss,
        stop_reason=reason,
        seconds=clock.elapsed(),
        chars_per_sec=last.chars_per_sec if last else 0.0,
        max_epochs=cfg.training.epochs,
        session_seconds=time.monotonic() - started,
        documents=plan.splits.encoded.documents,
        chief=plan.chief,
        unknown_chars=plan.splits.encoded.unknown,
        stop_requested=stopper.signal_name,
        start_val_loss=checkpoint.start_val_loss,
    )


@dataclass
class _Session:
    """One invocation's training of a plan: what each step of the loop reads and updates."""

    plan: TrainPlan
    trainer: Trainer
    progress: TrainingProgress
    judge: CurveJudge | None
    stopper: Stopper
    checkpoint: RunCheckpoint
    callbacks: keras.callbacks.CallbackList
    steps: int  # batches in every epoch
    epochs_done: int = 0  # complete ones
    batches_into_epoch: int = 0  # of the one a time budget cut
    clock: Clock = field(init=False)
    batches_done: int = 0  # by this invocation
    first_batch_at: float | None = None  # this invocation's agreed seconds when its first batch ended
    end_seconds: float | None = None  # the last epoch end's save, validation and sample took, agreed by the workers
    sampled_at: float = 0.0  # this invocation's seconds at the last sample

    def __post_init__(self) -> None:
        self.clock = self.stopper.clock

    def run_epochs(self) -> tuple[StopReason, EpochLog | None]:
        """Train epoch after epoch from where the plan starts, until a stop reason; the last epoch's log."""
        resume, run, cfg = self.plan.resume_state, self.plan.run, self.plan.config
        first = resume.epoch if resume else 0
        self.epochs_done, self.batches_into_epoch = first, resume.batch if resume else 0
        self.progress.start(self.plan, self.steps)
        self.callbacks.on_train_begin()
        self.checkpoint.restore(resume)
        if cfg.init_from and not resume:
            self.score_start()
        last: EpochLog | None = None
        epochs = itertools.count(first) if cfg.training.epochs is None else range(first, cfg.training.epochs)
        for epoch in epochs:
            start, carried = EpochProgress(), None
            if resume and epoch == first:
                start = resume.epoch_progress or EpochProgress(batch=resume.batch)
                carried = run.load_stream_states() if self.checkpoint.stream_states else None
            done, reason = self.train_epoch(epoch, start, carried)
            last, reason = self.end_epoch(epoch, done, reason)
            if reason is not None:
                return reason, last
        return StopReason.EPOCHS, last

    def score_start(self) -> None:
        """Validate the base's weights before the first update and make them the run's first best."""
        # A fine-tune is then never worse than its base on its own validation text: on a text like the base's, two
        # minutes on 50 KB leave a run behind the base as it is (Great Expectations read in one stream: 1.2545
        # nats/char on test against 1.2158, docs/finetuning.md). Quietly: the display has no epoch to show
        # "validating" in yet.
        val_loss = validate(self.trainer, self.plan.splits.val, self.plan.config.data, keras.callbacks.CallbackList(),
                            NoProgress())  # fmt: skip
        if math.isfinite(val_loss):  # a base that scores NaN here is no best; the first epoch says what went wrong
            self.checkpoint.start_best(val_loss)
            self.progress.base_scored(val_loss)

    def train_epoch(
        self, epoch: int, start: EpochProgress, stream_states: list[np.ndarray] | None
    ) -> tuple[EpochProgress, StopReason | None]:
        """Train on the epoch's batches from ``start`` on, until they end or a reason to stop comes; a mid-epoch
        resume point is saved whenever ``--save-every`` has passed. A resumed epoch's streams go on from
        ``stream_states``, saved with its resume point."""
        trainer, layout = self.trainer, training_layout(self.plan, epoch)
        self.callbacks.on_epoch_begin(epoch)
        if stream_states is not None:
            for variable, value in zip(trainer.stream_states(), stream_states, strict=True):
                variable.assign(value)
        self.progress.epoch_begin(epoch, start.batch)
        done = start
        if self.clock.expired():  # a run killed past its budget before validating resumes only to validate
            return done, StopReason.TIME_BUDGET
        batches = distributed_batches(trainer.strategy, self.plan.splits.train, layout, start.batch)
        train_step = trainer.step_for(epoch)
        for batch, (x, y) in enumerate(batches, start=start.batch):
            started = time.monotonic()
            self.callbacks.on_train_batch_begin(batch)
            loss = float(train_step(x, y))
            if not math.isfinite(loss):  # the update already happened: save nothing from here on
                raise TrainingDiverged(
                    f"training diverged: the loss became {loss} at epoch {epoch + 1}, batch {batch + 1}",
                    "nothing after the last resume point was saved. Start a new run with a lower --lr or --clip-norm",
                )
            done = EpochProgress(
                batch + 1, done.loss_sum + loss, done.batches + 1, done.seconds + time.monotonic() - started
            )
            self.checkpoint.after_batch(epoch, done, self.clock.elapsed)
            self.callbacks.on_train_batch_end(batch, {"loss": done.loss, "bpc": bits(done.loss), "batch_loss": loss})
            self.progress.batch_end(batch, done.loss)
            self.batches_done += 1
            self.clock.reserve = self.end_reserve()
            reason = self.stopper.check(MID_EPOCH)
            if self.first_batch_at is None:
                self.first_batch_at = self.clock.agreed
            if reason is None and batch + 1 < layout.batches:
                reason = self.validate_mid_epoch()
            if reason is None and batch + 1 < layout.batches and self.sample_due():
                self.progress.sample(self.write_sample())
            if reason is not None:
                return done, reason
        return done, None

    def end_reserve(self) -> float:
        """Seconds to hold back from the budget for the run's end: what the last epoch end took, or before one, an
        estimate from the training speed, at most ``ESTIMATE_SHARE`` of the budget (from agreed times only: every
        worker must stop at the same batch). The process's exit counts when the budget is a command's, not a
        tuning trial's."""
        exit_seconds = 0.0 if self.plan.trial else EXIT_SECONDS
        if self.end_seconds is not None:
            return self.end_seconds + exit_seconds
        rate = None
        if self.first_batch_at is not None and self.clock.agreed > self.first_batch_at:
            chars = (self.batches_done - 1) * self.plan.config.train_streams * self.plan.config.data.seq_len
            rate = chars / (self.clock.agreed - self.first_batch_at) or None
        sample = SAMPLE_SECONDS if self.plan.config.training.sample_every and self.plan.chief else 0.0
        estimate = estimate_validation(len(self.plan.splits.val), rate) + sample + exit_seconds
        return min(estimate, ESTIMATE_SHARE * (self.plan.config.training.time_budget or math.inf))

    def sample_due(self) -> bool:
        every = self.plan.config.training.sample_every
        return bool(every) and self.plan.chief and self.clock.agreed - self.sampled_at >= every

    def write_sample(self) -> str:
        self.sampled_at = self.clock.agreed
        return write_sample(self.trainer, self.plan.config, self.plan.splits.vocab, self.plan.splits.train)

    def validate_mid_epoch(self) -> StopReason | None:
        """Validate if the judge asks, put the training streams' states back, and let the judge end the run; a stop
        signal during the validation is answered first (the judge is not told: it could end the run instead)."""
        trainer, judge = self.trainer, self.judge
        if judge is None or trainer.strategy.num_replicas_in_sync > 1 or not judge.due(self.clock.elapsed()):
            return None
        states = [np.asarray(v) for v in trainer.stream_states()]
        # No callbacks: to them (TensorBoard's logs, say) validation is the epoch's.
        val_loss = validate(trainer, self.plan.splits.val, self.plan.config.data, keras.callbacks.CallbackList(),
                            self.progress)  # fmt: skip
        for variable, value in zip(trainer.stream_states(), states, strict=True):
            variable.assign(value)
        reason = self.stopper.check(MID_EPOCH)
        if reason is None and judge.should_stop(self.clock.elapsed(), val_loss):
            self.stopper.request(StopReason.PRUNED)
            reason = StopReason.PRUNED
        return reason

    def end_epoch(
        self, epoch: int, done: EpochProgress, reason: StopReason | None
    ) -> tuple[EpochLog | None, StopReason | None]:
        """Commit the epoch's training, validate it, commit the epoch, and decide whether the run goes on: the
        epoch's log (None if it was not validated) and the reason to stop, if any."""
        checkpoint, steps = self.checkpoint, self.steps
        # Commit the training before validating: a kill during validation costs only the validation.
        checkpoint.save_resume_point(epoch, done.batch, self.clock.elapsed(), done)
        self.epochs_done, self.batches_into_epoch = epoch, done.batch
        if reason is StopReason.INTERRUPTED and done.batch < steps:  # after the last batch: end the epoch first
            raise self.interrupted(f"stopped at epoch {epoch + 1}, batch {done.batch}/{steps}")
        if reason is StopReason.PRUNED:  # by the judge, mid-epoch: it has its validation
            return None, reason
        log = self.validated_log(epoch, done)
        # A time budget that cut the epoch resumes where training stopped, not at the next epoch.
        checkpoint.resume_at = (epoch, done.batch, done) if log.partial else (epoch + 1, 0, None)
        self.callbacks.on_epoch_end(epoch, log.metrics())  # the checkpoint commits the epoch there
        if not log.partial:
            self.epochs_done, self.batches_into_epoch = epoch + 1, 0
        self.progress.epoch_end(log)
        if self.judge is not None and self.judge.should_stop(log.seconds, log.val_loss):
            self.stopper.request(StopReason.PRUNED)
        epochs = self.plan.config.training.epochs
        if epochs is not None and epoch + 1 >= epochs:
            self.stopper.request(StopReason.EPOCHS)
        reason = self.stopper.check(EPOCH_END)
        if reason is StopReason.INTERRUPTED:  # a stop during validation: the epoch is saved
            raise self.interrupted(f"stopped after epoch {epoch + 1}")
        return log, reason

    def validated_log(self, epoch: int, done: EpochProgress) -> EpochLog:
        """Validate the epoch and make its log; a validation loss that is not finite ends the run."""
        trainer, began = self.trainer, self.clock.agreed  # agreed at the epoch's last batch
        val_loss = validate(trainer, self.plan.splits.val, self.plan.config.data, self.callbacks, self.progress)
        sample = self.write_sample() if self.plan.config.training.sample_every and self.plan.chief else None
        self.clock.synchronise(self.stopper.signals)  # every worker logs and decides the same from here on
        self.end_seconds = self.clock.agreed - began
        if not math.isfinite(val_loss):
            raise TrainingDiverged(
                f"training diverged: the validation loss of epoch {epoch + 1} is {val_loss}",
                "nothing of it was saved. Start a new run with a lower --lr or --clip-norm",
            )
        layout = training_layout(self.plan, epoch)
        return EpochLog(
            epoch=epoch + 1,
            loss=done.loss,
            bpc=bits(done.loss),
            val_loss=val_loss,
            val_bpc=bits(val_loss),
            chars_per_sec=done.batches * layout.chars_per_batch / max(done.seconds, 1e-9),
            learning_rate=float(tf.convert_to_tensor(trainer.optimizer.learning_rate.value)),
            batches=done.batches,
            seconds=self.clock.elapsed(),
            improved=val_loss < self.checkpoint.best_val_loss and self.checkpoint.eligible(),
            partial=done.batch < self.steps,
            sample=sample if math.isfinite(val_loss) else None,
        )

    def interrupted(self, where: str) -> TrainingInterrupted:
        return TrainingInterrupted(
            f"{where} ({self.stopper.signal_name})", self.plan.saved_note(), exit_code=self.stopper.exit_code
        )


# What a run's end takes beyond its last validation and sample: the final save, the loss charts, the process's exit
# (TensorFlow's teardown). With it, War and Peace runs end between 2.9 s before and 0.1 s after a 1, 2 or 5 minute
# budget, timed from launch to exit (benchmarks/budget.py, docs/performance.md).
EXIT_SECONDS = 3.0
# Before an epoch end has measured it: validation reads characters faster than training (forward only), and its
# first call traces the evaluation step. War and Peace's 160,378 validation characters took 3.8 s, tracing
# included, at 16,000 training chars/s; these constants estimate 5.3 s.
VALIDATION_SPEEDUP = 3.0
VALIDATION_TRACE_SECONDS = 2.0
# An estimate holds back at most this share of a budget: a 3-second tuning trial is not spent on one.
ESTIMATE_SHARE = 0.1


def estimate_validation(val_chars: int, train_chars_per_sec: float | None) -> float:
    """Seconds the last validation should take at the training speed (``None``: not measured yet)."""
    reading = val_chars / (train_chars_per_sec * VALIDATION_SPEEDUP) if train_chars_per_sec else 0.0
    return reading + VALIDATION_TRACE_SECONDS


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


@contextlib.contextmanager
def _keep_resume_point(plan: TrainPlan) -> Iterator[None]:
    """An id file that cannot be read mid-run (the cache removed while training) ends the run at its last resume
    point, saying how to go on: ``--resume`` encodes the corpus again, to the same ids."""
    try:
        yield
    except IdFileError as exc:
        raise IdFileError(f"{exc}; {plan.saved_note()}") from None
