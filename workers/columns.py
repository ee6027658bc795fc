"""Samples -> columnar chunks: one array per field with a leading axis of n samples.

A sample is a tuple/list of parts (named by ``fields``, the reader's slot
names, or "0", "1", ...), a dict (named by its keys), or a single value (named
``fields[0]`` or "data"). Parts of equal shape and a fixed dtype stack into one
array; anything else (ragged sequences, mixed types) becomes an object column,
which the protocol sends through ``loader.runtime.codec``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from loader.service.protocol import object_array
from loader.service.shm.refs import MIN_REF_ROW_BYTES

if TYPE_CHECKING:
    from workers.arena_writer import ArenaWriter

# A chunk is sent when it has this many bytes or has waited this long, whatever samples_per_message says:
# big samples then travel in messages of a few MiB, and the first batch of an epoch is not held back.
MAX_CHUNK_BYTES = 4 * 1024 * 1024
MAX_CHUNK_DELAY_S = 0.05
# Blocks read straight from a file (no per-sample mappers) aim at this many bytes: per-chunk work in the
# worker, the stage and on the wire is then constant per MiB, whatever the row size.
BLOCK_CHUNK_BYTES = 1024 * 1024
# A chunk may grow up to this to hold exactly one batch of big samples.
MAX_BATCH_CHUNK_BYTES = 64 * 1024 * 1024

KIND_TUPLE, KIND_DICT, KIND_VALUE = "tuple", "dict", "value"


def sample_parts(sample: Any, fields: Sequence[str] | None) -> tuple[str, list[str], list[Any]]:
    """(kind, names, values) of one sample."""
    if isinstance(sample, dict):
        names, values = [str(k) for k in sample], list(sample.values())
        if fields and names != fields:
            # Keys that are source.fields in another order are put in that order: it is the order of the batch's
            # fields and of Client.reader()'s sample tuples, which a DataFeeder's feed_list follows.
            ordered = in_order(KIND_DICT, names, values, list(fields))
            if ordered is not None:
                return KIND_DICT, list(fields), ordered
        return KIND_DICT, names, values
    if isinstance(sample, (tuple, list)):
        values = list(sample)
        # The reader's names for the positions it names: a mapper that adds a field (or drops the last) keeps
        # "data" and "label" where they were, the others named by position; all by position if that would
        # repeat a name.
        names = [fields[i] if fields and i < len(fields) else str(i) for i in range(len(values))]
        if len(set(names)) != len(names):
            names = [str(i) for i in range(len(values))]
        return KIND_TUPLE, names, values
    return KIND_VALUE, [fields[0] if fields else "data"], [sample]


_PY_NUMBERS = (bool, int, float)


def stack_column(values: list[Any]) -> np.ndarray:
    """One array with a leading axis of len(values) when they stack without changing any of them, else an
    object array of the values as they are.

    Numpy arrays and scalars stack only when all share one dtype and shape: ``np.stack`` would promote
    ``uint8`` and ``int8`` to ``int16``, or an ``int64`` beside a ``float32`` to ``float64``, and the
    training loop would get values no sample had. Python numbers stack as numpy decides (ints to int64).
    ``bytes`` and ``str`` never stack: a numpy ``S``/``U`` array pads every value to the longest and drops
    trailing NUL bytes when read back."""
    first = values[0]
    if isinstance(first, (np.ndarray, np.generic)):
        dtype, shape = first.dtype, np.shape(first)
        if dtype.hasobject or (dtype.kind in "SUV" and not isinstance(first, np.ndarray)):
            return object_array(values)
        if isinstance(first, np.ndarray):
            if all(isinstance(v, np.ndarray) and v.dtype == dtype and v.shape == shape for v in values):
                return np.stack(values)
        elif all(isinstance(v, np.generic) and v.dtype == dtype for v in values):
            return np.array(values, dtype=dtype)
        return object_array(values)
    if all(type(value) in _PY_NUMBERS for value in values):
        try:
            array = np.asarray(values)
        except (OverflowError, ValueError, TypeError):  # an int past 64 bits
            return object_array(values)
        return object_array(values) if array.dtype.hasobject else array
    return object_array(values)


def _layout(value: Any) -> tuple[tuple[int, ...], np.dtype]:
    array = np.asarray(value)
    return array.shape, array.dtype


def value_nbytes(value: Any) -> int:
    """About what one value of a sample takes in a message (8 for what does not say: a Python number); a
    list, tuple or dict counts what it holds (a list of crops is the crops' bytes, not 8)."""
    if isinstance(value, (np.ndarray, np.generic)):  # the usual value, once per field of every sample
        return int(value.nbytes)
    total, stack = 0, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, (bytes, bytearray, str)):
            total += len(item)
        elif isinstance(item, (list, tuple)):
            total += 8
            stack.extend(item)
        elif isinstance(item, dict):
            total += 8
            stack.extend(item.keys())
            stack.extend(item.values())
        else:
            total += int(getattr(item, "nbytes", 8))
    return total


