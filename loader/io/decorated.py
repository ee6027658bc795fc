"""Decorated readers of the class-based reader graph: shuffle, batch and multi-pass.

``ShuffleReader(reader, buffer_size, seed=None)``: block shuffle, as the original:
fill a buffer of ``buffer_size`` instances, deliver them in a random order,
refill. Pass ``p`` (counted by ``reinit()``) shuffles with the generator seeded
from ``(seed, p)``, so every pass differs and a run is repeatable; ``seed=None``
draws fresh entropy once, at construction.

``BatchReader(reader, batch_size, drop_last=False)``: up to ``batch_size``
instances per batch; the last, partial batch is kept unless ``drop_last``.
A ``lod_level == 0`` slot is stacked: ``(N,) + instance shape``. A
``lod_level == 1`` slot (each instance a sequence ``(T_i, ...)``) is concatenated
along the first axis, ``(sum T_i, ...)``, and its sequence lengths ``(N,)``
int64 are appended as an extra slot named ``"<slot>.lengths"`` after all the data
slots (so data slot ``i`` of a batch is slot ``i`` of its instances).
``lod_level > 1`` is refused. Instances of one slot must agree in dtype and in
shape (after the first axis for sequences): ``ShapeMismatchError`` otherwise.

A failure of the underlying reader reaches the consumer at once; the instances the shuffle and batch
readers read before it are kept for their next read, so a consumer that reads on past the failure (a
file reader steps past a bad record) gets every good instance once.

``MultiPassReader(reader, pass_num)``: ``pass_num`` passes over the underlying
reader, re-initialising it at each end. Unlike the original, an underlying
reader that is empty after ``reinit`` ends the data at once instead of
consuming one pass per call.
"""

from __future__ import annotations

from typing import cast

import numpy as np

from loader.errors import ShapeMismatchError
from loader.io.base import DecoratedReader, ReaderBase


def _read_up_to(reader: ReaderBase, count: int, items: list[list[np.ndarray]]) -> list[list[np.ndarray]]:
    """``items`` filled up to ``count`` items of ``reader``; fewer only at the end of its data.

    The caller keeps ``items`` across a failure of ``reader``: what was read before it stays there for
    the next call, so a caller that reads on past the failure (a file reader steps past a bad record)
    loses none of the good items read before it."""
    while len(items) < count:
        item = reader.read_next()
        if not item:
            break
        items.append(item)
    return items


class ShuffleReader(DecoratedReader):
    """Block shuffle of the underlying reader's instances, deterministic given ``seed``."""

    def __init__(self, reader: ReaderBase, buffer_size: int, seed: int | None = None) -> None:
        if buffer_size <= 0:
            raise ValueError(f"buffer_size must be > 0, got {buffer_size}")
        super().__init__(reader)
        self.buffer_size = buffer_size
        # Fresh randomness only when the user gives no seed (drawn once, kept for every pass).
        self._seed = int(seed) if seed is not None else int(cast(int, np.random.SeedSequence().entropy))
        self._pass = 0
        self._start_pass()

    def _start_pass(self) -> None:
        self._rng = np.random.default_rng([self._seed, self._pass])
        self._buffer: list[list[np.ndarray]] = []
        self._pos = 0
        self._filling: list[list[np.ndarray]] = []  # the next buffer, kept across a failure below (_read_up_to)

    def _read_next_impl(self) -> list[np.ndarray]:
        if self._pos >= len(self._buffer):
            buffer = _read_up_to(self.reader, self.buffer_size, self._filling)
            self._filling = []
            if not buffer:
                return []
            order = self._rng.permutation(len(buffer))
            self._buffer = [buffer[i] for i in order]
            self._pos = 0
        item = self._buffer[self._pos]
        self._buffer[self._pos] = []  # drop our reference as soon as it is handed out
        self._pos += 1
        return item

    def _reinit_impl(self) -> None:
        self.reader.reinit()
        self._pass += 1
        self._start_pass()

    def _close_impl(self) -> None:
        self._buffer, self._filling = [], []
        super()._close_impl()


