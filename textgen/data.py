"""A run's corpus as id files (memory-mapped splits), and batches read from them in the stateful stream layout.

The layout is ``textgen.layout.StreamLayout``'s arithmetic; here tf.data reads its batches from the id file a
record per stream, so memory does not grow with the corpus. Under ``tf.distribute`` each replica always gets
the same rows, so each replica's rows continue its own.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from textgen.config import DataConfig
from textgen.corpus import fingerprint, resolve_encoding
from textgen.errors import CorpusError, IdFileError
from textgen.idcache import CorpusSource, EncodedCorpus, encoded_corpus
from textgen.layout import MIN_SEQ_LEN, MIN_STREAMS, StreamLayout, fills_one_batch, fitting_layout
from textgen.vocab import Vocabulary

if TYPE_CHECKING:
    import tensorflow as tf


@dataclass(frozen=True)
class Splits:
    """A corpus encoded and cut into contiguous train / validation / test parts (memory maps)."""

    vocab: Vocabulary
    train: np.ndarray
    val: np.ndarray
    test: np.ndarray
    encoded: EncodedCorpus  # documents, characters, and what --max-vocab left out

    @property
    def chars(self) -> int:
        """The corpus's characters, all three parts."""
        return len(self.train) + len(self.val) + len(self.test)


def corpus_source(cfg: DataConfig) -> CorpusSource:
    """What the ids of ``cfg``'s corpus depend on: its files, their encodings and bytes, the cleaning."""
    files = tuple(Path(f) for f in cfg.paths)
    return CorpusSource(
        files,
        tuple(resolve_encoding(f, cfg.encoding) for f in files),
        tuple(fingerprint(f) for f in files),
        cfg.strip_boilerplate,
        cfg.max_vocab,
        cfg.val_fraction,
        cfg.test_fraction,
        cfg.base_vocab,
    )


def load_splits(
    cfg: DataConfig, cache_dir: Path, vocab: Vocabulary | None = None, train_streams: int | None = None
) -> Splits:
    """The corpus of ``cfg`` encoded (from the cache in ``cache_dir``, or now) and split; with ``vocab``
    (a run's saved one), the encoding must have the same vocabulary. The training split must fill a batch
    of ``train_streams`` (``--batch-size`` x ``--accumulate``), the validation split one of ``--batch-size``."""
    encoded = encoded_corpus(corpus_source(cfg), cache_dir)
    if vocab is not None and vocab != encoded.vocab:
        raise CorpusError(
            f"the corpus now encodes to another vocabulary than the run's ({encoded.vocab.size} ids, not "
            f"{vocab.size}); was it trained by another textgen version? Start a new run"
        )
    splits = Splits(encoded.vocab, encoded.ids("train"), encoded.ids("val"), encoded.ids("test"), encoded)
    for name, part, streams in (("training", splits.train, train_streams), ("validation", splits.val, None)):
        check_layout_fits(part, streams or cfg.batch_size, cfg.seq_len, name, encoded.chars, cfg.batch_size)
    return splits


def fit_small_corpus(
    cfg: DataConfig, cache_dir: Path, accumulate: int, given: set[str]
) -> tuple[DataConfig, str | None]:
    """``cfg`` with a batch layout its corpus fills, and a line saying why when it is not the default: for a text
    too small for the default layout, the biggest that fits (``textgen.layout.fitting_layout``) among the settings
    not ``given``. A layout the user gave is left for ``load_splits`` to refuse, with the flags to change."""
    keep_streams, keep_seq_len = "batch_size" in given, "seq_len" in given
    encoded = encoded_corpus(corpus_source(cfg), cache_dir)
    train, val = len(encoded.ids("train")), len(encoded.ids("val"))
    streams, seq_len = cfg.batch_size, cfg.seq_len
    if (keep_streams and keep_seq_len) or (
        fills_one_batch(val, streams, seq_len) and fills_one_batch(train, streams * accumulate, seq_len)
    ):
        return cfg, None
    fitted = fitting_layout(train, val, streams, seq_len, accumulate, keep_streams=keep_streams,
                            keep_seq_len=keep_seq_len)  # fmt: skip
    if fitted is None:
        least_streams = streams if keep_streams else MIN_STREAMS
        least_len = seq_len if keep_seq_len else MIN_SEQ_LEN
        need = least_streams * least_len + 1
        smallest = max(
            need / cfg.val_fraction,
            (least_streams * accumulate * least_len + 1) / (1 - cfg.val_fraction - cfg.test_fraction),
        )
        raise CorpusError(
            f"corpus too short: {encoded.chars:,} characters, and even a batch of {least_streams} streams x "
            f"{least_len} characters needs {need:,} in its validation split ({cfg.val_fraction:.0%} of the text); "
            f"give a text of at least {math.ceil(smallest / 100) * 100:,} characters"
        )
    batch_size, seq_len = fitted
    note = (
        f"a small text ({encoded.chars:,} characters): batches of {batch_size} streams x {seq_len} characters, not "
        f"{cfg.batch_size} x {cfg.seq_len}, so that its {val:,}-character validation split fills one"
    )
    return dataclasses.replace(cfg, batch_size=batch_size, seq_len=seq_len), note


