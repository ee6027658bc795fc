"""The stage: worker chunks in, exactly-once, shuffled, batched, credit-paced batches out.

One ``Session`` per attached client (rank, world_size). Each epoch a client asks
for is a ``Stream`` with its own id: it knows its share of files, the records
already delivered per file (``FileLedger``), a seeded shuffle buffer and a
batcher. Chunks carry (stream, file, first record, count) so a chunk from a
cancelled stream is simply dropped, and a file re-read after a worker died is
de-duplicated.

A stream's input is complete when every file of its share has its FILE_DONE
marker and all the records that marker announced; then the shuffle buffer is
flushed, the last batch sent (unless drop_last) and END follows. Batches are
sent only while the client has credits (its prefetch depth), and
``may_lease`` tells the coordinator to stop handing out a stream's files
while its buffer is over ``buffer_limit_rows``: memory is bounded by the
configured depths plus one file in flight per worker.

The stage never touches a socket: it calls ``send(peer, frames) -> bool`` and
appends events (file complete, stream failed) for the daemon.

Large rows may arrive as references into shared-memory arenas (``shm.refs``);
``RefKeeper`` (``stage_refs``) adopts them, and the stage hands every row it
drops (a duplicate, a cancelled stream, ``drop_last``) back to it for freeing.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from loader.config.sections import MAX_PREFETCH
from loader.errors import WorkerError
from loader.service import protocol as P
from loader.service.blocks import Block, block_rows, select
from loader.service.daemon import fit
from loader.service.daemon.batching import Batcher, ShuffleBuffer
from loader.service.daemon.ledger import FileLedger
from loader.service.daemon.stage_refs import RefKeeper
from loader.service.shm.arena import ArenaError
from loader.service.shm.pool import ArenaPool

log = logging.getLogger("loader.stage")

SendFn = Callable[[bytes, list[Any]], bool]
# An epoch whose client has credits and receives nothing for this long fails, naming the cause it can
# see: the daemon passes 2 * workers.progress_timeout_s, so a hung worker is replaced before this fires,
# and never less than MIN_STALL_TIMEOUT_S, the time replacing a worker may take (stop, spawn, hello).
DEFAULT_STALL_TIMEOUT_S = 240.0
MIN_STALL_TIMEOUT_S = 30.0


@dataclass
class Stream:
    """One epoch's share for one session."""

    stream_id: int
    epoch: int
    files: dict[int, FileLedger]
    shuffle: ShuffleBuffer
    batcher: Batcher
    gen: int | None = None  # the client's request id; None while read ahead
    incomplete: set[int] = field(default_factory=set)
    sample_kind: str = "tuple"
    failed: bool = False
    batches_sent: int = 0
    samples_sent: int = 0
    ref_columns: frozenset[str] | None = None  # decided by the first chunk (stage_refs.py)
    starved_since: float | None = None  # when the client last had credits and nothing to receive
    layout: fit.Layout | None = None  # fields, dtypes and row shapes, decided by the first chunk (fit.py)
    rejected: dict[int, int] = field(default_factory=dict)  # file -> records that did not fit (on_error = "skip")

    @property
    def input_done(self) -> bool:
        """Every file of the share has its FILE_DONE marker and all its records."""
        return not self.incomplete

    @property
    def rows_buffered(self) -> int:
        return self.shuffle.rows + self.batcher.rows

    def buffered_blocks(self) -> list[Block]:
        return self.shuffle.blocks() + self.batcher.blocks()


@dataclass(frozen=True)
class StreamSettings:
    """How one dataset's streams are shuffled and batched (a session reads one dataset)."""

    batch_size: int
    drop_last: bool
    shuffle_buffer: int
    seed: int


