"""A corpus encoded once, in a streaming pass, into compact id files on disk, read back as memory maps.

An entry holds ``train.ids``, ``val.ids`` and ``test.ids`` (raw uint8 ids when the vocabulary fits in
256, else uint16) and ``meta.json`` (the vocabulary, counts, and each id file's size and checksum). Its name is
a hash of the files' bytes and of everything that changes the ids (cleaning, encodings, ``--max-vocab``, split
fractions, the vocabulary a fine-tuned run extends), so a second run on the same corpus opens it at once, and an edited file gets a new entry.

An entry is verified, not trusted: it is built in a scratch directory, ``meta.json`` last, and renamed into
place, so an entry without ``meta.json`` never finished. Each open checks every id file against ``meta.json``
(size, checksum, no id past the vocabulary); an entry that fails is moved aside and encoded again.

Each file is split contiguously on its own, train first and test last, so every document contributes
to validation and test. In a many-file corpus the documents of a split are joined by
``DOCUMENT_BOUNDARY``, so a stream reads from one book into the next across a character that says so.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import secrets
import shlex
import shutil
import tempfile
import time
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from textgen.corpus import TextScan, kept_chunks, scan_text
from textgen.errors import CorpusError, TextgenWarning
from textgen.files import fsync_path, fsync_tree
from textgen.vocab import DOCUMENT_BOUNDARY, Vocabulary, merge_counts

FORMAT = 2  # bump when the ids an entry holds would change for the same inputs (2: no boundary without text)
SPLIT_NAMES = ("train", "val", "test")
CACHE_DIR_ENV = "TEXTGEN_CACHE_DIR"
STALE_SCRATCH_S = 3600.0  # a scratch directory untouched this long belongs to an encoding that was killed


@dataclass(frozen=True)
class CorpusSource:
    """The files of a corpus and how they are read: everything the ids depend on."""

    files: tuple[Path, ...]
    codecs: tuple[str, ...]  # one per file
    fingerprints: tuple[tuple[int, str], ...]  # (bytes, hash) per file
    strip_boilerplate: bool
    max_vocab: int | None
    val_fraction: float
    test_fraction: float
    base_vocab: str | None = None  # extend this vocabulary (its characters in id order), not the corpus's own

    def key(self) -> str:
        """The cache entry's name."""
        described = {
            "format": FORMAT,
            "files": [
                [size, digest, codec] for (size, digest), codec in zip(self.fingerprints, self.codecs, strict=True)
            ],
            "strip_boilerplate": self.strip_boilerplate,
            "max_vocab": self.max_vocab,
            "fractions": [self.val_fraction, self.test_fraction],
        }
        if self.base_vocab is not None:  # a scratch run on the same text has its own entry, and keeps its old key
            described["base_vocab"] = self.base_vocab
        return hashlib.blake2b(json.dumps(described).encode(), digest_size=16).hexdigest()


@dataclass(frozen=True)
class EncodedCorpus:
    """A cache entry: the vocabulary, the split files, and what ``--max-vocab`` left out."""

    path: Path
    vocab: Vocabulary
    sizes: dict[str, int]  # ids per split
    documents: int
    chars: int  # characters of kept text in all documents
    unknown: int  # of them, how many map to the unknown id (characters --max-vocab dropped)
    unknown_distinct: int

    def ids(self, split: str) -> np.ndarray:
        """The ids of ``split`` as a read-only memory map (nothing is read until it is indexed)."""
        if self.sizes[split] == 0:  # mmap cannot map an empty file
            return np.zeros(0, self.vocab.id_dtype)
        return np.memmap(self.path / f"{split}.ids", dtype=self.vocab.id_dtype, mode="r", shape=(self.sizes[split],))


def cache_root(checkpoint_dir: Path) -> Path:
    """Where encoded corpora are kept: $TEXTGEN_CACHE_DIR, else ``.cache`` in the checkpoint directory."""
    return Path(os.environ.get(CACHE_DIR_ENV) or Path(checkpoint_dir) / ".cache")


def split_sizes(n: int, val_fraction: float, test_fraction: float) -> tuple[int, int, int]:
    """(train, val, test) sizes of one document of ``n`` characters: contiguous, train first."""
    n_val, n_test = int(n * val_fraction), int(n * test_fraction)
    return n - n_val - n_test, n_val, n_test


