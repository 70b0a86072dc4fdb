"""textgen.corpus: finding, downloading, decoding and cleaning a corpus file."""

from __future__ import annotations

import codecs
import contextlib
import hashlib
import io
import os
import random
import re
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from textgen import corpus, gutenberg
from textgen.corpus import (
    BINARY_CONTROLS,
    HEAD_BYTES,
    available_memory,
    corpus_fingerprint,
    fingerprint,
    gutenberg_number,
    read_corpus,
    resolve_corpora,
    resolve_corpus,
    resolve_encoding,
)
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
    with pytest.raises(CorpusError, match="not found"):  # a home directory that does not exist is a path as typed
        resolve_corpus("~no-such-user-here/yours.txt")


def test_unknown_name_says_where_it_looked(in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEXTGEN_CORPUS_PATH", str(in_tmp / "shelf"))
    with pytest.raises(CorpusError) as info:
        resolve_corpus("my_book.txt")
    message = str(info.value)
    assert "'my_book.txt' not found" in message
    assert "corpora" in message and str(in_tmp / "shelf") in message
    assert "--download" not in message  # not a Project Gutenberg name
    assert "TEXTGEN_CORPUS_PATH (not set)" not in message


def test_an_unset_corpus_path_is_named_where_it_looked(in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TEXTGEN_CORPUS_PATH", raising=False)
    with pytest.raises(CorpusError, match=r"looked in \., corpora, \$TEXTGEN_CORPUS_PATH \(not set\)"):
        resolve_corpus("my_book.txt")


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


def test_download_of_a_non_gutenberg_name_is_not_attempted(in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: object, **kwargs: object) -> None:
        raise AssertionError("no download expected")

    monkeypatch.setattr(urllib.request, "urlopen", fail)
    with pytest.raises(CorpusError, match="not found"):
        resolve_corpus("my_book.txt", download=True)


def test_many_sources_resolve_to_files_in_order(in_tmp: Path) -> None:
    books = in_tmp / "books"
    names = ("b.txt", "a.txt", "sub/c.txt", ".hidden/d.txt", "README.md", ".e.txt", "ck/run/loss_curve.txt")
    for name in (*names, "ck/run/config.json", "ck/run/state.json"):  # a textgen run's files are no corpus
        (books / name).parent.mkdir(parents=True, exist_ok=True)
        (books / name).write_text("text\n", encoding="utf-8")
    (in_tmp / "one.txt").write_text("one\n", encoding="utf-8")
    expected_dir = [books / "a.txt", books / "b.txt", books / "sub" / "c.txt"]  # *.txt, sorted, not hidden
    assert resolve_corpora(["books"]) == [p.resolve() for p in expected_dir]
    # the order given; a glob's files sorted; a file named twice read once
    found = resolve_corpora(["one.txt", "books/*.txt", "books/a.txt"])
    assert found == [(in_tmp / "one.txt").resolve(), (books / "a.txt").resolve(), (books / "b.txt").resolve()]
    with pytest.raises(CorpusError, match=r"empty has no \.txt files"):
        (in_tmp / "empty").mkdir()
        resolve_corpora(["empty"])
    with pytest.raises(CorpusError, match=r"no files match 'nothing/\*.txt'"):
        resolve_corpora(["nothing/*.txt"])
    with pytest.raises(CorpusError, match="give a corpus to train on"):
        resolve_corpora([])
    for empty in ("", "  "):  # an unset "$BOOK": not the current directory
        with pytest.raises(CorpusError, match="a corpus name is empty"):
            resolve_corpora(["one.txt", empty])


def test_the_fingerprint_of_many_files_changes_with_any_of_them(tmp_path: Path) -> None:
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("one\n", encoding="utf-8")
    b.write_text("two\n", encoding="utf-8")
    assert corpus_fingerprint([a]) == corpus.fingerprint(a)  # one file: as before
    both = corpus_fingerprint([a, b])
    assert both[0] == 8 and both != corpus_fingerprint([b, a])
    b.write_text("twO\n", encoding="utf-8")
    assert corpus_fingerprint([a, b]) != both


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


def test_a_file_of_no_bytes_is_refused_as_the_corpus_is_found(tmp_path: Path) -> None:
    """Before TensorFlow loads (train and evaluate find the corpus first), also among other books."""
    (tmp_path / "books").mkdir()
    (tmp_path / "books" / "one.txt").write_text("some text", encoding="utf-8")
    (tmp_path / "books" / "two.txt").write_bytes(b"")
    with pytest.raises(CorpusError, match=r"two\.txt is empty; give a plain-text file"):
        resolve_corpora([str(tmp_path / "books")])


def test_binary_file(tmp_path: Path) -> None:
    path = tmp_path / "model.bin"
    path.write_bytes(b"\x89HDF\r\n\x1a\n\x00\x00\x00\x00\x08\x08\x00\x04")
    with pytest.raises(CorpusError, match=r"model\.bin looks like a binary file .*NUL bytes"):
        read_corpus(path)


def test_binary_bytes_without_nul_are_refused_and_a_stray_control_is_text(tmp_path: Path) -> None:
    noise = bytes(b or 1 for b in random.Random(0).randbytes(4096))  # compressed data, say, its NUL bytes gone
    with pytest.raises(CorpusError, match=r"noise\.gz looks like a binary file \(\d+ of its first 4,096 bytes are co"):
        read_corpus(write(tmp_path / "noise.gz", noise))
    book = "A chapter.\x1c\n" + "Another, a form feed before it.\f\n\x1b[1mbold\x1b[0m\tand a tab.\n" * 20
    assert read_corpus(write(tmp_path / "book.txt", book.encode()), strip_boilerplate=False) == book
    seven = "text " * 100 + "\x01" * 7  # fewer than BINARY_MIN_CONTROLS
    assert read_corpus(write(tmp_path / "short.txt", seven.encode()), strip_boilerplate=False) == seven


def test_invalid_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin1.txt"
    path.write_bytes("Déjà vu, naïve café\n".encode("latin-1"))
    with pytest.raises(CorpusError) as info:
        read_corpus(path)
    message = str(info.value)
    assert "latin1.txt is not valid UTF-8 (bad byte at offset 1)" in message
    assert "--encoding auto" in message


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match=r"cannot read .*nope\.txt"):
        read_corpus(tmp_path / "nope.txt")


def test_utf8_text_is_read_exactly(tmp_path: Path) -> None:
    text = "Пьер — «Ну, князь»\tdéjà 😀\n"
    assert read_corpus(put(tmp_path / "utf8.txt", text)) == text


def test_utf16_file_is_named_as_such(tmp_path: Path) -> None:
    path = tmp_path / "utf16.txt"
    path.write_bytes("War and Peace\n".encode("utf-16"))
    with pytest.raises(CorpusError, match=r"is UTF-16 text; pass --encoding utf-16, or convert it to UTF-8"):
        read_corpus(path)


# --- download_gutenberg against a local server ---------------------------------

PAYLOAD = GUTENBERG.replace("\n", "\r\n").encode("utf-8-sig")
SMALL_CAP = 1000  # the size cap the tests set, so "too big" needs only a few kB


STALL_ENDS = threading.Event()  # set by the stalled-download test once its download has failed


class BookHandler(BaseHTTPRequestHandler):
    """GET /<route>/<number>: book, big, big-unsized, truncated, chunked-cut, slow, stall, hangup; else 404."""

    def do_GET(self) -> None:
        route = self.path.split("/")[1].replace("-", "_")
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the client gave up, as some cases expect
            getattr(self, f"serve_{route}", self.serve_missing)()

    def start(self, length: int | None) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        if length is not None:
            self.send_header("Content-Length", str(length))
        self.end_headers()

    def serve_book(self) -> None:
        self.start(len(PAYLOAD))
        self.wfile.write(PAYLOAD)

    def serve_big(self) -> None:
        self.start(5 * SMALL_CAP)
        self.wfile.write(b"x" * 5 * SMALL_CAP)

    def serve_big_unsized(self) -> None:  # no Content-Length: the body runs to the connection's end
        self.start(None)
        self.wfile.write(b"x" * 5 * SMALL_CAP)

    def serve_truncated(self) -> None:
        self.start(1000)
        self.wfile.write(b"only ten b")

    def serve_chunked_cut(self) -> None:  # chunked encoding, closed before the last chunk
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.write(b"a\r\n0123456789\r\n")

    def serve_slow(self) -> None:  # a byte every 50 ms: never idle long enough for a socket timeout
        self.start(200)
        for _ in range(200):
            self.wfile.write(b"x")
            time.sleep(0.05)

    def serve_stall(self) -> None:  # the headers, then nothing until the test has seen the client give up
        self.start(100)
        STALL_ENDS.wait(120)

    def serve_hangup(self) -> None:
        pass  # closes the connection without a response

    def serve_missing(self) -> None:
        self.send_error(404)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), BookHandler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def serve(server: str, in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """Point the downloader at routes of the local server, with no proxy in between."""
    monkeypatch.setenv("no_proxy", "*")
    monkeypatch.setattr(gutenberg, "GUTENBERG_MAX_BYTES", SMALL_CAP * 2)

    def point(*routes: str) -> None:
        monkeypatch.setattr(gutenberg, "GUTENBERG_URLS", tuple(f"{server}/{route}/{{n}}" for route in routes))

    return point


def download_error(in_tmp: Path) -> str:
    """The one-line message of a failed download of book #2600; nothing may be left behind."""
    with pytest.raises(CorpusError) as info:
        resolve_corpus("2600-0.txt", download=True)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("could not download Project Gutenberg book #2600 (")
    assert "offline? Put the file in corpora/" in message and "TEXTGEN_CORPUS_PATH" in message
    assert not (in_tmp / "corpora").exists()
    return message


def test_download_saves_into_local_corpora(in_tmp: Path, serve: Callable[..., None]) -> None:
    serve("book")
    path = resolve_corpus("2600-0.txt", download=True)
    assert path == Path("corpora") / "2600-0.txt"
    assert (in_tmp / "corpora" / "2600-0.txt").read_bytes() == PAYLOAD
    assert [p.name for p in (in_tmp / "corpora").iterdir()] == ["2600-0.txt"]  # no temporary files left
    assert read_corpus(path) == BODY


def test_download_falls_back_to_the_next_url(in_tmp: Path, serve: Callable[..., None]) -> None:
    serve("missing", "book")
    assert (in_tmp / resolve_corpus("2600-0.txt", download=True)).read_bytes() == PAYLOAD


@pytest.mark.parametrize(
    ("route", "why"),
    [
        ("missing", "HTTP 404 Not Found"),
        ("big", "too big: 5,000 bytes, the limit is 2,000"),
        ("big-unsized", "too big: over 2,000 bytes"),
        ("truncated", "truncated: got 10 of 1,000 bytes"),
        ("chunked-cut", "truncated: the connection closed after 10 bytes"),
        ("hangup", "bad HTTP response (RemoteDisconnected"),
    ],
)
def test_download_failures(in_tmp: Path, server: str, serve: Callable[..., None], route: str, why: str) -> None:
    serve(route, route)
    message = download_error(in_tmp)
    assert message.count(f"{server}/{route}/2600: {why}") == 2  # each URL tried, each with its reason


def test_a_slow_download_stops_at_the_deadline(
    in_tmp: Path, server: str, serve: Callable[..., None], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gutenberg, "DOWNLOAD_DEADLINE_S", 1.0)
    serve("slow", "book")
    message = download_error(in_tmp)
    received = re.search(r"too slow: ([\d,]+) bytes in", message)
    assert received and int(received[1].replace(",", "")) < 200  # cut off, not read to the end of its 200 bytes
    assert f"{server}/slow/2600: too slow:" in message and "bytes in when the 1 s deadline passed" in message
    assert f"{server}/book/2600: not tried, the 1 s download deadline had passed" in message


def test_a_stalled_download_times_out(
    in_tmp: Path, server: str, serve: Callable[..., None], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gutenberg, "DOWNLOAD_READ_TIMEOUT_S", 0.3)
    serve("stall")
    try:
        assert f"{server}/stall/2600: timed out" in download_error(in_tmp)
    finally:
        STALL_ENDS.set()


def test_a_refused_connection(in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    monkeypatch.setenv("no_proxy", "*")
    monkeypatch.setattr(gutenberg, "GUTENBERG_URLS", (f"http://127.0.0.1:{port}/{{n}}",))
    assert f"http://127.0.0.1:{port}/2600: Connection refused" in download_error(in_tmp)


def test_a_bad_url(in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gutenberg, "GUTENBERG_URLS", ("nonsense/{n}",))
    assert "nonsense/2600: bad URL (unknown url type" in download_error(in_tmp)


# --- encodings -----------------------------------------------------------------------

# The characters cp1252 puts at bytes 0x80-0x9F, where Latin-1 has C1 control codes.
CP1252_EXTRAS = "".join(bytes([b]).decode("cp1252") for b in range(0x80, 0xA0) if b not in b"\x81\x8d\x8f\x90\x9d")
# Text's ASCII: every character but CR (line endings are normalised) and the controls that make a file binary.
ASCII = "".join(chr(b) for b in range(1, 128) if b not in BINARY_CONTROLS).replace("\r", "")
# Every character cp1252 can encode, less those and NUL.
CP1252_CHARS = "".join(
    bytes([b]).decode("cp1252", errors="ignore") for b in range(1, 256) if b not in BINARY_CONTROLS
).replace("\r", "")


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_windows_1252_curly_quotes_and_dashes(tmp_path: Path) -> None:
    text = "“Quoted,” she said — it’s 5 € in the café.\n"
    path = write(tmp_path / "win.txt", text.encode("cp1252"))
    assert resolve_encoding(path) == "cp1252"
    assert read_corpus(path, encoding="auto") == text


@pytest.mark.parametrize("byte", [0x81, 0x8D, 0x8F, 0x90, 0x9D])
def test_latin1_with_a_byte_cp1252_leaves_undefined(tmp_path: Path, byte: int) -> None:
    path = write(tmp_path / "latin.txt", "café ".encode("latin-1") + bytes([byte]) + b" \x93fin\n")
    assert resolve_encoding(path) == "latin-1"
    assert read_corpus(path, encoding="auto") == f"café {chr(byte)} \x93fin\n"


@pytest.mark.parametrize("bom", [b"", codecs.BOM_UTF8], ids=["plain", "bom"])
def test_utf8_is_detected(tmp_path: Path, bom: bytes) -> None:
    text = "Пьер — «Ну, князь» déjà 😀\n"
    path = write(tmp_path / "utf8.txt", bom + text.encode())
    assert resolve_encoding(path) == "utf-8"
    assert read_corpus(path, encoding="auto") == text


def test_ascii_and_empty_files_are_utf8(tmp_path: Path) -> None:
    assert resolve_encoding(write(tmp_path / "ascii.txt", b"plain\n")) == "utf-8"
    assert resolve_encoding(write(tmp_path / "empty.txt", b"")) == "utf-8"


def test_detection_reads_in_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(corpus, "READ_CHUNK_BYTES", 1)  # every multi-byte character is split across reads
    assert resolve_encoding(write(tmp_path / "utf8.txt", "déjà 😀 “x”\n".encode())) == "utf-8"
    assert resolve_encoding(write(tmp_path / "win.txt", "“x” — y\n".encode("cp1252"))) == "cp1252"
    assert resolve_encoding(write(tmp_path / "cut.txt", "déjà 😀".encode()[:-1])) == "cp1252"  # cut off mid-character


@pytest.mark.parametrize(("codec", "label"), [("utf-16", "UTF-16"), ("utf-16-be", "UTF-16"), ("utf-32", "UTF-32")])
def test_utf16_and_utf32_are_refused_under_auto_with_the_flag_to_use(tmp_path: Path, codec: str, label: str) -> None:
    data = "War and Peace\n".encode(codec)
    if codec == "utf-16-be":
        data = codecs.BOM_UTF16_BE + data
    path = write(tmp_path / "wide.txt", data)
    with pytest.raises(CorpusError) as info:
        resolve_encoding(path)
    message = str(info.value)
    assert f"wide.txt is {label} text; pass --encoding {label.lower()}, or convert it to UTF-8" in message
    assert f"iconv -f {label.lower()} -t utf-8" in message


@pytest.mark.parametrize("codec", ["utf-16", "utf-32"])
def test_utf16_and_utf32_named_for_a_file_without_their_bom_is_one_error(tmp_path: Path, codec: str) -> None:
    path = write(tmp_path / "plain.txt", b"War and Peace\n")
    with pytest.raises(CorpusError, match=rf"plain.txt is not valid {codec} \(.+\); pass --encoding auto"):
        read_corpus(path, encoding=codec)


@pytest.mark.parametrize("codec", ["utf-16", "utf-32"])
def test_utf16_and_utf32_are_read_when_named(tmp_path: Path, codec: str) -> None:
    path = write(tmp_path / "wide.txt", "War — and\r\nPeace 😀\n".encode(codec))
    assert resolve_encoding(path, codec) == codec
    assert read_corpus(path, encoding=codec) == "War — and\nPeace 😀\n"


@pytest.mark.parametrize(
    ("name", "codec"),
    [
        ("utf-8", "utf-8"),
        ("UTF8", "utf-8"),
        ("latin1", "iso8859-1"),
        ("Windows-1252", "cp1252"),
        ("utf-8-sig", "utf-8-sig"),
    ],
)
def test_named_encodings_are_normalised(tmp_path: Path, name: str, codec: str) -> None:
    assert resolve_encoding(write(tmp_path / "a.txt", b"abc\n"), name) == codec


def test_auto_is_not_case_sensitive(tmp_path: Path) -> None:
    assert resolve_encoding(write(tmp_path / "a.txt", "“x”".encode("cp1252")), "AUTO") == "cp1252"


@pytest.mark.parametrize("name", ["klingon", "base64", "rot13", "", "undefined"])
def test_unknown_encoding(tmp_path: Path, name: str) -> None:
    path = write(tmp_path / "a.txt", b"abc\n")
    with pytest.raises(CorpusError) as info:
        read_corpus(path, encoding=name)
    assert str(info.value).startswith(f"unknown --encoding {name!r}; use auto, or a text encoding Python knows")


def test_a_named_encoding_that_does_not_fit(tmp_path: Path) -> None:
    path = write(tmp_path / "latin.txt", "café ".encode("latin-1") + b"\x81\n")
    with pytest.raises(CorpusError) as info:
        read_corpus(path, encoding="cp1252")
    message = str(info.value)
    assert "latin.txt is not valid cp1252 (bad byte at offset 5)" in message
    assert "--encoding auto" in message


def test_bad_byte_offset_counts_the_bom(tmp_path: Path) -> None:
    path = write(tmp_path / "bom.txt", codecs.BOM_UTF8 + b"ab\xff\n")
    with pytest.raises(CorpusError, match=r"is not valid UTF-8 \(bad byte at offset 5\)"):
        read_corpus(path, encoding="utf-8")


def test_latin1_file_is_read_under_auto(tmp_path: Path) -> None:
    text = "café crème brûlée\n" * 50  # the CLI test's "latin-1" corpus
    assert read_corpus(write(tmp_path / "book.txt", text.encode("latin-1")), encoding="auto") == text


def test_binary_files_are_refused_under_a_named_ascii_based_codec(tmp_path: Path) -> None:
    path = write(tmp_path / "model.bin", b"\x89HDF\r\n\x1a\n\x00\x00\x00\x00")
    for name in ("auto", "latin-1", "cp1252"):
        with pytest.raises(CorpusError, match="looks like a binary file"):
            read_corpus(path, encoding=name)


class CountingFileIO(io.FileIO):
    """A raw file that counts the bytes read from it, into ``total``."""

    total = 0

    def readinto(self, buffer: Any) -> int | None:
        n = super().readinto(buffer)
        CountingFileIO.total += n or 0
        return n

    def readall(self) -> bytes:
        data = super().readall()
        CountingFileIO.total += len(data)
        return data


def test_binary_check_reads_only_the_head(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "huge.bin"
    path.touch()
    os.truncate(path, 1 << 30)  # 1 GiB of NUL bytes, sparse: nothing written to disk
    monkeypatch.setattr(CountingFileIO, "total", 0)
    monkeypatch.setattr(corpus, "open", lambda p, mode: io.BufferedReader(CountingFileIO(p, mode)), raising=False)
    monkeypatch.setattr(corpus, "available_memory", lambda: 1 << 50)  # the memory check would stop it first
    with pytest.raises(CorpusError, match=r"huge\.bin looks like a binary file"):
        read_corpus(path, encoding="auto")
    assert 0 < CountingFileIO.total <= HEAD_BYTES + io.DEFAULT_BUFFER_SIZE


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(CP1252_CHARS, min_size=1))
def test_cp1252_text_is_detected_unless_it_is_also_valid_utf8(tmp_path: Path, text: str) -> None:
    data = text.encode("cp1252")
    assume(text.strip() and not data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)))
    path = write(tmp_path / "any.txt", data)
    try:
        data.decode("utf-8")
        expected = "utf-8"  # e.g. "Ã€" is C3 80 in cp1252: UTF-8 for "À", and detected as such
    except UnicodeDecodeError:
        expected = "cp1252"
    assert resolve_encoding(path) == expected
    if expected == "cp1252":
        assert read_corpus(path, strip_boilerplate=False, encoding="auto") == text


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.tuples(
        st.text(ASCII),  # no byte that could start a UTF-8 sequence, so a lone 0x80-0x9F byte is invalid UTF-8
        st.sampled_from(CP1252_EXTRAS),
        st.text(ASCII + CP1252_EXTRAS),
    ).map("".join)
)
def test_ascii_with_cp1252_punctuation_is_always_cp1252(tmp_path: Path, text: str) -> None:
    path = write(tmp_path / "any.txt", text.encode("cp1252"))
    assert resolve_encoding(path) == "cp1252"
    assert read_corpus(path, strip_boilerplate=False, encoding="auto") == text