@dataclass
class Session:
    session_id: int
    peer: bytes
    rank: int
    world_size: int
    prefetch: int
    last_seen: float = field(default_factory=time.monotonic)
    credits: int = 0
    current: Stream | None = None
    ahead: Stream | None = None
    read_ahead: bool = True
    batches_sent: int = 0
    samples_sent: int = 0
    wait_s: float = 0.0  # the client's running total of time waiting for batches (its credits say it)
    bytes_sent: int = 0
    shm: bool = False  # the client maps the daemon's arenas (it says so with each EPOCH)
    # (request id, reference arrays) per batch sent and not yet taken by the consumer
    outstanding: deque = field(default_factory=deque)
    dataset: str = "default"
    settings: StreamSettings | None = None  # None: the stage's own (the default dataset's)


@dataclass(frozen=True)
class FileComplete:
    """Every record of a file arrived: its lease is over."""

    stream_id: int
    file_index: int


@dataclass(frozen=True)
class StreamFailed:
    """A file of ``stream`` failed for good: the epoch ends with ``error`` (``WorkerError.to_dict()``)."""

    session: Session
    stream: Stream
    error: dict[str, Any]


StageEvent = FileComplete | StreamFailed


class Stage:
    """Sessions, streams and batching; see the module docstring."""

    def __init__(
        self,
        *,
        batch_size: int,
        drop_last: bool,
        shuffle_buffer: int,
        seed: int,
        samples_per_message: int,
        send: SendFn,
        arenas: ArenaPool | None = None,
        on_error: str = "raise",
        batch_format: str = "stacked",
        files: Sequence[str] = (),
        stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S,
    ) -> None:
        """``files`` are the daemon's file paths by index (errors name them); ``on_error`` and
        ``batch_format`` are the pipeline's (a sample that does not fit its batch fails or is skipped)."""
        self.on_error, self.batch_format, self.files = on_error, batch_format, list(files)
        self.stall_timeout_s = max(MIN_STALL_TIMEOUT_S, stall_timeout_s)
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.shuffle_buffer = shuffle_buffer
        self.seed = seed
        self.settings = StreamSettings(batch_size, drop_last, shuffle_buffer, seed)
        self.samples_per_message = samples_per_message
        self.send = send
        self.sessions: dict[bytes, Session] = {}
        self.streams: dict[int, tuple[Session, Stream]] = {}
        self.events: list[StageEvent] = []
        self._ids = itertools.count(1)
        self.skipped_records = 0
        self.samples_in = 0
        self.dropped_duplicates = 0
        self.sent_totals = [0, 0, 0]
        self.refs = RefKeeper(arenas)

    # -- sessions -----------------------------------------------------------
    def open_session(self, peer: bytes, rank: int, world_size: int, prefetch: int) -> Session:
        old = self.sessions.get(peer)
        if old is not None:
            self.close_session(old)
        # A prefetch beyond what the client's socket queues would read as a dead peer (config.MAX_PREFETCH).
        session = Session(next(self._ids), peer, rank, world_size, max(1, min(prefetch, MAX_PREFETCH)))
        self.sessions[peer] = session
        return session

    def close_session(self, session: Session) -> list[int]:
        """Forget a session; returns the stream ids whose jobs must be cancelled."""
        self.sessions.pop(session.peer, None)
        streams = [s for s in (session.current, session.ahead) if s is not None]
        for stream in streams:
            self.drop_stream(stream)
        session.current = session.ahead = None
        self.refs.release_outstanding(session)
        return [s.stream_id for s in streams]

    def buffer_limit_rows(self, session: Session) -> int:
        settings = session.settings or self.settings
        return 2 * settings.shuffle_buffer + settings.batch_size * (session.prefetch + 2) + self.samples_per_message

    def accepting(self) -> bool:
        """False while the daemon should stop reading worker data: a stream holds more than twice its
        lease bound (a file in flight outgrew it) and no client is waiting for rows. The workers then
        wait for room mid-file (their sends block), so memory is bounded by configuration, not by
        file size. Data keeps flowing while any client has credits and too little to send: pausing
        then could starve it behind a stream that is not being read (read-ahead, another client)."""
        overfull = False
        for session, stream in self.streams.values():
            if stream.rows_buffered >= 2 * self.buffer_limit_rows(session):
                overfull = True
        if not overfull:
            return True
        return any(self._starved(session) for session in self.sessions.values())

    def _starved(self, session: Session) -> bool:
        stream = session.current
        return (
            stream is not None
            and stream.gen is not None
            and not stream.failed
            and session.credits > 0
            and stream.batcher.rows < self.batch_size
        )

    def may_lease(self, stream_id: int) -> bool:
        entry = self.streams.get(stream_id)
        if entry is None:
            return False
        session, stream = entry
        return not stream.failed and stream.rows_buffered < self.buffer_limit_rows(session)

    # -- streams ------------------------------------------------------------
    def new_stream(self, session: Session, epoch: int, file_indexes: list[int]) -> Stream:
        settings = session.settings or self.settings
        rng = np.random.default_rng((settings.seed, epoch, session.rank, session.world_size))
        stream = Stream(
            next(self._ids),
            epoch,
            {i: FileLedger() for i in file_indexes},
            ShuffleBuffer(settings.shuffle_buffer, rng),
            Batcher(settings.batch_size, settings.drop_last),
            incomplete=set(file_indexes),
        )
        self.streams[stream.stream_id] = (session, stream)
        return stream

    def drop_stream(self, stream: Stream | None) -> int | None:
        if stream is None:
            return None
        self.streams.pop(stream.stream_id, None)
        if stream.ref_columns:
            self.refs.release_blocks(stream.shuffle.drain() + stream.batcher.drain(), stream.ref_columns)
        return stream.stream_id

    # -- data from workers --------------------------------------------------
    def _addressed(self, message: P.FileMessage) -> tuple[Session, Stream] | None:
        """The (session, stream) a worker message is for; None for a cancelled stream or a client that left."""
        return self.streams.get(message.stream)

    def on_chunk(self, chunk: P.Chunk, columns: Block) -> None:
        try:
            names = self.refs.adopt(chunk.refs, columns)
        except ArenaError as exc:
            log.warning("dropping a chunk of file index %s: %s", chunk.file, exc)
            return
        entry = self._addressed(chunk)
        ledger = entry[1].files.get(chunk.file) if entry is not None else None
        if entry is None or ledger is None or entry[1].failed:
            self.refs.release_blocks([columns], names)
            return
        _, stream = entry
        indexes = columns.pop(P.INDEX_COLUMN, None)
        count = chunk.count
        first_record = int(indexes[0]) if indexes is not None and len(indexes) else chunk.record
        keep = ledger.accept(chunk.record, count, indexes)
        if keep is not None:
            kept = int(keep.sum())
            self.dropped_duplicates += count - kept
            if kept != count:
                self.refs.release_blocks([select(columns, ~keep)], names)
            if kept == 0:
                return
            if kept != count:
                columns = select(columns, keep)
        if stream.ref_columns is None:
            stream.ref_columns = names
        if names or stream.ref_columns:
            columns = self.refs.conform(stream.ref_columns, columns, names)
        fitted = self._fit(stream, chunk, columns, first_record)
        if fitted is None:
            self.refs.release_blocks([columns], stream.ref_columns or frozenset())
            self._check_file(stream, chunk.file)
            return
        columns = fitted
        stream.sample_kind = chunk.sample_kind
        stream.starved_since = None
        self.samples_in += block_rows(columns)
        stream.batcher.extend(stream.shuffle.add(columns))
        self._check_file(stream, chunk.file)

    def _fit(self, stream: Stream, chunk: P.Chunk, columns: Block, record: int) -> Block | None:
        """``columns`` made to fit the stream's batches, or None when they cannot (the file failed,
        or under ``on_error = "skip"`` the rows were counted as skipped)."""
        if stream.layout is None:
            stream.layout = fit.describe(columns)
            return columns
        layout = stream.layout
        reason = fit.field_misfit(layout, columns)
        misfits = {} if reason is not None else fit.shape_misfits(layout, columns)
        if reason is None and misfits and self.batch_format == "list":
            layout.update((name, fit.RAGGED) for name in misfits)  # list batches hold ragged fields as objects
            misfits = {}
        if reason is None and not misfits:
            ragged = [n for n, v in columns.items() if layout[n] == fit.RAGGED and not v.dtype.hasobject]
            # Fixed rows of a ragged field travel as objects, so no two fixed blocks of other shapes meet.
            return {n: fit.as_objects(v) if n in ragged else v for n, v in columns.items()} if ragged else columns
        if reason is None:
            reason = "; ".join(misfits.values()) + f" ({fit.RAGGED_HINT})"
        self._misfit(stream, chunk, block_rows(columns), record, f"a sample does not fit its batch: {reason}")
        return None

    def _misfit(self, stream: Stream, chunk: P.Chunk, rows: int, record: int, message: str) -> None:
        path = self.files[chunk.file] if 0 <= chunk.file < len(self.files) else f"file index {chunk.file}"
        if self.on_error == "skip":
            stream.rejected[chunk.file] = stream.rejected.get(chunk.file, 0) + rows
            log.warning("skipping %d record(s) from record %d of %s: %s", rows, record, path, message)
            return
        error = WorkerError("ShapeMismatchError", message, worker=chunk.worker, file=path, record=record)
        self.fail_file(stream.stream_id, chunk.file, error.to_dict())

    def on_done(self, done: P.FileDone) -> None:
        entry = self._addressed(done)
        if entry is None:
            return
        _, stream = entry
        ledger = stream.files.get(done.file)
        if ledger is None:
            return
        ledger.mark_done(done.sent, done.skipped)
        self._check_file(stream, done.file)

    def on_file_error(self, failure: P.FileError) -> None:
        self.fail_file(failure.stream, failure.file, failure.error)

    def fail_file(self, stream_id: int, file_index: int, error: dict[str, Any]) -> None:
        """File ``file_index`` of stream ``stream_id`` failed for good (``error``: ``WorkerError.to_dict()``)."""
        entry = self.streams.get(stream_id)
        if entry is None:
            return
        session, stream = entry
        if stream.failed or file_index not in stream.incomplete:
            return
        if self.on_error == "skip":
            self._skip_rest(stream, file_index, error)
            return
        stream.failed = True
        self.events.append(StreamFailed(session, stream, error))

    def fail_waiting(self, error: dict[str, Any]) -> None:
        """Every stream still waiting for input fails with ``error`` (no worker can read its files)."""
        for session, stream in list(self.streams.values()):
            if not stream.input_done:
                self.fail_waiting_stream(session, stream, error)

    def _skip_rest(self, stream: Stream, file_index: int, error: dict[str, Any]) -> None:
        """Under ``on_error = "skip"`` a file that failed for good (its workers died on it) ends here: the
        records delivered are kept, the rest of the file counts as one skipped record."""
        ledger = stream.files[file_index]
        ledger.mark_done(ledger.received, max(1, ledger.skipped))
        log.warning(
            "skipping the rest of file index %d (epoch %d): %s", file_index, stream.epoch, WorkerError.from_dict(error)
        )
        self._check_file(stream, file_index)

    def _check_file(self, stream: Stream, file_index: int) -> None:
        ledger = stream.files[file_index]
        if file_index not in stream.incomplete or not ledger.complete:
            return
        stream.incomplete.discard(file_index)
        skipped = ledger.skipped + stream.rejected.get(file_index, 0)
        if skipped:
            self.skipped_records += skipped
            log.warning("skipped %d bad record(s) in file index %d (epoch %d)", skipped, file_index, stream.epoch)
        self.events.append(FileComplete(stream.stream_id, file_index))
        if not stream.incomplete:
            stream.batcher.extend(stream.shuffle.flush())

    # -- batches to clients -------------------------------------------------
    def pump(self, session: Session) -> None:
        """Send what the client's credits allow, then END once the stream is drained."""
        stream = session.current
        if stream is None or stream.gen is None or stream.failed:
            return
        while session.credits > 0:
            batch = stream.batcher.pop()
            if batch is None and stream.input_done:
                if stream.batcher.drop_last and stream.ref_columns:
                    self.refs.release_blocks(stream.batcher.drain(), stream.ref_columns)
                batch = stream.batcher.flush()
            if batch is None:
                self._starving(session, stream)
                break
            stream.starved_since = None
            self._send_batch(session, stream, batch)
        if stream.input_done and stream.batcher.rows == 0:
            end = P.End(epoch=stream.epoch, gen=stream.gen, batches=stream.batches_sent, samples=stream.samples_sent)
            self.send(session.peer, P.encode(end))
            self.drop_stream(stream)
            session.current = None

    def _starving(self, session: Session, stream: Stream) -> None:
        """The client has credits and nothing to receive: fail the epoch once that lasted the stall timeout."""
        now = time.monotonic()
        if stream.starved_since is None:
            stream.starved_since = now
            return
        if now - stream.starved_since < self.stall_timeout_s or stream.input_done:
            return
        waiting = len(stream.incomplete)
        message = (
            f"epoch {stream.epoch} made no progress for {now - stream.starved_since:.0f}s: "
            f"{waiting} file(s) still unread and no record arrived (see the daemon's log and `loader status`)"
        )
        self.fail_waiting_stream(session, stream, WorkerError("EpochStalledError", message).to_dict())

    def fail_waiting_stream(self, session: Session, stream: Stream, error: dict[str, Any]) -> None:
        if not stream.failed:
            stream.failed = True
            self.events.append(StreamFailed(session, stream, error))

    def _send_batch(self, session: Session, stream: Stream, batch: Block) -> None:
        n = block_rows(batch)
        # Recorded as outstanding before sending: a failed send drops the session, which frees it.
        batch, refs = self.refs.outbound(session, batch, stream.ref_columns or frozenset(), stream.gen)
        message = P.Batch(epoch=stream.epoch, gen=stream.gen, count=n, sample_kind=stream.sample_kind, refs=refs)
        frames = P.encode(message, batch)
        self.send(session.peer, frames)
        nbytes = frames_nbytes(frames)
        session.bytes_sent += nbytes
        self.sent_totals[0] += 1  # batches, samples, bytes to every client since the daemon started
        self.sent_totals[1] += n
        self.sent_totals[2] += nbytes
        session.credits -= 1
        stream.batches_sent += 1
        stream.samples_sent += n
        session.batches_sent += 1
        session.samples_sent += n

    def buffered_rows(self) -> int:
        return sum(stream.rows_buffered for _, stream in self.streams.values())

    # -- references ---------------------------------------------------------
    def on_credit(self, session: Session, gen: Any, count: int) -> None:
        """The client's consumer took ``count`` batches of request ``gen``: more credits, their rows freed."""
        # Credits for an epoch the client abandoned must not inflate the next one's window.
        if session.current is not None and gen == session.current.gen:
            session.credits += count
        self.refs.credited(session, gen, count)

    def on_epoch_request(self, session: Session, shm: bool) -> None:
        """A client asks for an epoch: every batch it will still read has been copied, so free them all."""
        session.shm = shm and self.refs.arenas is not None
        self.refs.release_outstanding(session)

    def arenas_held(self) -> set[int]:
        """Arena ids of the references buffered or outstanding (a retired arena waits for these)."""
        buffered = [
            (block, stream.ref_columns)
            for _, stream in self.streams.values()
            if stream.ref_columns
            for block in stream.buffered_blocks()
        ]
        return self.refs.held(buffered, self.sessions.values())


def frames_nbytes(frames: list[Any]) -> int:
    """Bytes of a message's frames (bytes, numpy arrays, buffers, zmq frames); per message, so kept cheap:
    ``nbytes`` where a frame has it, else ``len`` (bytes and zmq frames count bytes), never a memoryview."""
    total = 0
    for frame in frames:
        nbytes = getattr(frame, "nbytes", None)
        total += nbytes if nbytes is not None else len(frame)
    return total


__all__ = ["Stage", "Session", "Stream", "frames_nbytes"]
