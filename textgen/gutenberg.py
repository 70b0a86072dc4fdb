"""Download a Project Gutenberg book by its number, bounded in size and time, written atomically."""

from __future__ import annotations

import http.client
import time
import urllib.error
import urllib.request
from pathlib import Path

from textgen.files import atomic_path

GUTENBERG_URLS = (
    "https://www.gutenberg.org/cache/epub/{n}/pg{n}.txt",
    "https://www.gutenberg.org/files/{n}/{n}-0.txt",
)
GUTENBERG_MAX_BYTES = 64 << 20  # the largest books are about 15 MB; a much bigger answer is not a book
DOWNLOAD_DEADLINE_S = 120.0  # for all the URLs together, so a trickling server cannot stall a run
DOWNLOAD_READ_TIMEOUT_S = 30.0  # for connecting and for each read
DOWNLOAD_CHUNK_BYTES = 1 << 20  # read this much at a time: memory stays bounded


class DownloadFailed(Exception):
    """No URL gave the book; the message says why for each."""


class _FetchError(Exception):
    """Why one URL gave no book, as a short phrase."""


def download_gutenberg(number: int, dest: Path) -> Path:
    """Fetch Project Gutenberg book ``number`` to ``dest``, trying each of ``GUTENBERG_URLS``; ``DownloadFailed``
    saying why each failed.

    All attempts together get ``DOWNLOAD_DEADLINE_S``; a body over ``GUTENBERG_MAX_BYTES``
    or cut short is a failure. Nothing partial is ever left at ``dest``.
    """
    deadline = time.monotonic() + DOWNLOAD_DEADLINE_S
    errors = []
    for template in GUTENBERG_URLS:
        url = template.format(n=number)
        try:
            body = _fetch(url, deadline)
        except _FetchError as exc:
            errors.append(f"{url}: {exc}")
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(dest) as tmp:
            tmp.write_bytes(body)
        return dest
    raise DownloadFailed("; ".join(errors))


def _fetch(url: str, deadline: float) -> bytearray:
    """The body at ``url``, or a _FetchError saying why not."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise _FetchError(f"not tried, the {DOWNLOAD_DEADLINE_S:g} s download deadline had passed")
    try:
        with urllib.request.urlopen(url, timeout=min(DOWNLOAD_READ_TIMEOUT_S, remaining)) as response:
            return _read_body(response, deadline)
    except urllib.error.HTTPError as exc:
        exc.close()  # an HTTPError holds the response open
        raise _FetchError(f"HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
        raise _FetchError(_why(exc)) from None


def _read_body(response: http.client.HTTPResponse, deadline: float) -> bytearray:
    """``response``'s body read in chunks, checking its size and the deadline as it comes."""
    expected = _content_length(response)
    if expected is not None and expected > GUTENBERG_MAX_BYTES:
        raise _FetchError(f"too big: {expected:,} bytes, the limit is {GUTENBERG_MAX_BYTES:,}")
    body = bytearray()
    try:
        # read1, not read: read(n) waits for all n bytes, so a trickle would never reach the deadline check.
        while chunk := response.read1(DOWNLOAD_CHUNK_BYTES):
            body += chunk
            if len(body) > GUTENBERG_MAX_BYTES:
                raise _FetchError(f"too big: over {GUTENBERG_MAX_BYTES:,} bytes")
            if time.monotonic() > deadline:
                raise _FetchError(
                    f"too slow: {len(body):,} bytes in when the {DOWNLOAD_DEADLINE_S:g} s deadline passed"
                )
    except http.client.IncompleteRead:
        raise _FetchError(f"truncated: the connection closed after {len(body):,} bytes") from None
    if expected is not None and len(body) < expected:
        raise _FetchError(f"truncated: got {len(body):,} of {expected:,} bytes")
    return body


def _content_length(response: http.client.HTTPResponse) -> int | None:
    """The announced body size, if the server gave a usable one."""
    try:
        return int(response.headers.get("Content-Length", ""))
    except ValueError:
        return None


def _why(exc: BaseException) -> str:
    """A network failure as a short one-line phrase."""
    if isinstance(exc, urllib.error.URLError):
        reason = exc.reason
        return _why(reason) if isinstance(reason, BaseException) else _one_line(str(reason))
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, http.client.HTTPException):
        return _one_line(f"bad HTTP response ({type(exc).__name__}: {exc})")
    if isinstance(exc, ValueError):
        return _one_line(f"bad URL ({exc})")
    if isinstance(exc, OSError) and exc.strerror:
        return _one_line(exc.strerror)
    return _one_line(str(exc) or type(exc).__name__)


def _one_line(text: str) -> str:
    return " ".join(text.split())
