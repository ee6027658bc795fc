"""Reference columns: a column of large rows kept in arenas, carried as small int64 references.

A reference column is an int64 array of shape ``(n, 3)``: per row ``[arena id,
first block, spec id]``, where the spec (``Specs``) is the row's dtype and
shape. The stage's dedupe, shuffle and batcher move these rows like any other
column, touching no sample data. On the wire the column is an ordinary int64
frame and the message header says which columns are references and what their
specs are (``"refs": {name: {spec id: [dtype, shape]}}``).

A reference may also name a row of a local ``.npy``/``.npz`` file instead of
an arena (a negative id, ``file_rows``); ``gather`` reads those from the file.

``write_column`` (a worker) copies a column's rows into its arena, one run of
blocks per row, so rows can later be freed one by one after the shuffle split
them up. ``gather`` (the client, or the stage for a client that cannot map
arenas) copies rows into one fresh contiguous array per column (the one copy
of the fast path) and frees their blocks. ``free_refs`` frees rows nobody
will read (duplicates, cancelled streams, batches of a client that left).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from loader.service.shm.arena import Arena, ArenaError
from loader.service.shm.file_rows import FileRowsError, is_file_id, source_of

# Rows smaller than this travel inline: a reference saves little, and rounding to blocks would waste more.
MIN_REF_ROW_BYTES = 64 * 1024
LOCAL_ARENA = -1  # reserved id: never an arena (the stage's own inline rows)
REF_WIDTH = 3  # arena id, first block, spec id

Spec = tuple[str, tuple[int, ...]]
ArenaOf = Callable[[int], Any]  # an id -> its Arena or file_rows.RowFile (None when gone)


class Specs:
    """Interned row specs (dtype string, row shape) -> small ints, for one process."""

    def __init__(self) -> None:
        self._ids: dict[Spec, int] = {}
        self.specs: dict[int, Spec] = {}
        self._next = itertools.count()  # never reused: an id forgotten (``keep_only``) names nothing again

    def intern(self, dtype: str, shape: Any) -> int:
        spec = (str(dtype), tuple(int(d) for d in shape))
        spec_id = self._ids.get(spec)
        if spec_id is None:
            spec_id = self._ids[spec] = next(self._next)
            self.specs[spec_id] = spec
        return spec_id

    def keep_only(self, spec_ids: set[int]) -> None:
        """Forget every spec but these (the ones rows still name)."""
        for spec_id in [i for i in self.specs if i not in spec_ids]:
            del self._ids[self.specs.pop(spec_id)]

    def describe(self, refs: np.ndarray) -> dict[int, list[Any]]:
        """The wire form of the specs ``refs`` use: ``{spec id: [dtype, shape]}``."""
        return {int(i): [self.specs[int(i)][0], list(self.specs[int(i)][1])] for i in np.unique(refs[:, 2])}

    def adopt(self, refs: np.ndarray, described: Mapping[Any, Any]) -> np.ndarray:
        """``refs`` from a peer, renumbered to this table's spec ids (a new array)."""
        mapping = {int(k): self.intern(v[0], v[1]) for k, v in described.items()}
        out = np.array(refs, dtype=np.int64, copy=True)
        if mapping:
            keys = np.fromiter(mapping.keys(), np.int64)
            values = np.fromiter(mapping.values(), np.int64)
            order = np.argsort(keys)
            pos = np.searchsorted(keys[order], out[:, 2])
            if np.any(pos >= len(keys)) or np.any(keys[order][np.minimum(pos, len(keys) - 1)] != out[:, 2]):
                raise ArenaError("a reference column names a spec its header does not describe")
            out[:, 2] = values[order][pos]
        elif len(out):
            raise ArenaError("a reference column has no specs")
        return out


MAX_SPEC_DIMENSIONS = 32  # as frames.MAX_DIMENSIONS
MAX_ROW_BYTES = 1 << 40  # no arena or file row is larger; beyond it a claimed shape is a lie


def parse_specs(described: Mapping[Any, Any]) -> dict[int, Spec]:
    """``{spec id: (dtype, shape)}`` from the wire form, refusing object dtypes."""
    specs: dict[int, Spec] = {}
    for key, (dtype, shape) in described.items():
        try:
            parsed = np.dtype(dtype)
        except Exception as exc:  # numpy raises TypeError, ValueError, even SyntaxError for odd strings
            raise ArenaError(f"a reference column claims an unknown dtype {str(dtype)[:40]!r}") from exc
        if parsed.hasobject or parsed.itemsize == 0 or parsed.shape != () or parsed.names is not None:
            raise ArenaError(f"a reference column claims dtype {str(dtype)[:40]!r}")  # objects, subarrays, records
        dims = tuple(int(d) for d in shape)
        nbytes = parsed.itemsize
        for d in dims:  # Python ints: a product numpy would wrap around in int64 is refused, not believed
            nbytes *= max(d, 1)  # a 0 makes a row empty, but numpy still refuses a shape whose others overflow
        if len(dims) > MAX_SPEC_DIMENSIONS or any(d < 0 for d in dims) or nbytes > MAX_ROW_BYTES:
            raise ArenaError(f"a reference column claims rows of shape {str(dims)[:60]} and dtype {str(dtype)[:40]!r}")
        specs[int(key)] = (str(dtype), dims)
    return specs


