"""What the stage keeps: per client session, per epoch stream of a job, and the events it reports.

Plain records, no behaviour beyond what they can say of themselves: the ``Stage``
(``stage.py``) moves rows between them, the client desk (``desk.py``) attaches
sessions to streams, the daemon's loop acts on the events. A ``Session`` is one
attached client (rank, world_size, credits); a ``Stream`` is one epoch of one
job, from its files in order to the steps cut for every rank.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from loader.service.blocks import Block
from loader.service.daemon import fit
from loader.service.daemon.batching import StepCutter, WindowShuffle
from loader.service.daemon.sequencer import Sequencer
from loader.service.order import Anchor


@dataclass
class Traffic:
    """One dataset's totals since the daemon started: what its metrics (label ``dataset``) export."""

    batches_sent: int = 0
    samples_sent: int = 0
    bytes_sent: int = 0  # of BATCH messages to clients
    samples_in: int = 0  # rows of the epoch's order, from workers (after de-duplication)
    bytes_in: int = 0  # of data messages from workers holding one of its leases


@dataclass(frozen=True)
class StreamSettings:
    """How one dataset's streams are shuffled and batched (a session reads one dataset)."""

    batch_size: int
    drop_last: bool
    shuffle_buffer: int
    seed: int


@dataclass
class Step:
    """One global step: a block per rank (None once sent or freed), and where the epoch stands after it."""

    index: int
    slices: list[Block | None]
    position: int
    anchor: Anchor | None
    # Where the step's rows lie when they were cut from one block (``batching.CutStep``): rank r's slice is
    # rows ``start + r x batch_size`` on of ``source``. The stage sends a run of adjacent slices as one view.
    source: Block | None = None
    start: int = 0


@dataclass
class Session:
    session_id: int
    peer: bytes
    rank: int
    world_size: int
    prefetch: int
    last_seen: float = field(default_factory=time.monotonic)
    owner: str | None = None  # its process's random value (ClientHello.owner)
    credits: int = 0
    current: Stream | None = None
    read_ahead: bool = True
    batches_sent: int = 0
    samples_sent: int = 0
    wait_s: float = 0.0  # the client's running total of time waiting for batches (its credits say it)
    bytes_sent: int = 0
    shm: bool = False  # the client maps the daemon's arenas (it says so with each EPOCH)
    pack: int = 1  # the most batches it takes in one message (``Epoch.pack``)
    # (request id, reference arrays) per batch sent and not yet taken by the consumer
    outstanding: deque = field(default_factory=deque)
    dataset: str = "default"
    job: str = ""  # the key of the job this session reads with (``desk``)
    settings: StreamSettings | None = None  # None: the stage's own (the default dataset's)
    # (epoch, files, files done, samples sent) of the epoch whose END it was sent last: the client may
    # still be reading it, so the loader_epoch* gauges go on showing it until the next epoch starts.
    finished: tuple[int, int, int, int] | None = None
    # A ``protocol.Epoch`` waiting for the pace of epochs (``desk.EPOCH_PACING``); a newer one replaces it.
    parked_epoch: Any = None

    def epoch_progress(self) -> tuple[int, int, int, int] | None:
        """(epoch, files, files done, samples sent to this rank) of the epoch it reads, else of the one it was
        sent last: what `loader status` and the loader_epoch* gauges show of its epoch."""
        stream = self.current
        if stream is None:
            return self.finished
        files = len(stream.sequencer.order)
        done = files - len(stream.sequencer.incomplete)
        return (stream.epoch, files, done, stream.samples_sent.get(self.rank, 0))


@dataclass
class Stream:
    """One epoch of one job, from ``position`` on (0, or a checkpoint's)."""

    stream_id: int
    epoch: int
    job: str
    world_size: int
    settings: StreamSettings
    position: int
    sequencer: Sequencer
    shuffle: WindowShuffle
    cutter: StepCutter
    prefetch: int
    steps: deque[Step] = field(default_factory=deque)
    steps_cut: int = 0
    total_steps: int | None = None  # known once the input is complete
    members: dict[int, Session] = field(default_factory=dict)  # rank -> the session reading it now
    gens: dict[int, int] = field(default_factory=dict)  # rank -> its request id
    cursors: dict[int, int] = field(default_factory=dict)  # rank -> the next step to send it
    released: set[int] = field(default_factory=set)  # ranks that left or ended: nothing is kept for them
    attached_ever: set[int] = field(default_factory=set)
    sessions_ever: set[int] = field(default_factory=set)  # ids of the sessions that read it
    # False once a rank of an earlier run of the job left it unfinished, or that run was replaced (a restarted
    # trainer): no rank joins it any more, as the rank that left would be on another stream for good.
    joinable: bool = True
    ranks_noted: bool = False  # the log said which ranks its steps wait for (``Stage._starving``)
    ranks_looked_at: float = 0.0  # when it was last looked at which ranks it waits for (a walk of every rank)
    sample_kind: str = "tuple"
    failed: bool = False
    ref_columns: frozenset[str] | None = None  # decided by the first chunk (stage_refs.py)
    layout: fit.Layout | None = None  # fields, dtypes and row shapes, decided by the first chunk (fit.py)
    layout_file: int = -1  # the file of that chunk (errors name it)
    rejected: dict[int, int] = field(default_factory=dict)  # file -> records that did not fit (on_error = "skip")
    starved_since: float | None = None
    step_rows: int = 0  # rows in ``steps`` not yet sent
    samples_sent: dict[int, int] = field(default_factory=dict)  # rank -> samples sent it
    arrived: dict[int, int] = field(default_factory=dict)  # file -> records that reached the stage from its lease
    # file -> why rows of its lease were refused: it changed under the lease (on_error = "skip": its FILE_DONE says so)
    changed: dict[int, str] = field(default_factory=dict)
    chunk_rows: int = 0  # the most records one chunk of this stream has brought (its bound must hold one)
    rows_taken: int = 0  # rows it has taken here, for the byte bound (``row_bytes``)
    bytes_taken: int = 0  # ... which took about these bytes (references: 24 a row)
    dataset: str = "default"  # the dataset its job reads (the metrics count traffic per dataset)

    @property
    def input_done(self) -> bool:
        return self.total_steps is not None

    @property
    def row_bytes(self) -> int:
        """The mean bytes of the rows it has taken (rounded up; 0 before any)."""
        return -(-self.bytes_taken // self.rows_taken) if self.rows_taken else 0

    @property
    def rows_buffered(self) -> int:
        return self.sequencer.held_rows + self.shuffle.rows + self.cutter.rows + self.step_rows

    def buffered_blocks(self) -> list[Block]:
        slices = [s for step in self.steps for s in step.slices if s is not None]
        return self.sequencer.blocks() + self.shuffle.blocks() + self.cutter.blocks() + slices


@dataclass(frozen=True)
class FileComplete:
    """Every record of a file arrived: its lease is over."""

    stream_id: int
    file_index: int


@dataclass(frozen=True)
class FileCut:
    """The reorder window is full: stop the lease of this file, to be leased again from where it stands."""

    stream_id: int
    file_index: int


@dataclass(frozen=True)
class StreamFailed:
    """A file of ``stream`` failed for good: the epoch ends with ``error`` (``WorkerError.to_dict()``)."""

    stream: Stream
    error: dict[str, Any]


StageEvent = FileComplete | FileCut | StreamFailed


__all__ = [
    "Traffic",
    "StreamSettings",
    "Step",
    "Session",
    "Stream",
    "FileComplete",
    "FileCut",
    "StreamFailed",
    "StageEvent",
]
