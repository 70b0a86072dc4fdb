"""Corpus ids -> contiguous splits -> tf.data datasets in the stateful stream layout.

The layout: a split's ids are cut into ``batch_size`` contiguous streams, and batch
``k`` holds characters ``[k*seq_len, (k+1)*seq_len)`` of every stream, so row ``i``
of batch ``k+1`` continues row ``i`` of batch ``k`` exactly. Targets are the inputs
shifted by one character.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from textgen.config import DataConfig
from textgen.corpus import read_corpus
from textgen.errors import CorpusError
from textgen.vocab import Vocabulary

if TYPE_CHECKING:
    import tensorflow as tf


@dataclass(frozen=True)
class Splits:
    """A corpus encoded and cut into contiguous train / validation / test parts."""

    vocab: Vocabulary
    train: np.ndarray
    val: np.ndarray
    test: np.ndarray


def split_ids(ids: np.ndarray, val_fraction: float, test_fraction: float) -> tuple[np.ndarray, ...]:
    """Contiguous (train, val, test) parts: train first, test last."""
    n_val, n_test = int(len(ids) * val_fraction), int(len(ids) * test_fraction)
    n_train = len(ids) - n_val - n_test
    return ids[:n_train], ids[n_train : n_train + n_val], ids[n_train + n_val :]


def load_splits(cfg: DataConfig, vocab: Vocabulary | None = None) -> Splits:
    """Read the corpus, encode it (with ``vocab``, or a new one built from the whole text), split it."""
    text = read_corpus(cfg.corpus, strip_boilerplate=cfg.strip_boilerplate, encoding=cfg.encoding)
    vocab = vocab or Vocabulary.from_text(text)
    train, val, test = split_ids(vocab.encode(text), cfg.val_fraction, cfg.test_fraction)
    for name, part in (("training", train), ("validation", val)):
        check_layout_fits(part, cfg.batch_size, cfg.seq_len, name, len(text))
    return Splits(vocab, train, val, test)


def check_layout_fits(ids: np.ndarray, batch_size: int, seq_len: int, name: str, corpus_chars: int) -> None:
    """Raise a CorpusError saying how short ``ids`` is if it cannot fill one batch."""
    need = batch_size * seq_len + 1
    if len(ids) < need:
        raise CorpusError(
            f"corpus too short: its {name} split has {len(ids):,} characters (of {corpus_chars:,}) but "
            f"--batch-size {batch_size} x --seq-len {seq_len} needs {need:,}; use a smaller "
            f"--batch-size or --seq-len, or a longer text"
        )


def stream_layout(ids: np.ndarray, batch_size: int, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Inputs and targets shaped (num_batches, batch_size, seq_len) in the stateful layout."""
    num_batches = (len(ids) - 1) // (batch_size * seq_len)
    if num_batches <= 0:  # (len - 1) // n is -1 for no ids at all
        raise CorpusError(f"{len(ids)} characters cannot fill one {batch_size} x {seq_len} batch")
    stream_len = num_batches * seq_len
    used = batch_size * stream_len

    def arrange(part: np.ndarray) -> np.ndarray:
        return part.reshape(batch_size, num_batches, seq_len).transpose(1, 0, 2)

    return arrange(ids[:used]), arrange(ids[1 : used + 1])


def fit_layout(n: int, batch_size: int, seq_len: int) -> tuple[int, int]:
    """``(batch_size, seq_len)`` if ``n`` ids fill one such batch, else the largest layout they do fill
    (fewer streams first, then shorter ones); ``n`` must be at least 2."""
    streams = max(1, min(batch_size, (n - 1) // seq_len))
    return streams, min(seq_len, (n - 1) // streams)


def make_dataset(ids: np.ndarray, batch_size: int, seq_len: int) -> tf.data.Dataset:
    """A tf.data dataset of (inputs, targets) int32 batches in the stateful layout, in order."""
    import tensorflow as tf

    inputs, targets = stream_layout(ids, batch_size, seq_len)
    dataset = tf.data.Dataset.from_tensor_slices((inputs.astype(np.int32), targets.astype(np.int32)))
    return dataset.cache().prefetch(tf.data.AUTOTUNE)
