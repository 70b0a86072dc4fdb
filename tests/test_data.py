"""textgen.data and textgen.idcache: memory-mapped splits, and the stateful stream layout read by tf.data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import SHIFTS, all_batches, layout_of, layouts, make_text, write_corpus
from hypothesis import given, settings
from hypothesis import strategies as st

from textgen import corpus as corpusmod
from textgen import idcache
from textgen.config import DataConfig
from textgen.corpus import read_corpus
from textgen.data import distributed_batches, load_splits, replica_batches, write_id_file
from textgen.errors import CorpusError
from textgen.idcache import split_sizes
from textgen.layout import StreamLayout
from textgen.vocab import DOCUMENT_BOUNDARY, UNKNOWN_ID, Vocabulary


@settings(max_examples=10, deadline=None)  # each example builds tf.data pipelines
@given(layouts(), st.sampled_from([1, 2, 4]), st.integers(0, 3), SHIFTS)
def test_each_replica_reads_the_same_rows_every_batch(
    tmp_path_factory: pytest.TempPathFactory, shape: tuple[int, int, int], replicas: int, start: int, shift: int | None
) -> None:
    n, streams, seq_len = shape
    streams *= replicas
    n = max(n, streams * seq_len + 1)
    layout = layout_of(n, streams, seq_len, shift)
    ids = write_id_file(np.arange(n, dtype=np.uint16), tmp_path_factory.mktemp("ids") / "train.ids")
    inputs, targets = all_batches(ids, layout)
    per, start = streams // replicas, min(start, layout.batches)
    for replica in range(replicas):
        batches = [(x.numpy(), y.numpy()) for x, y in replica_batches(ids, layout, replica, replicas, start)]
        assert len(batches) == layout.batches - start  # from a resumed batch on
        for k, (x, y) in enumerate(batches, start=start):
            np.testing.assert_array_equal(x, inputs[k, replica * per : (replica + 1) * per])
            np.testing.assert_array_equal(y, targets[k, replica * per : (replica + 1) * per])


class PipelinesOnly:
    """``distribute_datasets_from_function``'s side of a strategy with ``replicas`` replicas fed by ``pipelines``
    input pipelines (one per worker), without the devices: each pipeline's dataset, as its worker builds it."""

    def __init__(self, pipelines: int, replicas: int) -> None:
        self.pipelines, self.num_replicas_in_sync = pipelines, replicas

    def distribute_datasets_from_function(self, dataset_fn):
        import tensorflow as tf

        return [
            dataset_fn(tf.distribute.InputContext(self.pipelines, p, self.num_replicas_in_sync))
            for p in range(self.pipelines)
        ]


@settings(max_examples=10, deadline=None)  # each example builds tf.data pipelines
@given(layouts(), st.sampled_from([(1, 2), (2, 2), (1, 4), (2, 4), (4, 4)]), st.integers(0, 3), SHIFTS)
def test_each_worker_deals_its_replicas_their_rows_of_every_batch_in_turn(
    tmp_path_factory: pytest.TempPathFactory,
    shape: tuple[int, int, int],
    topology: tuple[int, int],
    start: int,
    shift: int | None,
) -> None:
    """Pipeline p (worker p) yields, batch after batch, one element per replica it feeds, in replica order;
    ``distribute_datasets_from_function`` deals them round-robin, so replica r gets rows r * per .. of every batch."""
    n, streams, seq_len = shape
    pipelines, replicas = topology
    streams *= replicas
    n = max(n, streams * seq_len + 1)
    layout = layout_of(n, streams, seq_len, shift)
    ids = write_id_file(np.arange(n, dtype=np.uint16), tmp_path_factory.mktemp("ids") / "train.ids")
    inputs, targets = all_batches(ids, layout)
    per, local, start = streams // replicas, replicas // pipelines, min(start, layout.batches)
    for p, dataset in enumerate(distributed_batches(PipelinesOnly(pipelines, replicas), ids, layout, start)):
        elements = [(x.numpy(), y.numpy()) for x, y in dataset]
        assert len(elements) == (layout.batches - start) * local
        for j, (x, y) in enumerate(elements):
            k, replica = start + j // local, p * local + j % local
            rows = slice(replica * per, (replica + 1) * per)
            np.testing.assert_array_equal(x, inputs[k, rows])
            np.testing.assert_array_equal(y, targets[k, rows])


