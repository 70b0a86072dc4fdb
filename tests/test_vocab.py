"""textgen.vocab.Vocabulary: characters <-> int32 ids, id 0 for unknown characters."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from textgen.vocab import UNKNOWN_CHAR, UNKNOWN_ID, Vocabulary


@given(st.text())
def test_round_trip_for_arbitrary_text(text: str) -> None:
    vocab = Vocabulary.from_text(text)
    ids = vocab.encode(text)
    assert ids.shape == (len(text),)
    assert vocab.decode(ids) == text
    assert vocab.decode(ids.tolist()) == text


@given(st.text())
def test_ids_are_int32_in_range_and_known_chars_are_never_unknown(text: str) -> None:
    vocab = Vocabulary.from_text(text)
    ids = vocab.encode(text)
    assert ids.dtype == np.int32
    assert vocab.size == len(set(text)) + 1
    if text:
        assert ids.min() >= 1  # every character of the text is in its own vocabulary
        assert ids.max() < vocab.size
    assert vocab.unknown_chars(text) == []


@given(st.text(min_size=1).flatmap(lambda t: st.tuples(st.just(t), st.permutations(list(t)))))
def test_order_does_not_depend_on_the_text_order(pair: tuple[str, list[str]]) -> None:
    text, permuted = pair
    a, b = Vocabulary.from_text(text), Vocabulary.from_text("".join(permuted))
    assert a == b
    assert a.chars == tuple(sorted(set(text)))  # code point order
    np.testing.assert_array_equal(a.encode(text), b.encode(text))


def test_ids_follow_code_point_order() -> None:
    vocab = Vocabulary.from_text("cab\n")
    assert vocab.chars == ("\n", "a", "b", "c")
    assert vocab.encode("abc\n").tolist() == [2, 3, 4, 1]
    assert vocab.size == 5


@given(st.text(), st.text())
def test_unknown_chars_map_to_id_0_and_decode_to_replacement(known: str, other: str) -> None:
    vocab = Vocabulary.from_text(known)
    ids = vocab.encode(other)
    assert ids.dtype == np.int32
    for char, i in zip(other, ids.tolist(), strict=True):
        assert (i == UNKNOWN_ID) == (char not in known)
    assert vocab.unknown_chars(other) == sorted(set(other) - set(known))
    assert vocab.decode(ids) == "".join(c if c in known else UNKNOWN_CHAR for c in other)


def test_unknown_chars_below_and_above_the_largest_known_code_point() -> None:
    vocab = Vocabulary.from_text("ace")
    # "b" and "d" are inside the encode table, "z" and the emoji are past its end
    assert vocab.encode("abcdez\U0001f600").tolist() == [1, 0, 2, 0, 3, 0, 0]
    assert vocab.unknown_chars("zbdb\U0001f600a") == ["b", "d", "z", "\U0001f600"]
    assert vocab.decode([0, 1, 2]) == "\ufffdac"


def test_empty_vocabulary_encodes_everything_as_unknown() -> None:
    vocab = Vocabulary.from_text("")
    assert vocab.size == 1
    assert vocab.encode("").tolist() == []
    assert vocab.encode("xy").tolist() == [0, 0]
    assert vocab.decode([]) == ""


@given(st.text())
def test_json_round_trip(text: str) -> None:
    vocab = Vocabulary.from_text(text)
    again = Vocabulary.from_json(vocab.to_json())
    assert again == vocab
    np.testing.assert_array_equal(again.encode(text), vocab.encode(text))
    assert json.loads(vocab.to_json()) == {"chars": "".join(sorted(set(text)))}


@pytest.mark.parametrize("bad", ['{"chars": ["a", "b"]}', '{"chars": 3}', '{"chars": null}'])
def test_from_json_rejects_non_string_chars(bad: str) -> None:
    with pytest.raises(ValueError, match="chars"):
        Vocabulary.from_json(bad)


def test_a_document_boundary_is_shown_as_a_blank_line() -> None:
    from textgen.vocab import DOCUMENT_BOUNDARY, for_display

    assert for_display(f"the end.{DOCUMENT_BOUNDARY}Chapter 1") == "the end.\n\nChapter 1"
    assert for_display("no boundary") == "no boundary"


@given(st.text(), st.text())
def test_encode_known_leaves_out_what_the_vocabulary_lacks_and_keeps_the_rest_in_order(
    corpus: str, prompt: str
) -> None:
    vocab = Vocabulary.from_text(corpus)
    known = vocab.encode_known(prompt)
    assert known.dtype == np.int32 and UNKNOWN_ID not in known
    assert vocab.decode(known) == "".join(c for c in prompt if c not in vocab.unknown_chars(prompt))
