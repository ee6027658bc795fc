"""The stage's side of reference columns: adopt them from chunks, keep them uniform, free what is dropped.

``RefKeeper`` is what ``Stage`` calls so that its dedupe, shuffle and batcher
can treat a reference column like any other column (int64 rows, no data
touched). Its rules:

* One stream column is either references or inline for its whole life (the
  first chunk decides), because the shuffle buffer concatenates blocks. A
  later inline chunk for a reference column (the worker's arena was full, or
  the worker runs on another host) is kept as *local* rows: the received arrays
  themselves, held in a dict and referenced with arena id ``LOCAL_ARENA``. A
  later reference chunk for an inline column is copied out (``materialize``).
* A batch goes to a client as references only when the client maps arenas and
  the batch has no local rows; otherwise its reference columns are copied out
  here, once.
* Rows sent as references are *outstanding* until the client's consumer has
  taken their batch: a CREDIT for that epoch request frees the oldest ones, a new
  EPOCH or the client saying goodbye frees the rest. The client copies a batch when it
  arrives, before its consumer can take it, so this never frees a row being read,
  and a client that dies holds them no longer than that. Every row the stage drops (duplicates,
  cancelled streams, ``drop_last``) is freed through ``release``.
* A client that returns no credit for a batch holds its rows at most
  ``service.reclaim_after_s`` (``reclaim``) from when it was sent, which the
  batch says (``Batch.kept``): a client that copies them later refuses the
  batch. A client dropped without saying goodbye may still copy the batches
  on their way to it, so their rows are set aside as long (``set_aside``).
* A worker's references are believed only for what it holds (``check_owned``,
  before ``adopt``): rows of its own arena, in range, allocated (state byte
  used), not overlapping, and not already held by the stage. Held blocks are
  tracked per arena until released, so a forged or replayed reference can
  neither free a row the stage still holds nor make two rows share blocks.
* File rows (``shm.file_rows``) are believed only as rows of the file the
  coordinator leased for the chunk (the worker names no path), exactly the
  chunk's records, of the dtype and row shape the file's header gives, and
  from a worker with an arena (on this host). Nothing is freed for them; a
  client that cannot read them (``session.shm`` false) gets them copied here.
"""

from __future__ import annotations

import itertools
import math
import time
from collections import deque
from collections.abc import Iterable
from typing import Any

import numpy as np

from loader.service import protocol as P
from loader.service.blocks import Block
from loader.service.daemon.stage_file_rows import bind_file_rows
from loader.service.shm import file_rows as F
from loader.service.shm import refs as R
from loader.service.shm.arena import USED, ArenaError, run_indexes
from loader.service.shm.file_layout import Identity

# Row specs (dtype, shape) the stage keeps interned beyond those its rows name. Past this count, and past
# twice what rows named at the last collection, the unnamed ones are forgotten (``collect_specs``): each
# chunk may name a new spec, so a lease holder claiming another row shape every time would otherwise
# grow the table without bound.
SPECS_KEPT = 1024
DEFAULT_KEEP_S = 60.0  # as service.reclaim_after_s


