"""The CLI's progress bar for long work other than training (a long prompt read, dynamic evaluation): a
``textgen.tracking.Track`` that shows a bar on a terminal, with characters done, characters a second and the time
left, and nothing when the output is not a terminal or the work is short."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from rich.console import Console
from rich.progress import BarColumn, Progress, ProgressColumn, Task, TaskID, TextColumn, TimeRemainingColumn
from rich.text import Text

from textgen.tracking import Track, untracked

# Work of fewer characters than this gets no bar: it is done in about a second (a prompt is read at about 5,000
# characters a second at batch 1 by base:en on 2 cores; dynamic evaluation goes at about 1,500 to 5,000).
SHOWN_FROM = 5_000


class _Rate(ProgressColumn):
    """Characters a second, once Rich has measured it."""

    def render(self, task: Task) -> Text:
        return Text("" if task.speed is None else f"{task.speed:,.0f} chars/s")


class _Bars:
    """One bar per piece of work while it runs; the display is up only while some bar is unfinished, so that text
    printed after the work (a sample streaming in) is not drawn over."""

    def __init__(self, console: Console) -> None:
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(bar_width=30),
            TextColumn("{task.completed:,.0f}/{task.total:,.0f} chars"),
            _Rate(),
            TimeRemainingColumn(),
            console=console,
            transient=True,
        )
        self.tasks: dict[str, TaskID] = {}
        self.running = False

    def track(self, what: str, done: int, total: int) -> None:
        if total < SHOWN_FROM:
            return
        if what not in self.tasks:
            self.tasks[what] = self.progress.add_task(what, total=total)
            if not self.running:
                self.progress.start()
                self.running = True
        task = self.tasks[what]
        self.progress.update(task, completed=done)
        if done >= total:
            self.progress.remove_task(task)
            del self.tasks[what]
            if not self.tasks:
                self.stop()

    def stop(self) -> None:
        if self.running:
            self.progress.stop()
            self.running = False


@contextlib.contextmanager
def tracker(console: Console) -> Iterator[Track]:
    """A ``Track`` for the work done inside the block: bars on ``console`` if it is a terminal, else silence."""
    if not console.is_terminal:
        yield untracked
        return
    bars = _Bars(console)
    try:
        yield bars.track
    finally:
        bars.stop()
