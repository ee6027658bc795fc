"""Whether the filesystem under the arenas has room: said once in the daemon's log when it has not.

A container's ``/dev/shm`` is often small (Docker's default is 64 MiB). Arenas are reserved as they are used,
so a full one is a failed allocation, never a crash: each worker then sends its big rows inline, through the
sockets. That kept working, and said nothing while it ran a pipeline of decoded images 3-4x slower (2 workers,
``/dev/shm`` of 64 MiB against 4 GiB: 524-626 against 1,679-2,299 images/s; 544-871 since a chunk is cut
where its arena fills, docs/performance.md). The daemon sees such rows arrive. When the
filesystem is (nearly) full at that moment, it says so once, with the numbers and the fix. An arena that is
full because its rows are all in use (a slow client) leaves the filesystem room, and is said nothing of.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from loader.service.shm.arena import RESERVE_STEP_BYTES
from loader.service.shm.refs import MIN_REF_ROW_BYTES

log = logging.getLogger("loader.daemon")

CHECK_EVERY_S = 1.0  # at most one statvfs a second, however many chunks come inline


class ShmRoom:
    """Watches the chunks of one daemon for big rows sent inline while the arenas' filesystem is full."""

    def __init__(
        self,
        directory: str,
        arena_mib: int,
        workers: int,  # the most local workers the daemon runs (each has an arena)
        *,
        clock: Callable[[], float] = time.monotonic,
        statvfs: Callable[[str], Any] | None = None,
    ) -> None:
        self.directory, self.arena_mib, self.workers = directory, arena_mib, workers
        self.said = False
        self._clock, self._statvfs = clock, statvfs
        self._next_check = 0.0

    def note_chunk(self, refs: dict[str, Any] | None, columns: dict[str, Any]) -> None:
        """A chunk arrived with ``columns``, those named in ``refs`` as arena references."""
        if self.said:
            return
        row_bytes = _largest_inline_row(refs or {}, columns)
        if row_bytes < MIN_REF_ROW_BYTES:
            return  # rows that never go by reference: nothing to say
        now = self._clock()
        if now < self._next_check:
            return
        self._next_check = now + CHECK_EVERY_S
        try:
            status = (self._statvfs or os.statvfs)(self.directory)
        except OSError:
            return
        free, total = status.f_bavail * status.f_frsize, status.f_blocks * status.f_frsize
        if free >= RESERVE_STEP_BYTES + row_bytes:  # a worker reserves this much at a time: there was room
            return
        self.said = True
        log.warning(
            "shared memory is full: %s has %.0f MiB free of %.0f MiB, so workers send rows of %.0f KiB through the "
            "sockets instead of their arenas, several times slower. The arenas may use up to %d workers x "
            "workers.shm_arena_mib (%d MiB): give it that much (docker run --shm-size=...; on Kubernetes an "
            "emptyDir volume with medium: Memory on /dev/shm), or lower workers.shm_arena_mib",
            self.directory,
            free / 2**20,
            total / 2**20,
            row_bytes / 1024,
            self.workers,
            self.arena_mib,
        )


def _largest_inline_row(refs: dict[str, Any], columns: dict[str, Any]) -> int:
    """Bytes of the largest row among the columns of fixed dtype that travel inline."""
    largest = 0
    for name, values in columns.items():
        if name in refs or not isinstance(values, np.ndarray) or values.ndim < 1 or not len(values):
            continue
        if values.dtype.hasobject:
            continue
        largest = max(largest, values.nbytes // len(values))
    return largest


__all__ = ["ShmRoom", "CHECK_EVERY_S"]
