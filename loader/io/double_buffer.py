"""``DoubleBufferReader``: prepare the next item on a thread while the current one is used.

One background thread (owned by a ``ThreadPipeline``) reads ahead from the
underlying reader, up to ``capacity`` items, and for a device place starts the
copy there (``Placer(place).stage``); the consumer's ``read_next`` waits for the
next item and finishes the copy (``Placer.finish``). The thread starts at the
first read, not at construction, and ``reinit()``/``close()`` stop it (bounded
wait) before touching the underlying reader.

An exception in the underlying reader reaches the consumer as the original
object, after the items read before it; later reads raise it again until
``reinit()``.
"""

from __future__ import annotations

from typing import Any


from loader._threads import ThreadPipeline
from loader.device import Placer
from loader.io.base import DecoratedReader, ReaderBase


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
        self._placer = Placer(place)  # an unsupported place fails here, not in the thread
        self._pipeline: ThreadPipeline | None = None
        self._ended = False
        self._failure: BaseException | None = None

    def _read_next_impl(self) -> list[Any]:
        if self._failure is not None:
            raise self._failure
        if self._ended:
            return []
        if self._pipeline is None:
            self._pipeline = ThreadPipeline(self.capacity, name="loader-double-buffer")
            self._pipeline.spawn(_prefetch, self.reader, self._placer)
        try:
            staged = self._pipeline.get()
        except StopIteration:
            self._ended = True
            self._stop()
            return []
        except BaseException as exc:
            self._failure = exc
            self._stop()
            raise
        return self._placer.finish(staged)

    def _stop(self) -> None:
        if self._pipeline is not None:
            self._pipeline.close()
            self._pipeline = None

    def __del__(self) -> None:
        # A reader dropped without close() must not leave its threads polling forever.
        # (The threads hold no reference to this object, so it can be collected.)
        try:
            self._stop()
        except Exception:  # noqa: BLE001 - never raise from a finaliser
            pass

    def _reinit_impl(self) -> None:
        self._stop()  # the thread must be gone before the underlying reader rewinds
        self._ended = False
        self._failure = None
        self.reader.reinit()

    def _close_impl(self) -> None:
        self._stop()
        self.reader.close()


__all__ = ["DoubleBufferReader"]
