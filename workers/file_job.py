"""One lease: read its file and send the daemon its chunks, then FILE_DONE or FILE_ERROR.

A ``FileJob`` belongs to the worker's main thread and lives for one lease. It
does not touch the control channel: between samples it calls the worker's
``check`` (which raises to cancel or stop the job), and it sends through the
worker's ``send_data`` (which waits for room while still obeying cancel and
stop).

Every exception while opening, reading or mapping is caught and reported as
FILE_ERROR naming the file and record (``on_error = "raise"``), or the record
is skipped and counted in FILE_DONE (``on_error = "skip"``). A reader that
raised cannot go on, so the rest of its file is skipped; a mapper that raised
skips only its record, a batch mapper the records of its block.

Batch mappers (``pipeline.batch_mappers``, workers/mapping.py) run on each chunk
just before it is sent: after the per-sample mappers, or straight on the blocks
of the fast path, so a numpy transform runs once per block. They must be
row-wise, since where chunks are cut is no function of the data alone.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from loader.config import LoaderConfig
from loader.errors import MalformedMessageError, MessageTooLargeError, UnsendableSampleError, WorkerError
from loader.service import protocol as P
from loader.service.blocks import block_nbytes, block_rows
from loader.service.shm.file_layout import FileChangedError
from workers.arena_writer import ArenaWriter
from workers.columns import (
    BLOCK_CHUNK_BYTES,
    MAX_BATCH_CHUNK_BYTES,
    MAX_CHUNK_BYTES,
    ChunkBuilder,
    rows_for_bytes,
    value_nbytes,
)
from workers.control import Whereabouts
from workers.file_pin import changed_since_start
from workers.mapping import BatchMappers, SampleMappers
from workers.sample_check import SampleCheck, unsendable_dtype
from workers.sources import FileSource, GroupSource, PieceSource, Source

log = logging.getLogger("loader.worker")

SKIP_BLOCK_ROWS = 4096  # rows per read while reading past records already sent (salvaging a failed block)
SKIPS_LOGGED_PER_LEASE = 5  # bad records a worker names one by one in a lease (on_error = "skip"); then one line


class FileJob:
    """Reads the file of one lease and sends it; ``run()`` once."""

    def __init__(
        self,
        lease: P.Lease,
        *,
        config: LoaderConfig,
        worker_id: str,
        mappers: Callable[[], list[Any]],
        batch_mappers: Callable[[], list[Any]],
        arena: Callable[[], ArenaWriter | None],
        send_data: Callable[[list[Any]], None],
        check: Callable[[], None],
        whereabouts: Whereabouts | None = None,
    ) -> None:
        self.lease, self.config, self.worker_id = lease, config, worker_id
        # The arena is asked for at each chunk: a re-WELCOME during the lease (handled inside
        # ``check``) closes the worker's arena and names a fresh one.
        self._mappers, self._batch_mappers, self._arena = mappers, batch_mappers, arena
        self._send_data, self._check = send_data, check
        self._batch = BatchMappers((), ())  # bound in run()
        self._file_rows = False  # large rows go as references into the leased file (decided in run())
        self._opened: Source | None = None  # the lease's file, group or piece: where a record came from
        # What a message may carry inline: the usual bounds, or half the daemon's largest message when that is
        # smaller (``service.max_message_mib``), so a chunk never outgrows what the daemon accepts.
        self._largest_message = config.service.max_message_mib * 1024 * 1024
        self._chunk_bytes = min(MAX_CHUNK_BYTES, self._largest_message // 2)
        self._block_bytes = min(BLOCK_CHUNK_BYTES, self._largest_message // 2)
        self._chunk_bytes_at_most = min(MAX_BATCH_CHUNK_BYTES, self._largest_message // 2)  # a batch of big rows
        self._skips_logged = 0
        self._sent = 0  # records of the lease sent in chunks (FILE_DONE's count, which the stage checks)
        self._progress: _Progress | None = None  # the sending loop's count of sent and skipped records
        self._where = whereabouts if whereabouts is not None else Whereabouts()  # the record being read or mapped

    def run(self) -> None:
        try:
            self._run()
        finally:
            self._where.at = None  # between leases, nowhere

    def _run(self) -> None:
        try:
            lease = self.lease
            mappers = SampleMappers(self._mappers(), seed=lease.seed, epoch=lease.epoch, file_key=lease.file_key)
            self._batch = BatchMappers(self.config.pipeline.batch_mappers, self._batch_mappers())
            changed = changed_file(lease)
            if changed is not None:
                path, why = changed
                if self._failed(FileChangedError(why), None, path=path):
                    self._done(sent=0, skipped=1)
                return
            source = self._open()
        except Exception as exc:  # every failure travels as a message
            if self._failed(exc, None):
                self._done(sent=0, skipped=1)
            return
        # Only rows nothing changes after the read are the file's rows: no mappers of either kind.
        self._file_rows = (
            self.config.workers.file_rows
            and source.can_read_blocks
            and source.reads_array_file
            and not mappers
            and not self._batch
        )
        try:
            if source.can_read_blocks and not mappers:
                counts = self._send_blocks(source)
            else:
                counts = self._send_samples(source, mappers)
            if counts is not None:
                self._check_unchanged()  # cut short or written after the last chunk: the end of the read
        except _ChangedWhileRead as written:
            counts = self._changed_while_read(written)
        finally:
            source.close()
        if counts is not None:
            self._done(*counts)

    def _check_unchanged(self) -> None:
        """Raise ``_ChangedWhileRead`` when a file read since the last check was written since it was opened
        (``workers.file_pin``): after reading rows and before sending them, so changed rows are never sent."""
        found = self._opened.changed() if self._opened is not None else None
        if found is not None:
            raise _ChangedWhileRead(*found)

    def _changed_while_read(self, changed: _ChangedWhileRead) -> tuple[int, int] | None:
        """FILE_ERROR for a file written while it was read; under ``on_error = "skip"`` the rest of the lease is
        skipped, counted as one record, and the counts for FILE_DONE are returned."""
        if not self._failed(FileChangedError(changed.why), None, path=changed.path):
            return None
        return self._sent, (self._progress.skipped if self._progress is not None else 0) + 1

    def _open(self) -> Source:
        """The lease's file, its group of files or its piece of a file (a fresh reader each call)."""
        lease = self.lease
        source: Source
        if lease.more:
            source = GroupSource(self.config, lease.paths, lease.seen)
        elif lease.piece:
            source = PieceSource(self.config, lease.path, *lease.piece)
        else:
            source = FileSource(self.config, lease.path)
        self._opened = source
        return source

    def _tag(self) -> dict[str, Any]:
        """The fields every message about this lease's file carries."""
        lease = self.lease
        return {
            "stream": lease.stream,
            "file": lease.file,
            "lease": lease.lease,
            "worker": self.worker_id,
            "token": lease.token,
        }

    def _done(self, sent: int, skipped: int) -> None:
        self._send_data(P.encode(P.FileDone(**self._tag(), sent=sent, skipped=skipped)))

    def _failed(self, exc: BaseException, record: int | None, count: int = 1, path: str | None = None) -> bool:
        """Report a failure at ``record`` (of ``path``, by default the lease's first file); True when it and the
        ``count - 1`` records after it are skipped (on_error = "skip")."""
        path = path or self.lease.path
        if self._opened is not None and record is not None:
            path, record = self._opened.locate(record)  # a group's file, a piece's record in its file
        error = WorkerError.from_exception(exc, worker=self.worker_id, file=path, record=record)
        if self.config.pipeline.on_error == "skip":
            if record is None and isinstance(exc, FileChangedError):  # from here on (it counts as one record)
                log.warning("skipping the rest of %s: %s", path, exc)
                return True
            if record is None:  # the file could not be opened (it counts as one record)
                log.warning("skipping %s, which could not be opened: %s: %s", path, type(exc).__name__, exc)
                return True
            # A file of bad records would be a line each: the first few name their record and error, the
            # daemon's summary at the end of the file gives the count.
            self._skips_logged += 1
            if self._skips_logged <= SKIPS_LOGGED_PER_LEASE:
                what = f"record {record}" if count == 1 else f"{count} records from record {record}"
                log.warning("skipping %s of %s: %s: %s", what, path, type(exc).__name__, exc)
            elif self._skips_logged == SKIPS_LOGGED_PER_LEASE + 1:
                log.warning("skipping more records of %s (the daemon logs how many when the file is done)", path)
            return True
        self._send_data(P.encode(P.FileError(**self._tag(), error=error.to_dict())))
        return False

    def _send_blocks(self, source: Source) -> tuple[int, int] | None:
        wanted = self.config.workers.samples_per_message
        batch_size = self.config.pipeline.batch_size
        # A first block of one row tells the row size, so big rows never make a huge first message; a reader
        # that knows it from the file's headers spares that message (one of three for a small file), unless
        # batch mappers may change what a row weighs.
        known = source.row_bytes
        rows = 1
        if known is not None and not self._batch:
            rows = rows_for_bytes(known, wanted, batch_size, self._block_bytes, self._chunk_bytes_at_most)
        done = self._progress = _Progress(record=0)
        fresh: Source | None = None  # a reader reopened to salvage a failed block (closed here)
        if self.lease.start:
            # Records before the lease's start were taken from an earlier lease (a cut or resumed file).
            try:
                _skip_records(source, self.lease.start)
            except Exception as exc:
                self._failed(exc, self.lease.start)
                return (0, 1) if self.config.pipeline.on_error == "skip" else None
            done.record = self.lease.start
        try:
            while True:
                self._check()
                self._where.at = (self.lease.lease, done.record)
                try:
                    block = (fresh or source).read_block(rows)
                except Exception as exc:
                    if self.config.pipeline.on_error != "skip":
                        self._failed(exc, done.record)
                        return None
                    # A block's failure is met at its first record (``read_block``). A reader that stepped past
                    # the damage reads on from after it, here: a re-read (below) cost a reopen and a re-inflated
                    # chunk per bad record (17 s for a chunk of 200 undecodable ones, the worker seen as stalled).
                    lost = getattr(exc, "records_skipped", None)
                    if isinstance(lost, int) and lost >= 1:
                        self._failed(exc, done.record, count=lost)
                        done.skipped += lost
                        done.record += lost
                        continue
                    if fresh is not None:
                        fresh.close()
                    fresh, found = self._salvage(done.record, rows)
                    done.sent += found.sent
                    done.skipped += found.skipped
                    done.record = found.record
                    if fresh is None:
                        return done.sent, done.skipped
                    continue
                if block is None:
                    return done.sent, done.skipped
                n = block_rows(block)
                nbytes = self._send_mapped(done.record, n, "tuple", dict(block), done)
                if nbytes is None:
                    return None
                done.record += n
                # Sized by what is sent too: a batch mapper may make rows bigger than the file's.
                row_bytes = max(block_nbytes(block), nbytes) // max(1, n)
                rows = rows_for_bytes(row_bytes, wanted, batch_size, self._block_bytes, self._chunk_bytes_at_most)
        finally:
            if fresh is not None:
                fresh.close()

    def _salvage(self, first: int, rows: int) -> tuple[Source | None, _Progress]:
        """A block starting at record ``first`` failed (``on_error = "skip"``): read it again one record
        at a time on a fresh reader, send the good records, skip the bad one. Returns the reader to go
        on with, or None when the rest of the file cannot be read."""
        found = _Progress(record=first)
        try:
            source = self._open()
        except Exception as exc:
            self._failed(exc, first)
            found.skipped += 1
            self._rest_lost(first)
            return None, found
        try:
            try:
                _skip_records(source, first)
            except Exception as exc:  # the records before ``first`` read differently this time
                self._failed(exc, first)
                found.skipped += 1
                source.close()
                self._rest_lost(first)
                return None, found
            for _ in range(rows + 1):
                self._check()
                self._where.at = (self.lease.lease, found.record)
                try:
                    block = source.read_block(1)
                except Exception as exc:
                    self._failed(exc, found.record)
                    # A format that stepped past the damage says how many records it lost (a RecordIO
                    # chunk); any other failure leaves the rest of the file unreadable.
                    lost = getattr(exc, "records_skipped", None)
                    if not isinstance(lost, int) or lost < 1:
                        found.skipped += 1
                        source.close()
                        self._rest_lost(found.record)
                        return None, found
                    found.skipped += lost
                    found.record += lost
                    return source, found
                if block is None:
                    break
                # Only under on_error = "skip": a batch mapper's failure is skipped and counted, never final.
                self._send_mapped(found.record, 1, "tuple", dict(block), found)
                found.record += 1
            return source, found
        except BaseException:
            source.close()
            raise

    def _rest_lost(self, record: int) -> None:
        """Say that the file could not be read past ``record``: its records after it are lost uncounted (how
        many is unknown), which "skipped 1 bad record" alone hid."""
        path, at = self._opened.locate(record) if self._opened is not None else (self.lease.path, record)
        log.warning(
            "could not read %s past record %s: its records after it are skipped too, uncounted (how many is unknown)",
            path,
            at,
        )

    def _send_samples(self, source: Source, mappers: SampleMappers) -> tuple[int, int] | None:
        # Rows that go through the arena need no room in the message: a chunk of them may hold a batch of
        # decoded images. At most a quarter of the arena, so a few chunks are in flight at once, and half the
        # daemon's largest message, so the chunk still fits one when the arena is full and it travels inline.
        arena = None if self._batch else self._arena()
        max_ref_bytes = 0
        if arena is not None:
            max_ref_bytes = min(MAX_BATCH_CHUNK_BYTES, arena.capacity_bytes // 4, self._largest_message // 2)
        wanted = self.config.workers.samples_per_message
        builder = ChunkBuilder(source.fields, wanted, max_ref_bytes, self._chunk_bytes, arena)
        group = source if isinstance(source, GroupSource) else None
        checked = 0  # the group's files begun when a sample was last checked against the chunk (below)
        check = SampleCheck(source.fields, stacked=self.config.pipeline.batch_format == "stacked")
        samples = source.samples()
        record, done = 0, _Progress(record=0)  # ``record``: the reader's position; ``done``: sent and skipped
        self._progress = done
        start = self.lease.start  # records before it were taken from an earlier lease: read, not mapped or sent
        where, lease_id = self._where, self.lease.lease
        try:
            while True:
                self._check()
                where.at = (lease_id, record)
                try:
                    sample = next(samples)
                except StopIteration:
                    break
                except Exception as exc:
                    if not self._failed(exc, record):
                        return None
                    lost = getattr(exc, "records_skipped", None)
                    if isinstance(lost, int) and lost >= 1:  # the reader stepped past the damage: go on after it
                        # Only what lies from ``start`` on: the lease that read the records before it counted those.
                        done.skipped += max(0, record + lost - max(record, start))
                        record += lost
                        continue
                    done.skipped += 1
                    self._rest_lost(record)
                    break
                if record < start:
                    record += 1
                    continue
                failure: Exception | None = None
                try:
                    mapped = mappers(sample, record)
                except Exception as exc:
                    failure = exc
                else:
                    if group is not None and group.files_begun != checked:
                        # A group's next file: its samples are named by its own fields, and share the chunk only if
                        # they stack with its samples (as blocks do, ``GroupSource.read_block``). So the stage sees
                        # what one lease per file sends, and fits or refuses it, never ragged rows across files
                        # stacked as objects (or an upcast dtype) without a word.
                        checked = group.files_begun
                        builder.fields = list(group.fields) if group.fields else None
                        check.restart(builder.fields)
                        if not builder.fits(mapped) and not self._flush(builder, done):
                            return None
                    elif builder.fields is None and source.fields is not None:
                        # Names the first good record gave, after a damaged first record (FileSource._after_read).
                        builder.fields = list(source.fields)
                        check.restart(builder.fields)
                    parts, taken = None, True
                    try:
                        parts = check(mapped)  # the parts the check made (one split a sample), for the builder
                        taken = builder.add(record, mapped, parts)
                    except Exception as exc:
                        failure = exc
                    if not taken:
                        # Its big row found no room beside the chunk's rows: the chunk goes, the sample starts the next.
                        if not self._flush(builder, done):
                            return None
                        try:
                            builder.add(record, mapped, parts)
                        except Exception as exc:
                            failure = exc
                    # The builder holds what it keeps (an arena's view of a big row): the mapper's own arrays go
                    # now, so its next sample reuses their memory while the cache still holds it.
                    mapped = sample = None
                if failure is not None:
                    if not self._failed(failure, record):
                        return None
                    done.skipped += 1
                record += 1
                if builder.due and not self._flush(builder, done):
                    return None
            if len(builder) and not self._flush(builder, done):
                return None
            return done.sent, done.skipped
        finally:
            builder.discard()  # rows placed in the arena for a chunk never sent (the file failed or was cancelled)

    def _flush(self, builder: ChunkBuilder, done: _Progress) -> bool:
        """Send the builder's samples as one chunk; False when a failure ended the file (FILE_ERROR sent)."""
        # Big mapped rows (decoded images) go straight from each sample into the arena, sparing a stacked copy
        # (float32 224x224 images: 1.02-1.08 -> 0.82-0.90 worker CPU ms each); not when batch mappers want the block.
        arena = None if self._batch else self._arena()
        columns, records, placed = builder.take_placed(arena)
        parts = inline_parts(columns, placed, int(records.size), self._chunk_bytes)
        for i, rows in enumerate(parts):
            part = columns if rows == slice(None) else {name: values[rows] for name, values in columns.items()}
            taken = records[rows]
            n = int(taken.size)
            skipped_inside = int(taken[-1]) - int(taken[0]) + 1 != n  # the rows then say which records they are
            index = taken if skipped_inside else None
            sent = None
            try:
                sent = self._send_mapped(int(taken[0]), n, builder.kind, part, done, index, placed)
            finally:
                if sent is None and i + 1 < len(parts):  # the file ended here: the later parts' arena rows go back
                    self._free_placed(arena, columns, placed, slice(parts[i + 1].start, None))
            if sent is None:
                return False
        return True

    def _free_placed(
        self, arena: ArenaWriter | None, columns: dict[str, Any], placed: dict[str, Any], rows: slice
    ) -> None:
        """Give back rows ``arena`` took for a chunk never sent; not if a re-WELCOME has replaced it since. An arena
        is picked by id when freeing, and a restarted daemon numbers its arenas afresh: the new one could have
        the old one's id, and these blocks there are another chunk's."""
        if arena is not None and placed and arena is self._arena():
            arena.free([(columns[name][rows], spec) for name, spec in placed.items()])

    def _send_mapped(
        self,
        record: int,
        n: int,
        kind: str,
        columns: dict[str, Any],
        done: _Progress,
        index: Any = None,
        placed: dict[str, Any] | None = None,
    ) -> int | None:
        """Send ``n`` records from ``record`` on through the batch mappers, counted in ``done``.

        Returns the bytes of the columns sent; 0 when the batch mappers failed and the block's records
        are skipped (``on_error = "skip"``); None when the failure was reported as FILE_ERROR.
        """
        if self._batch:
            try:
                columns = self._batch(columns)
            except Exception as exc:
                if not self._failed(exc, record, n):
                    return None
                done.skipped += n
                return 0
        if index is not None:
            columns[P.INDEX_COLUMN] = index
        nbytes = block_nbytes(columns)  # now: sending puts arena references (24 bytes a row) in place of big rows
        try:
            self._send_chunk(record, n, kind, columns, placed)
        except (MessageTooLargeError, UnsendableSampleError) as exc:
            if not self._failed(exc, record, n):
                return None
            done.skipped += n
            return 0
        done.sent += n
        self._sent += n
        return nbytes

    def _send_chunk(
        self, record: int, count: int, sample_kind: str, columns: dict[str, Any], placed: dict[str, Any] | None = None
    ) -> None:
        """Send records ``record``.. as a chunk, its large columns as arena references when they fit (``placed``:
        those already written there)."""
        arena = self._arena()
        refs: dict[str, Any] = {}
        if arena is not None and self._file_rows and P.INDEX_COLUMN not in columns:
            # File rows name rows of the file: a piece's records begin at its first.
            refs = arena.put_file_rows(columns, record + (self.lease.piece[0] if self.lease.piece else 0))
        in_arena, written = arena.put(columns, placed) if arena is not None else ({}, [])
        refs.update(in_arena)
        chunk = P.Chunk(**self._tag(), record=record, count=count, sample_kind=sample_kind, refs=refs or None)
        what = "the sample" if count == 1 else f"a chunk of {count} records from this one"
        try:
            try:
                _refuse_structured(columns)
                frames = P.encode(chunk, columns)
            except (TypeError, ValueError, OverflowError) as exc:  # what a batch mapper made, or a file's dtype
                raise UnsendableSampleError(f"{what} cannot be sent: {exc}") from None
            size = sum(memoryview(frame).nbytes for frame in frames)
            if size > self._largest_message:
                # The daemon's socket would drop it and the file would end in "a chunk was lost": say why here.
                raise MessageTooLargeError(
                    f"{what} takes a message of {size / 1024**2:.1f} MiB, over service.max_message_mib = {self.config.service.max_message_mib} "
                    "(the largest message the daemon accepts from a worker): raise it, or make samples smaller"
                )
            self._check_unchanged()
            self._send_data(frames)
        except BaseException:
            # Cancelled or stopping while the stage was busy: never sent. Only into the arena that wrote them
            # (``_free_placed`` says why).
            if written and arena is not None and arena is self._arena():
                arena.free(written)
            raise


class _ChangedWhileRead(Exception):
    """A file of the lease was written while it was read: ends the sending loops, up to ``FileJob._run``."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(why)
        self.path, self.why = path, why


def changed_file(lease: P.Lease) -> tuple[str, str] | None:
    """The first file of ``lease`` whose size is not what the daemon found at start-up (``Lease.seen``), and why
    (``file_pin.changed_since_start``)."""
    if lease.seen is None:
        return None
    paths = lease.paths
    if len(lease.seen) != len(paths):
        raise MalformedMessageError(f"a lease of {len(paths)} files carries {len(lease.seen)} start-up sizes")
    for path, size in zip(paths, lease.seen):
        why = changed_since_start(path, size)
        if why is not None:
            return path, why
    return None


def inline_parts(columns: dict[str, Any], placed: dict[str, Any], n: int, bound: int = MAX_CHUNK_BYTES) -> list[slice]:
    """The row ranges to send a chunk of ``n`` rows in, by what each row carries inline (its columns not
    placed in the arena): all of it when that is within ``bound`` (``MAX_CHUNK_BYTES``), or past it by the
    last row only (a chunk is due once past the bound); else parts of at most ``bound``, a row larger than
    that alone. So a chunk grown large for the arena that found it full goes in parts of the usual size, and
    a sample too big for any message is sent (and refused, ``MessageTooLargeError``) on its own."""
    if n <= 1:
        return [slice(None)]
    sizes = np.zeros(n, dtype=np.int64)
    for name, values in columns.items():
        if name in placed:
            continue
        if values.dtype.hasobject:
            sizes += np.fromiter((value_nbytes(v) for v in values), dtype=np.int64, count=n)
        else:
            sizes += values.nbytes // n
    if int(sizes.max()) <= bound and int(sizes.sum()) <= bound + int(sizes[-1]):
        return [slice(None)]
    parts, first, held = [], 0, 0
    for row, size in enumerate(sizes.tolist()):
        if row > first and held + size > bound:
            parts.append(slice(first, row))
            first, held = row, 0
        held += size
    parts.append(slice(first, n))
    return parts


def _refuse_structured(columns: dict[str, Any]) -> None:
    """A column of a structured dtype (a ``.npy`` of records) would arrive as raw bytes (``dtype.str`` is
    "|V8"): its fields' names and types lost on the way. One of a zero-width dtype (``|V0``) the daemon drops
    as malformed, and the file failed as "a chunk was lost on the way"."""
    for name, values in columns.items():
        if isinstance(values, np.ndarray) and values.dtype.names is not None:
            raise TypeError(f"field {name!r} has the structured dtype {values.dtype}; make each of its fields a field")
        if isinstance(values, np.ndarray) and values.dtype.itemsize == 0:
            raise TypeError(f"field {name!r} {unsendable_dtype(values.dtype)}")


class _Progress:
    """Records sent and skipped so far, and the next record index to read."""

    def __init__(self, record: int) -> None:
        self.record, self.sent, self.skipped = record, 0, 0


def _skip_records(source: Source, count: int) -> None:
    """Read past the first ``count`` records of a freshly opened source (already sent)."""
    while count > 0:
        try:
            block = source.read_block(min(count, SKIP_BLOCK_ROWS))
        except Exception as exc:
            lost = getattr(exc, "records_skipped", None)
            if not isinstance(lost, int) or lost < 1:
                raise
            count -= lost  # damage stepped past before (and counted then)
            continue
        if block is None:
            raise EOFError(f"{source.path} has fewer records than the {count} more already read from it")
        count -= block_rows(block)


__all__ = ["FileJob"]