def row_nbytes(spec: Spec) -> int:
    dtype, shape = spec
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def eligible(values: Any, min_row_bytes: int = MIN_REF_ROW_BYTES) -> bool:
    """Whether a column would travel by reference: a fixed dtype and rows of at least ``min_row_bytes``."""
    return (
        isinstance(values, np.ndarray)
        and values.ndim >= 1
        and len(values) > 0
        and not values.dtype.hasobject
        and values.dtype.names is None  # a row spec is dtype.str: a structured dtype's fields would be lost
        and values.nbytes // len(values) >= min_row_bytes
    )


def write_column(arena: Arena, rows: np.ndarray | Sequence[np.ndarray], spec_id: int = 0) -> np.ndarray | None:
    """Copy each row into ``arena``; the ``(n, 3)`` references, or None when it is full (nothing taken).

    ``rows`` is a column (an array with a leading axis of rows) or its rows as separate arrays of one dtype
    and shape: a chunk's samples written straight into the arena, with no stacked copy first."""
    n = len(rows)
    dtype, shape, row_bytes = rows[0].dtype, rows[0].shape, rows[0].nbytes
    starts = arena.alloc(n, arena.blocks_for(row_bytes))
    if starts is None:
        return None
    block = arena.block_bytes
    for row, start in zip(rows, starts.tolist()):
        arena.data[start * block : start * block + row_bytes].view(dtype).reshape(shape)[...] = row
    refs = np.empty((n, REF_WIDTH), dtype=np.int64)
    refs[:, 0], refs[:, 1], refs[:, 2] = arena.arena_id, starts, spec_id
    return refs


def gather(
    refs: np.ndarray,
    specs: Mapping[int, Spec],
    arena_of: ArenaOf,
    *,
    free: bool = True,
    empty: Callable[[int], np.ndarray] | None = None,
) -> np.ndarray:
    """The rows of ``refs`` as one fresh array (an object array of rows when their specs differ); frees them.

    ``arena_of`` gives an ``Arena`` for an arena id and a ``file_rows.RowFile`` for a file id; ``empty``
    gives the memory of the array, uninitialised ``uint8`` of a size (``np.empty`` when not given)."""
    n = len(refs)
    spec_ids = np.unique(refs[:, 2]) if n else np.zeros(0, np.int64)
    missing = set(spec_ids.tolist()) - set(specs)
    if missing:  # a client's specs come from the daemon's message: a bad one is one line, not a KeyError
        raise ArenaError(f"a reference names row spec {min(missing)}, which its message does not describe")
    nbytes_of = {int(spec_id): row_nbytes(specs[int(spec_id)]) for spec_id in spec_ids.tolist()}
    for spec_id, nbytes in nbytes_of.items():  # before allocating what the references claim
        _check_rows_fit(refs[refs[:, 2] == spec_id], nbytes, arena_of)
    _check_disjoint(refs, np.array([nbytes_of[s] for s in refs[:, 2].tolist()], dtype=np.int64), arena_of)
    out: np.ndarray
    if len(spec_ids) == 1:
        dtype, shape = specs[int(spec_ids[0])]
        nbytes = nbytes_of[int(spec_ids[0])]
        raw = (np.empty(n * nbytes, dtype=np.uint8) if empty is None else empty(n * nbytes)).reshape(n, nbytes)
        _copy_rows(refs, raw, nbytes, arena_of)
        out = raw.view(np.dtype(dtype)).reshape((n, *shape))
    else:
        out = np.empty(n, dtype=object)
        for i, spec_id in enumerate(refs[:, 2].tolist()):
            dtype, shape = specs[spec_id]
            one = np.empty((1, nbytes_of[spec_id]), dtype=np.uint8)
            _copy_rows(refs[i : i + 1], one, one.shape[1], arena_of)
            out[i] = one[0].view(dtype).reshape(shape)
    if free:
        free_refs(refs, specs, arena_of)
    return out


