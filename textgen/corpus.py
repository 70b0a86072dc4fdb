"""Find corpus files (files, directories, globs; a missing Project Gutenberg book through ``textgen.gutenberg``),
and decode and clean their text a chunk at a time."""

from __future__ import annotations

import codecs
import contextlib
import fnmatch
import glob
import hashlib
import itertools
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from textgen.commands import QUICK_START_TRAIN, command
from textgen.errors import CorpusError
from textgen.gutenberg import DownloadFailed, download_gutenberg
from textgen.vocab import char_counts, merge_counts

CORPUS_PATH_ENV = "TEXTGEN_CORPUS_PATH"
LOCAL_CORPORA = Path("corpora")
_GUTENBERG_NAME = re.compile(r"^(?:pg)?(\d+)(?:-0|-8)?\.txt$")
_START = re.compile(r"^\*\*\* ?START OF.*$", re.MULTILINE)
_END = re.compile(r"^\*\*\* ?END OF.*$", re.MULTILINE)

READ_CHUNK_BYTES = 1 << 20  # files are read this much at a time: memory stays bounded
HEAD_BYTES = 64 << 10  # how much of a file the binary / UTF-16 checks look at
# Control bytes that text does not hold (tab, newline, vertical tab, form feed, carriage return and escape are
# text's). A file with NUL bytes is binary; so is one where these make up BINARY_SHARE of the head: uniform bytes
# (compressed or encrypted data) hold about 10%, while none of the 31 books in ../shared/corpora/ holds one in its
# first 64 KiB (2026-12-04).
BINARY_CONTROLS = frozenset(bytes(range(0x01, 0x09)) + bytes(range(0x0E, 0x1B)) + bytes(range(0x1C, 0x20)))
BINARY_SHARE, BINARY_MIN_CONTROLS = 0.01, 8

# Memory ``read_corpus`` and ``evaluate FILE`` hold per character: the str (1 byte per character
# for Latin-1 text, up to 4), its compact ids (up to 4) and their int32 copy (4): at most 12. A
# file's size in bytes is at least its number of characters, so size * 12 errs on the side of
# refusing. (Training streams the corpus instead: textgen.idcache.)
BYTES_PER_CORPUS_CHAR = 12


def search_dirs() -> list[Path]:
    """Where a corpus named without a path is looked up: ./corpora, then $TEXTGEN_CORPUS_PATH."""
    extra = [Path(p) for p in os.environ.get(CORPUS_PATH_ENV, "").split(os.pathsep) if p]
    return [LOCAL_CORPORA, *extra]


def gutenberg_number(name: str) -> int | None:
    """The book number if ``name`` looks like a Project Gutenberg file (2600-0.txt, pg2600.txt)."""
    match = _GUTENBERG_NAME.match(Path(name).name)
    return int(match.group(1)) if match else None


def resolve_corpus(name: str, download: bool = False) -> Path:
    """The corpus file for ``name``: a path, else a file of that name in the search dirs.

    With ``download``, a Project Gutenberg name found nowhere is fetched into ./corpora.
    """
    path = Path(os.path.expanduser(name))
    if path.is_dir():
        raise CorpusError(f"{name} is a directory; give the path of a plain-text file inside it")
    if path.is_file():
        return path
    dirs = search_dirs()
    for directory in dirs:
        candidate = directory / path.name
        if candidate.is_file():
            return candidate
    looked = ", ".join(str(d) for d in [path.parent if str(path.parent) != "." else Path("."), *dirs])
    if not os.environ.get(CORPUS_PATH_ENV):
        looked += f", ${CORPUS_PATH_ENV} (not set)"
    number = gutenberg_number(name)
    if number is None:
        raise CorpusError(f"corpus {name!r} not found (looked in {looked}); give a path to a text file")
    if not download:
        raise CorpusError(
            f"corpus {name!r} not found (looked in {looked}); add --download to fetch "
            f"Project Gutenberg book #{number} into {LOCAL_CORPORA}/"
        )
    try:
        return download_gutenberg(number, LOCAL_CORPORA / path.name)
    except DownloadFailed as exc:
        raise CorpusError(
            f"could not download Project Gutenberg book #{number} ({exc}); offline? "
            f"Put the file in {LOCAL_CORPORA}/ or a directory on ${CORPUS_PATH_ENV} (looked in {looked})"
        ) from None