MIRRORED_ROWS = """
import json, sys
import numpy as np
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
from textgen.data import distributed_batches, write_id_file
from textgen.layout import StreamLayout
ids = write_id_file(np.arange(1000, dtype=np.uint16), sys.argv[1])
layout = StreamLayout.of(1000, 8, 10)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
seen = [
    [[r.numpy().tolist() for r in strategy.experimental_local_results(part)] for part in batch]
    for batch in distributed_batches(strategy, ids, layout, start=1)
]
print(json.dumps(seen))
"""


def test_mirrored_replicas_each_read_their_own_rows_of_every_batch(tmp_path: Path) -> None:
    """Through a real MirroredStrategy over two logical CPUs: replica r holds rows r * 4 .. r * 4 + 3 of each batch."""
    import json

    from helpers import run_python

    out = run_python(["-c", MIRRORED_ROWS, str(tmp_path / "train.ids")])
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    layout = StreamLayout.of(1000, 8, 10)
    inputs, targets = all_batches(np.arange(1000), layout)
    assert len(seen) == layout.batches - 1  # resumed at batch 1
    for k, (x_parts, y_parts) in enumerate(seen, start=1):
        assert x_parts == [inputs[k, :4].tolist(), inputs[k, 4:].tolist()]
        assert y_parts == [targets[k, :4].tolist(), targets[k, 4:].tolist()]


@settings(max_examples=10, deadline=None)  # each example builds a tf.data pipeline
@given(layouts(), st.integers(0, 3), st.sampled_from([np.uint8, np.uint16, np.int32]), SHIFTS)
def test_distributed_batches_yield_the_layout_in_order_as_int32(
    tmp_path_factory: pytest.TempPathFactory, shape: tuple[int, int, int], start: int, dtype: type, shift: int | None
) -> None:
    import tensorflow as tf

    n, streams, seq_len = shape
    ids = write_id_file((np.arange(n) % 200).astype(dtype), tmp_path_factory.mktemp("ids") / "train.ids")
    layout = layout_of(n, streams, seq_len, shift)
    inputs, targets = all_batches(ids, layout)
    start = min(start, layout.batches)
    for _ in range(2):  # the same batches in the same order every epoch
        batches = [
            (x.numpy(), y.numpy()) for x, y in distributed_batches(tf.distribute.get_strategy(), ids, layout, start)
        ]
        assert len(batches) == layout.batches - start
        for k, (x, y) in enumerate(batches, start=start):
            assert x.dtype == np.int32 and y.dtype == np.int32
            np.testing.assert_array_equal(x, inputs[k])
            np.testing.assert_array_equal(y, targets[k])


def test_distributed_batches_read_an_id_file_not_an_array() -> None:
    import tensorflow as tf

    with pytest.raises(TypeError, match="reads an id file"):
        list(distributed_batches(tf.distribute.get_strategy(), np.arange(100), StreamLayout.of(100, 2, 4)))


# --- splits -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "fractions", "sizes"),
    [
        (1000, (0.1, 0.05), (850, 100, 50)),
        (3_207_562, (0.05, 0.05), (2_886_806, 160_378, 160_378)),  # War and Peace: its test split's 160,378 characters
        (9, (0.1, 0.1), (9, 0, 0)),  # too short for a character of validation: none, rather than a rounded-up one
        (0, (0.1, 0.1), (0, 0, 0)),
    ],
)
def test_split_sizes(n: int, fractions: tuple[float, float], sizes: tuple[int, int, int]) -> None:
    assert split_sizes(n, *fractions) == sizes


@given(st.integers(0, 5000), st.floats(0.001, 0.499), st.floats(0.001, 0.499))
def test_split_sizes_cover_the_text_and_never_exceed_their_fractions(n: int, val: float, test: float) -> None:
    sizes = split_sizes(n, val, test)
    assert sum(sizes) == n and min(sizes) >= 0
    assert sizes[1] <= n * val < sizes[1] + 1 and sizes[2] <= n * test < sizes[2] + 1


def data_config(*paths: Path, **settings: object) -> DataConfig:
    files = tuple(str(p) for p in paths)
    return DataConfig(
        corpus=files[0], files=files if len(files) > 1 else (), **{"batch_size": 4, "seq_len": 16, **settings}
    )  # type: ignore[arg-type]


