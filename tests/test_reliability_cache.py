"""The id cache is verified, not trusted; patterns and directories cannot explode (issue 42, categories 3 and 4).

Every file of a cache entry is damaged in turn, as a kill, a partial copy, a hand edit or a failing disk would:
the entry is encoded again, to the same ids, or the one line says which entry and the command that clears it.
A cache removed or cut short while a run trains ends it with one line and a resumable run. Glob patterns with
``**`` finish under links back up, to siblings and to nowhere.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import json
import os
import re
import shutil
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from helpers import TINY_DATA, assert_one_line_error, invoke, make_text, write_corpus

from textgen import idcache
from textgen.config import DataConfig
from textgen.corpus import resolve_corpora
from textgen.data import Splits, load_splits
from textgen.errors import CorpusError, TextgenWarning

# --- 3. the id cache is verified, not trusted ------------------------------------------------------


def two_books(tmp_path: Path) -> DataConfig:
    """A corpus of two files (its vocabulary has the document boundary), as the CLI reads it by default."""
    files = (str(write_corpus(tmp_path / "a.txt", 1500, seed=1)), str(write_corpus(tmp_path / "b.txt", 1200, seed=2)))
    return DataConfig(corpus=files[0], files=files, **TINY_DATA)


def arrays(splits: Splits) -> list[np.ndarray]:
    return [np.array(splits.train), np.array(splits.val), np.array(splits.test)]


def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01  # another id of the vocabulary: only the checksum tells
    path.write_bytes(bytes(data))


def id_beyond_the_vocabulary(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] = 0xFF
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


def grow(path: Path) -> None:
    with open(path, "ab") as fh:
        fh.write(b"\x01\x02")


def edit_meta(change: Callable[[dict], object]) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        meta = json.loads(path.read_text(encoding="utf-8"))
        change(meta)
        path.write_text(json.dumps(meta), encoding="utf-8")

    return damage


ID_DAMAGE = {
    "truncated": truncate,
    "a flipped byte": flip_a_byte,
    "an id beyond the vocabulary": id_beyond_the_vocabulary,
    "deleted": Path.unlink,
    "emptied": lambda p: p.write_bytes(b""),
    "grown": grow,
}
META_DAMAGE = {
    "deleted": Path.unlink,
    "emptied": lambda p: p.write_bytes(b""),
    "truncated": truncate,
    "not an object": lambda p: p.write_text("[]"),
    "not UTF-8": lambda p: p.write_bytes(b"\xff\xfe{"),
    "nested too deep": lambda p: p.write_text("[" * 100_000 + "]" * 100_000),
    "without sizes": edit_meta(lambda m: m.pop("sizes")),
    "a size of the wrong type": edit_meta(lambda m: m["sizes"].update(train="many")),
    "an infinite count": lambda p: p.write_text(
        p.read_text(encoding="utf-8").replace('"chars": ', '"chars": 1e999, "x": ')
    ),
    "a vocabulary one character short": edit_meta(lambda m: m.update(vocab=m["vocab"][:-1])),
    "a vocabulary that is not text": edit_meta(lambda m: m.update(vocab=[1, 2])),
    "another checksum": edit_meta(lambda m: m["digests"].update(val="0" * 32)),
}
DAMAGE = [(f"{split}.ids", how) for split in idcache.SPLIT_NAMES for how in ID_DAMAGE] + [
    ("meta.json", how) for how in META_DAMAGE
]


@pytest.mark.parametrize(("name", "how"), DAMAGE, ids=[f"{n} {h}" for n, h in DAMAGE])
def test_every_damage_to_every_file_of_an_entry_is_encoded_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, how: str
) -> None:
    cfg = two_books(tmp_path)
    first = load_splits(cfg, tmp_path / "cache")
    before, entry = arrays(first), first.encoded.path
    (META_DAMAGE if name == "meta.json" else ID_DAMAGE)[how](entry / name)
    scans: list[object] = []
    scan = idcache.scan_text
    monkeypatch.setattr(idcache, "scan_text", lambda *a: scans.append(a) or scan(*a))
    with pytest.warns(
        TextgenWarning, match=rf"the encoded corpus in {re.escape(str(entry))} was unusable \(.+\): encoding it again"
    ):
        again = load_splits(cfg, tmp_path / "cache")
    assert scans, "the damage went unnoticed"
    assert again.encoded.path == entry and again.vocab == first.vocab
    for a, b in zip(arrays(again), before, strict=True):
        np.testing.assert_array_equal(a, b)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [entry.name]  # nothing left aside


def test_an_entry_a_kill_left_half_written_is_encoded_again(tmp_path: Path) -> None:
    """As an encoder that wrote in place would leave it: some id files, one cut short, no meta.json. (textgen's
    own encoder renames a finished scratch directory into place; this was "Directory not empty; free some space".)"""
    cfg = two_books(tmp_path)
    first = load_splits(cfg, tmp_path / "cache")
    before, entry = arrays(first), first.encoded.path
    (entry / "meta.json").unlink()
    (entry / "test.ids").unlink()
    truncate(entry / "val.ids")
    again = load_splits(cfg, tmp_path / "cache")
    for a, b in zip(arrays(again), before, strict=True):
        np.testing.assert_array_equal(a, b)


def test_the_check_reads_every_chunk_and_entries_made_before_checksums_still_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An entry without checksums (textgen before them) opens without encoding; its largest id is still checked,
    chunk by chunk, up to the last, with two-byte ids."""
    path = tmp_path / "wide.txt"
    path.write_text(make_text(1500) + "".join(map(chr, range(0x400, 0x400 + 300))), encoding="utf-8")
    cfg = DataConfig(corpus=str(path), **TINY_DATA)
    first = load_splits(cfg, tmp_path / "cache")
    entry, expected = first.encoded.path, np.array(first.test)
    assert expected.dtype == np.uint16
    edit_meta(lambda m: m.pop("digests"))(entry / "meta.json")
    monkeypatch.setattr(idcache, "CHECK_CHUNK_BYTES", 64)
    scans: list[object] = []
    scan = idcache.scan_text
    monkeypatch.setattr(idcache, "scan_text", lambda *a: scans.append(a) or scan(*a))
    np.testing.assert_array_equal(load_splits(cfg, tmp_path / "cache").test, expected)
    assert not scans
    data = bytearray((entry / "test.ids").read_bytes())
    data[-2:] = np.array([first.vocab.size], np.uint16).tobytes()  # one past the last id, in the last chunk
    (entry / "test.ids").write_bytes(bytes(data))
    np.testing.assert_array_equal(load_splits(cfg, tmp_path / "cache").test, expected)
    assert scans


