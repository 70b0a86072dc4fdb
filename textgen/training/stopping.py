"""How a run stops: stop signals, the wall-clock budget, and every other reason, agreed by all workers of a
cluster and checked in one place (``Stopper.check``); and what happens when another worker is lost."""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import tensorflow as tf

from textgen.cluster import replica_sum
from textgen.errors import ClusterError, ConfigError
from textgen.results import StopReason
from textgen.signals import StopSignals

if TYPE_CHECKING:
    from textgen.training.plan import TrainPlan


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
    # Seconds held back from the budget for the run's end (its last validation, sample and save), so that the run
    # ends by its budget; set by the loop from what every worker agreed, so they all stop at the same batch.
    reserve: float = 0.0

    def synchronise(self, stop: StopSignals) -> None:
        requested = stop.requested  # read once: the signal handler may set it at any moment
        self.stopping, self.agreed = self.agree(requested is not None, time.monotonic() - self.started)
        if self.stopping and requested is None and stop.requested is None:
            stop.requested, stop.exit_code = "a stop on another worker", 143

    def elapsed(self) -> float:
        return self.before + self.agreed

    def expired(self) -> bool:
        """Whether the budget has no room for more training before the run's end."""
        return self.budget is not None and self.elapsed() + self.reserve >= self.budget


def compile_agreement(strategy: tf.distribute.Strategy) -> Callable[[bool, float], tuple[bool, float]]:
    """``Clock.agree`` through one all-reduce over ``strategy``'s replicas (~0.1 ms on one device)."""
    replicas, reduce = strategy.num_replicas_in_sync, replica_sum(strategy)

    def agree(stop: bool, seconds: float) -> tuple[bool, float]:
        stops, total = reduce(tf.constant([float(stop), seconds], tf.float32)).numpy()
        return bool(stops > 0), float(total) / replicas

    return agree


# Which reason wins when several are asked for at once. Within an epoch a stop signal comes first (the epoch is
# saved where it got), then a judge's verdict; a spent budget lets the epoch end and be validated. At an epoch's
# end the run's own ends come first: a signal then stops only a run that would have gone on, and a run that was
# finishing anyway finishes (the signal is still reported, as ``TrainResult.stop_requested``).
MID_EPOCH = (StopReason.INTERRUPTED, StopReason.PRUNED, StopReason.TIME_BUDGET)
EPOCH_END = (
    StopReason.EARLY_STOPPING,  # said first: more epochs or time would not help this run
    StopReason.TIME_BUDGET,
    StopReason.EPOCHS,
    StopReason.INTERRUPTED,
    StopReason.PRUNED,
)


@dataclass
class Stopper:
    """Every reason to stop a run reported in one place: a stop signal (on any worker), the time budget, the
    last epoch, early stopping and a judge of the curve (``request``). The loop asks ``check`` after each batch
    and at each epoch's end, and stops for the reason it returns."""

    clock: Clock
    signals: StopSignals
    requested: set[StopReason] = field(default_factory=set)

    def request(self, reason: StopReason) -> None:
        self.requested.add(reason)

    def check(self, order: tuple[StopReason, ...]) -> StopReason | None:
        """Agree with the other workers on the time and on any stop signal, then the reason to stop now, if any."""
        self.clock.synchronise(self.signals)
        if self.clock.stopping:
            self.request(StopReason.INTERRUPTED)
        if self.clock.expired():
            self.request(StopReason.TIME_BUDGET)
        return next((reason for reason in order if reason in self.requested), None)

    @property
    def signal_name(self) -> str | None:
        """The stop signal received (here, or on another worker), for messages."""
        return self.signals.requested

    @property
    def exit_code(self) -> int:
        return self.signals.exit_code


def is_multi_worker(strategy: tf.distribute.Strategy) -> bool:
    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)


# What a collective raises when a peer is gone: a dead process resets its connections (the survivor's step fails
# within 0.1 s), a frozen one misses the coordination service's heartbeats (~10 s).
_PEER_ERRORS = (
    tf.errors.UnavailableError,
    tf.errors.DeadlineExceededError,
    tf.errors.AbortedError,
    tf.errors.CancelledError,
)


@contextlib.contextmanager
def lost_peers(plan: TrainPlan, unsaved: list[Callable[[], None]]) -> Iterator[None]:
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
    if not is_multi_worker(strategy):
        return
    resume = plan.resume_state
    settings = plan.config.to_dict()
    settings["data"] = {k: v for k, v in settings["data"].items() if k not in ("corpus", "files")}  # paths may differ
    if "init_from" in settings:  # a worker reads the base run from its scratch copy
        settings["init_from"] = {k: v for k, v in settings["init_from"].items() if k != "source"}
    described = json.dumps([settings, [resume.epoch, resume.batch, resume.step] if resume else [None] * 3])
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
