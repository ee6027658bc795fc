"""Columnar sample blocks, the seeded shuffle buffer and the batcher, all vectorised.

A block is ``dict field -> array`` whose arrays share a leading axis of n
samples (object arrays hold ragged values). Nothing here loops over samples in
Python: blocks are concatenated, permuted with ``np.take`` and sliced.
``to_batch`` (the client's view of a received batch) builds per-sample
objects only for ``batch_format = "list"``, which asks for them.

The shuffle buffer is a block shuffle: incoming blocks accumulate until there
are ``2 * capacity`` rows; then all rows are permuted and every row beyond
``capacity`` is emitted, the rest kept. Each row is copied a small constant
number of times on average, and the mixing matches a classic shuffle buffer of
``capacity`` rows. At the end of an epoch everything left is permuted and emitted.
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

Block = dict[str, np.ndarray]


def block_rows(block: Block) -> int:
    for values in block.values():
        return int(values.shape[0])
    return 0


def concat(blocks: list[Block]) -> Block:
    if len(blocks) == 1:
        return blocks[0]
    names = list(blocks[0])
    return {name: _concat_column([b[name] for b in blocks]) for name in names}


def _concat_column(parts: list[np.ndarray]) -> np.ndarray:
    if any(p.dtype.hasobject for p in parts) and not all(p.dtype.hasobject for p in parts):
        # One block stacked, another ragged: fall back to object rows for all.
        parts = [p if p.dtype.hasobject else _as_object_rows(p) for p in parts]
    return np.concatenate(parts, axis=0)


def _as_object_rows(array: np.ndarray) -> np.ndarray:
    out = np.empty(array.shape[0], dtype=object)
    for i in range(array.shape[0]):
        out[i] = array[i]
    return out


def take(block: Block, rows: np.ndarray) -> Block:
    return {name: np.take(values, rows, axis=0) for name, values in block.items()}


def select(block: Block, keep: np.ndarray) -> Block:
    """Rows where the boolean mask ``keep`` is true."""
    return {name: values[keep] for name, values in block.items()}


def rows_slice(block: Block, start: int, stop: int) -> Block:
    return {name: values[start:stop] for name, values in block.items()}


def block_nbytes(block: Block) -> int:
    return sum(int(v.nbytes) for v in block.values())


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


def to_batch(columns: dict[str, np.ndarray], sample_kind: str, batch_format: str) -> Any:
    """A received batch as the user sees it: stacked dict, or a list of samples."""
    if batch_format == "list":
        names = list(columns)
        n = len(next(iter(columns.values()))) if columns else 0
        if sample_kind == "dict":
            return [{name: columns[name][i] for name in names} for i in range(n)]
        if sample_kind == "value" and len(names) == 1:
            return list(columns[names[0]])
        return [tuple(columns[name][i] for name in names) for i in range(n)]
    return {name: _stack_objects(values) for name, values in columns.items()}


def _stack_objects(values: np.ndarray) -> Any:
    if not values.dtype.hasobject:
        return values
    try:
        return np.stack([np.asarray(v) for v in values])
    except (ValueError, TypeError):
        return list(values)  # ragged: a list of per-sample values


__all__ = ["to_batch", "Block", "ShuffleBuffer", "Batcher", "concat", "take", "select", "block_rows", "rows_slice"]