def encoded_corpus(source: CorpusSource, root: Path) -> EncodedCorpus:
    """The cache entry for ``source`` under ``root``, checked; encoded now if there is none, or if it is unusable
    (an encoding that never finished, a partial copy, a damaged or hand-edited file)."""
    entry = root / source.key()
    if os.path.lexists(entry):
        try:
            return _open(entry)
        except _Unusable as exc:
            _discard(entry, str(exc))
            unusable = f"the encoded corpus in {entry} was unusable ({exc}): encoding it again"
            warnings.warn(TextgenWarning(unusable), stacklevel=2)
    try:
        _encode(source, entry)
    except OSError as exc:
        space = "free some space there, or " if exc.errno in (errno.ENOSPC, errno.EDQUOT) else ""
        raise CorpusError(
            f"cannot write the encoded corpus to {root}: {exc.strerror or exc}; {space}choose another place "
            f"with ${CACHE_DIR_ENV}"
        ) from None
    try:
        return _open(entry)
    except _Unusable as exc:  # written and synced a moment ago: the storage does not keep what it is given
        raise CorpusError(
            f"the encoded corpus in {entry} is damaged right after encoding it ({exc}); check that disk, or "
            f"choose another place with ${CACHE_DIR_ENV}"
        ) from None


class _Unusable(Exception):
    """Why a cache entry cannot be used: it is incomplete or damaged (naming the file)."""


CHECK_CHUNK_BYTES = 1 << 20  # id files are checked this much at a time: memory stays bounded


def _open(entry: Path) -> EncodedCorpus:
    """The entry in ``entry``, checked against its ``meta.json``: every id file's size, checksum (entries made
    before checksums have none) and largest id. ``_Unusable`` if it fails; a read that fails is a CorpusError."""
    try:
        meta = json.loads((entry / "meta.json").read_bytes())
    except (FileNotFoundError, NotADirectoryError):
        raise _Unusable("it has no meta.json: its encoding never finished") from None
    except (ValueError, RecursionError):
        raise _Unusable("its meta.json is not valid JSON") from None
    except OSError as exc:
        raise _unreadable(entry, exc) from None
    try:
        if not isinstance(meta["vocab"], str):
            raise TypeError("vocab")
        corpus = EncodedCorpus(
            entry,
            Vocabulary(tuple(meta["vocab"])),
            {name: int(meta["sizes"][name]) for name in SPLIT_NAMES},
            int(meta["documents"]),
            int(meta["chars"]),
            int(meta["unknown"]),
            int(meta["unknown_distinct"]),
        )
        digests = {name: str(meta["digests"][name]) for name in SPLIT_NAMES} if "digests" in meta else None
    except KeyError as exc:
        raise _Unusable(f"its meta.json has no {exc}") from None
    except (TypeError, ValueError, OverflowError):
        raise _Unusable("its meta.json holds a value of the wrong type") from None
    dtype = np.dtype(corpus.vocab.id_dtype)
    for name in SPLIT_NAMES:
        try:
            size = (entry / f"{name}.ids").stat().st_size
        except FileNotFoundError:
            raise _Unusable(f"{name}.ids is missing") from None
        except OSError as exc:
            raise _unreadable(entry, exc) from None
        if size != corpus.sizes[name] * dtype.itemsize:
            raise _Unusable(f"{name}.ids has {size:,} bytes, not {corpus.sizes[name] * dtype.itemsize:,}")
    for name in SPLIT_NAMES:
        try:
            digest, top = _digest_and_top(entry / f"{name}.ids", dtype)
        except OSError as exc:
            raise _unreadable(entry, exc) from None
        if digests is not None and digest != digests[name]:
            raise _Unusable(f"{name}.ids does not match its checksum")
        if top >= corpus.vocab.size:
            raise _Unusable(f"{name}.ids holds id {top}, beyond the vocabulary's {corpus.vocab.size} ids")
    return corpus


