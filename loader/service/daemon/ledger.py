"""Which records of one file the stage has already delivered (exactly-once after re-leases).

A file normally arrives in order from one worker, so the common case is a
counter of contiguous records: a chunk starting at that counter is accepted
whole, with no per-record work. Anything else (a replacement worker re-sending
the start of a file, skipped records, two workers racing on one file) switches
the file to a growable bitmap and filters with numpy.
"""

from __future__ import annotations

import numpy as np

_INITIAL_BITMAP_RECORDS = 1024


class FileLedger:
    """Delivered records of one (stream, file), and whether the file is complete."""

    __slots__ = ("contiguous", "bitmap", "received", "expected", "skipped")

    def __init__(self) -> None:
        self.contiguous = 0  # records [0, contiguous) delivered (while bitmap is None)
        self.bitmap: np.ndarray | None = None
        self.received = 0  # distinct records delivered
        self.expected: int | None = None  # records the worker sent, known from FILE_DONE
        self.skipped = 0

    def accept(self, first: int, count: int, indexes: np.ndarray | None = None) -> np.ndarray | None:
        """Register a chunk; returns None to keep every row, else a boolean keep-mask."""
        if indexes is None and self.bitmap is None and first == self.contiguous:
            self.contiguous += count
            self.received += count
            return None
        if indexes is None:
            indexes = np.arange(first, first + count, dtype=np.int64)
        indexes = np.asarray(indexes, dtype=np.int64)
        self._ensure_bitmap(int(indexes.max()) + 1 if indexes.size else 0)
        assert self.bitmap is not None
        keep = ~self.bitmap[indexes]
        fresh = indexes[keep]
        self.bitmap[fresh] = True
        self.received += int(fresh.size)
        return keep

    def _ensure_bitmap(self, size: int) -> None:
        if self.bitmap is None:
            self.bitmap = np.zeros(max(size, self.contiguous, _INITIAL_BITMAP_RECORDS), dtype=bool)
            self.bitmap[: self.contiguous] = True
        elif size > self.bitmap.size:
            grown = np.zeros(max(size, 2 * self.bitmap.size), dtype=bool)
            grown[: self.bitmap.size] = self.bitmap
            self.bitmap = grown

    def mark_done(self, sent: int, skipped: int) -> None:
        """The worker finished the file having sent ``sent`` records (and skipped ``skipped``)."""
        self.expected = sent if self.expected is None else max(self.expected, sent)
        self.skipped = max(self.skipped, skipped)

    @property
    def complete(self) -> bool:
        return self.expected is not None and self.received >= self.expected


__all__ = ["FileLedger"]
