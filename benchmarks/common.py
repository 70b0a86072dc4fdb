"""What the benchmarks share: the reference workload (REF), its corpus split, and one timing loop.

The scripts run as ``python benchmarks/X.py``, so this directory is ``sys.path[0]`` and they
``from common import ...``. Nothing here imports TensorFlow, or textgen at module level: a
script may import this module in a process that must not start TensorFlow.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from textgen.config import DataConfig, DeviceProfile, RunConfig
    from textgen.data import Splits

# REF: War and Peace, Embedding(V, 64) -> LSTM(512) -> Dense(V), batch 64 x 100 chars.
REF_CORPUS = "2600-0.txt"
REF_VOCAB_SIZE = 105  # the number of ids of REF_CORPUS's vocabulary
REF = {"batch_size": 64, "seq_len": 100, "embedding_dim": 64, "units": 512, "layers": 1, "dropout": 0.0}
_MODEL_KEYS = ("embedding_dim", "units", "layers", "dropout")


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


def ref_data_config(corpus: str) -> DataConfig:
    """REF's batch layout over ``corpus``, with training's split fractions (DataConfig's defaults)."""
    from textgen.config import DataConfig

    return DataConfig(corpus=corpus, batch_size=REF["batch_size"], seq_len=REF["seq_len"])


def ref_run_config(corpus: str, vocab_size: int, profile: DeviceProfile) -> RunConfig:
    """The REF model and batches, with training's default optimiser settings, under ``profile``."""
    from textgen.config import ModelConfig, RunConfig, TrainConfig

    return RunConfig(
        data=ref_data_config(corpus),
        model=ModelConfig(vocab_size=vocab_size, **{k: REF[k] for k in _MODEL_KEYS}),
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
