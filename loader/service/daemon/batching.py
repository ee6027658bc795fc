"""The stage's seeded shuffle buffer and its batcher, both over columnar blocks.

The shuffle buffer is a block shuffle: incoming blocks accumulate until there
are ``2 * capacity`` rows; then all rows are permuted and every row beyond
``capacity`` is emitted, the rest kept. Each row is copied a small constant
number of times on average, and the mixing matches a classic shuffle buffer of
``capacity`` rows. At the end of an epoch everything left is permuted and emitted.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from loader.service.blocks import Block, block_rows, concat, rows_slice, take


class ShuffleBuffer:
    """Seeded block shuffle of ``capacity`` rows; ``capacity == 0`` passes blocks through."""

    def __init__(self, capacity: int, rng: np.random.Generator) -> None:
        self.capacity = max(0, int(capacity))
        self._rng = rng
        self._pending: list[Block] = []
        self.rows = 0

    def add(self, block: Block) -> list[Block]:
        """Take one block; return the blocks now ready to batch (possibly none)."""
        n = block_rows(block)
        if n == 0:
            return []
        if self.capacity == 0:
            return [block]
        self._pending.append(block)
        self.rows += n
        if self.rows < 2 * self.capacity:
            return []
        return [self._emit(keep=self.capacity)]

    def flush(self) -> list[Block]:
        """Everything still buffered, permuted (end of the epoch's input)."""
        if not self._pending:
            return []
        return [self._emit(keep=0)]

    def drain(self) -> list[Block]:
        """Everything buffered, unpermuted, and the buffer empty (a dropped stream frees its rows)."""
        out, self._pending, self.rows = self._pending, [], 0
        return out

    def blocks(self) -> list[Block]:
        """What is buffered, left in place."""
        return list(self._pending)

    def _emit(self, keep: int) -> Block:
        pool = concat(self._pending)
        total = block_rows(pool)
        order = self._rng.permutation(total)
        out = take(pool, order[: total - keep])
        self._pending = [take(pool, order[total - keep :])] if keep else []
        self.rows = keep
        return out


class Batcher:
    """Cuts blocks into batches of ``batch_size`` rows (views when a block holds a whole batch)."""

    def __init__(self, batch_size: int, drop_last: bool) -> None:
        self.batch_size = int(batch_size)
        self.drop_last = drop_last
        self._pieces: list[Block] = []
        self._offset = 0  # rows of _pieces[0] already handed out
        self.rows = 0

    def extend(self, blocks: Iterable[Block]) -> None:
        for block in blocks:
            n = block_rows(block)
            if n:
                self._pieces.append(block)
                self.rows += n

    def pop(self) -> Block | None:
        """One full batch, or None when fewer than ``batch_size`` rows are buffered."""
        if self.rows < self.batch_size:
            return None
        return self._cut(self.batch_size)

    def flush(self) -> Block | None:
        """The last partial batch (None when empty or ``drop_last``)."""
        if self.rows == 0 or self.drop_last:
            self._pieces, self._offset, self.rows = [], 0, 0
            return None
        return self._cut(self.rows)

    def drain(self) -> list[Block]:
        """The rows not yet handed out, and the batcher empty (a dropped stream frees its rows)."""
        out = self.blocks()
        self._pieces, self._offset, self.rows = [], 0, 0
        return out

    def blocks(self) -> list[Block]:
        """The rows not yet handed out, left in place."""
        if not self._pieces:
            return []
        first = self._pieces[0]
        return [rows_slice(first, self._offset, block_rows(first)), *self._pieces[1:]]

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


__all__ = ["ShuffleBuffer", "Batcher"]
