"""Training on several devices or machines with ``tf.distribute``: this process's role, and its strategy.

A multi-worker cluster is described the standard way, by ``$TF_CONFIG`` on every machine::

    {"cluster": {"worker": ["host1:2222", "host2:2222"]}, "task": {"type": "worker", "index": 0}}

The chief (a "chief" task, else worker 0) writes the run; the other workers train in step with it and
write only into scratch space of their own.
"""

from __future__ import annotations

import errno
import os
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from textgen.errors import ConfigError, shown
from textgen.files import parse_json_object

if TYPE_CHECKING:
    import tensorflow as tf

TF_CONFIG_EXAMPLE = (
    'TF_CONFIG=\'{"cluster": {"worker": ["host1:2222", "host2:2222"]}, "task": {"type": "worker", "index": 0}}\''
)
_ADDRESS = re.compile(r"^(?:[A-Za-z0-9_.-]+|\[[0-9A-Fa-f:.]+\]):(\d{1,5})$")  # host:port, [IPv6]:port
TASK_TYPES = ("chief", "worker")  # the tasks that train (a cluster may also list others, an evaluator say)


@dataclass(frozen=True)
class Role:
    """This process's place in training: how many workers, which one it is, whether it writes the run, and the
    address its gRPC server listens on (multi-worker only)."""

    workers: int = 1
    index: int = 0
    chief: bool = True
    address: str = ""


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
        cluster, kind, index = _read_tf_config(raw)
    except ValueError as exc:
        raise ConfigError(f"$TF_CONFIG {exc}; it looks like {TF_CONFIG_EXAMPLE}") from None
    tasks = [(k, i) for k in TASK_TYPES for i in range(len(cluster.get(k, [])))]
    place = tasks.index((kind, index))
    return Role(workers=len(tasks), index=place, chief=place == 0, address=cluster[kind][index])


def _read_tf_config(raw: str) -> tuple[dict[str, list[str]], str, int]:
    """``$TF_CONFIG``'s cluster, and this task's type and index; ``ValueError`` saying which field is wrong."""
    try:
        config = parse_json_object(raw)
    except ValueError as exc:
        raise ValueError(f"is not a JSON object ({exc})") from None
    cluster, task = config.get("cluster"), config.get("task")
    if not isinstance(cluster, dict) or not cluster:
        raise ValueError(f"has no cluster of task lists (cluster={shown(cluster)})")
    addresses: list[Any] = []
    for kind, tasks in cluster.items():
        if not isinstance(tasks, list) or not all(isinstance(a, str) and _ADDRESS.match(a) for a in tasks):
            raise ValueError(f'cluster.{kind} must be a list of "host:port" strings (got {shown(tasks)})')
        addresses += tasks
    for address in addresses:
        if not 0 < int(address.rsplit(":", 1)[1]) < 65536:
            raise ValueError(f"has {address}, whose port is not from 1 to 65535")
        if addresses.count(address) > 1:
            raise ValueError(f"lists {address} twice")
    if len(cluster.get("chief", [])) > 1:
        raise ValueError("has more than one chief")
    if not isinstance(task, dict):
        raise ValueError(f'has no task object, like {{"type": "worker", "index": 0}} (task={shown(task)})')
    kind, index = task.get("type"), task.get("index")
    if kind not in TASK_TYPES or kind not in cluster:
        raise ValueError(f"task.type={shown(kind)}: this process must be a chief or worker of the cluster")
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(cluster[kind]):
        raise ValueError(f"task.index={shown(index)}: cluster.{kind} has {len(cluster[kind])} (from 0)")
    return cluster, kind, index


def make_strategy(strategy: str, role: Role) -> tf.distribute.Strategy:
    """The ``tf.distribute`` strategy named by ``--strategy``; create it before any other TensorFlow work."""
    import tensorflow as tf

    if strategy == "mirrored":
        return tf.distribute.MirroredStrategy()
    if strategy == "multiworker":
        try:
            return tf.distribute.MultiWorkerMirroredStrategy()
        except tf.errors.OpError as exc:  # its gRPC server could not start
            port = int(role.address.rsplit(":", 1)[1])
            if _in_use(port):
                raise ConfigError(
                    f"port {port} of this worker ({role.address} in $TF_CONFIG) is in use by another process: "
                    "stop it, or give this worker another port"
                ) from None
            raise ConfigError(f"this worker ({role.address} in $TF_CONFIG) could not start: {exc.message}") from None
    return tf.distribute.get_strategy()


def _in_use(port: int) -> bool:
    """Whether another process listens on ``port`` (the gRPC server binds every interface)."""
    with socket.socket() as probe:
        try:
            probe.bind(("", port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def replica_sum(strategy: tf.distribute.Strategy) -> Callable[[tf.Tensor], tf.Tensor]:
    """A compiled function summing a tensor over ``strategy``'s replicas, each giving its own value."""
    import tensorflow as tf

    @tf.function(autograph=False)
    def total(values: tf.Tensor) -> tf.Tensor:
        return strategy.reduce("SUM", strategy.run(tf.identity, args=(values,)), axis=None)

    return total
