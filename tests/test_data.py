"""textgen.data: contiguous splits and the stateful stream layout, in numpy and tf.data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import write_corpus
from hypothesis import given, settings
from hypothesis import strategies as st

from textgen.config import DataConfig
from textgen.data import load_splits, make_dataset, split_ids, stream_layout
from textgen.errors import CorpusError


@st.composite
def layouts(draw: st.DrawFn) -> tuple[int, int, int]:
    """(n, batch_size, seq_len) with room for at least one batch."""
    batch_size = draw(st.integers(1, 8))
    seq_len = draw(st.integers(1, 12))
    n = draw(st.integers(batch_size * seq_len + 1, batch_size * seq_len * 7 + 20))
    return n, batch_size, seq_len


@given(layouts())
def test_stream_layout_continues_every_row_across_batches(layout: tuple[int, int, int]) -> None:
    n, batch_size, seq_len = layout
    ids = np.arange(n)  # each id is its own position in the text
    inputs, targets = stream_layout(ids, batch_size, seq_len)

    num_batches = (n - 1) // (batch_size * seq_len)
    assert inputs.shape == targets.shape == (num_batches, batch_size, seq_len)
    # ids, not one-hot vectors
    assert inputs.ndim == 3 and np.issubdtype(inputs.dtype, np.integer)
    # targets are the inputs shifted by one character
    np.testing.assert_array_equal(targets, inputs + 1)
    # within a row, characters are consecutive
    np.testing.assert_array_equal(np.diff(inputs, axis=2), 1)
    # row i of batch k+1 starts with the character right after the end of row i of batch k
    np.testing.assert_array_equal(inputs[1:, :, 0], inputs[:-1, :, -1] + 1)
    # streams are consecutive slices of the text: stream i+1 starts where stream i ends
    stream_len = num_batches * seq_len
    np.testing.assert_array_equal(inputs[0, :, 0], np.arange(batch_size) * stream_len)
    # together the streams are exactly the start of the text, each position used once
    streams = inputs.transpose(1, 0, 2).reshape(-1)
    np.testing.assert_array_equal(streams, np.arange(batch_size * stream_len))


@given(layouts(), st.randoms(use_true_random=False))
def test_stream_layout_picks_ids_by_position(layout: tuple[int, int, int], rnd) -> None:
    n, batch_size, seq_len = layout
    ids = np.array([rnd.randrange(50) for _ in range(n)], dtype=np.int32)
    positions, _ = stream_layout(np.arange(n), batch_size, seq_len)
    inputs, targets = stream_layout(ids, batch_size, seq_len)
    np.testing.assert_array_equal(inputs, ids[positions])
    np.testing.assert_array_equal(targets, ids[positions + 1])


@pytest.mark.parametrize(("n", "batch_size", "seq_len"), [(0, 1, 1), (1, 1, 1), (16, 4, 4), (64, 4, 16)])
def test_stream_layout_rejects_too_few_ids(n: int, batch_size: int, seq_len: int) -> None:
    with pytest.raises(CorpusError, match=f"{n} characters cannot fill one {batch_size} x {seq_len} batch"):
        stream_layout(np.arange(n), batch_size, seq_len)


def test_stream_layout_exactly_one_batch() -> None:
    inputs, targets = stream_layout(np.arange(9), 2, 4)
    assert inputs.tolist() == [[[0, 1, 2, 3], [4, 5, 6, 7]]]
    assert targets.tolist() == [[[1, 2, 3, 4], [5, 6, 7, 8]]]


@settings(max_examples=15, deadline=None)  # each example builds a tf.data pipeline
@given(layouts())
def test_make_dataset_yields_the_layout_in_order_as_int32(layout: tuple[int, int, int]) -> None:
    n, batch_size, seq_len = layout
    ids = np.arange(n, dtype=np.int64)
    inputs, targets = stream_layout(ids, batch_size, seq_len)
    dataset = make_dataset(ids, batch_size, seq_len)
    assert int(dataset.cardinality()) == len(inputs)
    for _ in range(2):  # the same batches in the same order every epoch
        batches = [(x.numpy(), y.numpy()) for x, y in dataset]
        assert len(batches) == len(inputs)
        for k, (x, y) in enumerate(batches):
            assert x.dtype == np.int32 and y.dtype == np.int32
            np.testing.assert_array_equal(x, inputs[k])
            np.testing.assert_array_equal(y, targets[k])


@given(
    st.integers(0, 5000),
    st.floats(0.001, 0.499),
    st.floats(0.001, 0.499),
)
def test_split_ids_is_contiguous_train_val_test(n: int, val_fraction: float, test_fraction: float) -> None:
    ids = np.arange(n)
    train, val, test = split_ids(ids, val_fraction, test_fraction)
    np.testing.assert_array_equal(np.concatenate([train, val, test]), ids)
    assert len(val) == int(n * val_fraction)
    assert len(test) == int(n * test_fraction)
    assert len(train) == n - len(val) - len(test)


def test_load_splits_encodes_the_whole_text_in_order(tmp_path: Path) -> None:
    path = write_corpus(tmp_path / "c.txt", 2000)
    text = path.read_text(encoding="utf-8")
    splits = load_splits(DataConfig(corpus=str(path), batch_size=4, seq_len=16, val_fraction=0.1, test_fraction=0.1))
    assert splits.vocab.chars == tuple(sorted(set(text)))
    joined = np.concatenate([splits.train, splits.val, splits.test])
    assert splits.vocab.decode(joined) == text
    assert len(splits.val) == int(len(text) * 0.1)


@pytest.mark.parametrize(
    ("batch_size", "seq_len", "split_says", "layout_says"),
    [
        (64, 100, "training split has 900 characters (of 1,000)", "--batch-size 64 x --seq-len 100 needs 6,401"),
        (4, 16, "validation split has 50 characters (of 1,000)", "--batch-size 4 x --seq-len 16 needs 65"),
    ],
)
def test_corpus_too_short_for_a_split(
    tmp_path: Path, batch_size: int, seq_len: int, split_says: str, layout_says: str
) -> None:
    path = tmp_path / "short.txt"
    path.write_text("abcdefghij" * 100, encoding="utf-8")  # 1,000 characters: 900 train, 50 validation
    cfg = DataConfig(corpus=str(path), batch_size=batch_size, seq_len=seq_len)
    with pytest.raises(CorpusError) as info:
        load_splits(cfg)
    message = str(info.value)
    assert split_says in message
    assert layout_says in message
    assert "smaller --batch-size or --seq-len" in message


def test_corpus_just_long_enough(tmp_path: Path) -> None:
    path = tmp_path / "ok.txt"
    path.write_text("abcdefghij" * 130, encoding="utf-8")  # validation gets 65 = 4 x 16 + 1 characters
    splits = load_splits(DataConfig(corpus=str(path), batch_size=4, seq_len=16))
    assert len(splits.val) == 65
    inputs, _ = stream_layout(splits.val, 4, 16)
    assert inputs.shape == (1, 4, 16)