def _same_array_layout(value: Any, first: Any) -> bool:
    """Whether ``value`` is an array of fixed dtype with the shape and dtype of its column's first value."""
    return (
        isinstance(value, np.ndarray)
        and isinstance(first, np.ndarray)
        and not value.dtype.hasobject
        and value.dtype == first.dtype
        and value.shape == first.shape
    )


def rows_for_bytes(
    row_bytes: int,
    wanted: int,
    batch_size: int,
    target: int = BLOCK_CHUNK_BYTES,
    batch_bytes: int = MAX_BATCH_CHUNK_BYTES,
) -> int:
    """How many rows of ``row_bytes`` make a block's chunk: about ``target`` bytes (``BLOCK_CHUNK_BYTES``), at
    most ``wanted`` (``samples_per_message``); a multiple of batch_size when that is possible, so the stage can
    cut batches out of one chunk without copying, and one whole batch when it takes at most ``batch_bytes``
    (``MAX_BATCH_CHUNK_BYTES``, less when the daemon accepts smaller messages)."""
    rows = max(1, min(wanted, target // max(1, row_bytes)))
    if batch_size > 1 and rows >= batch_size:
        rows -= rows % batch_size
    elif rows < batch_size <= wanted and batch_size * row_bytes <= batch_bytes:
        rows = batch_size  # big samples: one batch per chunk, so the stage forwards it without copying
    return rows


def in_order(kind: str, names: list[str], values: list[Any], wanted: list[str]) -> list[Any] | None:
    """A dict sample's values in the order of ``wanted`` when it has those keys in another order; else None."""
    if kind != KIND_DICT or len(names) != len(wanted) or set(names) != set(wanted):
        return None
    by_name = dict(zip(names, values))
    return [by_name[name] for name in wanted]


class ChunkBuilder:
    """Collects samples with their record indexes and decides when a chunk is due."""

    def __init__(
        self,
        fields: Sequence[str] | None,
        max_samples: int,
        max_ref_bytes: int = 0,
        max_bytes: int = MAX_CHUNK_BYTES,
        arena: ArenaWriter | None = None,
    ) -> None:
        self.fields = list(fields) if fields else None
        self.max_samples = max(1, max_samples)
        self.max_bytes = max_bytes  # bytes that travel in the message (less when the daemon's bound is small)
        # With an arena, big array rows (decoded images) travel by reference: a chunk of them may grow to
        # ``max_ref_bytes`` (one batch of 64 images, 37 MiB, is one message, not nine: the daemon's CPU a
        # decoded image 0.10 -> 0.03 ms). 0: every byte counts against ``MAX_CHUNK_BYTES``.
        self.max_ref_bytes = max_ref_bytes
        # Given the arena, each big row goes into it as its sample is added (``ArenaWriter.put_row``), and the
        # column keeps the arena's view of it: the copy reads the row while it is still in the CPU's cache, and the
        # mapper's next sample reuses the memory just freed. Rows kept until the chunk was cut (a hundred decoded
        # images, 58 MiB) were copied cold, and each new image landed in memory the cache had never held
        # (docs/performance.md, images).
        self.arena = arena
        self._early: list[list[np.ndarray | None]] = []  # per column, each row's arena reference if placed early
        self._big = False  # whether the chunk's first sample has a column of big rows (there is an arena)
        self._ref_bytes = 0
        self._names: list[str] | None = None
        self.kind = KIND_TUPLE
        self._values: list[list[Any]] = []
        self._records: list[int] = []
        self._bytes = 0
        self._started = 0.0
        # For ``fits``: per column, whether its values differ in shape or dtype, from those looked at so far
        # (each value is looked at once: ``fits`` may be asked at every sample of a group of one-sample files).
        self._ragged: list[bool] = []
        self._scanned = 0

    def __len__(self) -> int:
        return len(self._records)

    def add(self, record: int, sample: Any, parts: tuple[str, list[str], list[Any]] | None = None) -> bool:
        """Take ``sample`` as record ``record``; ``parts``: its ``sample_parts`` when already made (SampleCheck).

        False, taking nothing, when a big row of the sample finds no room in the arena while this chunk's rows of
        its column lie there: the chunk is due as it is, by reference, and the caller sends it, then adds the
        sample to the next (an empty chunk takes any). Cut there, a small or busy arena sends smaller chunks by
        reference; before, the whole chunk went inline, several times slower."""
        kind, names, values = parts if parts is not None else sample_parts(sample, self.fields)
        if self._names is None or not self._records:
            self._names, self.kind = names, kind
            self._values = [[] for _ in names]
            self._early = [[] for _ in names]
            self._big = self.arena is not None and any(self._by_reference(value) for value in values)
            self._ragged, self._scanned = [False] * len(names), 0
            self._started = time.monotonic()
        elif names != self._names:
            reordered = in_order(kind, names, values, self._names)
            if reordered is None:
                raise ValueError(f"sample fields {names} differ from the chunk's fields {self._names}")
            values = reordered
        places = self._place(values)
        if places is None:
            return False
        self._records.append(record)
        for column, early, value, place in zip(self._values, self._early, values, places):
            first = column[0] if column else value
            nbytes = value_nbytes(value)
            by_reference = self._by_reference(first)
            if by_reference and _same_array_layout(value, first):
                # A row the arena takes (rows of one dtype and shape, no objects). Also when this chunk's first row
                # found no room: those rows wait for the cut (put_rows), and counting them against the 4 MiB
                # message bound instead, so the next chunk would try the arena sooner, measured slower with a 64 MiB
                # /dev/shm (769-782 against 833-888 images/s, 2 workers, two runs each).
                self._ref_bytes += nbytes
                column.append(value if place is None else place[0])
                early.append(None if place is None else place[1])
                continue
            column.append(value)
            early.append(None)
            self._bytes += nbytes
            if by_reference:  # the column turned ragged: it travels inline (objects), as does all counted so far
                self._bytes += self._ref_bytes
                self._ref_bytes = 0
        return True

    def _place(self, values: list[Any]) -> list[tuple[np.ndarray, np.ndarray] | None] | None:
        """Where each of a sample's values now lies in the arena, (view, reference), or None where it stays as it
        is: not a big row of its column's layout, or a column whose first row in this chunk found no room (its
        rows are placed at the cut if there is room then, else sent inline). None for the sample when a row
        finds no room in a column whose chunk rows are in the arena; what was placed for it is given back."""
        places: list[tuple[np.ndarray, np.ndarray] | None] = []
        if not self._big or self.arena is None:  # no column of big rows in this chunk: the usual small sample
            return [None] * len(values)
        for column, early, value in zip(self._values, self._early, values):
            first = column[0] if column else value
            if not (self._by_reference(first) and _same_array_layout(value, first)) or (column and early[0] is None):
                places.append(None)
                continue
            place = self.arena.put_row(value)
            if place is None and column:
                for done, taken in zip(places, values):
                    if done is not None:
                        self.arena.free([(done[1][np.newaxis], (taken.dtype.str, taken.shape))])
                return None
            places.append(place)
        return places

    def _by_reference(self, first: Any) -> bool:
        """Whether a column whose first value is ``first`` travels by reference (given an arena)."""
        return bool(self.max_ref_bytes) and _same_array_layout(first, first) and first.nbytes >= MIN_REF_ROW_BYTES

    def fits(self, sample: Any) -> bool:
        """Whether ``sample`` goes with the samples collected (any does with none): of the same kind and
        fields, each part of the first sample's shape and dtype, or of a field already ragged (objects)."""
        if not self._records:
            return True
        kind, names, values = sample_parts(sample, self.fields)
        if kind != self.kind:
            return False
        if names != self._names:
            assert self._names is not None
            reordered = in_order(kind, names, values, self._names)
            if reordered is None:
                return False
            values = reordered
        for i, column in enumerate(self._values):
            if not self._ragged[i]:
                first = _layout(column[0])
                self._ragged[i] = any(_layout(v) != first for v in column[max(1, self._scanned) :])
        self._scanned = len(self._records)
        return all(
            ragged or _layout(value) == _layout(column[0])
            for value, column, ragged in zip(values, self._values, self._ragged)
        )

    @property
    def due(self) -> bool:
        return bool(self._records) and (
            len(self._records) >= self.max_samples
            or self._bytes >= self.max_bytes
            or self._ref_bytes >= max(self.max_ref_bytes, self.max_bytes)
            or time.monotonic() - self._started >= MAX_CHUNK_DELAY_S
        )

    def take(self) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """(columns, record indexes) of the collected samples; the builder starts empty again."""
        columns, records, _ = self.take_placed(None)
        return columns, records

    def take_placed(self, arena: ArenaWriter | None) -> tuple[dict[str, np.ndarray], np.ndarray, dict[str, Any]]:
        """``take``, with a column's rows in ``arena`` where they fit: placed as they came (``put_row``), or
        now, straight from each sample's array (``put_rows``). (columns, record indexes, the row spec of each
        column whose values are the arena's references.)"""
        assert self._names is not None
        columns: dict[str, np.ndarray] = {}
        placed: dict[str, Any] = {}
        try:
            for name, values, early in zip(self._names, self._values, self._early):
                refs = [ref for ref in early if ref is not None]
                if arena is not None and arena is self.arena and values and len(refs) == len(values):
                    columns[name], placed[name] = np.stack(refs), (values[0].dtype.str, values[0].shape)
                    early[:] = [None] * len(early)  # the rows are the chunk's now (``placed``), not the builder's
                    continue
                # Some rows found no room (or the column turned ragged, or the arena changed): as if none was placed.
                values = self._unplace(values, early)
                put = arena.put_rows(values) if arena is not None else None
                if put is None:
                    columns[name] = stack_column(values)
                else:
                    columns[name], placed[name] = put
        except BaseException:
            # Out of memory stacking a column, say: what this call wrote goes back now, and what it had not
            # reached is still the builder's, for ``discard``. Nothing is freed twice.
            if arena is not None and placed:
                arena.free([(columns[name], spec) for name, spec in placed.items()])
            raise
        records = np.asarray(self._records, dtype=np.int64)
        self._clear()
        return columns, records, placed

    def discard(self) -> None:
        """Drop what was collected (the file ended early), giving back the arena rows placed for it."""
        for values, early in zip(self._values, self._early):
            self._unplace(values, early)
        self._clear()

    def _unplace(self, values: list[Any], early: list[np.ndarray | None]) -> list[Any]:
        """``values`` with each row placed early copied out of the arena, whose blocks go back (``early`` is
        cleared: they are no longer the builder's). An arena a re-WELCOME closed keeps its blocks marked: the
        daemon retires that arena whole."""
        refs = [(i, ref) for i, ref in enumerate(early) if ref is not None]
        if not refs:
            return values
        values = list(values)
        for i, _ in refs:
            values[i] = np.array(values[i])  # a copy: the arena's view is reused once freed
        early[:] = [None] * len(early)
        assert self.arena is not None  # rows were placed early only with one
        first = values[refs[0][0]]  # rows placed early all have the layout of the column's first row
        self.arena.free([(np.stack([ref for _, ref in refs]), (first.dtype.str, first.shape))])
        return values

    def _clear(self) -> None:
        self._values = [[] for _ in self._names or []]
        self._early = [[] for _ in self._names or []]
        self._records = []
        self._bytes = self._ref_bytes = 0


__all__ = ["ChunkBuilder", "sample_parts", "stack_column", "rows_for_bytes", "value_nbytes", "MAX_CHUNK_BYTES"]