# --- memory ------------------------------------------------------------------------


def test_a_corpus_too_big_for_memory_is_refused_before_reading(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path / "big.txt", b"\xff" * 100)  # not UTF-8 either: the size is checked first
    monkeypatch.setattr(corpus, "available_memory", lambda: 1000)
    with pytest.raises(CorpusError) as info:
        read_corpus(path)
    message = str(info.value)
    assert "\n" not in message
    assert "big.txt is too big to read into memory: it is 100 bytes, reading it needs about 1.2 KiB" in message
    assert "(12 bytes per character) and 1000 bytes of memory is available" in message
    assert "score it in parts (training streams a corpus of any size)" in message


def test_a_corpus_that_fits_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(corpus, "available_memory", lambda: 2400)
    assert read_corpus(write(tmp_path / "ok.txt", b"x" * 99 + b"\n")) == "x" * 99 + "\n"


def test_available_memory() -> None:
    assert available_memory() > 0


def test_available_memory_falls_back_to_physical_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_proc(*args: object, **kwargs: object) -> None:
        raise FileNotFoundError("/proc/meminfo")

    monkeypatch.setattr(corpus, "open", no_proc, raising=False)
    assert available_memory() == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


# --- fingerprint ---------------------------------------------------------------------


def test_fingerprint_is_the_size_and_a_hash_of_the_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = GUTENBERG.encode() * 10
    path = write(tmp_path / "book.txt", data)
    expected = (len(data), hashlib.blake2b(data, digest_size=16).hexdigest())
    assert fingerprint(path) == expected
    monkeypatch.setattr(corpus, "READ_CHUNK_BYTES", 7)  # chunked reading gives the same hash
    assert fingerprint(path) == expected


