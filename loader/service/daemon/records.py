"""What the coordinator keeps per lease (``Job``) and per worker (``WorkerRecord``)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Job:
    lease_id: int
    stream_id: int
    epoch: int
    file_index: int
    path: str
    worker: str | None = None
    start: int = 0  # the first record the lease reads (set at each grant)
    token: str = ""  # issued afresh with every grant (``next_job``)
    heard: bool = False  # data of this lease arrived: its worker has started it
    # member -> (size, mtime_ns, inode, device) of the file this lease's first file rows were bound to
    # (``stage_file_rows``): the worker reads the file it opened, so later rows must name that one too.
    file_identities: dict[str, tuple[int, int, int, int]] = field(default_factory=dict)


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
    last_file_s: float = 0.0  # how long its last complete file took, from there to its end
    files_done: int = 0
    started: float = field(default_factory=time.monotonic)
    progress_at: float = field(default_factory=time.monotonic)  # last lease granted or data received
    claim: str | None = None  # the secret a worker this daemon started must show in its first HELLO

    @property
    def alive(self) -> bool:
        return self.process.is_alive() if self.process is not None else self.peer is not None


__all__ = ["Job", "WorkerRecord"]
