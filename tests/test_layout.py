"""textgen.layout: the stateful stream layout's arithmetic, over plain arrays and memory maps."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import SHIFTS, all_batches, layout_of, layouts
from hypothesis import given
from hypothesis import strategies as st

from textgen.errors import CorpusError
from textgen.layout import (
    MASKED,
    MIN_SEQ_LEN,
    MIN_STREAMS,
    StreamLayout,
    fills_one_batch,
    fitting_layout,
    scoring_layout,
)


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


def every_batch(ids: np.ndarray, layout: StreamLayout) -> tuple[np.ndarray, np.ndarray]:
    """The full batches and then the last ones, side by side: inputs and targets shaped (streams, width)."""
    pairs = [layout.batch(ids, k) for k in range(layout.batches)] + layout.last_batches(ids)
    assert all(x.shape == y.shape == (layout.streams, layout.seq_len) for x, y in pairs)  # one shape for every call
    return np.concatenate([x for x, _ in pairs], axis=1), np.concatenate([y for _, y in pairs], axis=1)


@given(st.integers(1, 8), st.integers(1, 12), st.integers(0, 150))
def test_a_covering_layout_scores_every_character_once_in_contiguous_streams(
    streams: int, seq_len: int, more: int
) -> None:
    """Equal streams, the last one taking the characters left over; each row scored from its start to its end and
    padded after it, in as few batches as that takes."""
    n = streams + 1 + more
    layout = StreamLayout.covering(n, streams, seq_len)
    inputs, targets = every_batch(np.arange(n), layout)
    scored = targets != MASKED
    assert layout.scored == int(scored.sum()) == n - 1
    np.testing.assert_array_equal(targets[scored], inputs[scored] + 1)
    length = (n - 1) // streams
    for i in range(streams):
        end = (i + 1) * length if i < streams - 1 else n - 1
        assert scored[i, : end - i * length].all() and not scored[i, end - i * length :].any()
        np.testing.assert_array_equal(targets[i, scored[i]], np.arange(i * length + 1, end + 1))
    assert scored[:, : layout.batches * seq_len].all()  # the full batches have no padding
    assert all((y != MASKED).any() for _, y in layout.last_batches(np.arange(n)))  # nor a last batch all padding


@given(st.integers(1, 8), st.integers(1, 12), st.integers(0, 150), st.integers(1, 9), st.randoms(use_true_random=False))
def test_counting_in_a_covering_layouts_targets_reads_every_character_after_the_first(
    streams: int, seq_len: int, more: int, chunk: int, rnd
) -> None:
    import textgen.layout

    n = streams + 1 + more
    ids = np.array([rnd.randrange(3) for _ in range(n)], dtype=np.uint8)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(textgen.layout, "COUNT_CHUNK", chunk)
        assert StreamLayout.covering(n, streams, seq_len).count_in_targets(ids, 0) == int(
            np.count_nonzero(ids[1:] == 0)
        )


def test_a_covering_layout_needs_a_character_to_score_in_every_stream() -> None:
    assert StreamLayout.covering(4, 3, 10).scored == 3
    with pytest.raises(CorpusError, match="3 characters cannot give each of 3 streams one to score"):
        StreamLayout.covering(3, 3, 10)


def test_war_and_peaces_test_split_is_scored_to_its_last_character() -> None:
    """Its 160,378 characters (tests/test_data.py's split sizes) in the default 64 x 100: 160,377 scored, where
    full batches alone scored 160,000."""
    layout = scoring_layout(160_378, 64, 100, "the test split")
    assert (layout.streams, layout.seq_len, layout.batches, layout.tail, layout.extra) == (64, 100, 25, 5, 57)
    assert layout.scored == 160_377
    assert StreamLayout.of(160_378, 64, 100).scored == 160_000


@pytest.mark.parametrize(
    ("n", "shape"),
    [(101, (3, 32, 100)), (7, (1, 6, 6)), (2, (1, 1, 1)), (1000, (8, 32, 999))],
)
def test_a_text_too_short_for_the_batch_is_scored_in_fewer_or_shorter_streams(
    n: int, shape: tuple[int, int, int]
) -> None:
    layout = scoring_layout(n, 8, 32, "a text")
    assert (layout.streams, layout.seq_len, layout.scored) == shape
    with pytest.raises(CorpusError, match="a text has 1 characters; at least 2 are needed"):
        scoring_layout(1, 8, 32, "a text")


@given(
    train=st.integers(0, 200_000),
    val=st.integers(0, 20_000),
    accumulate=st.sampled_from([1, 2, 4]),
    keep_streams=st.booleans(),
    keep_seq_len=st.booleans(),
)
def test_a_small_text_gets_the_biggest_layout_that_both_splits_fill(
    train: int, val: int, accumulate: int, keep_streams: bool, keep_seq_len: bool
) -> None:
    chosen = fitting_layout(train, val, 64, 100, accumulate, keep_streams=keep_streams, keep_seq_len=keep_seq_len)
    streams = [64] if keep_streams else [64, 32, 16, 8, 4]
    lengths = [100] if keep_seq_len else [100, 50, 32]
    fitting = [
        (b, n)
        for b in streams
        for n in lengths
        if fills_one_batch(val, b, n) and fills_one_batch(train, b * accumulate, n)
    ]
    if not fitting:
        assert chosen is None
        return
    assert chosen in fitting
    assert chosen[0] * chosen[1] == max(b * n for b, n in fitting)  # no fitting layout holds more characters
    assert chosen[0] >= MIN_STREAMS and chosen[1] >= MIN_SEQ_LEN


def test_a_19566_character_book_gets_8_streams_of_100() -> None:
    """The issue's book: 978 validation characters, which 64 x 100 (6,401) does not fill."""
    assert fitting_layout(17_610, 978, 64, 100, keep_streams=False, keep_seq_len=False) == (8, 100)
    assert fitting_layout(17_610, 978, 64, 100, keep_streams=True, keep_seq_len=False) is None  # --batch-size 64
    assert fitting_layout(17_610, 978, 64, 100, keep_streams=False, keep_seq_len=True) == (8, 100)
    assert fitting_layout(17_610, 200, 64, 100, keep_streams=False, keep_seq_len=False) == (4, 32)
