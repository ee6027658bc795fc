"""File rows: large rows of a local ``.npy``/``.npz`` sent as references into the file itself.

A row read by the block fast path from a memory-mapped array already lies in
the page cache. Copying it into an arena and again into the batch costs two
copies; a reference to ``(file, row)`` lets the client read it straight into
the batch (one copy). A reference column of file rows has the arena layout
(``refs.REF_WIDTH`` int64 per row) with a negative id in place of the arena:

* in a worker's chunk, ``[FILE_ROWS, record, spec]``: "row ``record`` of the
  file this lease is for". The worker never names a path: the stage binds the
  reference to the path the coordinator leased, so a worker cannot make anyone
  read a file it was not given;
* in the stage and in batches, ``[file_id(source), row, spec]``, where the
  source (``Layout``) names the file, the member and the file's identity.

Whoever reads rows (the stage for a client on another host, the client)
takes dtype, shape and offset from the file's own header (``file_layout``) (never unpickling:
object dtypes are refused), checks every row index against the row count, and
refuses a file whose size, mtime or inode is not what the stage saw, with one
``FileRowsError``. Rows are copied with ``preadv`` into the destination rather
than through a mapping: a file truncated under a mapping would kill the reader
with SIGBUS, a short read is only an error.
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from typing import Any

import numpy as np

from loader.service.shm.file_layout import FileChangedError, FileRowsError, Layout, identity, member_file, read_layout

FILE_ROWS = -2  # column 0 of a worker's file-row reference: the leased file; the stage's ids go down from here
MAX_OPEN_FILES = 64  # file descriptors a reader keeps open for file rows (least recently used closed first)
OPEN_FILE_IDLE_S = 30.0  # a reader closes a file unused this long (an open one keeps a deleted file's space)


def file_id(source: int) -> int:
    """The reference id of source ``source`` (0, 1, ...): -2, -3, ..."""
    return FILE_ROWS - source


def source_of(ref_id: int) -> int:
    return FILE_ROWS - ref_id


def is_file_id(ref_id: int) -> bool:
    return ref_id <= FILE_ROWS


class RowFile:
    """One open member: copies its rows into a destination, checking the file is still the one described."""

    def __init__(self, layout: Layout, fd: int) -> None:
        self.layout, self._fd = layout, fd

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def read_rows(self, first: int, count: int, out: np.ndarray, row_bytes: int) -> None:
        """Rows ``first .. first + count - 1`` into ``out`` (``count * row_bytes`` contiguous bytes)."""
        layout = self.layout
        if row_bytes != layout.row_bytes:
            raise FileRowsError(
                f"{layout.file}: a reference claims rows of {row_bytes} bytes, the header says otherwise"
            )
        if first < 0 or count < 0 or first + count > layout.rows:
            raise FileRowsError(f"{layout.file}: row {first + count - 1} is outside its {layout.rows} rows")
        try:
            if identity(os.fstat(self._fd)) != layout.identity:
                raise FileChangedError(f"{layout.file} changed while its rows were in flight (size, mtime or inode)")
            view = out.data.cast("B")  # a C-contiguous run of rows of the destination
            total, done = count * row_bytes, 0
            offset = layout.offset + first * row_bytes
            while done < total:
                got = os.preadv(self._fd, [view[done:total]], offset + done)
                if got <= 0:
                    raise FileChangedError(f"{layout.file} changed while its rows were in flight (it is shorter)")
                done += got
        except OSError as exc:
            # EIO, or ESTALE once a dataset on NFS is replaced: the file's fault, as a change is, so that epoch
            # fails naming it and the client stays usable (raw, it ended the client blaming the daemon).
            raise FileRowsError(f"{layout.file}: its rows cannot be read: {exc.strerror or exc}") from None

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class FileTable:
    """The stage's sources: ``(leased path, member)`` -> a ``Layout`` checked against the file now."""

    def __init__(self) -> None:
        self.sources: dict[int, Layout] = {}
        self._current: dict[tuple[str, str], int] = {}
        self._next = 0
        self.readers = RowFiles()  # the stage's own reads (a client on another host)

    def resolve(self, path: str, member: str) -> tuple[int, Layout]:
        """(reference id, layout) of ``member`` of ``path``; a changed file gets a new source."""
        key = (path, member)
        source = self._current.get(key)
        if source is not None and source in self.sources:
            layout = self.sources[source]
            try:
                if identity(os.stat(layout.file)) == layout.identity:
                    return file_id(source), layout
            except OSError as exc:
                raise FileRowsError(f"cannot stat {layout.file}: {exc}") from exc
        layout, fd = read_layout(path, member)
        os.close(fd)
        source, self._next = self._next, self._next + 1
        self.sources[source] = layout
        self._current[key] = source
        return file_id(source), layout

    def get(self, ref_id: int) -> RowFile:
        layout = self.sources.get(source_of(ref_id))
        if layout is None:
            raise FileRowsError(f"a reference names file source {source_of(ref_id)}, which the stage does not have")
        return self.readers.open(layout.describe())

    def describe(self, ids: Any) -> dict[int, list[Any]]:
        """``{source: [path, member, size, mtime_ns, inode, device]}`` for the file ids among ``ids``."""
        return {
            source_of(int(i)): self.sources[source_of(int(i))].describe()
            for i in np.unique(ids).tolist()
            if is_file_id(int(i))
        }

    def keep_only(self, ids: set[int]) -> None:
        """Forget the sources no row names (by reference id)."""
        named = {source_of(i) for i in ids if is_file_id(i)}
        for source in [s for s in self.sources if s not in named]:
            del self.sources[source]
        for key in [k for k, s in self._current.items() if s not in self.sources]:
            del self._current[key]

    def close(self) -> None:
        self.readers.close()


