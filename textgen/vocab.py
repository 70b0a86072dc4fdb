"""Characters <-> integer ids, vectorised with numpy. Id 0 is the unknown character."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

UNKNOWN_ID = 0
UNKNOWN_CHAR = "\ufffd"  # how an unknown id is shown when decoding


def _codepoints(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)


@dataclass(frozen=True)
class Vocabulary:
    """A sorted character set; character ``chars[i]`` has id ``i + 1``."""

    chars: tuple[str, ...]
    # Lookup tables derived from chars in __post_init__.
    _codes: np.ndarray = field(init=False, repr=False, compare=False)
    _decode_table: np.ndarray = field(init=False, repr=False, compare=False)
    _encode_table: np.ndarray = field(init=False, repr=False, compare=False)

    @classmethod
    def from_text(cls, text: str) -> Vocabulary:
        """The vocabulary of every distinct character in ``text``, in code point order."""
        codes = np.unique(_codepoints(text))
        return cls(tuple(chr(c) for c in codes))

    def __post_init__(self) -> None:
        self_codes = np.array([ord(c) for c in self.chars], dtype=np.uint32)
        object.__setattr__(self, "_codes", self_codes)
        decode_table = np.concatenate([[ord(UNKNOWN_CHAR)], self_codes]).astype(np.uint32)
        object.__setattr__(self, "_decode_table", decode_table)
        # A dense code point -> id table; its last slot (one past the largest code) is unknown.
        encode_table = np.zeros(int(self_codes.max(initial=0)) + 2, dtype=np.int32)
        encode_table[self_codes] = np.arange(1, len(self_codes) + 1, dtype=np.int32)
        object.__setattr__(self, "_encode_table", encode_table)

    @property
    def size(self) -> int:
        """Number of ids, the unknown id included."""
        return len(self.chars) + 1

    def encode(self, text: str) -> np.ndarray:
        """Ids (int32) for ``text``; characters outside the vocabulary get ``UNKNOWN_ID``."""
        table = self._encode_table
        return table[np.minimum(_codepoints(text), len(table) - 1)]

    def decode(self, ids: np.ndarray | list[int]) -> str:
        """Text for ``ids``; the unknown id decodes to U+FFFD."""
        codes = self._decode_table[np.asarray(ids, dtype=np.int64)]
        return codes.astype("<u4").tobytes().decode("utf-32-le", "surrogatepass")

    def unknown_chars(self, text: str) -> list[str]:
        """The distinct characters of ``text`` that are not in the vocabulary, sorted."""
        codes = np.unique(_codepoints(text))
        missing = ~np.isin(codes, self._codes)
        return [chr(c) for c in codes[missing]]

    def to_json(self) -> str:
        return json.dumps({"chars": "".join(self.chars)}, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> Vocabulary:
        chars = json.loads(text)["chars"]
        if not isinstance(chars, str):
            raise ValueError("'chars' must be a string")
        return cls(tuple(chars))
