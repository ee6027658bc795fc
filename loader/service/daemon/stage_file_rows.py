"""The stage's check of a worker's file-row column (``shm.file_rows``): bound to the leased file or refused.

A worker names no path: its references say "row ``record`` of the file this
lease is for". ``bind_file_rows`` takes the path from the coordinator's lease,
the layout from the file's header (``FileTable.resolve``), and accepts the
column only when its rows are exactly the chunk's records, inside the array,
of the header's dtype and row shape. Anything else is one ``ArenaError`` line:
the daemon drops the chunk and counts it, before anything of it is kept.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from loader.service import protocol as P
from loader.service.blocks import Block
from loader.service.shm import file_rows as F
from loader.service.shm import refs as R
from loader.service.shm.arena import ArenaError
from loader.service.shm.file_layout import FileChangedError, Identity


def bind_file_rows(
    files: F.FileTable,
    name: str,
    values: np.ndarray,
    specs: dict[Any, Any],
    columns: Block,
    chunk: P.Chunk | None,
    path: str | None,
    seen: dict[str, Identity] | None = None,
    first: int = 0,
) -> np.ndarray:
    """A worker's file-row column as references to the leased file's source; ``ArenaError`` unless its
    rows are exactly the chunk's records (from ``first`` on in the file, for a lease of a piece of it),
    inside the file, of the header's dtype and row shape.

    ``seen`` (the lease's, kept by the coordinator) pins each file to its identity at the grant, or for a
    companion at its first rows: the worker goes on reading the file it opened, so a path replaced since (a
    rename over it) names other rows than the ones that travel inline beside them; those are refused,
    never mixed."""
    if chunk is None or path is None:
        raise ArenaError(f"reference column {name!r} names file rows, but no file is leased for its chunk")
    if np.any(values[:, 0] != F.FILE_ROWS):
        raise ArenaError(f"reference column {name!r} mixes file rows and arena rows")
    index = columns.get(P.INDEX_COLUMN)
    if index is not None:
        expected = np.asarray(index, dtype=np.int64)
    else:
        expected = np.arange(chunk.record, chunk.record + chunk.count, dtype=np.int64)
    expected = expected + first
    if not np.array_equal(values[:, 1], expected):
        raise ArenaError(f"reference column {name!r} names file rows other than its chunk's records")
    ref_id, layout = files.resolve(path, name)  # FileRowsError (an ArenaError) names the file
    if seen is not None and seen.setdefault(layout.file, layout.identity) != layout.identity:
        raise FileChangedError(f"{layout.file} changed while its lease was read (size, mtime or inode)")
    parsed = R.parse_specs(specs)
    for spec_id in np.unique(values[:, 2]).tolist():
        claimed = parsed.get(spec_id)
        if claimed is None or np.dtype(claimed[0]) != np.dtype(layout.dtype) or claimed[1] != layout.row_shape:
            raise ArenaError(
                f"reference column {name!r} claims rows of {claimed}; {layout.file} holds "
                f"{layout.dtype} rows of shape {layout.row_shape}"
            )
    if int(expected.max()) >= layout.rows:
        raise ArenaError(f"reference column {name!r} names row {int(expected.max())}; {layout.file} has {layout.rows}")
    out = np.array(values, dtype=np.int64, copy=True)
    out[:, 0] = ref_id
    return out


__all__ = ["bind_file_rows"]
