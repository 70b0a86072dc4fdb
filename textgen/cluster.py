"""Training on several devices or machines with ``tf.distribute``: this process's role, and its strategy.

A multi-worker cluster is described the standard way, by ``$TF_CONFIG`` on every machine::

    {"cluster": {"worker": ["host1:2222", "host2:2222"]}, "task": {"type": "worker", "index": 0}}

The chief (a "chief" task, else worker 0) writes the run; the other workers train in step with it and
write only into scratch space of their own.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from textgen.errors import ConfigError

if TYPE_CHECKING:
    import tensorflow as tf

TF_CONFIG_EXAMPLE = (
    'TF_CONFIG=\'{"cluster": {"worker": ["host1:2222", "host2:2222"]}, "task": {"type": "worker", "index": 0}}\''
)


@dataclass(frozen=True)
class Role:
    """This process's place in training: how many workers, which one it is, whether it writes the run."""

    workers: int = 1
    index: int = 0
    chief: bool = True


def cluster_role(strategy: str, saved: bool = False) -> Role:
    """The role ``$TF_CONFIG`` gives this process under ``strategy`` (alone unless "multiworker"; ``saved``:
    the strategy comes from the run being resumed, not from the command line)."""
    if strategy != "multiworker":
        return Role()
    raw = os.environ.get("TF_CONFIG", "")
    if not raw.strip():
        if saved:
            raise ConfigError(
                "this run was trained with --strategy multiworker: set $TF_CONFIG on every worker to resume it so, "
                "or add --strategy none to resume it in this process alone"
            )
        raise ConfigError(
            f"--strategy multiworker needs $TF_CONFIG, the cluster and this worker's place in it, e.g. {TF_CONFIG_EXAMPLE}"
        )
    try:
        config = json.loads(raw)
        cluster, task = config["cluster"], config["task"]
        kind, index = task["type"], int(task["index"])
        tasks = [(k, i) for k in ("chief", "worker") for i in range(len(cluster.get(k, [])))]
        if (kind, index) not in tasks:
            raise ValueError(f"task {kind} {index} is not in the cluster")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(
            f"$TF_CONFIG is not a cluster description ({exc}); it looks like {TF_CONFIG_EXAMPLE}"
        ) from None
    return Role(workers=len(tasks), index=tasks.index((kind, index)), chief=tasks.index((kind, index)) == 0)


def make_strategy(strategy: str) -> tf.distribute.Strategy:
    """The ``tf.distribute`` strategy named by ``--strategy``; create it before any other TensorFlow work."""
    import tensorflow as tf

    if strategy == "mirrored":
        return tf.distribute.MirroredStrategy()
    if strategy == "multiworker":
        return tf.distribute.MultiWorkerMirroredStrategy()
    return tf.distribute.get_strategy()


def replica_sum(strategy: tf.distribute.Strategy) -> Callable[[tf.Tensor], tf.Tensor]:
    """A compiled function summing a tensor over ``strategy``'s replicas, each giving its own value."""
    import tensorflow as tf

    @tf.function(autograph=False)
    def total(values: tf.Tensor) -> tf.Tensor:
        return strategy.reduce("SUM", strategy.run(tf.identity, args=(values,)), axis=None)

    return total
