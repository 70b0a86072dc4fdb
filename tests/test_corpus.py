"""textgen.corpus: finding, downloading, decoding and cleaning a corpus file."""

from __future__ import annotations

import io
import os
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from textgen.corpus import gutenberg_number, read_corpus, resolve_corpus
from textgen.errors import CorpusError

GUTENBERG = (
    "The Project Gutenberg eBook of War and Peace\n"
    "This eBook is for the use of anyone anywhere.\n"
    "*** START OF THE PROJECT GUTENBERG EBOOK WAR AND PEACE ***\n"
    "Well, Prince, so Genoa and Lucca are now just family estates.\n"
    "*** END OF THE PROJECT GUTENBERG EBOOK WAR AND PEACE ***\n"
    "Section 1. General Terms of Use.\n"
)
BODY = "Well, Prince, so Genoa and Lucca are now just family estates.\n"


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Work in an empty directory with no $TEXTGEN_CORPUS_PATH."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TEXTGEN_CORPUS_PATH", raising=False)
    return tmp_path


def put(path: Path, text: str = "some text\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


# --- resolve_corpus ----------------------------------------------------------


def test_resolve_an_existing_path(in_tmp: Path) -> None:
    path = put(in_tmp / "books" / "mine.txt")
    assert resolve_corpus(str(path)) == path
    assert resolve_corpus("books/mine.txt") == Path("books/mine.txt")


def test_resolve_a_bare_name_in_local_corpora(in_tmp: Path) -> None:
    put(in_tmp / "corpora" / "mine.txt")
    assert resolve_corpus("mine.txt").resolve() == (in_tmp / "corpora" / "mine.txt").resolve()


def test_resolve_a_bare_name_on_the_corpus_path(in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = in_tmp / "first", in_tmp / "second"
    first.mkdir()
    put(second / "mine.txt")
    monkeypatch.setenv("TEXTGEN_CORPUS_PATH", os.pathsep.join([str(first), "", str(second)]))
    assert resolve_corpus("mine.txt") == second / "mine.txt"


def test_local_corpora_come_before_the_corpus_path(in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    put(in_tmp / "corpora" / "mine.txt")
    put(in_tmp / "elsewhere" / "mine.txt")
    monkeypatch.setenv("TEXTGEN_CORPUS_PATH", str(in_tmp / "elsewhere"))
    assert resolve_corpus("mine.txt").resolve() == (in_tmp / "corpora" / "mine.txt").resolve()


def test_a_path_that_does_not_exist_is_looked_up_by_its_file_name(in_tmp: Path) -> None:
    put(in_tmp / "corpora" / "mine.txt")
    assert resolve_corpus("no/such/dir/mine.txt").name == "mine.txt"


def test_unknown_name_says_where_it_looked(in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEXTGEN_CORPUS_PATH", str(in_tmp / "shelf"))
    with pytest.raises(CorpusError) as info:
        resolve_corpus("my_book.txt")
    message = str(info.value)
    assert "'my_book.txt' not found" in message
    assert "corpora" in message and str(in_tmp / "shelf") in message
    assert "--download" not in message  # not a Project Gutenberg name


def test_gutenberg_name_not_found_suggests_download(in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEXTGEN_CORPUS_PATH", str(in_tmp / "shelf"))
    with pytest.raises(CorpusError) as info:
        resolve_corpus("2600-0.txt")
    message = str(info.value)
    assert "'2600-0.txt' not found" in message
    assert "--download" in message
    assert "#2600" in message
    assert "corpora" in message and str(in_tmp / "shelf") in message
    assert not (in_tmp / "corpora").exists()  # nothing fetched without --download


@pytest.mark.parametrize(
    ("name", "number"),
    [("2600-0.txt", 2600), ("pg2600.txt", 2600), ("2600.txt", 2600), ("11-8.txt", 11), ("dir/2600-0.txt", 2600)],
)
def test_gutenberg_number(name: str, number: int) -> None:
    assert gutenberg_number(name) == number


@pytest.mark.parametrize("name", ["war.txt", "2600-0.md", "2600-1.txt", "pgx.txt", "2600"])
def test_not_a_gutenberg_name(name: str) -> None:
    assert gutenberg_number(name) is None


def test_download_failure_is_one_line(in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def offline(url: str, *args: object, **kwargs: object) -> None:
        calls.append(url)
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    with pytest.raises(CorpusError) as info:
        resolve_corpus("2600-0.txt", download=True)
    message = str(info.value)
    assert "\n" not in message
    assert "could not download Project Gutenberg book #2600" in message
    assert "Temporary failure in name resolution" in message
    assert "TEXTGEN_CORPUS_PATH" in message
    assert len(calls) >= 1 and all("2600" in url for url in calls)
    assert not (in_tmp / "corpora" / "2600-0.txt").exists()


def test_download_saves_into_local_corpora(in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    payload = GUTENBERG.replace("\n", "\r\n").encode("utf-8-sig")
    monkeypatch.setattr(urllib.request, "urlopen", lambda url, *a, **k: io.BytesIO(payload))
    path = resolve_corpus("2600-0.txt", download=True)
    assert path == Path("corpora") / "2600-0.txt"
    assert (in_tmp / "corpora" / "2600-0.txt").read_bytes() == payload
    assert [p.name for p in (in_tmp / "corpora").iterdir()] == ["2600-0.txt"]  # no temporary files left
    assert read_corpus(path) == BODY


def test_download_of_a_non_gutenberg_name_is_not_attempted(in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: object, **kwargs: object) -> None:
        raise AssertionError("no download expected")

    monkeypatch.setattr(urllib.request, "urlopen", fail)
    with pytest.raises(CorpusError, match="not found"):
        resolve_corpus("my_book.txt", download=True)


def test_a_directory_is_an_error(in_tmp: Path) -> None:
    (in_tmp / "books").mkdir()
    with pytest.raises(CorpusError, match="books is a directory"):
        resolve_corpus("books")
    with pytest.raises(CorpusError, match="is a directory"):
        read_corpus(in_tmp / "books")


# --- read_corpus ---------------------------------------------------------------


def test_bom_is_stripped(tmp_path: Path) -> None:
    path = tmp_path / "bom.txt"
    path.write_bytes("\ufeffhello world\n".encode())
    assert read_corpus(path) == "hello world\n"


def test_line_endings_are_normalised(tmp_path: Path) -> None:
    path = tmp_path / "endings.txt"
    path.write_bytes(b"one\r\ntwo\rthree\nfour\r\n\r\n")
    assert read_corpus(path) == "one\ntwo\nthree\nfour\n\n"


def test_gutenberg_boilerplate_is_stripped_by_default(tmp_path: Path) -> None:
    path = put(tmp_path / "2600-0.txt", GUTENBERG)
    assert read_corpus(path) == BODY


def test_gutenberg_boilerplate_is_kept_on_request(tmp_path: Path) -> None:
    path = put(tmp_path / "2600-0.txt", GUTENBERG)
    assert read_corpus(path, strip_boilerplate=False) == GUTENBERG


def test_real_world_gutenberg_file_with_bom_and_crlf(tmp_path: Path) -> None:
    path = tmp_path / "2600-0.txt"
    path.write_bytes(GUTENBERG.replace("\n", "\r\n").encode("utf-8-sig"))
    assert read_corpus(path) == BODY
    assert read_corpus(path, strip_boilerplate=False) == GUTENBERG


def test_text_without_markers_is_unchanged(tmp_path: Path) -> None:
    text = "No markers here.\n*** not a marker either\n"
    assert read_corpus(put(tmp_path / "plain.txt", text)) == text


def test_nothing_between_the_markers(tmp_path: Path) -> None:
    text = "header\n*** START OF THE BOOK ***\n\n*** END OF THE BOOK ***\nfooter\n"
    path = put(tmp_path / "hollow.txt", text)
    with pytest.raises(CorpusError, match="--keep-boilerplate"):
        read_corpus(path)
    assert read_corpus(path, strip_boilerplate=False) == text


@pytest.mark.parametrize("content", [b"", b" \n\r\n\t "], ids=["empty", "whitespace"])
def test_empty_file(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "empty.txt"
    path.write_bytes(content)
    with pytest.raises(CorpusError, match=r"empty\.txt is empty; give a plain-text file"):
        read_corpus(path)


def test_binary_file(tmp_path: Path) -> None:
    path = tmp_path / "model.bin"
    path.write_bytes(b"\x89HDF\r\n\x1a\n\x00\x00\x00\x00\x08\x08\x00\x04")
    with pytest.raises(CorpusError, match=r"model\.bin looks like a binary file .*NUL bytes"):
        read_corpus(path)


def test_invalid_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin1.txt"
    path.write_bytes("Déjà vu, naïve café\n".encode("latin-1"))
    with pytest.raises(CorpusError) as info:
        read_corpus(path)
    message = str(info.value)
    assert "latin1.txt is not valid UTF-8 (bad byte at offset 1)" in message
    assert "iconv" in message


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match=r"cannot read .*nope\.txt"):
        read_corpus(tmp_path / "nope.txt")


def test_utf8_text_is_read_exactly(tmp_path: Path) -> None:
    text = "Пьер — «Ну, князь»\tdéjà 😀\n"
    assert read_corpus(put(tmp_path / "utf8.txt", text)) == text


def test_utf16_file_is_named_as_such(tmp_path: Path) -> None:
    path = tmp_path / "utf16.txt"
    path.write_bytes("War and Peace\n".encode("utf-16"))
    with pytest.raises(CorpusError, match=r"is UTF-16 text; convert it to UTF-8"):
        read_corpus(path)
