"""textgen.layout: the stateful stream layout's arithmetic, over plain arrays and memory maps."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import SHIFTS, all_batches, layout_of, layouts
from hypothesis import given
from hypothesis import strategies as st

from textgen.errors import CorpusError
from textgen.layout import StreamLayout


@given(layouts())
def test_stream_layout_continues_every_row_across_batches(shape: tuple[int, int, int]) -> None:
    n, streams, seq_len = shape
    layout = StreamLayout.of(n, streams, seq_len)
    inputs, targets = all_batches(np.arange(n), layout)  # each id is its own position in the text

    num_batches = (n - 1) // (streams * seq_len)
    assert inputs.shape == targets.shape == (num_batches, streams, seq_len)
    assert inputs.dtype == targets.dtype == np.int32  # ids, not one-hot vectors
    # targets are the inputs shifted by one character
    np.testing.assert_array_equal(targets, inputs + 1)
    # within a row, characters are consecutive
    np.testing.assert_array_equal(np.diff(inputs, axis=2), 1)
    # row i of batch k+1 starts with the character right after the end of row i of batch k
    np.testing.assert_array_equal(inputs[1:, :, 0], inputs[:-1, :, -1] + 1)
    # streams are consecutive slices of the text: stream i+1 starts where stream i ends
    stream_len = num_batches * seq_len
    np.testing.assert_array_equal(inputs[0, :, 0], np.arange(streams) * stream_len)
    # together the streams are exactly the start of the text, each position used once
    np.testing.assert_array_equal(inputs.transpose(1, 0, 2).reshape(-1), np.arange(streams * stream_len))


@given(layouts(), st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1))
def test_a_shifted_layout_continues_every_row_from_its_first_id(
    shape: tuple[int, int, int], seed: int, other: int
) -> None:
    """--shift-windows: the layout of an epoch begins 0 to seq_len - 1 ids in, and is exact from there; every shift
    of the same ids gives as many batches (the learning-rate schedule and resume points count them)."""
    n, streams, seq_len = shape
    layout = StreamLayout.shifted(n, streams, seq_len, np.random.default_rng(seed))
    assert layout.batches == StreamLayout.shifted(n, streams, seq_len, np.random.default_rng(other)).batches >= 1
    assert 0 <= layout.first < seq_len
    inputs, targets = all_batches(np.arange(n), layout)
    np.testing.assert_array_equal(targets, inputs + 1)
    np.testing.assert_array_equal(np.diff(inputs, axis=2), 1)
    np.testing.assert_array_equal(inputs[1:, :, 0], inputs[:-1, :, -1] + 1)
    stream_len = layout.batches * seq_len
    ordered = inputs.transpose(1, 0, 2).reshape(-1)
    np.testing.assert_array_equal(ordered, layout.first + np.arange(streams * stream_len))  # each id once, in order
    assert targets.max() <= n - 1


def test_shifts_fall_anywhere_in_a_window() -> None:
    """Over many epochs' draws every shift from 0 to seq_len - 1 comes up; with no room past one batch, none."""
    shifts = {StreamLayout.shifted(1000, 4, 10, np.random.default_rng([0, e])).first for e in range(200)}
    assert shifts == set(range(10))
    assert StreamLayout.shifted(41, 4, 10, np.random.default_rng(0)) == StreamLayout.of(41, 4, 10)


@given(layouts(), st.randoms(use_true_random=False))
def test_stream_layout_picks_ids_by_position_from_a_memory_map(
    tmp_path_factory: pytest.TempPathFactory, shape: tuple[int, int, int], rnd
) -> None:
    n, streams, seq_len = shape
    ids = np.array([rnd.randrange(50) for _ in range(n)], dtype=np.uint8)
    path = tmp_path_factory.mktemp("ids") / "train.ids"
    ids.tofile(path)
    mapped = np.memmap(path, dtype=np.uint8, mode="r")
    layout = StreamLayout.of(n, streams, seq_len)
    positions, _ = all_batches(np.arange(n), layout)
    inputs, targets = all_batches(mapped, layout)
    np.testing.assert_array_equal(inputs, ids[positions])
    np.testing.assert_array_equal(targets, ids[positions + 1])


@given(layouts(), st.integers(1, 9), st.randoms(use_true_random=False), SHIFTS)
def test_counting_in_the_targets_reads_exactly_the_scored_ids(
    shape: tuple[int, int, int], chunk: int, rnd, shift: int | None
) -> None:
    import textgen.layout

    n, streams, seq_len = shape
    ids = np.array([rnd.randrange(3) for _ in range(n)], dtype=np.uint8)
    layout = layout_of(n, streams, seq_len, shift)
    _, targets = all_batches(ids, layout)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(textgen.layout, "COUNT_CHUNK", chunk)  # chunk edges anywhere
        assert layout.count_in_targets(ids, 0) == int(np.count_nonzero(targets == 0))


@pytest.mark.parametrize(("n", "streams", "seq_len"), [(0, 1, 1), (1, 1, 1), (16, 4, 4), (64, 4, 16)])
def test_stream_layout_rejects_too_few_ids(n: int, streams: int, seq_len: int) -> None:
    with pytest.raises(CorpusError, match=f"{n} characters cannot fill one {streams} x {seq_len} batch"):
        StreamLayout.of(n, streams, seq_len)


def test_stream_layout_exactly_one_batch() -> None:
    inputs, targets = all_batches(np.arange(9), StreamLayout.of(9, 2, 4))
    assert inputs.tolist() == [[[0, 1, 2, 3], [4, 5, 6, 7]]]
    assert targets.tolist() == [[[1, 2, 3, 4], [5, 6, 7, 8]]]