def resolve_corpora(names: list[str], download: bool = False) -> list[Path]:
    """The corpus files for ``names`` (see ``find_corpora``), each resolved to its real path."""
    return [path.resolve() for path in find_corpora(names, download)]


def find_corpora(names: list[str], download: bool = False) -> list[Path]:
    """The corpus files for ``names``: files (as ``resolve_corpus`` finds them), directories (every
    ``*.txt`` file under them) and glob patterns, in the order given, each directory's or pattern's
    files sorted by path; a file named twice (or through a link) is read once. Each is the path as found from the
    name given, not resolved through links: what the user is shown."""
    if not names:
        raise CorpusError(f"give a corpus to train on, e.g. {command(QUICK_START_TRAIN)}")
    files: dict[Path, Path] = {}  # each file's real path: the path it was first found by
    for name in names:
        if not name.strip():  # Path("") is the current directory: an unset "$BOOK" would read every .txt under it
            raise CorpusError("a corpus name is empty; give a file, a directory or a pattern, e.g. 2600-0.txt")
        path = Path(os.path.expanduser(name))
        if path.is_dir():
            found = sorted(p for p in path.rglob("*.txt") if p.is_file() and not _skipped(p.relative_to(path), path))
            if not found:
                raise CorpusError(f"{name} has no .txt files; textgen reads the *.txt files of a directory")
        elif not path.exists() and glob.has_magic(name):
            found = _glob_files(os.path.expanduser(name))
            if not found:
                raise CorpusError(
                    f"no files match {name!r}; check the pattern (quote it to keep the shell from expanding it)"
                )
        else:
            found = [resolve_corpus(name, download=download)]
        for path in found:
            files.setdefault(path.resolve(), path)
    if empty := next((p for p in files.values() if p.stat().st_size == 0), None):  # at once, not after TF's ~3 s
        raise empty_file(empty)
    return list(files.values())


def empty_file(path: Path) -> CorpusError:
    """The error for a corpus file with no text in it (no bytes, found as it is named; or only whitespace, as read)."""
    return CorpusError(f"{path} is empty; give a plain-text file with some text in it")


def _glob_files(pattern: str) -> list[Path]:
    """The files ``pattern`` matches, sorted: what ``glob.glob(pattern, recursive=True)`` finds, except that ``**``
    matches no link to a directory, as a directory corpus reads none. (glob's follows them: under one link back up,
    ``ln -s .. loop``, it reads loop/loop/... to the kernel's limit of 40 links; under two, 2^40 paths.)"""
    parts = pattern.split(os.sep)
    parts = [p for i, p in enumerate(parts) if not (p == "**" and i and parts[i - 1] == "**")]  # a/**/**: a/**
    return sorted({Path(p) for p in _glob(os.sep.join(parts)) if os.path.isfile(p)})


def _glob(pattern: str) -> Iterator[str]:
    head, name = os.path.split(pattern)
    if not glob.has_magic(pattern):
        if os.path.lexists(pattern):
            yield pattern
        return
    heads = _glob(head) if head != pattern and glob.has_magic(head) else [head]
    for parent in heads:
        for match in _matches(parent or os.curdir, name):
            yield os.path.join(parent, match)


def _matches(directory: str, name: str) -> Iterator[str]:
    """What the pattern component ``name`` matches in ``directory`` (``**``: "" and every path under it, through no
    link to a directory); hidden names only for a ``name`` that begins with a dot, as glob does."""
    if name == "**":
        yield ""
        for root, dirs, files in os.walk(directory):
            dirs[:] = [d for d in dirs if not d.startswith(".") and not os.path.islink(os.path.join(root, d))]
            relative = os.path.relpath(root, directory)
            for entry in [*dirs, *(f for f in files if not f.startswith("."))]:
                yield os.path.normpath(os.path.join(relative, entry))
    elif glob.has_magic(name):
        try:
            names = os.listdir(directory)
        except OSError:  # not a directory, or unreadable: glob skips it too
            return
        yield from fnmatch.filter([n for n in names if name.startswith(".") or not n.startswith(".")], name)
    elif os.path.lexists(os.path.join(directory, name)):
        yield name


def _skipped(relative: Path, root: Path) -> bool:
    """Whether a file under a corpus directory is left out: hidden, or in a textgen run (its loss_curve.txt)."""
    hidden = any(part.startswith(".") for part in relative.parts)
    return hidden or any(
        (root / folder / "config.json").is_file() and (root / folder / "state.json").is_file()
        for folder in relative.parents
    )