def test_an_unusable_entry_that_cannot_be_removed_names_it_and_the_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = two_books(tmp_path)
    entry = load_splits(cfg, tmp_path / "cache").encoded.path
    truncate(entry / "train.ids")

    def refused(*args: object) -> None:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

    monkeypatch.setattr(idcache.os, "rename", refused)
    monkeypatch.setenv(idcache.CACHE_DIR_ENV, str(tmp_path / "cache"))
    out = invoke("train", *cfg.paths, "--checkpoint-dir", str(tmp_path / "ck"), "--epochs", "1")
    assert_one_line_error(out, str(entry), "train.ids has", "Permission denied", f"rm -r {entry}")
    assert "free some space" not in out.stderr


def test_an_entry_damaged_as_it_is_written_is_one_line_not_a_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(idcache, "_digest_and_top", lambda path, dtype: ("0" * 32, 0))  # a disk that garbles
    with pytest.raises(CorpusError, match=r"is damaged right after encoding it \(train.ids does not match"):
        load_splits(two_books(tmp_path), tmp_path / "cache")


@pytest.mark.parametrize(
    ("code", "hint"), [(errno.ENOSPC, "free some space there, or choose"), (errno.EROFS, "; choose")]
)
def test_a_cache_that_cannot_be_written_says_what_helps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, hint: str
) -> None:
    def failing(*args: object) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(idcache, "_write_splits", failing)
    with pytest.raises(CorpusError, match=os.strerror(code)) as info:
        load_splits(two_books(tmp_path), tmp_path / "cache")
    assert hint in str(info.value) and idcache.CACHE_DIR_ENV in str(info.value)


# --- 3 and 1. the cache removed or cut short while a run trains ----------------------------------------


def remove_cache(ids: np.memmap) -> None:
    shutil.rmtree(Path(ids.filename).parent.parent)


def cut_short(ids: np.memmap) -> None:
    truncate(Path(ids.filename))


