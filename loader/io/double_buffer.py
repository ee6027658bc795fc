"""``DoubleBufferReader``: prepare the next item on a thread while the current one is used.

One background thread (a ``Prefetcher``) reads ahead from the underlying reader,
up to ``capacity`` items, and for a device place starts the copy there
(``Placer(place).stage``); the consumer's ``read_next`` waits for the next item
and finishes the copy (``Placer.finish``). The thread starts at the first read,
not at construction, and ``reinit()``/``close()`` stop it (bounded wait) before
touching the underlying reader.

An exception in the underlying reader reaches the consumer as the original
object, after the items read before it; later reads raise it again until
``reinit()``.
"""

from __future__ import annotations

from typing import Any

from loader.device import Placer
from loader.io.base import DecoratedReader, ReaderBase
from loader.io.prefetch import END, Prefetcher
from loader.runtime.threads import ThreadPipeline


def _prefetch(pipe: ThreadPipeline, reader: ReaderBase, placer: Placer) -> None:
    while True:
        item = reader.read_next()
        if not item:
            return
        pipe.put(placer.stage(item))  # raises StopRequested once the consumer closes the pipe


class DoubleBufferReader(DecoratedReader):
    """Reads ahead of the consumer on a background thread, optionally onto a device."""

    def __init__(self, reader: ReaderBase, place: str = "cpu", capacity: int = 2) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        super().__init__(reader)
        self.place = place
        self.capacity = capacity
        placer = self._placer = Placer(place)  # an unsupported place fails here, not in the thread
        # The spawn callback closes over the underlying reader, never over self (see Prefetcher).
        self._prefetcher = Prefetcher(
            capacity, "loader-double-buffer", lambda pipe: pipe.spawn(_prefetch, reader, placer)
        )

    def _read_next_impl(self) -> list[Any]:
        staged = self._prefetcher.next()
        if staged is END:
            return []
        return self._placer.finish(staged)

    def _reinit_impl(self) -> None:
        self._prefetcher.reset()  # the thread must be gone before the underlying reader rewinds
        self.reader.reinit()

    def _close_impl(self) -> None:
        self._prefetcher.stop()
        self.reader.close()


__all__ = ["DoubleBufferReader"]
