"""Rows of an epoch's files put back into the epoch's order, whatever order workers deliver them in.

Workers read several files at once and their chunks arrive interleaved. The
``Sequencer`` of a stream knows the files in reading order; the first file not
yet complete is the *head*. Rows of the head pass straight on; rows of later
files are held until every file before theirs is complete. A file's rows come
from one lease at a time, in record order (a lease reads from its ``start``
record on), so a file is put in order by dropping rows at or before the last
record already taken: what a re-leased file sends again.

Held rows are bounded by the reorder window: ``reorder_rows`` rows, or more
while they take at most ``reorder_bytes`` bytes (small rows would otherwise
leave a later file's worker idle behind a window of a few batches). A chunk of
a later file that would hold more is refused, and the stream *cuts* that file
there (``Cut``): its lease is cancelled and the file re-leased later from that
record. So a slow worker holds the stream back by at most the reorder window,
and memory stays bounded whatever the file sizes. A later file may be leased
only while the window has room for a chunk as large as the stream's largest:
with less, its first full chunk would be cut at once, and a cut file would be
leased, cut and queued again in a loop while the window stays full.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from loader.service.blocks import Block, block_nbytes, block_rows, select

# Files after the head that may be read ahead at once (their rows are held in the reorder window).
MAX_FILES_AHEAD = 64


@dataclass
class FileRows:
    """One file of the stream: where it stands in the order, what was taken, what is held."""

    order_index: int
    next_record: int = 0  # records before this were taken (passed on, held, or skipped as misfits)
    lease_start: int = 0  # where the current lease began reading
    taken: int = 0  # records the current lease delivered that were taken (rows, or skipped as misfits)
    skipped_before_cuts: int = 0  # records cut leases skipped (their FILE_DONE, which says so, is not taken)
    done: bool = False
    cut: bool = False  # cut and not leased again yet: what its old lease still sends is not taken
    held: list[tuple[Block, np.ndarray]] = field(default_factory=list)
    held_rows: int = 0
    held_bytes: int = 0


@dataclass(frozen=True)
class Cut:
    """A later file's chunk would overfill the reorder window: re-lease ``file_index`` from ``record``."""

    file_index: int
    record: int


Tagged = tuple[Block, int, np.ndarray]  # rows, order index of their file, their record indexes