def test_an_encoding_keeps_its_scratch_alive_and_clears_a_killed_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A killed encoding's scratch (untouched for an hour) is removed by the next; a running one touches its
    scratch after every chunk it writes, so that a second process never takes it for a killed one's."""
    import os
    import time

    from textgen.data import corpus_source

    path = write_corpus(tmp_path / "c.txt", 2000)
    cfg = data_config(path)
    key = corpus_source(cfg).key()
    killed, live = tmp_path / "cache" / f".tmp-{key}-killed", tmp_path / "cache" / f".tmp-{key}-live"
    for scratch, age in ((killed, 2 * idcache.STALE_SCRATCH_S), (live, 60.0)):
        scratch.mkdir(parents=True)
        os.utime(scratch, (time.time() - age, time.time() - age))
    touched: list[Path] = []
    real_utime = os.utime
    monkeypatch.setattr(idcache.os, "utime", lambda p, *a, **k: (touched.append(Path(p)), real_utime(p, *a, **k)))
    load_splits(cfg, tmp_path / "cache")
    assert not killed.exists() and live.exists()
    assert touched and all(p.name.startswith(f".tmp-{key}-") and p not in (killed, live) for p in touched)


def test_one_file_splits_exactly_as_the_whole_text_in_memory(tmp_path: Path) -> None:
    path = write_corpus(tmp_path / "c.txt", 2000)
    text = read_corpus(path)
    splits = load_splits(data_config(path, val_fraction=0.1, test_fraction=0.1), tmp_path / "cache")
    vocab = Vocabulary.from_text(text)
    assert splits.vocab == vocab  # no boundary character for one file
    ids = vocab.encode(text)
    n_train, n_val, _ = split_sizes(len(ids), 0.1, 0.1)
    np.testing.assert_array_equal(splits.train, ids[:n_train])
    np.testing.assert_array_equal(splits.val, ids[n_train : n_train + n_val])
    np.testing.assert_array_equal(splits.test, ids[n_train + n_val :])
    assert isinstance(splits.train, np.memmap) and splits.train.dtype == np.uint8
    assert splits.encoded.documents == 1 and splits.encoded.unknown == 0


def test_many_files_split_each_file_and_mark_the_boundaries(tmp_path: Path) -> None:
    texts = [make_text(800 + 300 * i, seed=i) for i in range(3)]
    paths = []
    for i, text in enumerate(texts):
        paths.append(tmp_path / f"book{i}.txt")
        paths[-1].write_text(text, encoding="utf-8")
    splits = load_splits(data_config(*paths), tmp_path / "cache")
    assert DOCUMENT_BOUNDARY in splits.vocab.chars and splits.encoded.documents == 3
    for name, part in (("train", splits.train), ("val", splits.val), ("test", splits.test)):
        documents = splits.vocab.decode(part).split(DOCUMENT_BOUNDARY)
        assert len(documents) == 3
        for text, document in zip(texts, documents, strict=True):
            n_train, n_val, _ = split_sizes(len(text), 0.05, 0.05)
            expected = {
                "train": text[:n_train],
                "val": text[n_train : n_train + n_val],
                "test": text[n_train + n_val :],
            }
            assert document == expected[name]  # every book contributes its own contiguous part to every split


def test_a_document_too_short_for_a_split_adds_no_boundary_to_it(tmp_path: Path) -> None:
    """Two 15-character files have no validation or test text (5% of 15 is 0): those splits hold the long book's
    parts alone, not boundaries between documents that are not there."""
    paths = [tmp_path / "a.txt", tmp_path / "b.txt", tmp_path / "book.txt"]
    for path, text in zip(paths, ["short note one\n", "short note two\n", make_text(800)], strict=True):
        path.write_text(text, encoding="utf-8")
    splits = load_splits(data_config(*paths), tmp_path / "cache")
    book = paths[2].read_text(encoding="utf-8")
    n_train, n_val, _ = split_sizes(len(book), 0.05, 0.05)
    assert splits.vocab.decode(splits.val) == book[n_train : n_train + n_val]
    assert splits.vocab.decode(splits.test) == book[n_train + n_val :]
    b = DOCUMENT_BOUNDARY
    assert splits.vocab.decode(splits.train) == f"short note one\n{b}short note two\n{b}{book[:n_train]}"


