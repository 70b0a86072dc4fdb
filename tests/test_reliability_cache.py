"""Patterns and directories cannot explode (issue 42, category 4): glob patterns with ``**`` finish under links back
up, to siblings and to nowhere.
"""

from __future__ import annotations

import contextlib
import glob
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import write_corpus

from textgen.corpus import resolve_corpora
from textgen.errors import CorpusError

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
