"""``Prefetcher``: the background-thread part shared by ``open_files`` and ``DoubleBufferReader``.

Both readers pull items from producer threads through one bounded
``ThreadPipeline``. ``Prefetcher`` starts that pipeline at the first ``next()``
(not at construction, so an unused reader costs no thread), remembers the end of
the data and a failure (later reads raise it again until ``reset()``, as a file
would), and stops the threads at the end, on failure, in ``reset()``, in
``stop()`` and when it is garbage-collected. The threads must not hold a
reference to the reader that owns the prefetcher, so that dropping the reader
drops the prefetcher and stops them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from loader.runtime.threads import ThreadPipeline

#: Returned by ``Prefetcher.next`` at the end of the data (items may be any object).
END = object()


class Prefetcher:
    """A lazily started ``ThreadPipeline`` of ``capacity`` items fed by ``spawn(pipeline)``."""

    def __init__(self, capacity: int, name: str, spawn: Callable[[ThreadPipeline], None]) -> None:
        self._capacity = capacity
        self._name = name
        self._spawn = spawn
        self._pipeline: ThreadPipeline | None = None
        self._ended = False
        self._failure: BaseException | None = None

    def next(self) -> Any:
        """The next item, or ``END``; re-raises a producer's exception (the original object)."""
        if self._failure is not None:
            raise self._failure
        if self._ended:
            return END
        if self._pipeline is None:
            self._pipeline = ThreadPipeline(self._capacity, name=self._name)
            self._spawn(self._pipeline)
        try:
            return self._pipeline.get()
        except StopIteration:
            self._ended = True
            self.stop()
            return END
        except BaseException as exc:
            self._failure = exc
            self.stop()
            raise

    def stop(self) -> None:
        """Stop the threads (bounded wait); the next ``next()`` after ``reset()`` starts new ones."""
        if self._pipeline is not None:
            self._pipeline.close()
            self._pipeline = None

    def reset(self) -> None:
        """Stop the threads and forget the end and any failure: a new pass."""
        self.stop()
        self._ended = False
        self._failure = None

    def __del__(self) -> None:
        # A reader dropped without close() must not leave its threads polling forever.
        try:
            self.stop()
        except Exception:  # never raise from a finaliser
            pass


__all__ = ["Prefetcher", "END"]
