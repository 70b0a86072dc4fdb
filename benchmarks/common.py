"""What the benchmarks share: the reference workload (REF), its corpus split, and timing helpers.

The scripts run as ``python benchmarks/X.py``, so this directory is ``sys.path[0]`` and they
``from common import ...``. Nothing here imports TensorFlow, or textgen at module level: a
script may import this module in a process that must not start TensorFlow.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict, TypeVar

if TYPE_CHECKING:
    from textgen.config import DataConfig, DeviceProfile, RunConfig
    from textgen.data import Splits

# REF: War and Peace, Embedding(V, 64) -> LSTM(512) -> Dense(V), batch 64 x 100 chars.
REF_CORPUS = "2600-0.txt"
REF_VOCAB_SIZE = 105  # the number of ids of REF_CORPUS's vocabulary


class Workload(TypedDict):
    """REF's shape: the batches and the model (a benchmark may set ``layers`` for its run)."""

    batch_size: int
    seq_len: int
    embedding_dim: int
    units: int
    layers: int
    dropout: float


REF: Workload = {"batch_size": 64, "seq_len": 100, "embedding_dim": 64, "units": 512, "layers": 1, "dropout": 0.0}

T = TypeVar("T")


def cpu_busy_seconds() -> float:
    """Seconds of CPU all processes spent busy so far (from /proc/stat)."""
    with open("/proc/stat") as fh:
        fields = [int(v) for v in fh.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def cycling(items: Iterable[T]) -> Callable[[], T]:
    """A function returning the next of ``items`` at each call, starting them over when they run out.

    The first call starts the first pass.
    """
    iterator: Iterator[T] | None = None

    def next_item() -> T:
        nonlocal iterator
        if iterator is not None:
            try:
                return next(iterator)
            except StopIteration:
                pass
        iterator = iter(items)
        return next(iterator)

    return next_item


def timed(call: Callable[[], object], seconds: float, warmup: int = 2) -> tuple[int, float]:
    """``call()`` repeated for ``seconds`` of wall time after ``warmup`` untimed calls: (timed calls, elapsed seconds).

    At least one call is timed; with ``seconds=0``, exactly one.
    """
    for _ in range(warmup):
        call()
    calls, started = 0, time.perf_counter()
    while calls == 0 or time.perf_counter() - started < seconds:
        call()
        calls += 1
    return calls, time.perf_counter() - started


def ref_data_config(corpus: str, files: tuple[str, ...] = (), encoding: str = "utf-8") -> DataConfig:
    """REF's batch layout over ``corpus`` (a many-file corpus: its ``files``, in order), with training's
    split fractions (DataConfig's defaults)."""
    from textgen.config import DataConfig

    return DataConfig(
        corpus=corpus, files=files, encoding=encoding, batch_size=REF["batch_size"], seq_len=REF["seq_len"]
    )


def ref_run_config(corpus: str, vocab_size: int, profile: DeviceProfile, data: DataConfig | None = None) -> RunConfig:
    """The REF model and batches, with training's default optimiser settings, under ``profile``; ``data``
    replaces ``ref_data_config(corpus)`` (e.g. for a many-file corpus)."""
    from textgen.config import ModelConfig, RunConfig, TrainConfig

    return RunConfig(
        data=data or ref_data_config(corpus),
        model=ModelConfig(
            vocab_size=vocab_size,
            embedding_dim=REF["embedding_dim"],
            units=REF["units"],
            layers=REF["layers"],
            dropout=REF["dropout"],
        ),
        training=TrainConfig(),
        profile=profile,
    )


def reference_splits() -> tuple[Path, Splits]:
    """REF's corpus file and its train / validation / test split, as ``textgen train`` cuts it: memory maps
    of the id cache training uses (``checkpoints/.cache``, or $TEXTGEN_CACHE_DIR), encoded there if needed."""
    from textgen.corpus import resolve_corpus
    from textgen.data import load_splits
    from textgen.idcache import cache_root

    path = resolve_corpus(REF_CORPUS)
    return path, load_splits(ref_data_config(str(path)), cache_root(Path("checkpoints")))