class Sequencer:
    """The in-order assembly of one stream's files; see the module docstring."""

    def __init__(
        self, order: list[int], start_order: int, start_record: int, reorder_rows: int, reorder_bytes: int = 0
    ) -> None:
        self.order = order  # file indexes in reading order (the whole epoch's order)
        self.head = start_order
        self.reorder_rows = reorder_rows
        self.reorder_bytes = reorder_bytes
        self.files = {f: FileRows(i) for i, f in enumerate(order) if i >= start_order}
        if start_order < len(order):
            first = self.files[order[start_order]]
            first.next_record = first.lease_start = start_record
        self.held_rows = 0
        self.held_bytes = 0
        # The largest chunk of the stream so far, in rows and in bytes (``may_read``); one row before any.
        self.chunk_rows = self.chunk_bytes = 1

    def _room(self, rows: int, nbytes: int) -> bool:
        """Whether ``rows`` more rows of ``nbytes`` fit the reorder window."""
        return self.held_rows + rows <= self.reorder_rows or self.held_bytes + nbytes <= self.reorder_bytes

    @property
    def complete(self) -> bool:
        return self.head >= len(self.order)

    @property
    def incomplete(self) -> list[int]:
        return [f for f in self.order[self.head :]]

    def lease_start(self, file_index: int) -> int:
        """A lease of this file begins now: the record it reads from."""
        state = self.files.get(file_index)
        if state is None:
            return 0
        state.cut = False
        state.lease_start, state.taken = state.next_record, 0
        return state.next_record

    def may_read(self, file_index: int) -> bool:
        """Whether a lease of this file may start now: the head always; a later file while the window has
        room for one more chunk as large as the largest so far.

        Room for one row would not do: a file cut because its chunk did not fit would be leased again at
        once, its next chunk refused and the file cut again, over and over while the window stays full
        (only the head's completion empties it), keeping workers from the head file."""
        state = self.files.get(file_index)
        if state is None or state.done:
            return False
        if state.order_index == self.head:
            return True
        return state.order_index < self.head + MAX_FILES_AHEAD and self._room(self.chunk_rows, self.chunk_bytes)

    def add(self, file_index: int, block: Block, records: np.ndarray) -> tuple[list[Tagged], list[Block], Cut | None]:
        """Rows of a file: (rows now in order, rows dropped as already taken, a cut or None)."""
        state = self.files.get(file_index)
        if state is None or state.done or state.cut:
            return [], [block], None
        fresh = records >= state.next_record
        dropped: list[Block] = []
        if not fresh.all():
            dropped.append(select(block, ~fresh))
            block, records = select(block, fresh), records[fresh]
        n = block_rows(block)
        if n == 0:
            return [], dropped, None
        nbytes = block_nbytes(block)
        self.chunk_rows, self.chunk_bytes = max(self.chunk_rows, n), max(self.chunk_bytes, nbytes)
        if state.order_index == self.head:
            state.next_record = int(records[-1]) + 1
            state.taken += n
            return [(block, state.order_index, records)], dropped, None
        if not self._room(n, nbytes):
            dropped.append(block)
            return [], dropped, self.cut(file_index)
        state.held.append((block, records))
        state.held_rows += n
        state.held_bytes += nbytes
        self.held_rows += n
        self.held_bytes += nbytes
        state.next_record = int(records[-1]) + 1
        state.taken += n
        return [], dropped, None

    def cut(self, file_index: int) -> Cut | None:
        """Stop taking this file's rows until it is leased again, from the record after the last one taken.

        The cut lease may still send (even FILE_DONE) before it is cancelled: none of it is taken."""
        state = self.files.get(file_index)
        if state is None or state.done or state.cut:
            return None
        state.cut = True
        # Records this lease read past without a row (skipped by the worker) lie before ``next_record``:
        # the next lease starts after them, and only this lease's FILE_DONE, never taken now, counted them.
        state.skipped_before_cuts += max(0, state.next_record - state.lease_start - state.taken)
        return Cut(file_index, state.next_record)

    def skip(self, file_index: int, records: np.ndarray) -> int:
        """Records that arrived but were refused (misfits under ``skip``): taken without rows, so a later
        lease starts after them; how many of them were new."""
        state = self.files.get(file_index)
        if state is None or state.done or state.cut or not len(records):
            return 0
        fresh = int(np.count_nonzero(records >= state.next_record))
        if fresh:
            state.next_record = max(state.next_record, int(records[-1]) + 1)
            state.taken += fresh
        return fresh

    def finish(self, file_index: int) -> list[Tagged]:
        """The file is complete: the rows that are in order now (its successors' held rows, when it was the head)."""
        state = self.files.get(file_index)
        if state is None or state.done or state.cut:
            return []
        state.done = True
        out: list[Tagged] = []
        while not self.complete:
            head = self.files[self.order[self.head]]
            for block, records in head.held:
                out.append((block, head.order_index, records))
            self.held_rows -= head.held_rows
            self.held_bytes -= head.held_bytes
            head.held, head.held_rows, head.held_bytes = [], 0, 0
            if not head.done:
                break
            self.head += 1
        return out

    def blocks(self) -> list[Block]:
        """The rows held, left in place."""
        return [block for state in self.files.values() for block, _ in state.held]

    def drain(self) -> list[Block]:
        out = self.blocks()
        for state in self.files.values():
            state.held, state.held_rows, state.held_bytes = [], 0, 0
        self.held_rows = self.held_bytes = 0
        return out


__all__ = ["Cut", "MAX_FILES_AHEAD", "Sequencer"]