def _digest_and_top(path: Path, dtype: np.dtype) -> tuple[str, int]:
    """The checksum of the id file ``path`` and its largest id, read a chunk at a time. (Checking War and Peace's
    3.2 MB of ids takes 5-6 ms on 2 busy cores, nearly all of it the checksum; the largest id alone, 0.2 ms.)"""
    digest, top = hashlib.blake2b(digest_size=16), 0
    with open(path, "rb") as fh:
        while chunk := fh.read(CHECK_CHUNK_BYTES):
            digest.update(chunk)
            top = max(top, int(np.frombuffer(chunk, dtype, count=len(chunk) // dtype.itemsize).max(initial=0)))
    return digest.hexdigest(), top


def _unreadable(entry: Path, exc: OSError) -> CorpusError:
    return CorpusError(
        f"cannot read the encoded corpus {exc.filename or entry}: {exc.strerror or exc}; choose another place "
        f"with ${CACHE_DIR_ENV}"
    )


def _discard(entry: Path, why: str) -> None:
    """Move the unusable ``entry`` aside, where it is removed (by a later encoding, if not now): renamed, so no
    process ever opens it half-removed."""
    aside = entry.parent / f".tmp-{entry.name}-{secrets.token_hex(4)}"
    try:
        os.rename(entry, aside)
    except FileNotFoundError:  # another process moved it first
        return
    except OSError as exc:
        raise CorpusError(
            f"the encoded corpus in {entry} is unusable ({why}) and cannot be removed ({exc.strerror or exc}); "
            f"remove it with: rm -r {shlex.quote(str(entry))}"
        ) from None
    shutil.rmtree(aside, ignore_errors=True)


def _encode(source: CorpusSource, entry: Path) -> None:
    """Encode ``source`` into ``entry``: count characters (one streaming pass per file), choose the
    vocabulary, encode and write the splits (a second pass). Built in a scratch directory and renamed into
    place, so a killed encoding leaves no entry and two processes encoding at once both end with one."""
    scans = [scan_text(f, c, source.strip_boilerplate) for f, c in zip(source.files, source.codecs, strict=True)]
    codes, counts = merge_counts([(s.codes, s.counts) for s in scans])
    many = len(scans) > 1
    if source.base_vocab is not None:
        vocab = Vocabulary(tuple(source.base_vocab)).extending(codes, counts, source.max_vocab, boundary=many)
    else:
        vocab = Vocabulary.from_counts(codes, counts, source.max_vocab, boundary=many)
    known = np.isin(codes, np.array([ord(c) for c in vocab.chars], dtype=np.uint32))
    entry.parent.mkdir(parents=True, exist_ok=True)
    for stale in entry.parent.glob(f".tmp-{entry.name}-*"):  # left by a killed encoding (or one running now,
        with contextlib.suppress(FileNotFoundError):  # which touches it after every chunk: see _write_splits)
            if time.time() - stale.stat().st_mtime > STALE_SCRATCH_S:
                shutil.rmtree(stale, ignore_errors=True)
    # A unique name, also between machines sharing the cache (their process ids may be equal).
    scratch = Path(tempfile.mkdtemp(prefix=f".tmp-{entry.name}-", dir=entry.parent))
    try:
        sizes, digests = _write_splits(source, scans, vocab, scratch)
        meta = {
            "format": FORMAT,
            "vocab": "".join(vocab.chars),
            "sizes": sizes,
            "digests": digests,
            "documents": len(scans),
            "chars": int(counts.sum()),
            "unknown": int(counts[~known].sum()),
            "unknown_distinct": int((~known).sum()),
            "files": [str(f) for f in source.files],
        }
        (scratch / "meta.json").write_text(json.dumps(meta, ensure_ascii=False), encoding="utf-8")  # the commit
        fsync_tree(scratch)
        try:
            os.rename(scratch, entry)
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):  # not another process's entry (checked on open)
                raise
        fsync_path(entry.parent)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _write_splits(
    source: CorpusSource, scans: list[TextScan], vocab: Vocabulary, out: Path
) -> tuple[dict[str, int], dict[str, str]]:
    """Encode every document's kept text and append its train, val and test parts to the split files; their sizes
    (in ids) and checksums."""
    boundary = vocab.encode_compact(DOCUMENT_BOUNDARY)
    sizes = dict.fromkeys(SPLIT_NAMES, 0)
    digests = {name: hashlib.blake2b(digest_size=16) for name in SPLIT_NAMES}
    handles = {name: open(out / f"{name}.ids", "wb") for name in SPLIT_NAMES}  # noqa: SIM115 (closed below)
    try:
        for path, codec, scan in zip(source.files, source.codecs, scans, strict=True):
            limits = np.cumsum(split_sizes(scan.chars, source.val_fraction, source.test_fraction))
            begun: set[str] = set()  # the splits this document has text in so far
            for name, ids in _route(kept_chunks(path, codec, scan), vocab, limits):
                # A boundary between two documents' text in a split (a document too short for a split adds none:
                # 1,000 files of 15 characters made a validation split of boundaries alone).
                if name not in begun and sizes[name]:
                    ids = np.concatenate([boundary, ids])
                begun.add(name)
                data = ids.tobytes()
                handles[name].write(data)
                digests[name].update(data)
                sizes[name] += len(ids)
                os.utime(out)  # alive: another process must not take this for a killed encoding's scratch
        for handle in handles.values():
            handle.flush()
            os.fsync(handle.fileno())
    finally:
        for handle in handles.values():
            handle.close()
    return sizes, {name: digest.hexdigest() for name, digest in digests.items()}


def _route(chunks: Iterable[str], vocab: Vocabulary, limits: np.ndarray) -> Iterable[tuple[str, np.ndarray]]:
    """Each chunk's ids cut at the split ``limits`` (cumulative train, val, test ends) into named parts."""
    position = 0
    for chunk in chunks:
        ids = vocab.encode_compact(chunk)
        begin = position
        for name, limit, start in zip(SPLIT_NAMES, limits, (0, *limits[:-1]), strict=True):
            a, b = max(start, begin) - begin, min(limit, begin + len(ids)) - begin
            if a < b:
                yield name, ids[a:b]
        position += len(ids)
