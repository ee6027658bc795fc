"""What the coordinator keeps per lease (``Job``) and per worker (``WorkerRecord``)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from loader.service.shm.file_layout import Identity, identity


@dataclass
class Job:
    lease_id: int
    stream_id: int
    epoch: int
    file_index: int
    path: str
    order: int = 0  # its place in the stream's epoch order: a job put back in the queue goes there
    worker: str | None = None
    start: int = 0  # the first record the lease reads (set at each grant)
    token: str = ""  # issued afresh with every grant (``next_job``)
    heard: bool = False  # data of this lease arrived: its worker has started it
    # file -> (size, mtime_ns, inode, device) as the lease found it: the leased file at the grant (with
    # ``Coordinator.pin_files``), a companion at its first file rows (``stage_file_rows``). The worker reads
    # the files it opened, so rows bound to a path replaced since are refused.
    file_identities: dict[str, Identity] = field(default_factory=dict)


@dataclass
class WorkerRecord:
    worker_id: str
    peer: bytes | None = None
    pid: int | None = None
    process: Any = None  # when this daemon started it: its launcher's handle (a multiprocessing process, a Ray actor)
    last_seen: float = field(default_factory=time.monotonic)
    asked: int = 0  # lease requests not yet answered
    leases: dict[int, Job] = field(default_factory=dict)  # in the order granted: the worker reads the first
    reading_since: float = 0.0  # when the worker began its first lease (as the daemon sees it)
    busy_since: float = 0.0  # when it last went from holding no lease to holding one
    last_file_s: float = 0.0  # how long its last complete file took, from there to its end
    files_done: int = 0
    started: float = field(default_factory=time.monotonic)
    progress_at: float = field(default_factory=time.monotonic)  # last lease granted or data received
    claim: str | None = None  # the secret a worker this daemon started must show in its first HELLO
    at: tuple[int, int] | None = None  # (lease, record) its last heartbeat said it was reading (``Heartbeat.at``)
    slow_noted: float | None = None  # the ``progress_at`` whose long wait the log has told (``WorkerPool``)

    @property
    def alive(self) -> bool:
        return self.process.is_alive() if self.process is not None else self.peer is not None


# How a worker left, as ``Coordinator.find_dead`` found it. The daemon stops a silent or a hung worker itself,
# so its exit code (SIGTERM) says nothing of the cause: these words do (``WorkerPool.gone``).
EXITED = "exited"  # its process ended
SILENT = "silent"  # no heartbeat for heartbeat_timeout_s
HUNG = "hung"  # holding a lease, no data for progress_timeout_s
LEFT = "left"  # it said goodbye (BYE): its own choice, or it took the daemon for gone
UNREADABLE = "unreadable"  # it said goodbye because it could not read a message of the daemon's (a lease)


class Departure(NamedTuple):
    """A worker found gone: the record, the log's words for why, and how (``EXITED``, ``SILENT``, ``HUNG``, ``LEFT``,
    ``UNREADABLE``)."""

    record: WorkerRecord
    why: str
    how: str = EXITED


def identity_at_grant(path: str) -> dict[str, Identity]:
    """``{path: its identity}`` now: the worker opens the file after the grant, so rows bound later to a path
    replaced in between are not the ones it read (``stage_file_rows``). Empty when it cannot be looked at
    (the worker will say why it cannot open it)."""
    try:
        return {path: identity(os.stat(path))}
    except OSError:
        return {}


__all__ = ["Job", "WorkerRecord", "Departure", "EXITED", "SILENT", "HUNG", "LEFT", "UNREADABLE", "identity_at_grant"]
