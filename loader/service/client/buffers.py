"""Memory the client gathers big batches into, kept for the next batch once one is dropped.

A batch of big rows is a large fresh allocation: 64 float32 images of
224x224x3 are 38 MiB, above glibc's largest mmap threshold (32 MiB), so each
``np.empty`` maps new pages, and the first write to each 4 KiB page faults
into the kernel, which zeroes it before the copy writes it again. For such
batches the faults cost about as much as the copy itself.

``BatchBuffers.empty`` hands out arrays over anonymous mappings that were
written before. When the last array or view over one is dropped (by the
training loop, whenever it likes), a weakref finalizer on its base array puts
the mapping back for the next batch of the same size. At most ``max_bytes``
wait there; the rest are unmapped when dropped. A batch of unusual size, or
one after the pool is closed, still gets a mapping of its own.
"""

from __future__ import annotations

import mmap
import threading
import weakref

import numpy as np

MIN_POOLED_BYTES = 4 * 1024 * 1024  # smaller batches come from malloc's own free lists
DEFAULT_MAX_BYTES = 256 * 1024 * 1024  # kept idle at most (about 6 batches of 64 images)


class BatchBuffers:
    """Reusable anonymous mappings for gathered batches; thread-safe (finalizers run on any thread)."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES, min_bytes: int = MIN_POOLED_BYTES) -> None:
        self.max_bytes, self.min_bytes = max_bytes, min_bytes
        # Reentrant: a finalizer may run on this thread inside ``empty`` (a garbage collection while locked).
        self._lock = threading.RLock()
        self._idle: dict[int, list[mmap.mmap]] = {}
        self._idle_bytes = 0
        self._closed = False
        self.reused = 0  # batches that found a mapping waiting (stats, tests)

    def empty(self, nbytes: int) -> np.ndarray:
        """A writable, uninitialised ``uint8`` array of ``nbytes`` bytes."""
        if nbytes < self.min_bytes:
            return np.empty(nbytes, dtype=np.uint8)
        with self._lock:
            waiting = self._idle.get(nbytes)
            memory = waiting.pop() if waiting else None
            if memory is not None:
                self._idle_bytes -= nbytes
                self.reused += 1
        if memory is None:
            # Private, as malloc's memory is: a child forked from the training process keeps its own
            # copy of a batch, never the next batch that reuses this mapping.
            memory = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        array = np.frombuffer(memory, dtype=np.uint8)
        done = weakref.finalize(array, self._put_back, memory)
        done.atexit = False
        return array

    def _put_back(self, memory: mmap.mmap) -> None:
        nbytes = len(memory)
        with self._lock:
            if self._closed or self._idle_bytes + nbytes > self.max_bytes:
                return  # dropped: unmapped once the last reference to it goes
            self._idle.setdefault(nbytes, []).append(memory)
            self._idle_bytes += nbytes

    @property
    def idle_bytes(self) -> int:
        return self._idle_bytes

    def close(self) -> None:
        """Drop the idle mappings; arrays still in use keep theirs until they are dropped."""
        with self._lock:
            self._closed = True
            self._idle.clear()
            self._idle_bytes = 0


__all__ = ["BatchBuffers"]