class BatchReader(DecoratedReader):
    """Batches of ``batch_size`` instances (see the module docstring for LoD slots)."""

    def __init__(self, reader: ReaderBase, batch_size: int, drop_last: bool = False) -> None:
        if batch_size <= 0:
            raise ValueError(f"batch_size must be > 0, got {batch_size}")
        super().__init__(reader)
        self.batch_size = batch_size
        self.drop_last = bool(drop_last)
        levels = reader.lod_levels or []
        if any(level > 1 for level in levels):
            raise ValueError(f"BatchReader supports lod_level 0 and 1, got lod_levels={list(levels)}")
        self._seq_slots = [i for i, level in enumerate(levels) if level == 1]
        # The next batch's instances (or blocks), kept across a failure below (see _read_up_to).
        self._pending: list[list[np.ndarray]] = []

    @property
    def slot_names(self) -> list[str]:
        names = self.reader.slot_names
        return names + [f"{names[i] if i < len(names) else f'slot{i}'}.lengths" for i in self._seq_slots]

    @property
    def shapes(self) -> list[list[int]] | None:  # type: ignore[override]
        shapes = self.reader.shapes
        return None if shapes is None else shapes + [[-1] for _ in self._seq_slots]

    @property
    def dtypes(self) -> list[np.dtype] | None:  # type: ignore[override]
        dtypes = self.reader.dtypes
        return None if dtypes is None else dtypes + [np.dtype(np.int64) for _ in self._seq_slots]

    @property
    def lod_levels(self) -> list[int] | None:  # type: ignore[override]
        levels = self.reader.lod_levels
        return None if levels is None else [0] * (len(levels) + len(self._seq_slots))

    def _read_next_impl(self) -> list[np.ndarray]:
        if not self._seq_slots:
            return self._read_stacked()
        items = _read_up_to(self.reader, self.batch_size, self._pending)
        self._pending = []
        if not items or (self.drop_last and len(items) < self.batch_size):
            return []
        out = []
        for slot in range(len(items[0])):
            parts = [item[slot] for item in items]
            out.append(self._join(parts, slot, sequence=slot in self._seq_slots))
        for slot in self._seq_slots:
            out.append(np.array([len(item[slot]) for item in items], dtype=np.int64))
        return out

    def _read_stacked(self) -> list[np.ndarray]:
        # No sequences: take whole blocks from the underlying reader (slices of
        # memory-mapped files, or blocks handed over by open_files) and join them.
        blocks = self._pending
        count = sum(len(block[0]) for block in blocks)
        while count < self.batch_size:
            block = self.reader.read_block(self.batch_size - count)  # a failure keeps the blocks read
            if not block:
                break
            blocks.append(block)
            count += len(block[0])
        self._pending = []
        if not blocks or (self.drop_last and count < self.batch_size):
            return []
        if len(blocks) == 1:
            # Own the memory: a block may be a view of a file or of a reader's buffer.
            return [part if part.flags.owndata else np.array(part) for part in blocks[0]]
        # A block ends before an instance of another shape or dtype, so a mismatch lies between blocks:
        # name it by the instance where its block starts, with instance shapes (not the blocks').
        starts = np.cumsum([0] + [len(b[0]) for b in blocks[:-1]]).tolist()
        return [
            self._join([b[slot] for b in blocks], slot, sequence=True, starts=starts) for slot in range(len(blocks[0]))
        ]

    def _join(self, parts: list[np.ndarray], slot: int, sequence: bool, starts: list[int] | None = None) -> np.ndarray:
        """``parts`` stacked (instances), or concatenated (sequences; or blocks of instances, ``starts``
        then giving the index in the batch of each block's first instance)."""
        first = parts[0]
        for k, part in enumerate(parts):
            same = part.shape[1:] == first.shape[1:] if sequence else part.shape == first.shape
            if not same or part.dtype != first.dtype or (sequence and part.ndim == 0):
                name = self.reader.slot_names[slot] if slot < len(self.reader.slot_names) else f"slot{slot}"
                item, shape, first_shape = k, part.shape, first.shape
                if starts is not None:
                    item, shape, first_shape = starts[k], part.shape[1:], first.shape[1:]
                raise ShapeMismatchError(
                    f"BatchReader: slot {slot} ({name!r}): item {item} of the batch has shape {shape} "
                    f"dtype {part.dtype}, the first has shape {first_shape} dtype {first.dtype}"
                )
        return np.concatenate(parts) if sequence else np.stack(parts)

    def _reinit_impl(self) -> None:
        self._pending = []
        super()._reinit_impl()

    def _close_impl(self) -> None:
        self._pending = []
        super()._close_impl()


class MultiPassReader(DecoratedReader):
    """``pass_num`` passes over the underlying reader."""

    def __init__(self, reader: ReaderBase, pass_num: int) -> None:
        if pass_num <= 0:
            raise ValueError(f"pass_num must be > 0, got {pass_num}")
        super().__init__(reader)
        self.pass_num = pass_num
        self._pass = 0

    @property
    def pass_index(self) -> int:
        """The pass now being read (0-based)."""
        return self._pass

    def _read_next_impl(self) -> list[np.ndarray]:
        while self._pass < self.pass_num:
            item = self.reader.read_next()
            if item:
                return item
            self._pass += 1
            if self._pass >= self.pass_num:
                break
            self.reader.reinit()
            item = self.reader.read_next()
            if item:
                return item
            self._pass = self.pass_num  # empty after reinit: every remaining pass is empty too
        return []

    def _reinit_impl(self) -> None:
        self._pass = 0
        self.reader.reinit()


__all__ = ["ShuffleReader", "BatchReader", "MultiPassReader"]
