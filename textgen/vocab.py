"""Characters <-> integer ids, vectorised with numpy. Id 0 is the unknown character."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field

import numpy as np

UNKNOWN_ID = 0
UNKNOWN_CHAR = "\ufffd"  # how an unknown id is shown when decoding


DOCUMENT_BOUNDARY = "\x1c"  # U+001C, the file separator: put between the documents of a many-file corpus


def for_display(text: str) -> str:
    """Generated text for a terminal: a document boundary shown as a blank line, where a new text begins."""
    return text.replace(DOCUMENT_BOUNDARY, "\n\n")


def _codepoints(text: str) -> np.ndarray:
    if text.isascii():  # O(1) to ask; a copy a quarter the size
        return np.frombuffer(text.encode("ascii"), dtype=np.uint8)
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)


def char_counts(text: str) -> tuple[np.ndarray, np.ndarray]:
    """The distinct code points of ``text``, ascending, and how often each occurs."""
    counts = np.bincount(_codepoints(text))
    codes = np.flatnonzero(counts)
    return codes.astype(np.uint32), counts[codes]


def merge_counts(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """``char_counts`` of several texts added up, as if of one."""
    if not parts:
        return np.zeros(0, np.uint32), np.zeros(0, np.int64)
    codes, where = np.unique(np.concatenate([c for c, _ in parts]), return_inverse=True)
    counts = np.zeros(len(codes), np.int64)
    np.add.at(counts, where, np.concatenate([n for _, n in parts]))
    return codes.astype(np.uint32), counts


@dataclass(frozen=True)
class Vocabulary:
    """A character set; character ``chars[i]`` has id ``i + 1``. A run's own vocabulary is in code point order; a
    fine-tuned run's keeps its base's ids and appends the characters only its text has (``extending``)."""

    chars: tuple[str, ...]
    # Lookup tables derived from chars in __post_init__.
    _decode_table: np.ndarray = field(init=False, repr=False, compare=False)
    _encode_table: np.ndarray = field(init=False, repr=False, compare=False)

    @classmethod
    def from_text(cls, text: str) -> Vocabulary:
        """The vocabulary of every distinct character in ``text``, in code point order."""
        return cls.from_counts(*char_counts(text))

    @classmethod
    def from_counts(
        cls, codes: np.ndarray, counts: np.ndarray, max_chars: int | None = None, boundary: bool = False
    ) -> Vocabulary:
        """The ``max_chars`` most frequent characters (all without it; ties go to the lower code point), plus
        ``DOCUMENT_BOUNDARY`` with ``boundary``, in code point order."""
        order = np.lexsort((codes, -np.asarray(counts, np.int64)))  # by count, descending, then by code
        kept = codes[order[:max_chars]] if max_chars is not None else codes
        chars = {chr(c) for c in kept} | ({DOCUMENT_BOUNDARY} if boundary else set())
        return cls(tuple(sorted(chars)))

    def extending(
        self, codes: np.ndarray, counts: np.ndarray, max_chars: int | None = None, boundary: bool = False
    ) -> Vocabulary:
        """This vocabulary with every id kept, and the characters of ``codes`` it lacks appended in code point order:
        the most frequent of them while the whole holds at most ``max_chars`` characters (all without it), plus
        ``DOCUMENT_BOUNDARY`` with ``boundary``. Renumbering would scramble what the base run learned."""
        known = set(self.chars)
        new = np.array([c not in known for c in map(chr, codes)], dtype=bool)
        codes, counts = np.asarray(codes)[new], np.asarray(counts)[new]
        room = None if max_chars is None else max(0, max_chars - len(self.chars))
        order = np.lexsort((codes, -np.asarray(counts, np.int64)))
        added = {chr(c) for c in (codes[order[:room]] if room is not None else codes)}
        if boundary and DOCUMENT_BOUNDARY not in known:
            added.add(DOCUMENT_BOUNDARY)
        return Vocabulary(self.chars + tuple(sorted(added)))

    def __post_init__(self) -> None:
        self_codes = np.array([ord(c) for c in self.chars], dtype=np.uint32)
        decode_table = np.concatenate([[ord(UNKNOWN_CHAR)], self_codes]).astype(np.uint32)
        object.__setattr__(self, "_decode_table", decode_table)
        # A dense code point -> id table over all of Unicode (1.1 MB of uint8 ids), so encoding is one lookup
        # with no bounds check: 0, the unknown id, wherever the vocabulary has no character.
        encode_table = np.zeros(sys.maxunicode + 1, dtype=self.id_dtype)
        encode_table[self_codes] = np.arange(1, len(self_codes) + 1)
        object.__setattr__(self, "_encode_table", encode_table)

    @property
    def size(self) -> int:
        """Number of ids, the unknown id included."""
        return len(self.chars) + 1

    def encode(self, text: str) -> np.ndarray:
        """Ids (int32) for ``text``; characters outside the vocabulary get ``UNKNOWN_ID``."""
        return self.encode_compact(text).astype(np.int32)

    def encode_known(self, text: str) -> np.ndarray:
        """``encode`` without the characters outside the vocabulary: how a prompt is read (``unknown_chars`` names
        what it leaves out)."""
        ids = self.encode(text)
        return ids[ids != UNKNOWN_ID]

    @property
    def id_dtype(self) -> type[np.unsignedinteger]:
        """The smallest unsigned integer type that holds every id: uint8 up to 256 ids, else uint16 (uint32
        past 65,536)."""
        return np.uint8 if self.size <= 2**8 else np.uint16 if self.size <= 2**16 else np.uint32

    def encode_compact(self, text: str) -> np.ndarray:
        """``encode`` in ``id_dtype``, a byte a character for most corpora."""
        return self._encode_table[_codepoints(text)]

    def decode(self, ids: np.ndarray | list[int]) -> str:
        """Text for ``ids``; the unknown id decodes to U+FFFD."""
        codes = self._decode_table[np.asarray(ids, dtype=np.int64)]
        return codes.astype("<u4").tobytes().decode("utf-32-le", "surrogatepass")

    def unknown_chars(self, text: str) -> list[str]:
        """The distinct characters of ``text`` that are not in the vocabulary, sorted."""
        codes = _codepoints(text)
        return [chr(c) for c in np.unique(codes[self._encode_table[codes] == UNKNOWN_ID])]

    def unknown_note(self, prompt: str) -> str | None:
        """What the sampler skips of ``prompt`` (characters the model has never seen), or None."""
        unknown = self.unknown_chars(prompt)
        return f"skipping characters the model has never seen: {' '.join(map(repr, unknown))}" if unknown else None

    def to_json(self) -> str:
        return json.dumps({"chars": "".join(self.chars)}, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> Vocabulary:
        chars = json.loads(text)["chars"]
        if not isinstance(chars, str):
            raise ValueError("'chars' must be a string")
        return cls(tuple(chars))