class RowFiles:
    """A reader's open files for file rows, by their description; at most ``MAX_OPEN_FILES`` stay open."""

    def __init__(self) -> None:
        self._open: OrderedDict[tuple[Any, ...], RowFile] = OrderedDict()
        self._used: dict[tuple[Any, ...], float] = {}
        self._next_evict = 0.0

    def open(self, described: list[Any]) -> RowFile:
        """The member ``described`` names (``Layout.describe``), refused unless the file is still that one."""
        key = tuple(described)
        self._used[key] = time.monotonic()
        found = self._open.get(key)
        if found is not None:
            self._open.move_to_end(key)
            return found
        path, member, *expected = described
        layout, fd = read_layout(str(path), str(member))
        if list(layout.identity) != expected:
            os.close(fd)
            raise FileRowsError(
                f"{layout.file} changed since the loader daemon read its header (size, mtime or inode differ); "
                "its rows cannot be read"
            )
        row_file = self._open[key] = RowFile(layout, fd)
        while len(self._open) > MAX_OPEN_FILES:
            old, oldest = self._open.popitem(last=False)
            oldest.close()
            self._used.pop(old, None)
        return row_file

    def evict_idle(self, now: float) -> None:
        """Close the files unused for ``OPEN_FILE_IDLE_S`` (looked at once a second at most)."""
        if now < self._next_evict:
            return
        self._next_evict = now + 1.0
        for key in [k for k, used in self._used.items() if now - used >= OPEN_FILE_IDLE_S]:
            del self._used[key]
            row_file = self._open.pop(key, None)
            if row_file is not None:
                row_file.close()

    def close(self) -> None:
        for row_file in self._open.values():
            row_file.close()
        self._open.clear()
        self._used.clear()


__all__ = [
    "FILE_ROWS",
    "FileChangedError",
    "FileRowsError",
    "FileTable",
    "Layout",
    "RowFile",
    "RowFiles",
    "file_id",
    "is_file_id",
    "member_file",
    "read_layout",
    "source_of",
]
