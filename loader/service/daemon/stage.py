"""The stage: worker chunks in; one ordered, shuffled, stepped stream per job epoch; credit-paced batches out.

One ``Session`` per attached client (rank, world_size). Each epoch a *job* reads
(the ranks of one training job, or one client alone) is a ``Stream`` with its own
id: its files in the epoch's order, put back in that order by a ``Sequencer``
(exactly once: rows a re-leased file sends again are dropped), shuffled by a
``WindowShuffle`` and cut by a ``StepCutter`` into global steps of ``world_size
x batch_size`` rows. Step k's slice r goes to the session of rank r, against its
credits; a step is freed once every rank has it. So every rank gets the same
number of batches, and the batches are a function of the config, the epoch and
the world size only (``order.py``). A rank that stops reading holds the others
back by at most the steps the stream may buffer (``buffer_limit_rows``).

A stream's input is complete when every file from its start on is complete;
then the shuffle is emptied, the last step cut (unless drop_last) and END
follows each rank's last batch. ``may_lease`` tells the coordinator which files
may be read now (buffer room, the reorder window); ``accepting`` tells the
daemon to stop reading worker data while a stream is full and no client starves.

The stage never touches a socket: it calls ``send(peer, frames) -> bool`` and
appends events (file complete, file cut, stream failed) for the daemon.
Large rows may arrive as references into shared-memory arenas (``shm.refs``);
``RefKeeper`` (``stage_refs``) adopts them, and the stage hands every row it
drops back to it for freeing.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from loader.config.sections import MAX_PREFETCH
from loader.errors import EpochStalledError, WorkerError
from loader.service import protocol as P
from loader.service.blocks import Block, block_rows, concat, row_nbytes_estimate, rows_slice
from loader.service.daemon import fit
from loader.service.daemon.batching import StepCutter, WindowShuffle
from loader.service.daemon.sequencer import Sequencer, Tagged
from loader.service.daemon.stage_refs import RefKeeper
from loader.service.daemon.streams import (
    FileComplete,
    FileCut,
    Session,
    StageEvent,
    Step,
    Stream,
    StreamFailed,
    StreamSettings,
    Traffic,
)
from loader.service.order import Anchor, window_rows
from loader.service.shm.arena import ArenaError
from loader.service.shm.pool import ArenaPool

log = logging.getLogger("loader.stage")

SendFn = Callable[[bytes, list[Any]], bool]
# An epoch whose client has credits and receives nothing for this long fails, naming the cause it can
# see: the daemon passes 3 * workers.progress_timeout_s, so a file whose workers hang fails first, saying so
# (``workforce.HUNG_FILE_ATTEMPTS``), and never less than MIN_STALL_TIMEOUT_S, the time replacing a worker
# may take (stop, spawn, hello).
DEFAULT_STALL_TIMEOUT_S = 360.0
MIN_STALL_TIMEOUT_S = 30.0
# A stream whose steps wait for ranks that never asked for it says so in the log after this long, once: the
# stall's error comes only after the stall timeout (360 s by default), and a forgotten rank looked like a hang.
RANKS_NOTE_S = 10.0
SHOWN_RANKS = 8  # the ranks a line (and a status row) names of those a stream waits for
# What ranks that resumed apart are told (the stage's stall lines, the desk's warning).
SAME_STATE_ADVICE = "every rank loads the same state (a state is global: rank 0's serves every rank)"
MAX_DEPARTED = 65536  # ranks remembered as left (``Stage.departed``), the oldest forgotten first
# Bytes of a stream's rows held for reordering (later files waiting for the head): ``service.reorder_window_mib``.
DEFAULT_REORDER_BYTES = 64 * 1024 * 1024
DEFAULT_STREAM_BUFFER_BYTES = 4096 * 1024 * 1024  # service.stream_buffer_mib
# A stream fails for its rows' mean size only once it has taken this many rows, or a quarter of its byte bound:
# before that, one big sample among the first few (a 15 MB JPEG among 110 kB ones) would stand for all of them.
ROW_BYTES_MIN_ROWS = 256
# A message that packs several batches for a client (``Epoch.pack``) holds at most this many bytes.
PACK_BYTES = 1024 * 1024
# A packed group that is one run of adjacent batches (views of one worker's chunk) this large ends where the
# next batch lies elsewhere, so that it goes as a view: joined with the next chunk's, all of it is copied.
PACK_RUN_BYTES = 256 * 1024
# A worker's error, logged under on_error = "skip": its first line, at most this long (the traceback stays out).
MAX_LOGGED_ERROR_CHARS = 500


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
        reorder_bytes: int = DEFAULT_REORDER_BYTES,
        stream_buffer_bytes: int = DEFAULT_STREAM_BUFFER_BYTES,
        lease_note: Callable[[int], str] = lambda file_index: "",
        file_record: Callable[[int, int], int] = lambda file_index, record: record,
    ) -> None:
        """``files`` are the daemon's file paths by index (errors name them; ``lease_note`` says more of a lease
        of several files or of a piece of one, ``file_record`` a lease's record's number in its file);
        ``on_error`` and ``batch_format`` are the pipeline's (a sample that does not fit its batch fails or is
        skipped)."""
        self.on_error, self.batch_format, self.files = on_error, batch_format, list(files)
        self.lease_note, self.file_record = lease_note, file_record
        self.stall_timeout_s = max(MIN_STALL_TIMEOUT_S, stall_timeout_s)
        self.reorder_bytes = reorder_bytes
        self.stream_buffer_bytes = stream_buffer_bytes
        self.settings = StreamSettings(batch_size, drop_last, shuffle_buffer, seed)
        self.batch_size = batch_size
        self.samples_per_message = samples_per_message
        self.send = send
        self.sessions: dict[bytes, Session] = {}
        self.streams: dict[int, Stream] = {}
        # (job, rank) -> when its client left (wall clock), until a client of that job and rank reads again: a
        # stream waiting for that rank then says it left, not that it "never asked" (``_ranks_waited_for``).
        self.departed: dict[tuple[str, int], float] = {}
        self.events: list[StageEvent] = []
        self._ids = itertools.count(1)
        self.skipped_records = 0
        self._failures_logged = _RateLimit(FAILED_EPOCH_LOG_EVERY_S)
        self.samples_in = 0
        self.dropped_duplicates = 0
        self.traffic: dict[str, Traffic] = {}  # dataset -> its totals (``traffic_of``)
        self.rejected_records = 0  # records refused because they do not fit their batch (``_misfit``)
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

    def close_session(self, session: Session, *, done_reading: bool = True) -> None:
        """Forget a session: its rank no longer holds its stream back, its rows are freed (``done_reading``:
        the client reads no batch sent to it), or else set aside until they would have been reclaimed."""
        self.sessions.pop(session.peer, None)
        if session.world_size > 1 and session.job:
            self.departed.pop((session.job, session.rank), None)  # re-inserted last: the oldest go first
            self.departed[(session.job, session.rank)] = time.time()
            while len(self.departed) > MAX_DEPARTED:
                del self.departed[next(iter(self.departed))]
        self.detach(session)
        if done_reading:
            self.refs.release_outstanding(session)
        else:
            self.refs.set_aside(session)

    def detach(self, session: Session) -> None:
        """``session`` stops reading its current stream (it left, or asked for another epoch)."""
        stream = session.current
        session.current = None
        if stream is None or stream.members.get(session.rank) is not session:
            return
        del stream.members[session.rank]
        self._release_rank(stream, session.rank)

    def _release_rank(self, stream: Stream, rank: int) -> None:
        stream.released.add(rank)
        for step in stream.steps:
            piece = step.slices[rank]
            if piece is not None:
                step.slices[rank] = None
                # No longer buffered: left counted, the rows of a rank that left held the stream "full", and the
                # ranks still reading waited for files never leased, until the stall timeout failed the epoch.
                stream.step_rows -= block_rows(piece)
                self._free(stream, [piece])
        self._trim(stream)

    def buffer_limit_rows(self, stream: Stream) -> int:
        """Rows a stream may buffer (shuffle, steps) before its next file waits; also its reorder window."""
        settings = stream.settings
        step = stream.world_size * settings.batch_size
        # One chunk's rows on top, as the worker sized it (by bytes: ``workers/columns.py``), not
        # ``samples_per_message``, the most it may be: that would let a stream of big rows hold gigabytes.
        rows = 2 * settings.shuffle_buffer + step * (stream.prefetch + 2) + stream.chunk_rows
        if stream.row_bytes:
            # And bytes (``stream_buffer_bytes``): big rows sent inline, or many ranks, cut the steps held ahead,
            # never below what the stream needs to go on (``rows_needed``: else it would wait for itself).
            rows = min(rows, max(self.stream_buffer_bytes // stream.row_bytes, self.rows_needed(stream)))
        return rows

    def rows_needed(self, stream: Stream) -> int:
        """Rows a stream must be able to hold to cut a step at all: twice its shuffle buffer (the shuffle mixes
        a round of new rows with the rows it keeps before it lets any out, ``WindowShuffle``), one global step
        (``world_size x batch_size``) and a chunk."""
        settings = stream.settings
        return 2 * settings.shuffle_buffer + stream.world_size * settings.batch_size + stream.chunk_rows

    def accepting(self) -> bool:
        """False while the daemon should stop reading worker data: a stream holds more than twice its
        lease bound (a file in flight outgrew it) and no client is waiting for rows. The workers then
        wait for room mid-file (their sends block), so memory is bounded by configuration, not by
        file size. Data keeps flowing while any client has credits and nothing to receive: pausing
        then could starve it behind a stream that is not being read (read-ahead, another job).
        Rows held in a reorder window do not count: the window bounds itself (``Sequencer``)."""
        overfull = any(self._overfull(s) for s in self.streams.values())
        return not overfull or any(self._starved(session) for session in self.sessions.values())

    def _starved(self, session: Session) -> bool:
        """The session waits for rows its stream does not have yet (not for another rank of its job:
        steps kept for a rank that stopped reading fill the stream's bound, and more input would not help)."""
        stream = session.current
        return (
            stream is not None
            and not stream.failed
            and session.credits > 0
            and self._step_for(stream, session.rank) is None
            and not stream.input_done
            and not self._overfull(stream)
        )

    def _overfull(self, stream: Stream) -> bool:
        """The stream holds twice its bound outside the reorder window (which bounds itself)."""
        return stream.rows_buffered - stream.sequencer.held_rows >= 2 * self.buffer_limit_rows(stream)

    def may_lease(self, stream_id: int, file_index: int) -> bool:
        """Whether a worker may start on this file of the stream now."""
        stream = self.streams.get(stream_id)
        if stream is None or stream.failed or not stream.sequencer.may_read(file_index):
            return False
        # Rows held for reordering do not count: the sequencer bounds them (``may_read``), and they wait
        # for the head file, which must always be leasable.
        return stream.rows_buffered - stream.sequencer.held_rows < self.buffer_limit_rows(stream)

    def lease_start(self, stream_id: int, file_index: int) -> int:
        """A lease of this file begins now: the record it starts at (what the stream has not yet taken)."""
        stream = self.streams.get(stream_id)
        if stream is None:
            return 0
        stream.arrived[file_index] = 0
        return stream.sequencer.lease_start(file_index)

    def next_record(self, stream_id: int, file_index: int) -> int | None:
        """The first record of this file the stream has not taken (None: no such stream or file); asks only."""
        stream = self.streams.get(stream_id)
        state = stream.sequencer.files.get(file_index) if stream is not None else None
        return state.next_record if state is not None else None

    # -- streams ------------------------------------------------------------
    def new_stream(
        self,
        *,
        settings: StreamSettings,
        epoch: int,
        world_size: int,
        order: list[int],
        job: str,
        prefetch: int,
        position: int = 0,
        anchor: Anchor = (0, 0, 0),
        dataset: str = "default",
    ) -> Stream:
        """A stream reading ``order`` (file indexes, the epoch's order) from ``position`` / ``anchor``."""
        window, order_index, record = anchor
        skip = position - window * window_rows(settings.shuffle_buffer)
        stream = Stream(
            stream_id=next(self._ids),
            epoch=epoch,
            job=job,
            world_size=world_size,
            settings=settings,
            position=position,
            sequencer=Sequencer(order, order_index, record, reorder_rows=0, reorder_bytes=self.reorder_bytes),
            shuffle=WindowShuffle(settings.shuffle_buffer, settings.seed, epoch, anchor),
            cutter=StepCutter(world_size, settings.batch_size, settings.drop_last, skip=skip),
            prefetch=prefetch,
            dataset=dataset,
        )
        stream.sequencer.reorder_rows = self.buffer_limit_rows(stream)
        self.streams[stream.stream_id] = stream
        if stream.sequencer.complete:
            self._end_input(stream)
        return stream

    def attach(self, session: Session, stream: Stream, gen: int, credits: int) -> None:
        """``session`` reads ``stream`` as its rank, as request ``gen``."""
        self.detach(session)
        rank = session.rank
        stream.members[rank] = session
        stream.gens[rank] = gen
        stream.cursors.setdefault(rank, 0)
        stream.attached_ever.add(rank)
        stream.sessions_ever.add(session.session_id)
        if self.departed:
            self.departed.pop((session.job, rank), None)
        # The epoch's credit may exceed the hello's prefetch (a client's "auto" prefetch): the buffer follows it.
        stream.prefetch = max(stream.prefetch, session.prefetch, min(credits, MAX_PREFETCH))
        session.current = stream
        session.credits = credits

    def drop_stream(self, stream: Stream | None) -> int | None:
        """Forget a stream and free every row it holds; its id (for cancelling its leases)."""
        if stream is None or self.streams.pop(stream.stream_id, None) is None:
            return None
        for session in list(stream.members.values()):
            if session.current is stream:
                session.current = None
        self._free(stream, stream.sequencer.drain() + stream.shuffle.drain() + stream.cutter.drain())
        for step in stream.steps:
            self._free(stream, [s for s in step.slices if s is not None])
        stream.steps.clear()
        stream.step_rows = 0
        return stream.stream_id

    def _free(self, stream: Stream, blocks: list[Block]) -> None:
        if stream.ref_columns and blocks:
            self.refs.release_blocks(blocks, stream.ref_columns)

    # -- data from workers --------------------------------------------------
    def chunk_problem(self, chunk: P.Chunk, columns: Block) -> str | None:
        """Why a chunk's columns do not fit its header, in one line (None when they do); asked before
        anything acts on the chunk, its references included.

        ``P.decode`` has checked that every column has ``count`` rows. What a worker sends besides: 1 to
        ``samples_per_message`` records (so a chunk of rows that take no bytes cannot make the stage hold
        or number billions of them), at least one column that is not the record index, and records that
        a later lease may start from (below ``P.MAX_INT``). Its record index column, sent when records
        were skipped inside the chunk, is inline 1-d integers rising strictly from ``record`` (the
        sequencer takes its last value as the file's next record, the shuffle its values as anchors)."""
        if not 0 < chunk.count <= self.samples_per_message:
            return (
                f"it holds {chunk.count} records; a worker sends 1 to {self.samples_per_message} "
                "(workers.samples_per_message)"
            )
        if all(name == P.INDEX_COLUMN for name in columns):
            return f"its {chunk.count} records have no columns"
        for name, values in columns.items():
            # A worker's column names its dtype by ``dtype.str`` (``frames``), never a structured one: only a header
            # made by hand does ("i4,i4"). Such dtypes of one size share ``dtype.str``, which the batch's fit compares,
            # and np.concatenate refused them only in the shuffle, once the chunk's rows counted as arrived.
            if values.dtype.names is not None:
                return (
                    f"its column {name[:64]!r} has a structured dtype ({str(values.dtype)[:80]}), which no worker sends"
                )
        index = columns.get(P.INDEX_COLUMN)
        if index is not None:
            if chunk.refs and P.INDEX_COLUMN in chunk.refs:
                return "its record index column is a reference column"
            if index.ndim != 1 or index.dtype.kind not in "iu":
                return f"its record index column holds {index.dtype} rows of shape {index.shape[1:]}, not integers"
        last = chunk.record + chunk.count - 1 if index is None else int(index.max())
        if last >= P.MAX_INT - 1:
            return f"it names record {last}, beyond what a lease can start after"
        if index is not None:
            records = index.astype(np.int64)  # every value is below P.MAX_INT now (a uint64 one too)
            if int(records[0]) != chunk.record or np.any(np.diff(records) <= 0):
                return f"its record index column does not rise strictly from its first record {chunk.record}"
        return None

    def on_chunk(self, chunk: P.Chunk, columns: Block) -> None:
        """Rows of a file from the worker that holds its lease (the daemon asked ``chunk_problem`` first)."""
        try:
            names = self.refs.adopt(chunk.refs, columns)
        except ArenaError as exc:
            log.warning("dropping a chunk of file index %s: %s", chunk.file, exc)
            return
        stream = self.streams.get(chunk.stream)
        if stream is None or stream.failed or chunk.file not in stream.sequencer.files:
            self.refs.release_blocks([columns], names)
            return
        stream.arrived[chunk.file] = stream.arrived.get(chunk.file, 0) + chunk.count
        try:
            self._take(stream, chunk, columns, names)
        except Exception as exc:
            # The chunk counts as arrived and its rows may be half taken (the sequencer moved past them, the shuffle
            # emptied its round into a concatenation that raised): dropped by the handler guard, the file's FILE_DONE
            # found every record arrived and the epoch ended short without a word. The stream fails, naming it.
            # Logged here, not re-raised: the loop's guard would say it dropped a message (nothing is dropped) and
            # count the worker's message as a hostile peer's refusal.
            path = self._path(chunk.file)
            message = f"taking rows of {path} failed: {type(exc).__name__}: {exc}"
            log.warning("%s (its epoch fails)", message)
            log.debug("where taking rows of %s failed", path, exc_info=True)
            self.fail_stream(stream, WorkerError("LoaderError", message, worker=chunk.worker, file=path).to_dict())

    def _take(self, stream: Stream, chunk: P.Chunk, columns: Block, names: frozenset[str]) -> None:
        """``on_chunk``'s rows into ``stream``: fitted, ordered, shuffled and cut into steps."""
        indexes = columns.pop(P.INDEX_COLUMN, None)
        if indexes is not None:
            records = np.asarray(indexes, dtype=np.int64)
        else:
            records = np.arange(chunk.record, chunk.record + chunk.count, dtype=np.int64)
        if stream.ref_columns is None:
            stream.ref_columns = names
        if names or stream.ref_columns:
            columns = self.refs.conform(stream.ref_columns, columns, names)
        fitted = self._fit(stream, chunk, columns, records)
        if fitted is None:
            self._free(stream, [columns])
            return
        if self._overfull(stream):
            # Data flows because another stream's client is starved, but this stream has no room: its
            # file is cut here and leased again from this record once the stream has room (bounded memory).
            cut = stream.sequencer.cut(chunk.file)
            self._free(stream, [fitted])
            if cut is not None:
                self.events.append(FileCut(stream.stream_id, cut.file_index))
            return
        # The mean row over the stream, not the biggest chunk's: a chunk of one big sample (ragged rows travel
        # inline) made every row count as big, and failed an epoch that holds a few of them with ease.
        before = stream.row_bytes
        stream.rows_taken += chunk.count
        stream.bytes_taken += row_nbytes_estimate(fitted) * chunk.count
        if chunk.count > stream.chunk_rows or stream.row_bytes != before:  # after the room check: a chunk
            stream.chunk_rows = max(stream.chunk_rows, chunk.count)  # cannot make room for itself
            stream.sequencer.reorder_rows = self.buffer_limit_rows(stream)
        if self._beyond_byte_bound(stream):  # asked at every chunk: it may wait for more rows
            self._free(stream, [fitted])
            return
        in_order, dropped, cut = stream.sequencer.add(chunk.file, fitted, records)
        self.dropped_duplicates += sum(block_rows(b) for b in dropped) if cut is None else 0
        self._free(stream, dropped)
        if cut is not None:
            self.events.append(FileCut(stream.stream_id, cut.file_index))
        stream.sample_kind = chunk.sample_kind
        self._feed(stream, in_order)

    def _beyond_byte_bound(self, stream: Stream) -> bool:
        """Fail the stream (True) when what it needs to hold to cut one step, in rows of its mean size, outgrows
        ``stream_buffer_bytes``: it would hold more and more of its input waiting (a world_size of thousands
        buffers a whole dataset for ranks that do not come). One line saying which numbers make it so; not before
        the stream has taken enough rows to know their size (``ROW_BYTES_MIN_ROWS``)."""
        needed = self.rows_needed(stream) * stream.row_bytes
        if needed <= self.stream_buffer_bytes:
            return False
        if stream.rows_taken < ROW_BYTES_MIN_ROWS and stream.bytes_taken <= self.stream_buffer_bytes // 4:
            return False
        settings = stream.settings
        message = (
            f"epoch {stream.epoch}: one step of world_size {stream.world_size} x batch_size {settings.batch_size} rows"
            + (f", with 2 x shuffle_buffer {settings.shuffle_buffer}" if settings.shuffle_buffer else "")
            + f" and a worker's chunk of {stream.chunk_rows},"
            + f" of about {stream.row_bytes:,} bytes each (their mean so far) takes {needed / 2**20:,.1f} MiB in the daemon, over "
            f"service.stream_buffer_mib = {self.stream_buffer_bytes // 2**20}: raise it, or lower these"
        )
        if self._failures_logged.allow(time.monotonic()) is not None:
            log.error("%s", message)  # at most a line a second: a client may ask again and again
        self.fail_stream(stream, WorkerError("StreamBufferError", message).to_dict())
        return True

    def _feed(self, stream: Stream, tagged: list[Tagged]) -> None:
        """Rows now in the epoch's order: through the shuffle and the cutter into steps."""
        for block, order_index, records in tagged:
            rows = block_rows(block)
            self.samples_in += rows
            self.traffic_of(stream.dataset).samples_in += rows
            out = stream.shuffle.add(block, order_index, records)
            self._free(stream, stream.cutter.extend(out))
        if tagged:
            stream.starved_since = None
        self._cut_steps(stream)

    def _cut_steps(self, stream: Stream) -> None:
        while (cut := stream.cutter.pop()) is not None:
            self._push_step(stream, cut.slices, stream.cutter.step_rows, cut.source, cut.start)

    def _push_step(
        self, stream: Stream, slices: list[Block], rows: int, source: Block | None = None, start: int = 0
    ) -> None:
        position = stream.position + stream.steps_cut * stream.cutter.step_rows + rows
        window = position // stream.shuffle.window_rows
        where = stream.shuffle.anchors.get(window)
        anchor = (window, *where) if where is not None else None
        step = Step(stream.steps_cut, list(slices), position, anchor, source, start)
        stream.steps_cut += 1
        stream.steps.append(step)
        for rank in range(stream.world_size):
            piece = step.slices[rank]
            if rank in stream.released:
                step.slices[rank] = None
                if piece is not None:
                    self._free(stream, [piece])
            elif piece is not None:
                stream.step_rows += block_rows(piece)
        if stream.released:  # a step no rank will take goes at once; the others go as they are sent (pump)
            self._trim(stream)

    def _end_input(self, stream: Stream) -> None:
        """Every file is in: empty the shuffle, cut the last step."""
        self._free(stream, stream.cutter.extend(stream.shuffle.finish()))
        self._cut_steps(stream)
        tail_rows = stream.cutter.rows
        tail, dropped = stream.cutter.flush()
        self._free(stream, dropped)
        if tail is not None:
            self._push_step(stream, self._unshare_repeats(stream, tail, tail_rows), tail_rows)
        stream.total_steps = stream.steps_cut

    def _unshare_repeats(self, stream: Stream, tail: list[Block], rows: int) -> list[Block]:
        """Padded repeats of reference rows become copies: each rank's batch frees its own rows."""
        if rows >= stream.world_size or not stream.ref_columns:
            return tail
        for rank in range(rows, stream.world_size):
            tail[rank] = {
                name: self.refs.duplicate(values) if name in stream.ref_columns else values
                for name, values in tail[rank].items()
            }
        return tail

    def _fit(self, stream: Stream, chunk: P.Chunk, columns: Block, records: np.ndarray) -> Block | None:
        """``columns`` made to fit the stream's batches, or None when they cannot (the file failed,
        or under ``on_error = "skip"`` the rows were counted as skipped)."""
        # Reference columns hold three integers a row: their rows' layout comes from the specs they name.
        known = {
            name: fit.of_rows(self.refs.row_layouts(columns[name]))
            for name in (stream.ref_columns or ())
            if name in columns
        }
        if stream.layout is None:
            stream.layout = fit.describe(columns, known)
            stream.layout_file = chunk.file
            return columns
        layout = stream.layout
        if list(columns) != list(layout) and set(columns) == set(layout):
            columns = {name: columns[name] for name in layout}  # the same fields in a file's own order (an .npz)
        reason = fit.field_misfit(layout, columns, self._path(stream.layout_file))
        misfits = {} if reason is not None else fit.shape_misfits(layout, columns, known)
        if reason is None and misfits and self.batch_format == "list":
            layout.update((name, fit.RAGGED) for name in misfits)  # list batches hold ragged fields as objects
            misfits = {}
        if reason is None and not misfits:
            ragged = [
                n for n, v in columns.items() if layout[n] == fit.RAGGED and not v.dtype.hasobject and n not in known
            ]
            # Fixed rows of a ragged field travel as objects, so no two fixed blocks of other shapes meet.
            return {n: fit.as_objects(v) if n in ragged else v for n, v in columns.items()} if ragged else columns
        if reason is None:
            reason = "; ".join(misfits.values()) + f" ({fit.misfit_hint(layout, columns, misfits, known)})"
        self._misfit(stream, chunk, records, f"a sample does not fit its batch: {reason}{self.lease_note(chunk.file)}")
        return None

    def _misfit(self, stream: Stream, chunk: P.Chunk, records: np.ndarray, message: str) -> None:
        path = self._path(chunk.file)
        record = self.file_record(chunk.file, int(records[0]) if len(records) else chunk.record)
        if self.on_error == "skip":
            rows = stream.sequencer.skip(chunk.file, records)  # a later lease starts after them: counted once
            stream.rejected[chunk.file] = stream.rejected.get(chunk.file, 0) + rows
            self.rejected_records = min(P.MAX_INT, self.rejected_records + rows)
            log.warning("skipping %d record(s) from record %d of %s: %s", rows, record, path, message)
            return
        self.rejected_records = min(P.MAX_INT, self.rejected_records + max(1, len(records)))
        error = WorkerError("ShapeMismatchError", message, worker=chunk.worker, file=path, record=record)
        self.fail_file(stream.stream_id, chunk.file, error.to_dict())

    def _path(self, file_index: int) -> str:
        return self.files[file_index] if 0 <= file_index < len(self.files) else f"file index {file_index}"

    def on_done(self, done: P.FileDone) -> None:
        stream = self.streams.get(done.stream)
        if stream is None or stream.failed:
            return
        arrived = stream.arrived.get(done.file, 0)
        if arrived != done.sent:
            # A lease's chunks and its FILE_DONE travel in order on one connection, so a shortfall means a
            # chunk was lost on the way (dropped as malformed or unowned): completing the file would lose
            # its records without a word.
            state = stream.sequencer.files.get(done.file)
            kind, message = "FileChangedError", stream.changed.pop(done.file, None)  # why its rows were refused
            if message is None:
                kind = "LostDataError"
                message = (
                    f"the worker sent {done.sent} record(s) of this file in chunks but {arrived} arrived "
                    "(a chunk was lost on the way; the daemon's log says why)"
                )
            message += self.lease_note(done.file)
            record = self.file_record(done.file, state.next_record) if state is not None else None
            error = WorkerError(kind, message, worker=done.worker, file=self._path(done.file), record=record)
            self.fail_file(
                stream.stream_id, done.file, error.to_dict(), lost=max(1, done.sent - arrived) + done.skipped
            )
            return
        self._complete_file(stream, done.file, done.skipped + stream.rejected.pop(done.file, 0))

    def _complete_file(self, stream: Stream, file_index: int, skipped: int, doing: str = "completing") -> None:
        """The file's rows move on (``skipped`` records counted); a fault here fails this stream, not the loop.

        Its callers run outside any one message's guard (the daemon's housekeeping skips a lost worker's file)
        or inside a guard that only drops the message (a FILE_DONE), which would leave the stream waiting for
        a file that never completes."""
        try:
            self._finish_file(stream, file_index, skipped)
        except Exception as exc:
            log.exception("%s file index %d (epoch %d) failed; that epoch fails", doing, file_index, stream.epoch)
            path = self._path(file_index)
            message = f"{doing} {path} failed: {type(exc).__name__}: {exc}"
            self.fail_stream(stream, WorkerError("LoaderError", message, file=path).to_dict())

    def _finish_file(self, stream: Stream, file_index: int, skipped: int) -> None:
        state = stream.sequencer.files.get(file_index)
        if state is None or state.done or state.cut:
            return
        skipped += state.skipped_before_cuts  # skipped by leases that were cut, whose FILE_DONE was not taken
        if skipped:
            # The worker's own count: the total stays one the protocol (``status()``) can carry.
            self.skipped_records = min(P.MAX_INT, self.skipped_records + skipped)
            path = self._path(file_index)
            log.warning(
                "skipped %d bad record(s) of %s (file index %d, epoch %d)", skipped, path, file_index, stream.epoch
            )
        self.events.append(FileComplete(stream.stream_id, file_index))
        self._feed(stream, stream.sequencer.finish(file_index))
        if stream.sequencer.complete and not stream.input_done:
            self._end_input(stream)

    def on_file_error(self, failure: P.FileError) -> None:
        self.fail_file(failure.stream, failure.file, failure.error)

    def fail_file(self, stream_id: int, file_index: int, error: dict[str, Any], lost: int = 1) -> None:
        """File ``file_index`` of stream ``stream_id`` failed for good (``error``: ``WorkerError.to_dict()``);
        under ``skip``, ``lost`` records count as skipped (one when unknown: the rest of the file)."""
        stream = self.streams.get(stream_id)
        if stream is None or stream.failed:
            return
        state = stream.sequencer.files.get(file_index)
        if state is None or state.done or state.cut:
            return
        # The file is settled before its error is logged: the error is a peer's, and had anything in making its
        # line raised, the handler guard would drop the message with the file neither failed nor done, and the
        # epoch would wait for it to its stall timeout.
        if self.on_error == "skip":
            # The records delivered are kept; the rest of the file counts as ``lost`` skipped records.
            self._complete_file(stream, file_index, lost + stream.rejected.pop(file_index, 0), "skipping the rest of")
            log.warning(
                "skipping the rest of file index %d (epoch %d): %s",
                file_index,
                stream.epoch,
                _first_line(str(WorkerError.from_dict(error)), MAX_LOGGED_ERROR_CHARS),  # a peer wrote it
            )
            return
        self.fail_stream(stream, error)
        # The clients get the error with its traceback; the operator reading the daemon's log gets one line, at
        # most one a second (a client asking for epochs that fail at once must not fill the disk with the log).
        suppressed = self._failures_logged.allow(time.monotonic())
        if suppressed is not None:
            log.error(
                "epoch %d of %s failed: %s%s",
                stream.epoch,
                stream.job if stream.world_size == 1 else f"job {stream.job!r}",  # "client N", or a name a client chose
                _first_line(str(WorkerError.from_dict(error)), MAX_LOGGED_ERROR_CHARS),  # a peer wrote it
                f" ({suppressed} more epochs failed since the last line)" if suppressed else "",
            )

    def fail_stream(self, stream: Stream, error: dict[str, Any]) -> None:
        if not stream.failed:
            stream.failed = True
            self.events.append(StreamFailed(stream, error))

    def fail_waiting(self, error: dict[str, Any]) -> None:
        """Every stream still waiting for input fails with ``error`` (no worker can read its files)."""
        for stream in list(self.streams.values()):
            if not stream.input_done:
                self.fail_stream(stream, error)

    # -- batches to clients -------------------------------------------------
    def _step_for(self, stream: Stream, rank: int) -> Step | None:
        index = stream.cursors.get(rank, 0)
        if not stream.steps or index < stream.steps[0].index:
            return None
        offset = index - stream.steps[0].index
        return stream.steps[offset] if offset < len(stream.steps) else None

    def pump(self, session: Session) -> None:
        """Send what the client's credits allow, then END once its share of the stream is sent."""
        stream = session.current
        if stream is None or stream.failed or stream.members.get(session.rank) is not session:
            return
        rank = session.rank
        while session.credits > 0 and stream.members.get(rank) is session:  # a failed send drops the client
            group, joined = self._take_steps(session, stream)
            if not group:
                break
            self._send_batch(session, stream, group, joined)
        self._trim(stream)
        if stream.members.get(rank) is not session:
            return  # sending found the client gone (it left the epoch early): it was dropped meanwhile
        if stream.total_steps is not None and stream.cursors.get(rank, 0) >= stream.total_steps:
            self._send_end(session, stream)
        elif session.credits > 0:
            self._starving(session, stream)
        else:
            stream.starved_since = None

    def _take_steps(self, session: Session, stream: Stream) -> tuple[list[tuple[Step, Block]], Block | None]:
        """The rank's pieces of the next steps that are cut, as many as one message carries: one, or for a
        client that takes packed messages (``Epoch.pack``) consecutive small batches up to ``PACK_BYTES``;
        and, when they are adjacent rows of one block, that block's view of all of them (else None).

        Per-message work (encode, send, the client's decode and credit) then stays constant while batches
        get smaller. Batches with reference or ragged (object) columns always travel one per message. A
        group that is a run of several adjacent batches of ``PACK_RUN_BYTES`` or more ends before a batch that
        lies elsewhere (the start of the next block): sent as it is, it is a view; joined with more, copied."""
        rank = session.rank
        group: list[tuple[Step, Block]] = []
        nbytes: int | None = 0  # of the group so far; None once it holds a batch that travels alone
        run: tuple[Block, int, int] | None = None  # (source, first row, rows) while the group is one run
        while True:
            step = self._step_for(stream, rank)
            if step is None:
                break
            piece = step.slices[rank]
            if piece is not None:
                size = None if stream.ref_columns else _packable_nbytes(piece)
                if group and (
                    nbytes is None or size is None or len(group) >= session.pack or nbytes + size > PACK_BYTES
                ):
                    break
                rows = block_rows(piece)
                start = step.start + rank * stream.cutter.batch_size
                if not group:
                    run = (step.source, start, rows) if step.source is not None else None
                elif run is not None:
                    if step.source is run[0] and start == run[1] + run[2]:
                        run = (run[0], run[1], run[2] + rows)
                    elif len(group) > 1 and nbytes is not None and nbytes >= PACK_RUN_BYTES:
                        break  # (a rank of several never has adjacent batches: its groups are copied as before)
                    else:
                        run = None
                nbytes = None if size is None or nbytes is None else nbytes + size
                stream.step_rows -= rows
                group.append((step, piece))
            step.slices[rank] = None
            stream.cursors[rank] = step.index + 1
        joined = rows_slice(run[0], run[1], run[1] + run[2]) if run is not None and len(group) > 1 else None
        return group, joined

    def _send_end(self, session: Session, stream: Stream) -> None:
        rank = session.rank
        batches, samples = stream.cursors[rank], stream.samples_sent.get(rank, 0)
        end = P.End(epoch=stream.epoch, gen=stream.gens[rank], batches=batches, samples=samples)
        files = len(stream.sequencer.order)
        session.finished = (stream.epoch, files, files - len(stream.sequencer.incomplete), samples)
        self.send(session.peer, P.encode(end))
        stream.members.pop(rank, None)  # sending may have dropped a client that is gone
        stream.released.add(rank)
        session.current = None

    def _trim(self, stream: Stream) -> None:
        """Forget the steps every rank has (or will never need)."""
        while stream.steps and all(s is None for s in stream.steps[0].slices):
            stream.steps.popleft()
        if stream.steps:
            stream.shuffle.forget_anchors_before(stream.steps[0].position // stream.shuffle.window_rows - 1)

    def _starving(self, session: Session, stream: Stream) -> None:
        """The client has credits and nothing to receive: say once which ranks the job waits for, if it waits for
        ranks, after ``RANKS_NOTE_S``; fail the epoch once that lasted the stall timeout."""
        now = time.monotonic()
        if stream.starved_since is None:
            stream.starved_since = now
            return
        if stream.input_done:
            return
        starved = now - stream.starved_since
        # Which ranks it waits for is looked at only when it is to be said (a look walks the sessions; this runs
        # every loop turn for every starving client, and a job of 65,536 ranks made each turn take a second).
        # At most once every RANKS_NOTE_S until said (the steps it waits on may be cut later), and at the stall.
        noting = starved >= RANKS_NOTE_S and not stream.ranks_noted and now - stream.ranks_looked_at >= RANKS_NOTE_S
        if not noting and starved < self.stall_timeout_s:
            return
        stream.ranks_looked_at = now
        ranks = self._ranks_waited_for(stream)
        if ranks is not None and noting:
            stream.ranks_noted = True  # once a stream: the stall's error follows, or the ranks come
            log.warning(
                "epoch %d of %s waits for %s (%.0f s so far); it fails after %g s without progress",
                stream.epoch,
                f"job {stream.job!r}",
                ranks,
                starved,
                self.stall_timeout_s,
            )
        if starved < self.stall_timeout_s:
            return
        if ranks is not None:
            message = f"epoch {stream.epoch} made no progress for {starved:.0f}s: it waits for {ranks}"
        else:
            message = (
                f"epoch {stream.epoch} made no progress for {starved:.0f}s: {len(stream.sequencer.incomplete)} "
                "file(s) still unread and no record arrived (see the daemon's log and `loader status`)"
            )
        self.fail_stream(stream, WorkerError(EpochStalledError.__name__, message).to_dict())

    def missing_ranks(self, stream: Stream, most: int | None = None) -> list[int]:
        """Ranks of ``stream``'s job that never asked for it while its steps wait for them, the first ``most``
        of them when given (``loader status``: a row of a job of 65,536 ranks held 65,535 numbers)."""
        if stream.starved_since is None or stream.input_done or not stream.steps:
            return []
        missing = (rank for rank in range(stream.world_size) if rank not in stream.attached_ever)
        return list(itertools.islice(missing, most))

    def _ranks_waited_for(self, stream: Stream) -> str | None:
        """Which ranks the stream's steps wait for and why, as the log and the stall's error say it; None when it
        waits for no rank (but for records)."""
        missing = self.missing_ranks(stream)
        if not missing:
            return None
        absent = set(missing)
        # Ranks waited for that read another stream of the job: (rank, its epoch, where that stream began).
        others = sorted(
            (s.rank, s.current.epoch, s.current.position)
            for s in self.sessions.values()
            if s.rank in absent and s.job == stream.job and s.current is not None and s.current is not stream
        )
        apart = [(r, p) for r, e, p in others if e == stream.epoch and p != stream.position]
        if apart:
            # The same epoch begun at another place: ranks that loaded states of different steps (the desk warned
            # of it when the second asked).
            rank, position = apart[0]
            return (
                f"rank(s) {shown_ranks(sorted({r for r, _ in apart}))} of world_size {stream.world_size}, which read "
                f"this epoch from another place (rank {rank}: begun at sample {position}; this stream at sample "
                f"{stream.position}): ranks that loaded states of different steps; {SAME_STATE_ADVICE}"
            )
        elsewhere = sorted(s.rank for s in self.sessions.values() if s.rank in absent and _read_another(s, stream))
        if elsewhere:
            # Each epoch() call is a request of its own, and a job's ranks pair their requests in order: a rank
            # that asked once more than the others reads a stream of its own.
            return (
                f"rank(s) {shown_ranks(elsewhere)} of world_size {stream.world_size}, which read another request for "
                f"epoch {stream.epoch}: the job's batches wait for every rank, and the ranks asked for it a "
                "different number of times (each client.epoch() iterated is a request; every rank must make the "
                "same calls)"
            )
        behind = [other for other in others if other[1] != stream.epoch]
        if behind:
            rank, epoch, position = behind[0]
            ranks = shown_ranks(sorted({r for r, _, _ in behind}))
            where = (
                f"rank {rank}: epoch {epoch}, begun at sample {position}; this is epoch {stream.epoch}, begun at "
                f"sample {stream.position}"
            )
            if stream.position or any(p for _, _, p in behind):
                # A resume on one side: most often only some ranks loaded the checkpoint's state and the others
                # started over. Their streams wait for each other; no rank of either will ever come.
                return (
                    f"rank(s) {ranks} of world_size {stream.world_size}, which read another epoch ({where}): the "
                    f"job's ranks read the same epochs in step; after a resume, {SAME_STATE_ADVICE}"
                )
            # No resume: a rank that is slower by an epoch (the next comes once it has finished its own).
            return (
                f"rank(s) {ranks} of world_size {stream.world_size}, which still read another epoch ({where}): "
                "the job's batches wait for every rank, and ranks that do not read their epochs in step wait here"
            )
        left = [rank for rank in missing if (stream.job, rank) in self.departed]
        if left:
            # A rank whose client left (a crash, a kill) and did not come back: the job's other ranks would wait
            # for it in their collectives too (torch.distributed). Say which, and when it left.
            when = time.strftime("%H:%M:%S", time.localtime(self.departed[(stream.job, left[0])]))
            return (
                f"rank(s) {shown_ranks(left)} of world_size {stream.world_size}, whose client left (rank {left[0]} at "
                f"{when}) and has not come back: the job's batches wait for every rank; a job that lost a rank is "
                "restarted as a whole (as torchrun restarts it), or its client started again with the same job"
            )
        # The steps are cut for every rank and wait for the ones that never came: say so, not "no record".
        return (
            f"rank(s) {shown_ranks(missing)} of world_size {stream.world_size}, which never asked for this epoch: the "
            "job's batches wait for every rank (start a client for each rank, or give the clients the world_size "
            "that runs)"
        )

    def _send_batch(
        self, session: Session, stream: Stream, group: list[tuple[Step, Block]], joined: Block | None = None
    ) -> None:
        """One BATCH message with the batches of ``group`` (one credit, however many batches it holds);
        ``joined``: their rows as one view, when they lie one after the other in one block."""
        batch = joined if joined is not None else concat([piece for _, piece in group])
        n = block_rows(batch)
        gen = stream.gens[session.rank]
        step = group[-1][0]
        parts = None
        if len(group) > 1:
            parts = [[block_rows(piece), s.position, *(s.anchor or ())] for s, piece in group]
        # Recorded as outstanding before sending: a failed send drops the session, which frees it.
        batch, refs, files = self.refs.outbound(session, batch, stream.ref_columns or frozenset(), gen)
        kept = session.outstanding[-1][2] + self.refs.keep_s if refs else None
        message = P.Batch(
            epoch=stream.epoch,
            gen=gen,
            count=n,
            sample_kind=stream.sample_kind,
            refs=refs,
            files=files,
            position=step.position,
            anchor=list(step.anchor) if step.anchor is not None else None,
            parts=parts,
            kept=kept,
        )
        frames = P.encode(message, batch)
        self.send(session.peer, frames)
        nbytes = frames_nbytes(frames)
        session.bytes_sent += nbytes
        traffic = self.traffic_of(stream.dataset)
        traffic.batches_sent += len(group)
        traffic.samples_sent += n
        traffic.bytes_sent += nbytes
        session.credits -= 1
        stream.samples_sent[session.rank] = stream.samples_sent.get(session.rank, 0) + n
        session.batches_sent += len(group)
        session.samples_sent += n

    def traffic_of(self, dataset: str) -> Traffic:
        """``dataset``'s totals (created at its first use)."""
        traffic = self.traffic.get(dataset)
        if traffic is None:
            traffic = self.traffic[dataset] = Traffic()
        return traffic

    def buffered_rows(self) -> int:
        return sum(stream.rows_buffered for stream in self.streams.values())

    def buffered_bytes(self) -> int:
        """About the bytes the streams hold (rows held x each stream's mean row, as the byte bound counts them:
        24 bytes for a row in shared memory)."""
        return sum(stream.rows_buffered * stream.row_bytes for stream in self.streams.values())

    # -- references ---------------------------------------------------------
    def on_credit(self, session: Session, gen: Any, count: int) -> None:
        """The client's consumer took ``count`` batches of request ``gen``: more credits, their rows freed."""
        # Credits for an epoch the client abandoned must not inflate the next one's window.
        stream = session.current
        if stream is not None and stream.gens.get(session.rank) == gen:
            session.credits += count
        self.refs.credited(session, gen, count)

    def on_epoch_request(self, session: Session, shm: bool, pack: int = 1) -> None:
        """A client asks for an epoch: every batch it will still read has been copied, so free them all."""
        session.shm = shm and self.refs.arenas is not None
        session.pack = max(1, min(pack, P.MAX_PACK))
        self.refs.release_outstanding(session)

    def arenas_held(self) -> set[int]:
        """Arena ids of the references buffered or outstanding (a retired arena waits for these)."""
        return self.refs.held(self._buffered_refs(), self.sessions.values())

    def collect_specs(self) -> None:
        """Forget row specs no row names any more, once enough were interned (``RefKeeper.collect_specs``)."""
        if self.refs.specs_due:
            self.refs.collect_specs(self._buffered_refs(), self.sessions.values())

    def _buffered_refs(self) -> list[tuple[Block, frozenset[str]]]:
        return [
            (block, stream.ref_columns)
            for stream in self.streams.values()
            if stream.ref_columns
            for block in stream.buffered_blocks()
        ]


def _packable_nbytes(piece: Block) -> int | None:
    """Bytes of a batch that may share a message with others; None for ragged (object) columns, whose
    size the array does not tell."""
    total = 0
    for values in piece.values():  # a plain loop: this runs for every batch sent
        if values.dtype.hasobject:
            return None
        total += values.nbytes
    return total


def frames_nbytes(frames: list[Any]) -> int:
    """Bytes of a message's frames (bytes, numpy arrays, buffers, zmq frames); per message, so kept cheap:
    ``nbytes`` where a frame has it, else ``len`` (bytes and zmq frames count bytes), never a memoryview."""
    total = 0
    for frame in frames:
        nbytes = getattr(frame, "nbytes", None)
        total += nbytes if nbytes is not None else len(frame)
    return total


FAILED_EPOCH_LOG_EVERY_S = 1.0


class _RateLimit:
    """At most one event a period is let through; ``allow`` says how many were held back before it."""

    def __init__(self, period_s: float) -> None:
        self.period_s, self.last, self.held = period_s, -float("inf"), 0

    def allow(self, now: float) -> int | None:
        """The count of events held back since the last one let through, or None to hold this one back."""
        if now - self.last < self.period_s:
            self.held += 1
            return None
        held, self.last, self.held = self.held, now, 0
        return held


def _first_line(text: str, limit: int) -> str:
    """The first line of ``text`` a peer wrote, at most ``limit`` characters, fit for the log (``P.printable``:
    terminal escapes do not reach the operator's terminal)."""
    line = P.printable(text.splitlines()[0] if text else "")
    return line if len(line) <= limit else line[:limit] + "..."


def shown_ranks(ranks: list[int]) -> str:
    """Ranks as a log line or an error names them: the first ``SHOWN_RANKS``, then "..." (a job may have 65,536)."""
    return ", ".join(map(str, ranks[:SHOWN_RANKS])) + (", ..." if len(ranks) > SHOWN_RANKS else "")


def _read_another(session: Session, stream: Stream) -> bool:
    """``session``, of ``stream``'s job, reads (or finished) another stream of the same epoch."""
    if session.job != stream.job:
        return False
    if session.current is not None:
        return session.current is not stream and session.current.epoch == stream.epoch
    return session.finished is not None and session.finished[0] == stream.epoch


__all__ = [
    "Stage",
    "Session",
    "Step",
    "Stream",
    "StreamSettings",
    "Traffic",
    "frames_nbytes",
    "shown_ranks",
    "SAME_STATE_ADVICE",
]