@pytest.mark.parametrize(
    ("damage", "when", "reason"),
    [
        (remove_cache, "before", "No such file or directory"),  # the next epoch's, or validation's, pipeline
        (remove_cache, "after", "No such file or directory"),  # tf.data's NotFoundError
        (cut_short, "after", "bytes, not"),  # tf.data's InvalidArgumentError
    ],
    ids=["removed before reading", "removed while reading", "cut short while reading"],
)
def test_the_cache_failing_while_a_run_trains_is_one_line_and_the_run_resumes(
    trained_run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: Callable, when: str, reason: str
) -> None:
    import textgen.training.loop as loop

    run = trained_run.copy_to(tmp_path / "ck")
    before = run.state_path.read_bytes()
    real = loop.distributed_batches

    def failing(strategy: object, ids: np.memmap, *args: object) -> object:
        if when == "before":
            damage(ids)
        batches = real(strategy, ids, *args)
        if when == "after":
            damage(ids)
        return batches

    monkeypatch.setattr(loop, "distributed_batches", failing)
    resume = ["train", "--resume", "--run", run.name, "--checkpoint-dir", str(tmp_path / "ck"), "--epochs", "5"]
    out = invoke(*resume)
    assert_one_line_error(out, "cannot read ", "train.ids", reason, f"textgen train --resume --run {run.name}")
    assert run.state_path.read_bytes() == before
    monkeypatch.undo()
    out = invoke(*resume)
    assert out.exit_code == 0, out.stderr
    assert run.load_state().epoch == 5


# --- 4. patterns and directories cannot explode -------------------------------------------------------


@contextlib.contextmanager
def finishing_within(seconds: float) -> Iterator[None]:
    def too_long(*args: object) -> None:
        raise TimeoutError(f"did not finish within {seconds} s")

    previous = signal.signal(signal.SIGALRM, too_long)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture
def linked_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """books/ with two files, links back up (to itself, its parent, from deeper down), a link to a sibling
    directory and a dangling link; glob.glob("books/**/*.txt", recursive=True) never ends here."""
    for name in ("books/a.txt", "books/sub/b.txt", "other/c.txt"):
        write_corpus(tmp_path / name, 50)
    links = {"books/self": ".", "books/sub/up": "..", "books/sub/deep/root": "../../..", "books/sibling": "../other",
             "books/dead.txt": "../nowhere.txt", "books/sub/dead": "../../gone"}  # fmt: skip
    for link, target in links.items():
        (tmp_path / link).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / link).symlink_to(target)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("books/**/*.txt", ["books/a.txt", "books/sub/b.txt"]),
        ("books/**", ["books/a.txt", "books/sub/b.txt"]),
        ("books/**/**/*.txt", ["books/a.txt", "books/sub/b.txt"]),
        ("**/*.txt", ["books/a.txt", "books/sub/b.txt", "other/c.txt"]),
        ("{root}/books/**/sub/*.txt", ["books/sub/b.txt"]),
        ("books/*/*.txt", ["books/self/a.txt", "books/sibling/c.txt", "books/sub/b.txt"]),  # one level, as glob
        ("books", ["books/a.txt", "books/sub/b.txt"]),  # a directory
    ],
)
def test_patterns_over_links_back_up_finish(linked_tree: Path, pattern: str, expected: list[str]) -> None:
    with finishing_within(10):
        found = resolve_corpora([pattern.format(root=linked_tree)])
    assert sorted(found) == sorted({(linked_tree / name).resolve() for name in expected})


def test_a_pattern_that_only_dangling_links_match_is_one_line(linked_tree: Path) -> None:
    with finishing_within(10), pytest.raises(CorpusError, match="no files match 'books/\\*\\*/dead\\*'"):
        resolve_corpora(["books/**/dead*"])


@pytest.mark.parametrize(
    "pattern",
    ["**/*.txt", "**", "*.txt", "a/**/*.txt", "*/**/*.txt", "**/b/*.txt", "a/*/*.txt", "**/.*.txt", ".h/**/*.txt",
     "a/**/**/*.txt", "**/*", "[ax]*", "./**/*.txt", "a/**/c/*", "{root}/**/*.txt", "a/**/c/"],
)  # fmt: skip
def test_without_links_patterns_find_what_glob_finds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pattern: str
) -> None:
    """The same files as ``glob.glob(recursive=True)``: hidden names only for a pattern that names them."""
    for name in ("x.txt", "a/y.txt", "a/b/z.txt", "a/b/c/w.txt", "a/b/c/v.md", ".h/h.txt", "a/.hid/q.txt",
                 "a/.dot.txt", "d/e.md"):  # fmt: skip
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("some text\n")
    monkeypatch.chdir(tmp_path)
    pattern = pattern.format(root=tmp_path)
    expected = {Path(p).resolve() for p in glob.glob(pattern, recursive=True) if Path(p).is_file()}
    if expected:
        assert set(resolve_corpora([pattern])) == expected
    else:
        with pytest.raises(CorpusError, match="no files match"):
            resolve_corpora([pattern])