def check_layout_fits(
    ids: np.ndarray, streams: int, seq_len: int, name: str, corpus_chars: int, batch_size: int
) -> None:
    """Raise a CorpusError saying how short ``ids`` is if it cannot fill one batch of ``streams`` (``batch_size``
    times ``--accumulate``)."""
    if not fills_one_batch(len(ids), streams, seq_len):
        need = streams * seq_len + 1
        accumulate = f" x --accumulate {streams // batch_size}" if streams != batch_size else ""
        raise CorpusError(
            f"corpus too short: its {name} split has {len(ids):,} characters (of {corpus_chars:,}) but "
            f"--batch-size {batch_size}{accumulate} x --seq-len {seq_len} needs {need:,}; use a smaller "
            f"--batch-size or --seq-len, or a longer text"
        )


PREFETCH_BATCHES = 2


def distributed_batches(
    strategy: tf.distribute.Strategy, ids: np.ndarray, layout: StreamLayout, start: int = 0
) -> Iterable[Any]:
    """The layout's batches from ``start`` on, read from the id file behind ``ids`` by tf.data and split over
    ``strategy``'s replicas by rows: replica ``r`` always reads streams ``r * per`` to ``(r + 1) * per``.
    Each worker's pipeline reads only its own replicas' rows, one element per replica in turn
    (``distribute_datasets_from_function`` deals a worker's elements to its replicas round-robin).

    Each row is a ``FixedLengthRecordDataset`` over its stream (records of ``seq_len`` ids; the targets, over
    the stream shifted by one id), so memory holds a small read buffer per stream and no Python runs per
    batch. (A ``from_generator`` pipeline over the memory map made the training step 25-30% slower on
    2 cores: 11,100 against 15,300 chars/s for War and Peace, alternating runs.)
    """
    import tensorflow as tf

    replicas = strategy.num_replicas_in_sync
    if layout.streams % replicas:
        raise CorpusError(f"{layout.streams} streams cannot be shared evenly by {replicas} replicas")

    # No autotuning: nothing here runs in parallel for it to tune, and its model thread made dropping the iterator
    # mid-epoch (a time budget's stop) block for up to ~35 s in 3 of 7 runs (the destructor waits for that thread;
    # War and Peace, --time-budget 2m, 2 cores). Two batches ahead keep the step fed.
    options = tf.data.Options()
    options.autotune.enabled = False

    def dataset(context: tf.distribute.InputContext) -> tf.data.Dataset:
        local = replicas // context.num_input_pipelines
        first = context.input_pipeline_id * local
        parts = [replica_batches(ids, layout, r, replicas, start) for r in range(first, first + local)]
        if len(parts) == 1:
            return parts[0].prefetch(PREFETCH_BATCHES).with_options(options)
        stacked = tf.data.Dataset.zip(tuple(parts)).map(
            lambda *pairs: tuple(tf.stack([pair[i] for pair in pairs]) for i in range(2))
        )
        return stacked.unbatch().prefetch(PREFETCH_BATCHES).with_options(options)

    return _Reading(strategy.distribute_datasets_from_function(dataset), _id_file(ids))


def _id_file(ids: np.ndarray) -> np.memmap:
    if not isinstance(ids, np.memmap) or ids.filename is None:
        raise TypeError("distributed_batches reads an id file: give it a np.memmap (see write_id_file)")
    return ids


