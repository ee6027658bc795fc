"""The stage's seeded window shuffle and its step cutter, both over columnar blocks.

Both are functions of the row sequence only, never of how it was cut into
chunks: the same rows in the same order give the same output, whichever
worker sent them and however they were split (``order.py`` says what the
sequence is).

``WindowShuffle``: the input is cut into windows of ``WINDOW_ROUNDS`` rounds of
``capacity`` rows. In each window a buffer of ``capacity`` rows mixes with the
next round's rows (2 x capacity, permuted by a generator seeded with (seed,
epoch, window, round)); ``capacity`` of them are emitted, the rest carried;
the window's last round emits everything. So a window's output is exactly its
input rows (positions line up), and a resume needs only its window's input.

``StepCutter``: cuts the output into global steps of ``world_size x
batch_size`` rows, rank r taking rows ``[r*b, (r+1)*b)`` of each step. The last,
incomplete step is dropped with ``drop_last``; otherwise it is split as evenly
as possible, and where a rank would get nothing, it gets a repeat of one of
the step's rows (at most ``world_size - 1`` repeats), as torch's
DistributedSampler pads: every rank receives the same number of batches.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import numpy as np

from loader.service.blocks import Block, block_rows, concat, rows_slice, take
from loader.service.order import WINDOW_ROUNDS, Anchor, window_rows


class WindowShuffle:
    """Seeded window shuffle of ``capacity`` rows (``capacity == 0``: rows pass in order).

    ``add`` takes rows tagged with where they come from (order index of their file, record indexes),
    so that ``anchors`` can name where each window's input begins.
    """

    def __init__(self, capacity: int, seed: int, epoch: int, start: Anchor) -> None:
        self.capacity = max(0, int(capacity))
        self.window_rows = window_rows(self.capacity)
        self._key = (int(seed), int(epoch))
        self.window = start[0]
        self.anchors: dict[int, tuple[int, int]] = {start[0]: (start[1], start[2])}
        self._in_window = 0  # input rows of the current window taken so far
        self._round: list[Block] = []
        self._round_rows = 0
        self._rounds_done = 0  # rounds of the current window processed
        self._carry: Block | None = None
        self.rows = 0  # rows held (carry + the round being filled)

    def add(self, block: Block, order_index: int, records: np.ndarray) -> list[Block]:
        """Take input rows (``records``: their record indexes in file ``order_index``); return output blocks."""
        out: list[Block] = []
        n = block_rows(block)
        done = 0
        while done < n:
            room = self.window_rows - self._in_window
            if self.capacity:
                room = min(room, self.capacity - self._round_rows)
            take_rows = min(room, n - done)
            piece = rows_slice(block, done, done + take_rows) if take_rows != n else block
            done += take_rows
            self._in_window += take_rows
            out.extend(self._take(piece, take_rows))
            if self._in_window == self.window_rows:
                last = int(records[done - 1])
                self.anchors[self.window + 1] = (order_index, last + 1)
                out.extend(self._end_window())
        return out

    def _take(self, piece: Block, n: int) -> list[Block]:
        if not self.capacity:
            return [piece]
        self._round.append(piece)
        self._round_rows += n
        self.rows += n
        if self._round_rows < self.capacity or self._in_window == self.window_rows:
            return []  # a full window's last round is emitted by _end_window
        return self._mix(final=False)

    def _end_window(self) -> list[Block]:
        out = self._mix(final=True) if self.capacity else []
        self.window += 1
        self._in_window = 0
        self._rounds_done = 0
        return out

    def finish(self) -> list[Block]:
        """The input ended: emit what is held, permuted."""
        return self._mix(final=True) if self.capacity else []

    def _mix(self, final: bool) -> list[Block]:
        parts = ([self._carry] if self._carry is not None else []) + self._round
        self._round, self._round_rows, self._carry = [], 0, None
        round_index = self._rounds_done
        self._rounds_done += 1
        if not parts:
            self.rows = 0
            return []
        pool = concat(parts)
        total = block_rows(pool)
        if round_index == 0 and not final:
            self._carry = pool  # the first round only fills the buffer
            self.rows = total
            return []
        order = np.random.default_rng((*self._key, self.window, round_index)).permutation(total)
        keep = 0 if final else min(self.capacity, total)
        self._carry = take(pool, order[total - keep :]) if keep else None
        self.rows = keep
        return [take(pool, order[: total - keep])]

    def blocks(self) -> list[Block]:
        """What is held, left in place."""
        return ([self._carry] if self._carry is not None else []) + list(self._round)

    def drain(self) -> list[Block]:
        """Everything held, and the buffer empty (a dropped stream frees its rows)."""
        out = self.blocks()
        self._round, self._round_rows, self._carry, self.rows = [], 0, None, 0
        return out

    def forget_anchors_before(self, window: int) -> None:
        for key in [k for k in self.anchors if k < window]:
            del self.anchors[key]


class CutStep(NamedTuple):
    """One global step's block per rank, and where its rows lie: rows ``[start, start + world_size x
    batch_size)`` of ``source`` when they were cut from one block (rank r's are views of rows ``start + r x
    batch_size`` on), else ``source`` is None (the step joins two blocks, or is the last one)."""

    slices: list[Block]
    source: Block | None
    start: int


class StepCutter:
    """Cuts output rows into global steps: one block per rank; see the module docstring."""

    def __init__(self, world_size: int, batch_size: int, drop_last: bool, skip: int = 0) -> None:
        self.world_size, self.batch_size, self.drop_last = int(world_size), int(batch_size), drop_last
        self._skip = int(skip)  # rows before the resume position: read again only to be dropped
        self._pieces: list[Block] = []
        self._offset = 0  # rows of _pieces[0] already cut
        self.rows = 0

    def extend(self, blocks: Iterable[Block]) -> list[Block]:
        """Take output rows; return the rows dropped because they lie before the resume position."""
        dropped = []
        for block in blocks:
            n = block_rows(block)
            if self._skip and n:
                cut = min(self._skip, n)
                self._skip -= cut
                dropped.append(rows_slice(block, 0, cut))
                block, n = rows_slice(block, cut, n), n - cut
            if n:
                self._pieces.append(block)
                self.rows += n
        return dropped

    @property
    def step_rows(self) -> int:
        return self.world_size * self.batch_size

    def pop(self) -> CutStep | None:
        """One full step (a block per rank, and where it lies), or None when fewer rows are held."""
        if self.rows < self.step_rows:
            return None
        b, n = self.batch_size, self.step_rows
        head, start = self._pieces[0], self._offset
        left = block_rows(head) - start
        if left >= n:  # the common case, cut from one block: a view of it (one per step, so kept short)
            step = rows_slice(head, start, start + n)
            if left == n:
                self._pieces.pop(0)
                self._offset = 0
            else:
                self._offset += n
            self.rows -= n
            source: Block | None = head
        else:
            step, source = self._cut(n), None
        slices = (
            [step] if self.world_size == 1 else [rows_slice(step, r * b, (r + 1) * b) for r in range(self.world_size)]
        )
        return CutStep(slices, source, start)

    def flush(self) -> tuple[list[Block] | None, list[Block]]:
        """(the last, incomplete step split over the ranks or None, the rows dropped by ``drop_last``)."""
        m = self.rows
        if m == 0:
            return None, []
        if self.drop_last:
            return None, self.drain()
        tail = self._cut(m)
        return split_tail(tail, m, self.world_size), []

    def blocks(self) -> list[Block]:
        if not self._pieces:
            return []
        first = self._pieces[0]
        return [rows_slice(first, self._offset, block_rows(first)), *self._pieces[1:]]

    def drain(self) -> list[Block]:
        out = self.blocks()
        self._pieces, self._offset, self.rows = [], 0, 0
        return out

    def _cut(self, count: int) -> Block:
        parts: list[Block] = []
        needed = count
        while needed:
            head = self._pieces[0]
            available = block_rows(head) - self._offset
            used = min(available, needed)
            parts.append(rows_slice(head, self._offset, self._offset + used))
            needed -= used
            if used == available:
                self._pieces.pop(0)
                self._offset = 0
            else:
                self._offset += used
        self.rows -= count
        return concat(parts)


def tail_sizes(rows: int, world_size: int) -> list[int]:
    """Rows per rank of a last step of ``rows`` rows: as even as possible, at least one each."""
    base, extra = divmod(rows, world_size)
    return [base + (1 if r < extra else 0) for r in range(world_size)]


def split_tail(tail: Block, rows: int, world_size: int) -> list[Block]:
    """The last step's rows per rank; a rank that would get none gets a repeat of row ``r - rows``."""
    out, start = [], 0
    for r, size in enumerate(tail_sizes(rows, world_size)):
        if size:
            out.append(rows_slice(tail, start, start + size))
            start += size
        else:
            repeat = (r - rows) % rows
            out.append(take(tail, np.array([repeat])))
    return out


__all__ = ["CutStep", "StepCutter", "WINDOW_ROUNDS", "WindowShuffle", "split_tail", "tail_sizes"]