# --- downloading ---------------------------------------------------------------


# --- encodings -------------------------------------------------------------------

# UTF-32 first: its little-endian BOM begins with UTF-16's.
_BOMS = (
    (codecs.BOM_UTF32_LE, "UTF-32"),
    (codecs.BOM_UTF32_BE, "UTF-32"),
    (codecs.BOM_UTF16_LE, "UTF-16"),
    (codecs.BOM_UTF16_BE, "UTF-16"),
)
_ASCII_PROBE = b"Az09 .,\n"


# What "auto" tries, in order, then the codec that decodes any bytes. cp1252 before latin-1: bytes 0x80-0x9F are C1
# control codes in Latin-1, which no real text uses, while cp1252 maps them to punctuation (curly quotes, dashes, the
# euro sign). Where no such byte occurs the two agree, so trying cp1252 first costs nothing.
AUTO_CODECS = ("utf-8", "cp1252")
AUTO_FALLBACK = "latin-1"


def resolve_encoding(path: Path, requested: str = "auto") -> str:
    """The codec to decode ``path`` with: ``requested`` checked, or for "auto" detected.

    "auto" gives utf-8 if the bytes are valid UTF-8 (a BOM is fine), else cp1252 if they
    are valid Windows-1252, else latin-1, which decodes any bytes. Binary files (``binary_evidence``)
    and UTF-16/32 text (a BOM) are refused, also for an explicit ASCII-based codec; only
    the first ``HEAD_BYTES`` are read for that. An explicit codec comes back under Python's
    normalised name (latin1 -> iso8859-1, windows-1252 -> cp1252).
    """
    path = Path(path)
    if requested.strip().lower() != "auto":
        codec = _codec(requested)
        if _ascii_based(codec):
            _check_head(path)
        return codec
    _check_head(path)
    for codec in AUTO_CODECS:
        if _decodes_as(path, codec):
            return codec
    return AUTO_FALLBACK


def _codec(name: str) -> str:
    """Python's name for the text codec ``name``, or a CorpusError naming --encoding."""
    try:
        codec = codecs.lookup(name).name
        _ASCII_PROBE.decode(codec, errors="replace")  # LookupError for codecs not for text (base64, rot13)
    except (LookupError, UnicodeError):  # UnicodeError: the "undefined" codec, which refuses everything
        raise CorpusError(
            f"unknown --encoding {name!r}; use auto, or a text encoding Python knows, "
            f"e.g. utf-8, cp1252, latin-1, utf-16"
        ) from None
    return codec


def same_codec(a: str, b: str) -> bool:
    """Whether two encoding names are the same codec (``latin1`` and ``ISO-8859-1``); an unknown name is
    refused with the usual line."""
    return _codec(a) == _codec(b)


def _ascii_based(codec: str) -> bool:
    """Whether ``codec`` reads ASCII bytes as ASCII, so NUL bytes or a UTF-16 BOM mean the wrong file."""
    return _ASCII_PROBE.decode(codec, errors="replace") == _ASCII_PROBE.decode("ascii")


def marked_encoding(head: bytes) -> str | None:
    """UTF-16 or UTF-32 if ``head`` starts with its byte-order mark, else None."""
    return next((label for bom, label in _BOMS if head.startswith(bom)), None)


def _check_head(path: Path) -> None:
    """Refuse UTF-16/32 text and binary files, judging by the first ``HEAD_BYTES``."""
    with _opened(path) as fh:
        head = fh.read(HEAD_BYTES)
    if label := marked_encoding(head):
        raise CorpusError(
            f"{path} is {label} text; pass --encoding {label.lower()}, or convert it to UTF-8, "
            f"e.g. iconv -f {label.lower()} -t utf-8"
        )
    if why := binary_evidence(head):
        raise CorpusError(f"{path} looks like a binary file ({why}); give a plain-text file")


def binary_evidence(head: bytes) -> str | None:
    """Why ``head`` (a file's first bytes) looks binary, or None if it looks like text: NUL bytes, or control bytes
    text does not hold making up ``BINARY_SHARE`` of it (and at least ``BINARY_MIN_CONTROLS``, so that one in a
    short prompt is taken as text)."""
    if b"\x00" in head:
        return "it contains NUL bytes"
    controls = sum(head.count(byte) for byte in BINARY_CONTROLS)  # 0.6 ms for 64 KiB
    if controls >= max(BINARY_MIN_CONTROLS, BINARY_SHARE * len(head)):
        return f"{controls:,} of its first {len(head):,} bytes are control characters"
    return None


