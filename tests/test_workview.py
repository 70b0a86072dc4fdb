"""The CLI's progress bar for long work: drawn only on a terminal and for work long enough, and down when done."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from textgen import workview
from textgen.tracking import untracked


def terminal() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=True, width=100), out


def live(console: Console) -> bool:
    """Whether a live display is up on ``console`` (Rich's own record of them)."""
    return bool(console._live_stack)


def test_no_bar_when_the_output_is_not_a_terminal() -> None:
    out = io.StringIO()
    with workview.tracker(Console(file=out, force_terminal=False)) as track:
        assert track is untracked
        track("reading the prompt", 10_000, 20_000)
    assert out.getvalue() == ""


def test_short_work_draws_nothing() -> None:
    console, out = terminal()
    with workview.tracker(console) as track:
        track("reading the prompt", 100, workview.SHOWN_FROM - 1)
    assert out.getvalue() == ""


def test_long_work_draws_a_bar_that_is_down_once_done() -> None:
    console, out = terminal()
    with workview.tracker(console) as track:
        track("reading the prompt", 10_000, 20_000)
        assert live(console), "a live display is up while the work runs"
        track("reading the prompt", 20_000, 20_000)
        assert not live(console), "the display is down once the work is done, before any text is printed"
    drawn = out.getvalue()
    assert "reading the prompt" in drawn and "/20,000 chars" in drawn


def test_two_stages_keep_the_display_until_both_are_done() -> None:
    console, _ = terminal()
    with workview.tracker(console) as track:
        track("tuning", 5_000, 60_000)
        track("scoring", 1_000, 160_000)
        track("tuning", 60_000, 60_000)
        assert live(console)
        track("scoring", 160_000, 160_000)
        assert not live(console)


def test_an_interruption_takes_the_display_down() -> None:
    console, _ = terminal()
    with pytest.raises(KeyboardInterrupt), workview.tracker(console) as track:
        track("reading the prompt", 10_000, 20_000)
        raise KeyboardInterrupt
    assert not live(console)