def test_max_vocab_keeps_the_most_frequent_characters(tmp_path: Path) -> None:
    path = tmp_path / "c.txt"
    text = "aaaa bbb cc d\n" * 300 + "xyz"
    path.write_text(text, encoding="utf-8")
    splits = load_splits(data_config(path, max_vocab=4), tmp_path / "cache")
    assert splits.vocab.chars == (" ", "a", "b", "c")  # the 4 most frequent, in code point order
    expected_unknown = sum(text.count(c) for c in "d\nxyz")
    assert splits.encoded.unknown == expected_unknown and splits.encoded.unknown_distinct == 5
    joined = np.concatenate([splits.train, splits.val, splits.test])
    assert int(np.sum(joined == UNKNOWN_ID)) == expected_unknown
    assert splits.vocab.decode(joined) == "".join(c if c in "abc " else "\ufffd" for c in text)


def test_a_second_load_opens_the_cache_without_reading_the_text(tmp_path: Path, monkeypatch) -> None:
    path = write_corpus(tmp_path / "c.txt", 2000)
    first = load_splits(data_config(path), tmp_path / "cache")

    def no_scan(*args: object) -> None:
        raise AssertionError("encoded again")

    monkeypatch.setattr(idcache, "scan_text", no_scan)
    second = load_splits(data_config(path), tmp_path / "cache")
    assert second.encoded.path == first.encoded.path
    np.testing.assert_array_equal(second.train, first.train)
    # an edit to the file, or another cleaning, is another entry
    monkeypatch.undo()
    path.write_text(path.read_text(encoding="utf-8") + "more text\n", encoding="utf-8")
    edited = load_splits(data_config(path), tmp_path / "cache")
    kept = load_splits(data_config(path, strip_boilerplate=False), tmp_path / "cache")
    assert len({first.encoded.path, edited.encoded.path, kept.encoded.path}) == 3
    assert not [p for p in (tmp_path / "cache").iterdir() if p.name.startswith(".tmp")]


def test_a_damaged_cache_entry_is_encoded_again(tmp_path: Path) -> None:
    """More damage in tests/test_reliability_cache.py."""
    path = write_corpus(tmp_path / "c.txt", 2000)
    first = load_splits(data_config(path), tmp_path / "cache")
    train = np.array(first.train)
    with open(first.encoded.path / "train.ids", "r+b") as fh:
        fh.truncate(10)
    again = load_splits(data_config(path), tmp_path / "cache")
    assert again.encoded.path == first.encoded.path
    np.testing.assert_array_equal(again.train, train)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            ["word ", "é", "😀", "\r\n", "\r", "\n", "*** START OF X ***\n", "*** END OF X ***\n", "***\n", "\ufeff"]
        ),
        max_size=40,
    ),
    st.integers(1, 9),
    st.booleans(),
)
def test_streaming_cleaning_equals_cleaning_the_whole_text(
    tmp_path_factory: pytest.TempPathFactory, parts: list[str], chunk: int, strip: bool
) -> None:
    """Tiny chunks cut lines, CRLFs, multi-byte characters and markers: the kept text is still that of the
    whole-text rule (line endings to \\n, a leading BOM dropped, the text between the first START line and
    the first END line after it)."""
    text = "x" + "".join(parts)
    path = tmp_path_factory.mktemp("c") / "c.txt"
    path.write_bytes(("\ufeff" + text).encode("utf-8"))
    expected = text.replace("\r\n", "\n").replace("\r", "\n")
    if strip:
        start = corpusmod._START.search(expected)
        if start:
            expected = expected[start.end() + 1 :]
        end = corpusmod._END.search(expected)
        if end:
            expected = expected[: end.start()]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(corpusmod, "READ_CHUNK_BYTES", chunk)
        if not expected.strip():
            with pytest.raises(CorpusError):
                read_corpus(path, strip_boilerplate=strip)
            return
        assert read_corpus(path, strip_boilerplate=strip) == expected
        scan = corpusmod.scan_text(path, "utf-8", strip)
    assert dict(zip(scan.codes.tolist(), scan.counts.tolist(), strict=True)) == {
        ord(c): expected.count(c) for c in set(expected)
    }


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
    with pytest.raises(CorpusError) as info:
        load_splits(data_config(path, batch_size=batch_size, seq_len=seq_len), tmp_path / "cache")
    message = str(info.value)
    assert split_says in message
    assert layout_says in message
    assert "smaller --batch-size or --seq-len" in message


def test_corpus_just_long_enough(tmp_path: Path) -> None:
    path = tmp_path / "ok.txt"
    path.write_text("abcdefghij" * 130, encoding="utf-8")  # validation gets 65 = 4 x 16 + 1 characters
    splits = load_splits(data_config(path), tmp_path / "cache")
    assert len(splits.val) == 65
    assert StreamLayout.of(len(splits.val), 4, 16).batches == 1
