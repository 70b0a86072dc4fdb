"""The prompt-state cache alone: its keys at a prompt's checkpoints, the longest prefix found, and its bounds."""

from __future__ import annotations

import numpy as np
import pytest

from textgen import promptcache
from textgen.promptcache import PromptCache, chain, checkpoints, next_checkpoint, prefix_keys


def state(value: float, size: int = 8) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    return np.full(size, value, np.float32), (np.full(size, value, np.float32), np.full(size, -value, np.float32))


def ids(text: str) -> np.ndarray:
    return np.frombuffer(text.encode(), np.uint8).astype(np.int32)


@pytest.fixture(autouse=True)
def every_4(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(promptcache, "EVERY", 4)


def test_checkpoints_are_every_few_characters_and_the_end() -> None:
    assert checkpoints(10) == [4, 8, 10]
    assert checkpoints(8) == [4, 8]
    assert checkpoints(0) == []


def test_a_prefix_has_the_same_key_in_every_prompt_it_starts() -> None:
    short, long = prefix_keys(ids("abcdefgh")), prefix_keys(ids("abcdefghij"))
    assert short == long[:2]
    assert prefix_keys(ids("abcdefgi"))[0] == short[0] and prefix_keys(ids("abcdefgi"))[1] != short[1]
    assert prefix_keys(ids("abcdef"))[-1] != prefix_keys(ids("abcdefgh"))[-1]


def test_the_longest_cached_prefix_is_found_and_counted() -> None:
    cache = PromptCache(8)
    prompt = ids("the quick brown fox")
    assert cache.longest(prompt) is None
    cache.put(prompt[:4], *state(1.0))
    cache.put(prompt[:12], *state(3.0))
    found = cache.longest(ids("the quick brown cat"))
    assert found is not None and found.length == 12 and found.logits[0] == 3.0 and found.states[1][0] == -3.0
    assert cache.longest(ids("the slow fox")) is not None  # its first 4 characters
    assert cache.longest(ids("a different one")) is None
    assert (cache.hits, cache.characters) == (2, 16)


def test_the_least_recently_used_entries_leave_within_the_bounds() -> None:
    one = state(0.0)[0].nbytes * 3  # an entry's bytes: logits and two states
    cache = PromptCache(3, max_bytes=10 * one)
    for word in ("aaaa", "bbbb", "cccc"):
        cache.put(ids(word), *state(1.0))
    assert cache.longest(ids("aaaa")) is not None  # now the most recently used
    cache.put(ids("dddd"), *state(1.0))
    assert len(cache) == 3 and cache.bytes == 3 * one
    assert cache.longest(ids("bbbb")) is None and cache.longest(ids("aaaa")) is not None
    small = PromptCache(100, max_bytes=2 * one)
    for word in ("aaaa", "bbbb", "cccc"):
        small.put(ids(word), *state(1.0))
    assert len(small) == 2 and small.bytes == 2 * one and small.longest(ids("aaaa")) is None


def test_a_stored_state_is_a_copy() -> None:
    cache = PromptCache(4)
    logits, states = state(1.0)
    cache.put(ids("abcd"), logits, states)
    logits[:], states[0][:] = 9.0, 9.0
    found = cache.longest(ids("abcd"))
    assert found is not None and found.logits[0] == 1.0 and found.states[0][0] == 1.0


def test_size_0_keeps_nothing() -> None:
    cache = PromptCache(0)
    cache.put(ids("abcd"), *state(1.0))
    assert not cache.enabled and len(cache) == 0 and cache.longest(ids("abcd")) is None and cache.hits == 0


def test_a_prompt_extending_an_earlier_one_starts_at_its_end() -> None:
    cache = PromptCache(8)
    cache.put(ids("abcdefg"), *state(7.0))  # past the checkpoint at 4
    cache.put(ids("abcdefx"), *state(8.0))  # the same length past the same checkpoint
    found = cache.longest(ids("abcdefgh and on"))
    assert found is not None and found.length == 7 and found.logits[0] == 7.0
    assert cache.longest(ids("abcdefy")) is None
    cache.put(ids("abcd"), *state(4.0))
    assert cache.longest(ids("abcdefy")).length == 4  # type: ignore[union-attr]
    for word in ("11111", "22222", "33333", "44444", "55555", "66666", "77777"):
        cache.put(ids(word), *state(1.0))  # "abcdefx" and "abcdefg" leave, the least recently used
    assert len(cache) == 8 and cache.longest(ids("abcdefgh")).length == 4  # type: ignore[union-attr]
    assert cache._ends.keys() == {v for v in cache._bases.values()}


def test_a_prompt_s_chain_made_once_gives_the_keys_its_prefixes_have() -> None:
    prompt = ids("abcdefghijk")
    links = chain(prompt)
    cache = PromptCache(8)
    for end in (4, 8, 11):
        cache.put(prompt[:end], *state(float(end)), links=links)
    other = PromptCache(8)
    for end in (4, 8, 11):
        other.put(prompt[:end], *state(float(end)))
    assert list(cache._entries) == list(other._entries)
    assert cache.longest(ids("abcdefghijk and on"), chain(ids("abcdefghijk and on"))).length == 11  # type: ignore[union-attr]


def test_a_prompt_leaving_a_cached_one_keeps_its_state_where_they_part(monkeypatch: pytest.MonkeyPatch) -> None:
    """A few-shot preamble of 7 characters, checkpoints every 4: the second prompt that shares it starts at 4 and
    keeps its state at 7, where it leaves the first, so that the prompts after it start there."""
    monkeypatch.setattr(promptcache, "BRANCH_MIN", 2)
    cache = PromptCache(8)
    first = ids("abcdefgone")
    cache.put(first[:4], *state(4.0), after=first[4:])
    entry = cache.longest(ids("abcdefgtwo"))
    assert entry is not None and entry.length == 4 and list(entry.after) == list(first[4:8])  # EVERY ids kept
    assert entry.branch(ids("abcdefgtwo")) == 7
    assert entry.branch(ids("abcdefg")) == 0  # its end: kept anyway
    assert entry.branch(ids("abcdeXgtwo")) == 0  # within BRANCH_MIN of the entry
    assert entry.branch(ids("abcdefgo and on")) == 0  # all EVERY ids kept are shared: up to the next checkpoint
    cache.put(ids("abcdefg"), *state(7.0), after=ids("two"))
    found = cache.longest(ids("abcdefgthree"))
    assert found is not None and found.length == 7 and found.logits[0] == 7.0
    assert found.branch(ids("abcdefgthree")) == 0  # "two" and "three" share one id


def test_the_next_checkpoint_is_a_multiple_of_every_or_the_branch_point_before_it() -> None:
    assert [next_checkpoint(read) for read in (0, 3, 4, 5)] == [4, 4, 8, 8]
    assert [next_checkpoint(read, branch=7) for read in (0, 4, 6, 7, 9)] == [4, 7, 7, 8, 12]


def test_serve_s_prompt_cache_is_0_or_more_entries() -> None:
    from textgen.errors import FieldError
    from textgen.genconfig import ServeConfig

    assert ServeConfig().prompt_cache == promptcache.ENTRIES and ServeConfig(prompt_cache=0).prompt_cache == 0
    with pytest.raises(FieldError, match="--prompt-cache must be 0 or more"):
        ServeConfig(prompt_cache=-1)