class _Reading:
    """Batches whose failed reads are one IdFileError naming the file: tf.data raises NotFoundError for an id file
    removed before it is opened, InvalidArgumentError or InternalError for one cut short, when the next batch is
    asked for (a lost peer's errors are left to ``textgen.training.stopping``)."""

    def __init__(self, batches: Iterable[Any], ids: np.memmap) -> None:
        self.batches, self.ids = batches, ids

    def __iter__(self) -> Iterator[Any]:
        import tensorflow as tf

        errors = tf.errors
        try:
            yield from self.batches
        except (
            errors.NotFoundError,
            errors.PermissionDeniedError,
            errors.InvalidArgumentError,
            errors.OutOfRangeError,
            errors.DataLossError,
            errors.InternalError,
            errors.UnknownError,
        ) as exc:
            raise _unreadable(self.ids, _id_file_problem(self.ids) or _tf_reason(exc)) from None


def _tf_reason(exc: Exception) -> str:
    """A TensorFlow error's message without the op and function names around it."""
    return " ".join(re.sub(r"\{\{.*?\}\}|\[Op:.*", "", str(exc), flags=re.DOTALL).split())[:200]


def _unreadable(ids: np.memmap, reason: str) -> IdFileError:
    return IdFileError(
        f"cannot read {ids.filename} (the encoded corpus; removed or changed while in use?): {reason}; the next "
        "command encodes it again"
    )


def _id_file_problem(ids: np.memmap) -> str | None:
    """What is wrong with the file behind ``ids`` now, if anything: it is gone, or cut short."""
    try:
        size = os.path.getsize(str(ids.filename))
    except OSError as exc:
        return exc.strerror or str(exc)
    return f"it has {size:,} bytes, not {ids.offset + ids.nbytes:,}" if size < ids.offset + ids.nbytes else None


READ_BUFFER_BYTES = 16 << 10  # per stream: 64 streams read 2 MB at a time


def replica_batches(
    ids: np.ndarray, layout: StreamLayout, replica: int, replicas: int, start: int = 0
) -> tf.data.Dataset:
    """Replica ``replica``'s (inputs, targets) of every batch from ``start`` on: rows ``replica * per`` to
    ``(replica + 1) * per`` of ``layout``'s batches, ``per`` being ``layout.streams // replicas``."""
    import tensorflow as tf

    per = layout.streams // replicas
    return tf.data.Dataset.zip(tuple(_rows(ids, layout, replica * per, per, start, shift) for shift in (0, 1)))


def _rows(ids: np.ndarray, layout: StreamLayout, first: int, rows: int, start: int, shift: int) -> tf.data.Dataset:
    """Rows ``first`` .. ``first + rows - 1`` of every batch from ``start`` on, shifted by ``shift`` ids (1 for
    the targets), as int32 (rows, seq_len) tensors: one reader per stream, interleaved one record each."""
    import tensorflow as tf

    ids = _id_file(ids)
    path, itemsize, record = str(ids.filename), ids.dtype.itemsize, layout.seq_len * ids.dtype.itemsize
    count = layout.batches - start  # a layout leaves an id after its last target: every read fits
    headers = [
        ids.offset + (layout.stream_start(i) + start * layout.seq_len + shift) * itemsize
        for i in range(first, first + rows)
    ]
    if problem := _id_file_problem(ids):  # the cache removed since it was opened (rm -r checkpoints/.cache)
        raise _unreadable(ids, problem)
    footers = [os.path.getsize(path) - h - count * record for h in headers]
    streams = tf.data.Dataset.from_tensor_slices((tf.constant(headers, tf.int64), tf.constant(footers, tf.int64)))
    read = streams.interleave(
        lambda header, footer: tf.data.FixedLengthRecordDataset(
            path, record, header_bytes=header, footer_bytes=footer, buffer_size=READ_BUFFER_BYTES
        ),
        cycle_length=rows,  # every stream's reader open at once, one record from each in turn
        block_length=1,
    )
    dtype = tf.as_dtype(ids.dtype)
    return read.batch(rows).map(lambda r: tf.cast(tf.io.decode_raw(r, dtype, little_endian=True), tf.int32))


def write_id_file(ids: np.ndarray, path: Path) -> np.memmap:
    """``ids`` (an array in memory, e.g. a text scored by ``evaluate``) written to ``path`` and mapped back, for
    ``distributed_batches``."""
    little = ids.dtype.newbyteorder("<")
    np.ascontiguousarray(ids, dtype=little).tofile(path)
    return np.memmap(path, dtype=little, mode="r", shape=(len(ids),))