def _decodes_as(path: Path, codec: str) -> bool:
    """Whether all of ``path`` is valid ``codec``, read a chunk at a time."""
    decoder = codecs.getincrementaldecoder(codec)()
    try:
        with _opened(path) as fh:
            while chunk := fh.read(READ_CHUNK_BYTES):
                decoder.decode(chunk)
        decoder.decode(b"", final=True)  # a multi-byte character cut off at the end
    except UnicodeError:  # UnicodeDecodeError, or the UTF-16 and UTF-32 codecs' "no BOM"
        return False
    return True


# --- memory ------------------------------------------------------------------------


def available_memory() -> int:
    """Bytes of memory free for new use: MemAvailable, else physical memory, else unlimited."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # reported in kB
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return sys.maxsize  # unknown: do not refuse a corpus on a guess


def _check_fits_in_memory(path: Path, size: int) -> None:
    """Refuse, before reading it, a text too big to hold in memory."""
    needed, available = size * BYTES_PER_CORPUS_CHAR, available_memory()
    if needed > available:
        raise CorpusError(
            f"{path} is too big to read into memory: it is {_human(size)}, reading it needs about {_human(needed)} "
            f"({BYTES_PER_CORPUS_CHAR} bytes per character) and {_human(available)} of memory is available; "
            f"score it in parts (training streams a corpus of any size)"
        )


def _human(n: int) -> str:
    """A byte count for people: 512 bytes, 1.5 MiB, 3.0 GiB."""
    units = ("bytes", "KiB", "MiB", "GiB", "TiB")
    value, power = float(n), 0
    while value >= 1024 and power < len(units) - 1:
        value, power = value / 1024, power + 1
    return f"{n} bytes" if power == 0 else f"{value:.1f} {units[power]}"


# --- reading -----------------------------------------------------------------------


@contextlib.contextmanager
def _opened(path: Path) -> Iterator[BinaryIO]:
    """``path`` open for reading; an OS error, on opening or reading, becomes a CorpusError."""
    try:
        with open(path, "rb") as fh:
            yield fh
    except IsADirectoryError:
        raise CorpusError(f"{path} is a directory; give the path of a plain-text file") from None
    except OSError as exc:
        raise CorpusError(f"cannot read {path}: {exc.strerror or exc}") from None


def fingerprint(path: Path) -> tuple[int, str]:
    """The size of ``path`` in bytes and a BLAKE2b hash of its bytes, read a chunk at a time.

    It identifies the bytes of the file, not the text in it: any edit changes it, even one
    that decodes to the same corpus (a BOM, line endings, the boilerplate).
    """
    digest, size = hashlib.blake2b(digest_size=16), 0
    with _opened(path) as fh:
        while chunk := fh.read(READ_CHUNK_BYTES):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def corpus_fingerprint(files: list[Path] | tuple[Path, ...]) -> tuple[int, str]:
    """Total bytes and one hash of ``files`` in order; for a single file, its own ``fingerprint``."""
    prints = [fingerprint(f) for f in files]
    if len(prints) == 1:
        return prints[0]
    digest = hashlib.blake2b("\n".join(f"{size} {h}" for size, h in prints).encode(), digest_size=16)
    return sum(size for size, _ in prints), digest.hexdigest()


def check_unchanged(
    paths: list[Path],
    fingerprint: Sequence[int | str] | None,
    gone: Callable[[Path], str],
    changed: Callable[[int, int], str],
) -> None:
    """Refuse corpus files that are gone (the message ``gone(path)``) or whose bytes differ from their
    ``fingerprint`` (``corpus_fingerprint``'s; None if it was not recorded: ``changed(bytes then, bytes now)``).
    A run's or a study's splits would no longer be those it started on."""
    for path in paths:
        if not path.is_file():
            raise CorpusError(gone(path))
    if fingerprint is None:  # recorded before fingerprints were
        return
    size, digest = corpus_fingerprint(paths)
    if [size, digest] != list(fingerprint):
        raise CorpusError(changed(int(fingerprint[0]), size))


def read_corpus(path: str | Path, strip_boilerplate: bool = True, encoding: str = "utf-8") -> str:
    """The cleaned text of a corpus file, decoded with ``encoding`` (a codec name, or "auto"), in memory.

    Refused up front if it could not be held in memory (training streams instead: ``textgen.idcache``).
    Line endings become \\n and, with ``strip_boilerplate``, only the text between Project Gutenberg's
    markers is kept.
    """
    path = Path(path)
    with _opened(path) as fh:
        size = os.fstat(fh.fileno()).st_size
    _check_fits_in_memory(path, size)
    codec = resolve_encoding(path, encoding)
    return "".join(kept_chunks(path, codec, scan_text(path, codec, strip_boilerplate)))


@dataclass(frozen=True)
class TextScan:
    """Where a file's kept text lies in its cleaned text (character offsets), and its characters."""

    start: int
    end: int
    codes: np.ndarray  # the distinct code points of the kept text, ascending
    counts: np.ndarray  # how often each occurs

    @property
    def chars(self) -> int:
        return self.end - self.start


def scan_text(path: Path, codec: str, strip_boilerplate: bool = True) -> TextScan:
    """Read ``path`` once, a chunk at a time: find Project Gutenberg's markers and count the characters of
    the text between them (all of it without ``strip_boilerplate``). Memory stays bounded by the chunk.

    The kept text is what the whole-text rule gives: after the first ``*** START OF`` line, up to the
    first ``*** END OF`` line after it. Every chunk is counted in pieces cut at each marker, so the
    counts of the kept text are sums of whole pieces.
    """
    pieces: list[tuple[int, np.ndarray, np.ndarray]] = []  # (offset, codes, counts), in order
    starts: list[int] = []  # where the text after each START line begins
    ends: list[int] = []  # where each END line begins
    offset = 0
    for chunk in _clean_chunks(path, codec):
        cuts = {0, len(chunk)}
        for at in _marker_line_starts(chunk) if strip_boilerplate else ():
            if start_line := _START.match(chunk, at):
                cuts.add(min(start_line.end() + 1, len(chunk)))  # + 1: the marker line's own newline
                starts.append(offset + min(start_line.end() + 1, len(chunk)))
            elif _END.match(chunk, at):
                cuts.add(at)
                ends.append(offset + at)
        bounds = sorted(cuts)
        for a, b in itertools.pairwise(bounds):
            pieces.append((offset + a, *char_counts(chunk[a:b])))
        offset += len(chunk)
    if not _has_text(pieces):
        raise empty_file(path)
    start = starts[0] if starts else 0
    end = next((e for e in ends if e >= start), offset)
    kept = [p for p in pieces if start <= p[0] < end]
    if strip_boilerplate and not _has_text(kept):
        raise CorpusError(f"{path} has no text between its Project Gutenberg markers; try --keep-boilerplate")
    codes, counts = merge_counts([(c, n) for _, c, n in kept])
    return TextScan(start, end, codes, counts)


def _marker_line_starts(chunk: str) -> Iterator[int]:
    """Where lines of ``chunk`` start with ``***``, as Project Gutenberg's markers do: only there are the
    marker regexes tried (``finditer`` tries a regex that starts with ^ at every position, which took longer
    than all the rest of encoding the 15 MB of shared books: 0.26 s against 0.21 s)."""
    at = chunk.find("***")
    while at != -1:
        if at == 0 or chunk[at - 1] == "\n":
            yield at
        at = chunk.find("***", at + 1)


def _has_text(pieces: list[tuple[int, np.ndarray, np.ndarray]]) -> bool:
    return any(not chr(c).isspace() for _, codes, _ in pieces for c in codes)


def kept_chunks(path: Path, codec: str, scan: TextScan) -> Iterator[str]:
    """The kept text of ``path`` (as ``scan`` found it), a chunk at a time."""
    offset = 0
    for chunk in _clean_chunks(path, codec):
        a, b = max(scan.start - offset, 0), min(scan.end - offset, len(chunk))
        if a < b:
            yield chunk[a:b]
        offset += len(chunk)
        if offset >= scan.end:
            return


LONG_LINE_CHARS = 4 * READ_CHUNK_BYTES  # a line longer than this is cut between chunks


def _clean_chunks(path: Path, codec: str) -> Iterator[str]:
    """The text of ``path`` decoded with ``codec`` (a UTF-8 BOM dropped), line endings as \\n, in chunks of
    whole lines of about ``READ_CHUNK_BYTES``; a bad byte is a CorpusError giving its offset in the file."""
    decoder = codecs.getincrementaldecoder(codec)()
    carry, read, first = "", 0, True
    with _opened(path) as fh:
        while True:
            data = fh.read(READ_CHUNK_BYTES)
            pending = len(decoder.getstate()[0])  # bytes of a character cut off by the last read
            try:
                text = carry + decoder.decode(data, final=not data)
            except UnicodeError as exc:  # UnicodeDecodeError, or the UTF-16 and UTF-32 codecs' "no BOM"
                label = "UTF-8" if codec == "utf-8" else codec
                where = (
                    f"bad byte at offset {read - pending + exc.start}" if isinstance(exc, UnicodeDecodeError) else exc
                )
                raise CorpusError(
                    f"{path} is not valid {label} ({where}); pass "
                    "--encoding auto to detect UTF-8, Windows-1252 or Latin-1, or name the file's encoding "
                    "with --encoding"
                ) from None
            read += len(data)
            if first and codec == "utf-8" and text.startswith("\ufeff"):
                text = text[1:]
            first = first and not text
            held = "\r" if data and text.endswith("\r") else ""  # it may be the first half of a \r\n
            if held:
                text = text[:-1]
            if "\r" in text:
                text = text.replace("\r\n", "\n").replace("\r", "\n")
            cut = len(text) if not data else text.rfind("\n") + 1
            if cut == 0 and len(text) > LONG_LINE_CHARS:
                cut = len(text)
            if cut:
                yield text[:cut]
            carry = text[cut:] + held
            if not data:
                return


def corpus_stem(names: list[str], files: list[Path]) -> str:
    """What a new run (or study) is named after: the book, the directory, or the first pattern's directory."""
    first = Path(os.path.expanduser(names[0])) if names else files[0]
    if len(files) == 1:
        return files[0].stem
    return first.name if first.is_dir() else files[0].parent.name


def read_prompt_file(name: str) -> str:
    """The text of a prompt file (``-``: standard input), kept whole (no boilerplate stripped), line endings as
    \\n. Decoded as ``--encoding auto`` decodes a corpus, except that a UTF-16 or UTF-32 byte-order mark is read as
    what it says (a prompt has no ``--encoding`` to give). A missing, empty, unreadable, binary or undecodable file is
    one ``CorpusError``."""
    if name == "-":
        return _decode_prompt(sys.stdin.buffer.read())
    path = Path(os.path.expanduser(name))
    if not path.exists():
        raise CorpusError(f"--prime-file {name}: no such file; give the path of a plain-text file, or - for stdin")
    with _opened(path) as fh:
        head = fh.read(HEAD_BYTES)
    if marked_encoding(head) is None:
        return read_corpus(path, strip_boilerplate=False, encoding="auto")
    _check_fits_in_memory(path, path.stat().st_size)
    with _opened(path) as fh:
        return _decode_prompt(fh.read(), f"--prime-file {name}")


def _decode_auto(data: bytes) -> str:
    """``data`` decoded as ``resolve_encoding``'s "auto" decodes a file (a UTF-8 BOM dropped)."""
    for codec in AUTO_CODECS:
        with contextlib.suppress(UnicodeDecodeError):
            return data.decode("utf-8-sig" if codec == "utf-8" else codec)
    return data.decode(AUTO_FALLBACK)


def _decode_prompt(data: bytes, where: str = "the prompt on standard input") -> str:
    """A prompt's bytes (piped in, or a file with a byte-order mark), decoded as ``read_prompt_file`` decodes a
    file: by its byte-order mark, else as "auto" decodes one."""
    marked = marked_encoding(data)
    if marked is None and (why := binary_evidence(data[:HEAD_BYTES])):
        raise CorpusError(f"{where} looks binary ({why}); give plain text")
    try:
        text = data.decode(marked.lower()) if marked else _decode_auto(data)
    except UnicodeDecodeError as exc:
        raise CorpusError(
            f"{where} starts as {marked} text but is not valid {marked} ({exc.reason} at byte {exc.start}); "
            f"convert it to UTF-8, e.g. iconv -f {str(marked).lower()} -t utf-8"
        ) from None
    if not text.strip():
        raise CorpusError(f"{where} is empty; give some text, or drop --prime-file")
    return text.replace("\r\n", "\n").replace("\r", "\n")