def test_fingerprint_changes_with_any_edit(tmp_path: Path) -> None:
    data = GUTENBERG.encode()
    path = write(tmp_path / "book.txt", data)
    before = fingerprint(path)
    assert fingerprint(path) == before  # stable
    write(path, data[:100] + b"w" + data[101:])  # one byte, same size
    after = fingerprint(path)
    assert after[0] == before[0] and after[1] != before[1]
    write(path, data)
    assert fingerprint(path) == before
    write(path, data.replace(b"\n", b"\r\n"))  # the same text once read, but other bytes
    assert fingerprint(path) != before


def test_fingerprint_of_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match=r"cannot read .*nope\.txt"):
        fingerprint(tmp_path / "nope.txt")


def piped(monkeypatch: pytest.MonkeyPatch, data: bytes) -> None:
    """Standard input as a pipe carrying ``data``."""
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data)))


@pytest.mark.parametrize(
    "data",
    [
        "naïve café\r\nline two\n".encode(),
        "\ufeffnaïve café\n".encode(),  # UTF-8 with a BOM
        "naïve “café”\n".encode("cp1252"),
        b"caf\xe9 \x81\n",  # not cp1252 either (0x81 is unassigned): latin-1
        "naïve café\n".encode("utf-16"),
        "naïve café\n".encode("utf-32"),
    ],
)
def test_a_prompt_reads_the_same_from_a_file_and_from_stdin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data: bytes
) -> None:
    path = tmp_path / "prompt.txt"
    path.write_bytes(data)
    piped(monkeypatch, data)
    from_file, from_stdin = corpus.read_prompt_file(str(path)), corpus.read_prompt_file("-")
    assert from_file == from_stdin and "\r" not in from_file and not from_file.startswith("\ufeff")
    assert from_file.startswith(("naïve", "caf"))


BAD_UTF16 = "starts as UTF-16 text but is not valid UTF-16 .*; convert it to UTF-8, e.g. iconv -f utf-16 -t utf-8"


@pytest.mark.parametrize(
    ("data", "message", "as_a_file"),
    [
        (b"", "is empty; give some text, or drop --prime-file", "is empty; give a plain-text file"),
        (b" \n\n", "is empty", "is empty"),
        (b"abc\x00def", "looks binary", "looks like a binary file"),
        (codecs.BOM_UTF16_LE + b"a\x00b", BAD_UTF16, BAD_UTF16),
    ],
)
def test_a_bad_prompt_is_one_error_from_stdin_as_from_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data: bytes, message: str, as_a_file: str
) -> None:
    piped(monkeypatch, data)
    with pytest.raises(CorpusError, match=f"^the prompt on standard input {message}"):
        corpus.read_prompt_file("-")
    path = tmp_path / "prompt.txt"
    path.write_bytes(data)
    with pytest.raises(CorpusError, match=as_a_file):
        corpus.read_prompt_file(str(path))
