"""Background threads that feed one bounded channel, owned and stopped by the consumer.

``buffered``, ``xmap_readers``, ``open_files`` and the double-buffer readers all
have the same shape: some producer threads put items into a bounded queue and
one consumer iterates it. ``ThreadPipeline`` is that shape, done once, with the
guarantees the original lacked:

* an exception in a producer reaches the consumer (the original exception
  object, so its type and traceback survive), after the items put before it;
* every blocking call polls with a timeout and a stop flag, so ``close()``
  stops producers that are blocked on a full queue;
* ``close()`` is idempotent, joins every thread with a bounded wait, and is
  called when iteration ends, breaks, or the generator is garbage-collected.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

POLL_INTERVAL_S = 0.05
THREAD_JOIN_TIMEOUT_S = 5.0


class _Done:
    __slots__ = ()


class _Failure:
    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


_DONE = _Done()


class StopRequested(Exception):
    """Raised inside a producer by ``put`` when the pipeline is closing."""


class ThreadPipeline:
    """Producer threads -> one bounded queue -> the consumer's ``__iter__``.

    ``capacity <= 0`` makes the queue unbounded (the original ``buffered(size=0)``
    meaning). A producer is ``target(pipeline, *args)``; it calls
    ``pipeline.put(item)`` for each item, which raises ``StopRequested`` once the
    consumer has gone away (the producer should simply let it propagate).
    """

    def __init__(self, capacity: int, name: str = "loader") -> None:
        self._queue: queue.Queue[Any] = queue.Queue(capacity if capacity > 0 else 0)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._running = 0
        self._name = name
        self._closed = False

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def spawn(self, target: Callable[..., None], *args: Any) -> None:
        """Start one producer thread; all must be spawned before iterating."""
        thread = threading.Thread(
            target=self._run, args=(target, args), name=f"{self._name}-{len(self._threads)}", daemon=True
        )
        self._threads.append(thread)
        self._running += 1
        thread.start()

    def put(self, item: Any) -> None:
        """Hand one item to the consumer, waiting while the queue is full."""
        while True:
            if self._stop.is_set():
                raise StopRequested
            try:
                self._queue.put(item, timeout=POLL_INTERVAL_S)
                return
            except queue.Full:
                continue

    def _run(self, target: Callable[..., None], args: tuple[Any, ...]) -> None:
        try:
            target(self, *args)
        except StopRequested:
            return
        except StopIteration as exc:
            # Re-raised by get(), a StopIteration would read as the end of the data: the items after it lost
            # without a word (a mapper calling next() on an empty iterator). PEP 479 turns it into this too.
            failure = RuntimeError(
                f"a reader or mapper raised StopIteration (next() on an exhausted iterator?): {exc!r}"
            )
            failure.__cause__ = exc
            self._put_final(_Failure(failure))
            return
        except BaseException as exc:  # every failure must reach the consumer
            self._put_final(_Failure(exc))
            return
        self._put_final(_DONE)

    def _put_final(self, marker: Any) -> None:
        try:
            self.put(marker)
        except StopRequested:
            pass

    def __iter__(self) -> Iterator[Any]:
        try:
            while True:
                try:
                    item = self.get()
                except StopIteration:
                    return
                yield item
        finally:
            self.close()

    def get(self, timeout: float | None = None) -> Any:
        """One item; raises ``StopIteration`` at the end and ``queue.Empty`` on timeout."""
        waited = 0.0
        while self._running > 0:
            try:
                item = self._queue.get(timeout=POLL_INTERVAL_S)
            except queue.Empty:
                waited += POLL_INTERVAL_S
                if timeout is not None and waited >= timeout:
                    raise
                if not any(t.is_alive() for t in self._threads) and self._queue.empty():
                    break
                continue
            if item is _DONE:
                self._running -= 1
            elif isinstance(item, _Failure):
                self.close()
                raise item.exc
            else:
                return item
        raise StopIteration

    def close(self) -> None:
        """Stop every producer and wait (bounded) for their threads to end."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        current = threading.current_thread()
        # A producer stuck inside user code (a source that never returns) cannot be
        # interrupted in Python; after a bounded wait it is left behind as a daemon
        # thread whose output nobody reads, rather than hanging the consumer.
        deadline = time.monotonic() + THREAD_JOIN_TIMEOUT_S
        for thread in self._threads:
            while thread is not current and thread.is_alive() and time.monotonic() < deadline:
                # Keep draining so a producer blocked in put() sees the stop flag quickly.
                self._drain()
                thread.join(timeout=POLL_INTERVAL_S)
        self._drain()

    def _drain(self) -> None:
        try:
            while True:
                self._queue.get_nowait()
        except queue.Empty:
            pass

    def __enter__(self) -> ThreadPipeline:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


__all__ = ["ThreadPipeline", "StopRequested", "POLL_INTERVAL_S", "THREAD_JOIN_TIMEOUT_S"]
