"""Stop sequences in a stream of text: what may be sent so far, and where a stop sequence ends it."""

from __future__ import annotations

import re

# Characters of a row's held-back tail checked as the possible start of a stop sequence, per push: text made of a
# stop's first character over and over ("aaaa" against a stop "abab") would otherwise cost a check per character.
HOLD_CHECKS = 4


class StopScanner:
    """Cuts a stream of text before the first of ``stops`` to be completed (of two completed by the same character,
    the one that began first) and holds back a tail that may begin one, so the pieces it lets out join into exactly
    the text a whole response holds, wherever the stream's pieces split. (The first to begin would depend on the
    split: "ac" then "a" completes "c" before "aca" is known.)

    A push costs time linear in its text plus the longest stop sequence, however long the stream has run: the tail
    held back is shorter than the longest stop, and of its characters that begin a stop sequence at most
    ``HOLD_CHECKS`` are checked one by one; from the next one on, the tail is held unchecked (held too long, text is
    late by up to a stop's length, never wrong)."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = tuple(s for s in stops if s)
        self.reach = max((len(s) for s in self.stops), default=1) - 1  # the longest tail that may begin one
        self.firsts = re.compile("|".join(re.escape(c) for c in {s[0] for s in self.stops}) or "(?!)")
        self.held = ""

    def push(self, text: str) -> tuple[str, bool]:
        """What may be sent of the text so far, and whether a stop sequence ended it."""
        if not self.stops:
            return text, False
        buffer = self.held + text
        found = [(start + len(s), start) for s in self.stops if (start := buffer.find(s)) >= 0]  # (end, start)
        if found:
            self.held = ""
            return buffer[: min(found)[1]], True
        cut = len(buffer) - self._unsure(buffer[max(0, len(buffer) - self.reach) :])
        self.held = buffer[cut:]
        return buffer[:cut], False

    def _unsure(self, tail: str) -> int:
        """How many of ``tail``'s last characters may begin a stop sequence."""
        begins = self.firsts.search(tail)
        for _ in range(HOLD_CHECKS):
            if begins is None:
                return 0
            rest = tail[begins.start() :]
            if any(s.startswith(rest) for s in self.stops):
                break
            begins = self.firsts.search(tail, begins.start() + 1)
        return 0 if begins is None else len(tail) - begins.start()

    def flush(self) -> str:
        """The held-back tail, at the end of the stream (no stop sequence followed it)."""
        text, self.held = self.held, ""
        return text
