"""A corpus encoded once, in a streaming pass, into compact id files on disk, read back as memory maps.

An entry holds ``train.ids``, ``val.ids`` and ``test.ids`` (raw uint8 ids when the vocabulary fits in
256, else uint16) and ``meta.json`` (the vocabulary and counts). Its name is a hash of the files' bytes
and of everything that changes the ids (cleaning, encodings, ``--max-vocab``, split fractions), so a
second run on the same corpus opens it at once, and an edited file gets a new entry.

Each file is split contiguously on its own, train first and test last, so every document contributes
to validation and test. In a many-file corpus the documents of a split are joined by
``DOCUMENT_BOUNDARY``, so a stream reads from one book into the next across a character that says so.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from textgen.corpus import TextScan, kept_chunks, scan_text
from textgen.errors import CorpusError
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
    """The cache entry for ``source`` under ``root``, encoded now if there is none."""
    entry = root / source.key()
    if not (entry / "meta.json").is_file():
        try:
            _encode(source, entry)
        except OSError as exc:
            raise CorpusError(
                f"cannot write the encoded corpus to {root}: {exc.strerror or exc}; free some space there, "
                f"or choose another place with ${CACHE_DIR_ENV}"
            ) from None
    try:
        meta = json.loads((entry / "meta.json").read_text(encoding="utf-8"))
        corpus = EncodedCorpus(
            entry,
            Vocabulary(tuple(meta["vocab"])),
            {name: int(meta["sizes"][name]) for name in SPLIT_NAMES},
            int(meta["documents"]),
            int(meta["chars"]),
            int(meta["unknown"]),
            int(meta["unknown_distinct"]),
        )
        itemsize = np.dtype(corpus.vocab.id_dtype).itemsize
        if any((entry / f"{n}.ids").stat().st_size != corpus.sizes[n] * itemsize for n in SPLIT_NAMES):
            raise ValueError("an id file has the wrong size")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CorpusError(
            f"the encoded corpus in {entry} is damaged ({exc}); delete that directory and it is encoded again"
        ) from None
    return corpus


def _encode(source: CorpusSource, entry: Path) -> None:
    """Encode ``source`` into ``entry``: count characters (one streaming pass per file), choose the
    vocabulary, encode and write the splits (a second pass). Built in a scratch directory and renamed into
    place, so a killed encoding leaves no entry and two processes encoding at once both end with one."""
    scans = [scan_text(f, c, source.strip_boilerplate) for f, c in zip(source.files, source.codecs, strict=True)]
    codes, counts = merge_counts([(s.codes, s.counts) for s in scans])
    many = len(scans) > 1
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
        sizes = _write_splits(source, scans, vocab, scratch)
        meta = {
            "format": FORMAT,
            "vocab": "".join(vocab.chars),
            "sizes": sizes,
            "documents": len(scans),
            "chars": int(counts.sum()),
            "unknown": int(counts[~known].sum()),
            "unknown_distinct": int((~known).sum()),
            "files": [str(f) for f in source.files],
        }
        (scratch / "meta.json").write_text(json.dumps(meta, ensure_ascii=False), encoding="utf-8")
        fsync_tree(scratch)
        try:
            os.rename(scratch, entry)
        except OSError:
            if not (entry / "meta.json").is_file():  # not another process's finished entry: a real failure
                raise
        fsync_path(entry.parent)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _write_splits(source: CorpusSource, scans: list[TextScan], vocab: Vocabulary, out: Path) -> dict[str, int]:
    """Encode every document's kept text and append its train, val and test parts to the split files."""
    boundary = vocab.encode_compact(DOCUMENT_BOUNDARY)
    sizes = dict.fromkeys(SPLIT_NAMES, 0)
    handles = {name: open(out / f"{name}.ids", "wb") for name in SPLIT_NAMES}  # noqa: SIM115 (closed below)
    try:
        for path, codec, scan in zip(source.files, source.codecs, scans, strict=True):
            limits = np.cumsum(split_sizes(scan.chars, source.val_fraction, source.test_fraction))
            begun: set[str] = set()  # the splits this document has text in so far
            for name, ids in _route(kept_chunks(path, codec, scan), vocab, limits):
                # A boundary between two documents' text in a split (a document too short for a split adds none:
                # 1,000 files of 15 characters made a validation split of boundaries alone).
                if name not in begun and sizes[name]:
                    handles[name].write(boundary.tobytes())
                    sizes[name] += 1
                begun.add(name)
                handles[name].write(ids.tobytes())
                sizes[name] += len(ids)
                os.utime(out)  # alive: another process must not take this for a killed encoding's scratch
        for handle in handles.values():
            handle.flush()
            os.fsync(handle.fileno())
    finally:
        for handle in handles.values():
            handle.close()
    return sizes


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
