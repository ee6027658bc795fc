"""The worker's arena: large columns of a chunk go into shared memory, the chunk carries references.

The daemon names one arena per worker in its WELCOME (``loader.service.shm.pool``).
A worker that cannot map it, or finds another token there (it runs on
another host), sends everything inline, as does a chunk whose rows are small
(``refs.MIN_REF_ROW_BYTES``) or that does not fit in the free blocks: the
worker never waits for arena space.

Rows the block fast path read straight from a memory-mapped ``.npy``/``.npz``
member need no arena at all: ``put_file_rows`` replaces them by references to
``(the leased file, record)`` (``shm.file_rows``), and the client reads them
from the page cache into its batch. Only a worker with an arena does so: having
one is the proof that it shares the daemon's host, hence its files.
"""

from __future__ import annotations

import logging
import mmap
from typing import Any

import numpy as np

from loader.service import protocol as P
from loader.service.shm import refs as R
from loader.service.shm.arena import Arena, ArenaError, arena_path
from loader.service.shm.file_rows import FILE_ROWS

log = logging.getLogger("loader.worker")


class ArenaWriter:
    """This worker's arena, written by its main thread only."""

    def __init__(self, arena: Arena) -> None:
        self.arena = arena

    @classmethod
    def from_welcome(cls, info: Any) -> ArenaWriter | None:
        """The arena a WELCOME names, or None (none named, not mappable here, another token)."""
        if not isinstance(info, dict) or "arena" not in info:
            return None
        try:
            arena_id = int(info["arena"])
            path = arena_path(str(info["dir"]), str(info["prefix"]), arena_id)
            return cls(Arena.open(path, arena_id, bytes.fromhex(str(info["token"]))))
        except (ArenaError, KeyError, ValueError, TypeError, OSError) as exc:
            log.info("no shared-memory arena, sending rows inline: %s", exc)
            return None

    @property
    def capacity_bytes(self) -> int:
        return self.arena.n_blocks * self.arena.block_bytes

    def put_rows(self, rows: list[Any]) -> tuple[np.ndarray, R.Spec] | None:
        """A column still held as one array per sample, written straight into the arena (no stacked copy
        first): (references, row spec); None when its rows are not arrays of one dtype and shape of at least
        ``refs.MIN_REF_ROW_BYTES``, or do not fit (the caller stacks them then)."""
        first = rows[0] if rows else None
        if not isinstance(first, np.ndarray) or not R.eligible(first[np.newaxis]):
            return None
        shape, dtype = first.shape, first.dtype
        if any(not isinstance(row, np.ndarray) or row.shape != shape or row.dtype != dtype for row in rows):
            return None
        refs = R.write_column(self.arena, rows)
        return None if refs is None else (refs, (dtype.str, shape))

    def put_row(self, row: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """One sample's array copied into the arena as soon as the sample is made: (the row where it now lies, a
        view into the arena; its reference, ``int64[REF_WIDTH]`` with row spec 0), or None when it is not
        eligible or the arena has no room (the caller keeps the array then)."""
        if not R.eligible(row[np.newaxis]):
            return None
        arena = self.arena
        try:
            starts = arena.alloc(1, arena.blocks_for(row.nbytes))
        except OSError as exc:  # fallocate failing other than for room (EIO): the row travels inline, as when full
            log.debug("arena %s refused a row: %s", arena.path, exc)
            return None
        if starts is None:
            return None
        start = int(starts[0])
        where = arena.row(start, row.nbytes).view(row.dtype).reshape(row.shape)
        where[...] = row
        return where, np.array([arena.arena_id, start, 0], dtype=np.int64)

    def put(
        self, columns: dict[str, Any], placed: dict[str, R.Spec] | None = None
    ) -> tuple[dict[str, Any], list[tuple[np.ndarray, R.Spec]]]:
        """Move the eligible columns into the arena (in place in ``columns``): (``Chunk.refs``, what was written).

        ``placed``: the columns ``put_rows`` already wrote (they hold references), with their row specs."""
        described: dict[str, Any] = {}
        written: list[tuple[np.ndarray, R.Spec]] = []
        for name, spec in (placed or {}).items():
            described[name] = {0: [spec[0], list(spec[1])]}
            written.append((columns[name], spec))
        for name, values in list(columns.items()):
            if name == P.INDEX_COLUMN or name in described or not R.eligible(values):
                continue
            refs = R.write_column(self.arena, values)
            if refs is None:
                continue  # full: this column travels inline
            columns[name] = refs
            described[name] = {0: [values.dtype.str, list(values.shape[1:])]}
            written.append((refs, (values.dtype.str, tuple(values.shape[1:]))))
        return described, written

    def put_file_rows(self, columns: dict[str, Any], record: int) -> dict[str, Any]:
        """Replace each eligible column that is a view of a memory-mapped file by references to records
        ``record, record + 1, ...`` of the leased file (in place); their ``Chunk.refs``."""
        described: dict[str, Any] = {}
        for name, values in list(columns.items()):
            if name == P.INDEX_COLUMN or not R.eligible(values) or not _maps_a_file(values):
                continue
            n = len(values)
            refs = np.empty((n, R.REF_WIDTH), dtype=np.int64)
            refs[:, 0], refs[:, 1], refs[:, 2] = FILE_ROWS, np.arange(record, record + n), 0
            columns[name] = refs
            described[name] = {0: [values.dtype.str, list(values.shape[1:])]}
        return described

    def free(self, written: list[tuple[np.ndarray, R.Spec]]) -> None:
        """Give back what ``put`` wrote for a chunk that was never sent."""
        for refs, spec in written:
            R.free_refs(refs, {0: spec}, self._own)

    def _own(self, arena_id: int) -> Arena | None:
        return self.arena if arena_id == self.arena.arena_id else None

    def close(self) -> None:
        self.arena.close()


def _maps_a_file(values: np.ndarray) -> bool:
    """Whether ``values`` are the bytes of a memory-mapped file (not a copy, not inflated)."""
    base: Any = values
    while base is not None:
        if isinstance(base, (np.memmap, mmap.mmap)):
            return True
        base = getattr(base, "base", None)
    return False


__all__ = ["ArenaWriter"]
