"""``xmap_readers``: map a reader's items with several threads, in order or not.

Shape: ``process_num`` handler threads share one source iterator (taken under a
lock, each item numbered as it is taken), map their item and put the result into
one bounded ``ThreadPipeline``. With ``order=True`` a handler waits on a
``Condition`` for its item's turn before putting it, so output order is input
order without the original's busy-wait.

Failures: an exception in the source or the mapper reaches the consumer as the
original exception object; with ``order=True`` it arrives exactly where the
failed item would have been. Abandoning the iteration stops every thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

from loader.reader._util import Reader, as_count, check_function, check_reader, close_quietly, open_source
from loader.runtime.threads import POLL_INTERVAL_S, StopRequested, ThreadPipeline


class _SharedSource:
    """One source iterator shared by the handlers, plus the ordering turn."""

    def __init__(self, source: Iterator[Any], pipeline: ThreadPipeline) -> None:
        self._source = source
        self._pipeline = pipeline
        self._lock = threading.Lock()
        self._taken = 0  # sequence number of the next item taken from the source
        self._exhausted = False
        self._turn = 0  # sequence number whose result goes out next (order=True)
        self._turn_changed = threading.Condition()
        self.closing = False

    def _check_stop(self) -> None:
        if self.closing or self._pipeline.stopping:
            raise StopRequested

    def take(self) -> tuple[int, Any, BaseException | None] | None:
        """``(seq, item, None)``, ``(seq, None, error)`` when the source failed, or ``None`` at the end."""
        while not self._lock.acquire(timeout=POLL_INTERVAL_S):
            self._check_stop()
        try:
            self._check_stop()
            if self._exhausted:
                return None
            seq = self._taken
            self._taken += 1
            try:
                return seq, next(self._source), None
            except StopIteration:
                self._exhausted = True
                return None
            except Exception as exc:  # handed to the consumer
                self._exhausted = True
                return seq, None, exc
        finally:
            self._lock.release()

    def wait_turn(self, seq: int) -> None:
        """Block (polling the stop flag) until ``seq`` is the next to go out."""
        with self._turn_changed:
            while self._turn != seq:
                self._check_stop()
                self._turn_changed.wait(timeout=POLL_INTERVAL_S)

    def next_turn(self) -> None:
        with self._turn_changed:
            self._turn += 1
            self._turn_changed.notify_all()

    def stop(self) -> None:
        """Wake every waiting handler so it sees the stop promptly."""
        with self._turn_changed:
            self.closing = True
            self._turn_changed.notify_all()


def _handler(pipeline: ThreadPipeline, shared: _SharedSource, mapper: Callable[[Any], Any], order: bool) -> None:
    while True:
        taken = shared.take()
        if taken is None:
            return
        seq, item, error = taken
        if error is None:
            try:
                item = mapper(item)
            except Exception as exc:  # re-raised below, in order
                error = exc
        if order:
            shared.wait_turn(seq)
        if error is not None:
            raise error  # ThreadPipeline hands this very object to the consumer
        pipeline.put(item)
        if order:
            shared.next_turn()


def xmap_readers(
    mapper: Callable[[Any], Any],
    reader: Reader,
    process_num: int,
    buffer_size: int,
    order: bool = False,
) -> Reader:
    """A reader of ``mapper(item)`` for each item of ``reader``, mapped by ``process_num`` threads.

    Despite the name these are threads, as in the original. ``buffer_size``
    bounds the results waiting for the consumer (``<= 0``: unbounded).
    ``order=True`` keeps input order; otherwise results come as they are ready.
    ``process_num < 1`` raises ``ValueError`` here (the original hung).
    """
    check_function(mapper, "xmap_readers: mapper")
    check_reader(reader, "xmap_readers")
    process_num = as_count(process_num, "xmap_readers: process_num")
    buffer_size = as_count(buffer_size, "xmap_readers: buffer_size")
    if process_num < 1:
        raise ValueError(f"xmap_readers needs process_num >= 1, got {process_num}")

    def xmap_reader() -> Iterator[Any]:
        pipeline = ThreadPipeline(buffer_size, name="xmap")
        source = open_source(reader)
        shared = _SharedSource(source, pipeline)
        try:
            for _ in range(process_num):
                pipeline.spawn(_handler, shared, mapper, bool(order))
            yield from pipeline
        finally:
            shared.stop()
            pipeline.close()
            close_quietly(source)

    return xmap_reader


__all__ = ["xmap_readers"]