class RefKeeper:
    def __init__(self, arenas: Any) -> None:
        self.arenas = arenas  # ArenaPool, or None when the fast path is off
        self.specs = R.Specs()
        self._collect_specs_at = SPECS_KEPT
        self.local: dict[int, Any] = {}
        self._local_ids = itertools.count()
        self._held: dict[int, np.ndarray] = {}  # arena id -> per block: held by the stage (adopted, not freed)
        self.files = F.FileTable()
        self.allow_files = True  # workers.file_rows: false refuses file rows too
        self.keep_s = DEFAULT_KEEP_S  # service.reclaim_after_s: how long sent rows stay reserved without a credit
        # Outstanding batches of sessions dropped while their client may still copy them (``set_aside``).
        self._set_aside: deque[tuple[Any, list[np.ndarray], float]] = deque()

    def arena_of(self, arena_id: int) -> Any:
        """The ``Arena`` of an arena id, the open ``RowFile`` of a file id (``FileRowsError`` when unknown)."""
        if F.is_file_id(arena_id):
            return self.files.get(arena_id)
        return self.arenas.get(arena_id) if self.arenas is not None else None

    # -- chunks in ------------------------------------------------------------
    def check_owned(
        self,
        described: dict[str, Any] | None,
        columns: Block,
        own_arena: int | None,
        chunk: P.Chunk | None = None,
        path: str | None = None,
        seen: dict[str, Identity] | None = None,
        first: int = 0,
    ) -> None:
        """``ArenaError`` unless every reference of a chunk is a run of blocks its sender may hand over, or
        rows of the file leased for it (``path``; ``seen``: the lease's files so far; ``first``: the file's
        record where a lease of a piece of it begins; ``bind_file_rows``),
        see the module docstring; marks those blocks held and turns file rows into references to the
        stage's sources."""
        if not described:
            return
        arena = self.arena_of(own_arena) if own_arena is not None else None
        if arena is None or arena.closed:
            raise ArenaError("a chunk carries references, but its sender has no arena of this daemon")
        blocks = []
        bound: dict[str, np.ndarray] = {}
        for name, specs in described.items():
            values = columns.get(name)
            if values is None or values.ndim != 2 or values.shape[1] != R.REF_WIDTH or values.dtype.kind not in "iu":
                raise ArenaError(f"reference column {name!r} is malformed")
            values = values.astype(np.int64, copy=False)
            if len(values) and np.any(values[:, 0] == F.FILE_ROWS):
                if not self.allow_files:
                    raise ArenaError(f"reference column {name!r} names file rows, which workers.file_rows turns off")
                bound[name] = bind_file_rows(self.files, name, values, specs, columns, chunk, path, seen, first)
                continue
            if np.any(values[:, 0] != own_arena):
                raise ArenaError(f"reference column {name!r} names an arena that is not its sender's")
            parsed = R.parse_specs(specs)
            for spec_id in np.unique(values[:, 2]).tolist():
                if spec_id not in parsed:
                    raise ArenaError(f"reference column {name!r} names a spec its header does not describe")
                dtype, shape = parsed[spec_id]
                nbytes = math.prod(shape) * np.dtype(dtype).itemsize  # Python ints: no overflow
                if nbytes > arena.n_blocks * arena.block_bytes:
                    raise ArenaError(f"reference column {name!r} claims rows larger than the arena")
                run = arena.blocks_for(nbytes)
                starts = values[values[:, 2] == spec_id, 1]
                if int(starts.min()) < 0 or int(starts.max()) + run > arena.n_blocks:
                    raise ArenaError(f"reference column {name!r} names blocks outside its arena")
                blocks.append(run_indexes(starts, run))
        taken = np.concatenate(blocks) if blocks else np.zeros(0, np.int64)
        if len(np.unique(taken)) != len(taken):
            raise ArenaError("a chunk's references overlap")
        held = self._held.setdefault(arena.arena_id, np.zeros(arena.n_blocks, dtype=bool))
        if np.any(arena.states[taken] != USED) or np.any(held[taken]):
            raise ArenaError("a chunk references blocks that are free or already handed over")
        held[taken] = True
        columns.update(bound)

    def _unhold(self, refs: np.ndarray) -> None:
        """The stage no longer holds these rows' blocks (they are freed, or about to be)."""
        for arena_id, spec_id in np.unique(refs[:, [0, 2]], axis=0).tolist() if len(refs) else ():
            if arena_id < 0:  # file rows hold no blocks
                continue
            held = self._held.get(arena_id)
            arena = self.arena_of(arena_id)
            if held is None or arena is None or spec_id not in self.specs.specs:
                continue
            run = arena.blocks_for(R.row_nbytes(self.specs.specs[spec_id]))
            starts = refs[(refs[:, 0] == arena_id) & (refs[:, 2] == spec_id), 1]
            held[run_indexes(starts.astype(np.int64), run)] = False

    def forget_arena(self, arena_id: int) -> None:
        self._held.pop(arena_id, None)

    def adopt(self, described: dict[str, Any] | None, columns: Block) -> frozenset[str]:
        """Renumber a chunk's reference columns (``Chunk.refs``) to our specs; their names. ``ArenaError`` when malformed."""
        described = described or {}
        names = []
        for name, specs in described.items():
            values = columns.get(name)
            if values is None or values.ndim != 2 or values.shape[1] != R.REF_WIDTH or values.dtype.kind not in "iu":
                raise ArenaError(f"reference column {name!r} is malformed")
            for spec in specs.values():
                R.parse_specs({0: spec})  # refuses object dtypes
            for arena_id in np.unique(values[:, 0]).tolist():
                if F.is_file_id(arena_id):
                    if F.source_of(arena_id) not in self.files.sources:
                        raise ArenaError(f"reference column {name!r} names a file source this stage does not have")
                    continue
                if self.arena_of(arena_id) is None:
                    raise ArenaError(
                        f"reference column {name!r} names arena {arena_id}, which this daemon does not have"
                    )
            columns[name] = self.specs.adopt(values, specs)
            names.append(name)
        return frozenset(names)

    def conform(self, ref_columns: frozenset[str], columns: Block, names: frozenset[str]) -> Block:
        """``columns`` with exactly ``ref_columns`` as references (see the module docstring)."""
        for name in ref_columns - names:
            if name in columns:
                columns[name] = self._to_local(columns[name])
        for name in names - ref_columns:
            columns[name] = self.materialize(columns[name])
        return columns

    def duplicate(self, refs: np.ndarray) -> np.ndarray:
        """Copies of rows another batch sends too (a padded repeat) as local rows, so that freeing
        one batch's rows never frees the other's. File rows stay references to the same rows: nothing
        frees them, and reading them here (in the loop's turn that ends an epoch's input, which a worker's
        death can take) would fail the daemon when the file changed since, not the batch that carries them."""
        out = np.array(refs, dtype=np.int64, copy=True)
        for i, (arena_id, start, spec_id) in enumerate(refs.tolist()):
            if F.is_file_id(arena_id):
                continue
            if arena_id == R.LOCAL_ARENA:
                # Local rows are never written to: sharing one is safe, and a row that is not an array (an
                # object column's value) must stay what it is (``materialize``).
                row = self.local[start]
            else:
                one = np.array([[arena_id, start, spec_id]], dtype=np.int64)
                row = R.gather(one, self.specs.specs, self.arena_of, free=False)[0]
            out[i] = self._to_local([row])[0]
        return out

    def row_layouts(self, refs: np.ndarray) -> set[tuple[str, tuple[int, ...]] | None]:
        """The (dtype, shape) of the rows a reference column names (None for an object row): what the
        stage checks against its batch, since the column itself is three integers a row."""
        arena_rows = refs[refs[:, 0] != R.LOCAL_ARENA]
        out: set[tuple[str, tuple[int, ...]] | None] = {
            self.specs.specs[i] for i in np.unique(arena_rows[:, 2]).tolist()
        }
        for key in refs[refs[:, 0] == R.LOCAL_ARENA, 1].tolist():
            row = self.local[key]
            # A row that is not an array (an object column's value: nested lists of any shape, a dict)
            # is an object row; numpy may not even make an array of it.
            fixed = isinstance(row, np.ndarray) and not row.dtype.hasobject
            out.add((row.dtype.str, tuple(row.shape)) if fixed else None)
        return out

    def _to_local(self, values: Any) -> np.ndarray:
        refs = np.empty((len(values), R.REF_WIDTH), dtype=np.int64)
        for i in range(len(values)):
            key = next(self._local_ids)
            self.local[key] = values[i]
            refs[i] = (R.LOCAL_ARENA, key, -1)
        return refs

    # -- copying out and freeing ---------------------------------------------
    def materialize(self, refs: np.ndarray) -> np.ndarray:
        """The rows' data as an inline column (one copy); arena rows are freed, local rows forgotten."""
        self._unhold(refs[refs[:, 0] != R.LOCAL_ARENA] if len(refs) else refs)
        if len(refs) and not np.any(refs[:, 0] == R.LOCAL_ARENA):
            return R.gather(refs, self.specs.specs, self.arena_of)
        rows = []
        for arena_id, start, spec_id in refs.tolist():
            if arena_id == R.LOCAL_ARENA:
                # As received: ``np.asarray`` would make a dict or None row a 0-d object array, which no
                # batch can carry (the codec refuses object arrays), so sending it would raise.
                rows.append(self.local.pop(start))
            else:
                one = np.array([[arena_id, start, spec_id]], dtype=np.int64)
                rows.append(R.gather(one, self.specs.specs, self.arena_of)[0])
        try:
            stacked = np.stack(rows) if rows else np.zeros((0,), np.uint8)
            if not stacked.dtype.hasobject:
                return stacked
        except (ValueError, TypeError):
            pass
        return P.object_array(rows)

    def release(self, refs: np.ndarray) -> None:
        """Free rows nobody will read."""
        if len(refs) == 0:
            return
        local = refs[:, 0] == R.LOCAL_ARENA
        for key in refs[local, 1].tolist():
            self.local.pop(key, None)
        self._unhold(refs[~local])
        R.free_refs(refs[~local], self.specs.specs, self.arena_of)

    def release_blocks(self, blocks: Iterable[Block], names: frozenset[str]) -> None:
        for block in blocks:
            for name in names:
                if name in block:
                    self.release(block[name])

    # -- batches out ----------------------------------------------------------
    def outbound(
        self, session: Any, batch: Block, ref_columns: frozenset[str], gen: int | None
    ) -> tuple[Block, dict[str, Any] | None, dict[int, Any] | None]:
        """(the batch to send, its ``Batch.refs``, its ``Batch.files``): references where the client maps
        arenas (and so shares this host and its files), copies elsewhere.

        Sent references are recorded as outstanding for ``session`` under request ``gen`` (also an
        empty entry, so that credits line up with batches).
        """
        batch = dict(batch)
        sent: list[np.ndarray] = []
        described = {}
        files: dict[int, Any] = {}
        for name in ref_columns:
            refs = batch.get(name)
            if refs is None:
                continue
            if session.shm and not np.any(refs[:, 0] == R.LOCAL_ARENA):
                described[name] = self.specs.describe(refs)
                files.update(self.files.describe(refs[:, 0]))
                sent.append(refs)
            else:
                batch[name] = self.materialize(refs)
        session.outstanding.append((gen, sent, time.monotonic()))
        return batch, described or None, files or None

    def credited(self, session: Any, gen: Any, count: int) -> None:
        """The client's consumer took ``count`` more batches of request ``gen``: free their rows."""
        queue: deque = session.outstanding
        while count > 0 and queue and queue[0][0] == gen:
            for refs in queue.popleft()[1]:
                self.release(refs)
            count -= 1

    def reclaim(self, sessions: Iterable[Any], now: float) -> None:
        """Free the rows of batches sent more than ``keep_s`` ago whose credit never came back, and those set
        aside for as long.

        The sessions' entries stay (empty), so credits still line up with batches."""
        after_s = self.keep_s
        if self._set_aside and any(now - sent_at > after_s for _, _, sent_at in self._set_aside):
            # In the order sessions were dropped, not sent: each looked at (a few per session dropped).
            kept: deque[tuple[Any, list[np.ndarray], float]] = deque()
            for entry in self._set_aside:
                if now - entry[2] > after_s:
                    for refs in entry[1]:
                        self.release(refs)
                else:
                    kept.append(entry)
            self._set_aside = kept
        for session in sessions:
            queue: deque = session.outstanding
            for i in range(len(queue)):
                gen, sent, sent_at = queue[i]
                if now - sent_at <= after_s:
                    break
                if sent:
                    for refs in sent:
                        self.release(refs)
                    queue[i] = (gen, [], sent_at)

    def set_aside(self, session: Any) -> None:
        """A session dropped while its client may still copy the batches sent to it (it went silent: stopped,
        paused in a debugger, starved of CPU; or another client took its rank): their rows stay reserved
        until ``keep_s`` after each was sent, the time each ``Batch.kept`` promised. Freed at once, they were
        given to other rows, and a client that woke up copied those into its batches as its own."""
        for entry in session.outstanding:
            if entry[1]:
                self._set_aside.append(entry)
        session.outstanding.clear()

    def release_outstanding(self, session: Any) -> None:
        """A new epoch request (the client copied every earlier batch it will read) or the client left."""
        while session.outstanding:
            for refs in session.outstanding.popleft()[1]:
                self.release(refs)

    def _kept(self, sessions: Iterable[Any]) -> list[Iterable[tuple[Any, list[np.ndarray], float]]]:
        """The batches sent whose rows are kept: each session's outstanding ones, and those set aside."""
        return [*(session.outstanding for session in sessions), self._set_aside]

    def held(self, buffered: Iterable[tuple[Block, frozenset[str]]], sessions: Iterable[Any]) -> set[int]:
        """Arena ids the stage still holds references into: buffered (block, reference column names)
        pairs and the sessions' outstanding batches."""
        ids: set[int] = set()
        for refs in _reference_columns(buffered, self._kept(sessions)):
            ids.update(np.unique(refs[:, 0]).tolist())
        return ids

    @property
    def specs_due(self) -> bool:
        """Whether enough specs were interned since the last collection to look for unnamed ones."""
        return max(len(self.specs.specs), len(self.files.sources)) > self._collect_specs_at

    def collect_specs(self, buffered: Iterable[tuple[Block, frozenset[str]]], sessions: Iterable[Any]) -> None:
        """Forget the specs no buffered or outstanding row names (as ``held``: every row the stage
        keeps); called between messages, so no chunk's rows are on their way in."""
        named: set[int] = set()
        sources: set[int] = set()
        for refs in _reference_columns(buffered, self._kept(sessions)):
            named.update(np.unique(refs[refs[:, 0] != R.LOCAL_ARENA, 2]).tolist())
            sources.update(np.unique(refs[refs[:, 0] <= F.FILE_ROWS, 0]).tolist())
        self.specs.keep_only(named)
        self.files.keep_only(sources)
        self._collect_specs_at = max(SPECS_KEPT, 2 * len(named))


def _reference_columns(
    buffered: Iterable[tuple[Block, frozenset[str]]], sent: Iterable[Iterable[tuple[Any, list[np.ndarray], float]]]
) -> Iterable[np.ndarray]:
    """Every reference column the stage keeps: in buffered (block, reference column names) pairs and in
    the batches sent whose rows are kept (``RefKeeper._kept``)."""
    for block, names in buffered:
        for name in names:
            if name in block:
                yield block[name]
    for batches in sent:
        for _, refs, _ in batches:
            yield from refs


__all__ = ["RefKeeper", "SPECS_KEPT"]
