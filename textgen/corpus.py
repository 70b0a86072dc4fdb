"""Find, read, decode and clean a corpus file."""

from __future__ import annotations

import os
import re
import urllib.error
import urllib.request
from pathlib import Path

from textgen.errors import CorpusError
from textgen.files import atomic_path

CORPUS_PATH_ENV = "TEXTGEN_CORPUS_PATH"
LOCAL_CORPORA = Path("corpora")
_GUTENBERG_NAME = re.compile(r"^(?:pg)?(\d+)(?:-0|-8)?\.txt$")
_GUTENBERG_URLS = (
    "https://www.gutenberg.org/cache/epub/{n}/pg{n}.txt",
    "https://www.gutenberg.org/files/{n}/{n}-0.txt",
)
_START = re.compile(r"^\*\*\* ?START OF.*$", re.MULTILINE)
_END = re.compile(r"^\*\*\* ?END OF.*$", re.MULTILINE)


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
    path = Path(name).expanduser()
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
    number = gutenberg_number(name)
    if number is None:
        raise CorpusError(f"corpus {name!r} not found (looked in {looked}); give a path to a text file")
    if not download:
        raise CorpusError(
            f"corpus {name!r} not found (looked in {looked}); add --download to fetch "
            f"Project Gutenberg book #{number} into {LOCAL_CORPORA}/"
        )
    return download_gutenberg(number, LOCAL_CORPORA / path.name, looked)


def download_gutenberg(number: int, dest: Path, looked: str = "") -> Path:
    """Fetch Project Gutenberg book ``number`` to ``dest`` (atomically)."""
    errors = []
    for url in _GUTENBERG_URLS:
        url = url.format(n=number)
        try:
            with urllib.request.urlopen(url, timeout=30) as response:
                data = response.read()
        except (urllib.error.URLError, OSError) as exc:
            errors.append(f"{url}: {getattr(exc, 'reason', exc)}")
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(dest) as tmp:
            tmp.write_bytes(data)
        return dest
    where = f" (looked in {looked})" if looked else ""
    raise CorpusError(
        f"could not download Project Gutenberg book #{number} ({'; '.join(errors)}); offline? "
        f"Put the file in {LOCAL_CORPORA}/ or a directory on ${CORPUS_PATH_ENV}{where}"
    )


def decode_corpus(data: bytes, name: str = "corpus") -> str:
    """UTF-8 text from bytes: BOM stripped, line endings normalised to \\n."""
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
        raise CorpusError(f"{name} is UTF-16 text; convert it to UTF-8, e.g. iconv -f utf-16 -t utf-8")
    if b"\x00" in data[:65536]:
        raise CorpusError(f"{name} looks like a binary file (it contains NUL bytes); give a plain-text file")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise CorpusError(
            f"{name} is not valid UTF-8 (bad byte at offset {exc.start}); convert it, e.g. iconv -f latin1 -t utf-8"
        ) from None
    if not text.strip():
        raise CorpusError(f"{name} is empty; give a plain-text file with some text in it")
    return text.replace("\r\n", "\n").replace("\r", "\n")


def strip_gutenberg_boilerplate(text: str) -> str:
    """The text between Project Gutenberg's ``*** START OF`` and ``*** END OF`` lines, if present."""
    start = _START.search(text)
    if start:
        text = text[start.end() + 1 :]  # + 1: the marker line's own newline
    end = _END.search(text)
    if end:
        text = text[: end.start()]
    return text


def read_corpus(path: str | Path, strip_boilerplate: bool = True) -> str:
    """The cleaned text of a corpus file."""
    try:
        data = Path(path).read_bytes()
    except IsADirectoryError:
        raise CorpusError(f"{path} is a directory; give the path of a plain-text file") from None
    except OSError as exc:
        raise CorpusError(f"cannot read {path}: {exc.strerror}") from None
    text = decode_corpus(data, str(path))
    if strip_boilerplate:
        text = strip_gutenberg_boilerplate(text)
        if not text.strip():
            raise CorpusError(f"{path} has no text between its Project Gutenberg markers; try --keep-boilerplate")
    return text
