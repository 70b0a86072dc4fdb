"""The emitter: the thread that turns a lane's drawn ids into each request's text, cut at its stop sequences, and
tells its listener; no TensorFlow here."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

import numpy as np

from textgen.rowtable import Event, Finish, Row, Ticket
from textgen.vocab import Vocabulary

log = logging.getLogger(__name__)


class Emitter:
    """The thread that turns the lanes' calls into their requests' events, in order: each row's new ids into text cut
    at its stop sequences (its ``StopScanner``, the emitter's alone), and the last events of rows and of queued
    requests. The engine reaches it through ``drawn``, ``end`` and ``end_queued`` only, each queued to run in order
    (a row's events keep their order) while the lane's next call computes (TensorFlow lets go of the GIL), so that
    the machine is not idle while Python turns ids into events."""

    def __init__(self, vocab: Vocabulary) -> None:
        self.vocab = vocab
        self.work: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="textgen-emitter", daemon=True)
        self.thread.start()

    def drawn(self, rows: list[Row], ids: np.ndarray, reads: np.ndarray, drawn: np.ndarray, last: list[bool]) -> None:
        """A call's ids (B, steps) for ``rows``: each row read ``reads`` of them and drew the ``drawn`` after those;
        the rows of ``last`` have drawn all they were asked for."""
        self.work.put(lambda: self._tell_drawn(rows, ids, reads, drawn, last))

    def end(self, row: Row, reason: Finish) -> None:
        """A row's last event, after the text already posted (none if it has had its last already)."""
        self.work.put(lambda: self._end_row(row, reason))

    def end_queued(self, ticket: Ticket, reason: Finish) -> None:
        """A request that never had rows: every continuation gets its last event."""

        def end() -> None:
            for index in range(ticket.job.rows):
                self._tell(ticket, Event(index, "", reason))

        self.work.put(end)

    def close(self) -> None:
        """Run what was posted, then stop."""
        self.work.put(None)
        self.thread.join()

    def _run(self) -> None:
        while (work := self.work.get()) is not None:
            try:
                work()
            except Exception:  # one request's failure is its own, not the server's
                log.exception("emitting a request's events failed")

    def _tell_drawn(
        self, rows: list[Row], ids: np.ndarray, reads: np.ndarray, drawn: np.ndarray, last: list[bool]
    ) -> None:
        for row, row_ids, n, k, is_last in zip(rows, ids, reads, drawn, last, strict=True):
            if row.ended or not k:
                continue
            text, stopped = row.scanner.push(self.vocab.decode(row_ids[n : n + k]))
            if stopped:
                self._end_row(row, Finish.stop, text)
            elif is_last:
                self._end_row(row, Finish.length, text)
            elif text:
                self._tell(row.ticket, Event(row.index, text))

    def _end_row(self, row: Row, reason: Finish, text: str = "") -> None:
        """A row's last event, its last ``text`` and what its stop scanner held back (nothing after a stop)."""
        if not row.ended:
            row.ended = True
            self._tell(row.ticket, Event(row.index, text + row.scanner.flush(), reason))

    @staticmethod
    def _tell(ticket: Ticket, event: Event) -> None:
        if ticket.cancelled:
            return
        try:
            ticket.listener(event)
        except Exception:  # a listener's failure is its request's problem, not the scheduler's
            log.exception("a request's listener failed")