def _check_rows_fit(refs: np.ndarray, nbytes: int, arena_of: ArenaOf) -> None:
    """Refuse references whose rows of ``nbytes`` lie outside their arena or file, before any allocation:
    the references come from a peer, and a claimed row size is only a number until checked."""
    for ref_id in np.unique(refs[:, 0]).tolist():
        starts = refs[refs[:, 0] == ref_id, 1]
        first, last = int(starts.min()), int(starts.max())
        if is_file_id(ref_id):
            source = arena_of(ref_id)
            layout = getattr(source, "layout", None)
            if layout is None:
                continue  # read_rows names a source that is not open
            if nbytes != layout.row_bytes:
                raise FileRowsError(
                    f"{layout.file}: a reference claims rows of {nbytes} bytes, the header says otherwise"
                )
            if first < 0 or last >= layout.rows:
                raise FileRowsError(
                    f"{layout.file}: row {first if first < 0 else last} is outside its {layout.rows} rows"
                )
            continue
        arena = _arena(arena_of, ref_id)
        size = arena.readable_bytes()  # not the mapping's length: the file may have been truncated since
        if first < 0 or last * arena.block_bytes + nbytes > size:
            raise ArenaError(
                f"a reference claims a row of {nbytes} bytes at block {first if first < 0 else last} of arena "
                f"{ref_id}, which holds {size} bytes"
            )


def _check_disjoint(refs: np.ndarray, row_bytes: np.ndarray, arena_of: ArenaOf) -> None:
    """Refuse references whose rows share bytes (``row_bytes[i]`` is row i's size; each row already fits).

    The rows of one message never overlap (a worker writes each into blocks of its own, the daemon hands
    each row out once), so a message that says otherwise is broken or hostile: 100,000 references to one
    64 KiB block would otherwise be copied into a 6.5 GB batch."""
    for ref_id in np.unique(refs[:, 0]).tolist():
        mine = refs[:, 0] == ref_id
        starts = refs[mine, 1]
        if is_file_id(ref_id):  # rows of a file: one size, so distinct rows never overlap
            if len(np.unique(starts)) != len(starts):  # a bad message (ArenaError), not a changed file
                raise ArenaError(f"references name a row of file source {source_of(ref_id)} twice")
            continue
        block = _arena(arena_of, ref_id).block_bytes
        order = np.argsort(starts, kind="stable")
        begins = starts[order] * block  # no overflow: every row fits in its arena (``_check_rows_fit``)
        ends = begins + row_bytes[mine][order]
        if len(begins) > 1 and np.any(ends[:-1] > begins[1:]):
            raise ArenaError(f"references name overlapping rows of arena {ref_id}")


def _copy_rows(refs: np.ndarray, raw: np.ndarray, nbytes: int, arena_of: ArenaOf) -> None:
    """Copy each referenced row into its row of ``raw``; consecutive rows of one file in one read."""
    ids, starts, n = refs[:, 0].tolist(), refs[:, 1].tolist(), len(refs)
    i = 0
    while i < n:
        ref_id, start = ids[i], starts[i]
        if is_file_id(ref_id):
            j = i + 1
            while j < n and ids[j] == ref_id and starts[j] == starts[j - 1] + 1:
                j += 1
            source = arena_of(ref_id)
            if source is None or source.closed:
                raise FileRowsError(f"a reference names file source {source_of(ref_id)}, which is not open")
            source.read_rows(start, j - i, raw[i:j], nbytes)
            i = j
        else:
            raw[i] = _arena(arena_of, ref_id).row(start, nbytes)
            i += 1


def free_refs(refs: np.ndarray, specs: Mapping[int, Spec], arena_of: ArenaOf) -> None:
    """Give the rows' blocks back; rows of arenas already gone are skipped (nothing to free)."""
    if len(refs) == 0:
        return
    for arena_id, spec_id in np.unique(refs[:, [0, 2]], axis=0).tolist():
        if arena_id < 0:  # local rows and file rows: nothing to free
            continue
        try:
            arena = arena_of(arena_id)
        except ArenaError:
            continue
        if arena is not None and not arena.closed:
            starts = refs[(refs[:, 0] == arena_id) & (refs[:, 2] == spec_id), 1]
            arena.free(starts, arena.blocks_for(row_nbytes(specs[spec_id])))


def _arena(arena_of: ArenaOf, arena_id: int) -> Arena:
    arena = arena_of(int(arena_id))
    if arena is None or arena.closed:
        raise ArenaError(f"a reference names arena {arena_id}, which is gone")
    return arena


__all__ = [
    "Specs",
    "MIN_REF_ROW_BYTES",
    "LOCAL_ARENA",
    "eligible",
    "write_column",
    "gather",
    "free_refs",
    "parse_specs",
    "row_nbytes",
]
