"""The control plane: file order, leases, worker liveness and replacement. No sample bytes.

The coordinator decides, workers obey:

* ``enqueue`` turns a stream's files (in the epoch's order, ``order.py``) into
  jobs; ``next_job`` leases one to a worker that asked (round robin over
  streams, and only while the stage's ``may_lease`` says the file may be read
  now: buffer room and the reorder window, which bound memory). A lease starts
  at the record the stage asks for (``lease_start``): a re-leased or resumed file
  is not read again from its beginning.
* A job stays leased until the stage has every record of the file
  (``job_finished``). When a worker dies (exit code, or heartbeats missing for
  ``heartbeat_timeout_s``) its unfinished jobs go back to their queue and, for
  a worker this daemon started, a replacement is launched.
* A queue stays in the epoch's order: a job put back (a dead worker's, a cut
  file, a lease taken back) goes to its place in it, so a queued head file
  (always leasable) is the next one leased.
* Heartbeats come from a thread of their own in the worker, so they say the
  process is alive, not that it works. A worker holding a lease that sends no
  data for ``progress_timeout_s`` (``LEASE_PROGRESS_TIMEOUT_S`` by default:
  generous, since a worker sends a chunk at least every 50 ms while samples
  flow) is hung, and is treated like a dead one.
* Leases are owned: each grant gets a fresh random ``token`` (``LEASE_TOKEN_BYTES``)
  that only the worker it was sent to learns (on its control connection), and
  ``owns`` accepts a data message only when its lease id, token, stream, file
  and worker all match a lease held now. The data endpoint cannot tell senders
  apart, so this token is what binds a chunk to the worker that holds the lease.
* Leases ahead (``leases_ahead``): a worker asks for its next file when it starts
  one, so it may hold a few leases, read in the order granted. When it may be
  granted one, and when a queued one goes back to the queue, is ``ahead.py``'s.
  A worker's death re-leases every lease it held.
"""

from __future__ import annotations

import hmac
import itertools
import logging
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

from loader.service.daemon import ahead
from loader.service.daemon.records import EXITED, HUNG, SILENT, Departure, Job, WorkerRecord, identity_at_grant

log = logging.getLogger("loader.coordinator")

# A leased worker that sends no data for this long is hung (one sample may not take longer).
LEASE_PROGRESS_TIMEOUT_S = 120.0
# Random bytes of a lease token: unguessable, so a forged data message cannot claim a lease.
LEASE_TOKEN_BYTES = 16
# Leases remembered after they end, so a worker's late data for one is told from a forgery (bounded).
ENDED_LEASES_KEPT = 4096
# Queued jobs of a stream looked at for one that may be leased now (re-queued files go first; see _leasable).
SCAN_JOBS = 256


class Coordinator:
    """Leases files to workers and keeps track of who holds what."""

    def __init__(
        self,
        files: list[str],
        *,
        heartbeat_timeout_s: float,
        may_lease: Callable[[int, int], bool] = lambda stream_id, file_index: True,
        lease_start: Callable[[int, int], int] = lambda stream_id, file_index: 0,
        progress_timeout_s: float = LEASE_PROGRESS_TIMEOUT_S,
        leases_ahead: int = 0,
        pin_files: bool = False,
    ) -> None:
        self.files = list(files)
        self.leases_ahead = leases_ahead
        self.pin_files = pin_files  # workers may send file rows: each grant notes its file's identity
        self.lease_start = lease_start
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.progress_timeout_s = progress_timeout_s
        self.may_lease = may_lease
        self.workers: dict[str, WorkerRecord] = {}
        self._queues: OrderedDict[int, deque[Job]] = OrderedDict()
        self._lease_ids = itertools.count(1)
        self.restarts = 0
        self._ended: OrderedDict[tuple[str, int], str] = OrderedDict()  # (worker, lease id) -> its token
        # (stream, file) of jobs put back in a queue (a dead worker's, a cut file, a lease taken back): only these
        # can be in a queue when their file completes, so ``job_finished`` searches a queue for these alone.
        self._requeued: set[tuple[int, int]] = set()
        self.leases_granted = 0  # counters for the metrics endpoint
        self.re_leases = 0
        self._busy_ended_s = 0.0  # worker-seconds of lease holding that ended (busy_seconds adds those going on)
        self.taken_back = 0  # leases queued behind a slow file returned to the queue (``take_back``)

    # -- jobs ---------------------------------------------------------------
    def enqueue(self, stream_id: int, epoch: int, file_indexes: list[int]) -> None:
        jobs = deque(
            Job(next(self._lease_ids), stream_id, epoch, i, self.files[i], order=place)
            for place, i in enumerate(file_indexes)
        )
        self._queues[stream_id] = jobs

    def cancel_stream(self, stream_id: int) -> list[tuple[str, int]]:
        """Forget a stream's jobs; returns (worker id, lease id) of leases to cancel."""
        for job in self._queues.pop(stream_id, ()):
            self._requeued.discard((stream_id, job.file_index))
        cancelled = []
        for worker in self.workers.values():
            for lease_id, job in list(worker.leases.items()):
                if job.stream_id == stream_id:
                    self._end(worker, lease_id)
                    cancelled.append((worker.worker_id, lease_id))
        return cancelled

    def wants_lease(self, worker: WorkerRecord, now: float) -> bool:
        """Whether ``worker`` asked and may be granted a lease now (``ahead.may_queue`` for one ahead)."""
        if worker.asked <= 0 or worker.peer is None:
            return False
        return not worker.leases or ahead.may_queue(worker, self.leases_ahead, now)

    def next_job(self, worker: WorkerRecord) -> Job | None:
        """A job for ``worker`` (rotating over streams so clients share workers fairly)."""
        for stream_id in list(self._queues):
            jobs = self._queues[stream_id]
            if not jobs:
                continue
            job = self._leasable(stream_id, jobs)
            if job is None:
                continue
            job.start = self.lease_start(stream_id, job.file_index)
            self._queues.move_to_end(stream_id)
            if not worker.leases:
                worker.progress_at = worker.reading_since = worker.busy_since = time.monotonic()
            job.worker = worker.worker_id
            job.token = secrets.token_hex(LEASE_TOKEN_BYTES)
            job.heard = False
            job.file_identities = identity_at_grant(job.path) if self.pin_files else {}
            worker.leases[job.lease_id] = job
            self.leases_granted += 1
            worker.asked = max(0, worker.asked - 1)
            return job
        return None

    def _leasable(self, stream_id: int, jobs: deque[Job]) -> Job | None:
        """The first queued job of the stream the stage lets a worker start now, taken off the queue.

        The queue is in the epoch's order (``_put_back``), so the head file, when queued, comes first; later
        files the stage refuses now (no room) are passed over, at most ``SCAN_JOBS`` of them."""
        for i, job in enumerate(itertools.islice(jobs, SCAN_JOBS)):
            if self.may_lease(stream_id, job.file_index):
                del jobs[i]
                self._requeued.discard((stream_id, job.file_index))
                return job
        return None

    def job_finished(self, stream_id: int, file_index: int) -> None:
        """The stage has every record of this file: forget its lease (or its re-queued job)."""
        for worker in self.workers.values():
            for lease_id, job in list(worker.leases.items()):
                if job.stream_id == stream_id and job.file_index == file_index:
                    if lease_id == next(iter(worker.leases)):
                        worker.last_file_s = time.monotonic() - worker.reading_since
                    self._end(worker, lease_id)
                    worker.files_done += 1
        queue = self._queues.get(stream_id)
        if queue and (stream_id, file_index) in self._requeued:
            # A dead worker's data can complete a file after its job was re-queued. Re-queued jobs lie near
            # the front (before every file not leased yet), and only those are looked for: a scan of the
            # whole queue per file would make an epoch cost quadratic in its files.
            self._requeued.discard((stream_id, file_index))
            for i, job in enumerate(queue):
                if job.file_index == file_index:
                    del queue[i]
                    break

    def requeue(self, stream_id: int, file_index: int) -> list[tuple[str, int]]:
        """End the lease of this file (the stage cut it) and queue it again; the (worker id, lease id) to
        cancel. It is leased again from where the stage stands (``lease_start``)."""
        cancelled = []
        for worker in self.workers.values():
            for lease_id, job in list(worker.leases.items()):
                if job.stream_id == stream_id and job.file_index == file_index:
                    self._end(worker, lease_id)
                    cancelled.append((worker.worker_id, lease_id))
                    self._queue_again(job)
        return cancelled

    def _queue_again(self, job: Job) -> None:
        """Queue the file of an ended lease again, as a new job (a new lease id)."""
        self._put_back(Job(next(self._lease_ids), job.stream_id, job.epoch, job.file_index, job.path, order=job.order))

    def _put_back(self, job: Job) -> bool:
        """Put ``job`` back in its stream's queue at its place in the epoch's order (False: the stream is gone).

        At the front, files put back in turn (taken back from two workers, cut) stood before the head file
        and could keep it from every worker for good (docs/internals.md, "Leases ahead"). A queue is leased
        from its front, so only files put back lie before that place: the walk is short."""
        queue = self._queues.get(job.stream_id)
        if queue is None:
            return False
        place = next((i for i, queued in enumerate(queue) if queued.order > job.order), len(queue))
        queue.insert(place, job)
        self._requeued.add((job.stream_id, job.file_index))
        return True

    def take_back(self, now: float) -> list[tuple[str, int]]:
        """Leases waiting behind a slow file (``ahead.waiting_behind_slow``) back to their queues, at their
        places in the epoch's order, as new leases; the (worker id, lease id) to cancel."""
        cancelled: list[tuple[str, int]] = []
        for worker in self.workers.values():
            queued = ahead.waiting_behind_slow(worker, now)
            for job in queued:
                self._end(worker, job.lease_id)
                self._queue_again(job)
                cancelled.append((worker.worker_id, job.lease_id))
            self.taken_back += len(queued)
        return cancelled

    def take_back_due_in(self, now: float) -> float:
        """Seconds until ``take_back`` may have something to do (inf when no lease waits behind another)."""
        return ahead.due_in(self.workers.values(), now)

    def queued(self, stream_id: int | None = None) -> int:
        if stream_id is not None:
            return len(self._queues.get(stream_id, ()))
        return sum(len(q) for q in self._queues.values())

    def leased(self) -> int:
        return sum(len(w.leases) for w in self.workers.values())

    def busy_seconds(self, now: float) -> float:
        """Worker-seconds spent holding a lease so far, counted from grant to end (``loader_worker_busy_seconds``).
        It was sampled at each metrics snapshot: an epoch that fell between two snapshots counted nothing."""
        going_on = sum(max(0.0, now - w.busy_since) for w in self.workers.values() if w.leases)
        return self._busy_ended_s + going_on

    # -- workers ------------------------------------------------------------
    def add_worker(self, worker_id: str, process: Any = None) -> WorkerRecord:
        record = WorkerRecord(worker_id, process=process, pid=getattr(process, "pid", None))
        self.workers[worker_id] = record
        return record

    def hello(self, worker_id: str, peer: bytes, pid: int | None) -> WorkerRecord:
        record = self.workers.get(worker_id) or self.add_worker(worker_id)
        record.peer, record.pid, record.last_seen = peer, pid, time.monotonic()
        return record

    def owns(self, worker_id: str, lease_id: int, token: str, stream_id: int, file_index: int) -> bool:
        """Whether ``worker_id`` holds lease ``lease_id`` with ``token`` for this stream and file right now."""
        record = self.workers.get(worker_id)
        job = record.leases.get(lease_id) if record is not None else None
        return (
            job is not None
            and job.stream_id == stream_id
            and job.file_index == file_index
            and bool(job.token)
            and hmac.compare_digest(job.token.encode(), token.encode())
        )

    def leased_job(self, worker_id: str, lease_id: int) -> Job | None:
        """The lease ``lease_id`` of ``worker_id``: its path and the identities file rows are bound to
        (asked after ``owns``)."""
        record = self.workers.get(worker_id)
        return record.leases.get(lease_id) if record is not None else None

    def _end(self, worker: WorkerRecord, lease_id: int) -> Job:
        """End one of ``worker``'s leases (remembered, so its late data is told from a forgery)."""
        if lease_id == next(iter(worker.leases)):
            worker.reading_since = time.monotonic()  # its worker goes on to the next one it holds
        job = worker.leases.pop(lease_id)
        if not worker.leases:
            self._busy_ended_s += time.monotonic() - worker.busy_since
        self._remember(worker.worker_id, job)
        return job

    def _remember(self, worker_id: str, job: Job) -> None:
        self._ended[(worker_id, job.lease_id)] = job.token
        while len(self._ended) > ENDED_LEASES_KEPT:
            self._ended.popitem(last=False)

    def was_owned(self, worker_id: str, lease_id: int, token: str) -> bool:
        """Whether ``worker_id`` held lease ``lease_id`` with ``token`` until recently (its data is late, not forged)."""
        ended = self._ended.get((worker_id, lease_id))
        return ended is not None and bool(ended) and hmac.compare_digest(ended.encode(), token.encode())

    def progressed(self, worker_id: str | None, lease_id: int | None = None) -> None:
        """A worker sent data (of ``lease_id``): it is working, whatever its heartbeats say."""
        record = self.workers.get(worker_id) if worker_id is not None else None
        if record is not None:
            record.progress_at = time.monotonic()
            job = record.leases.get(lease_id) if lease_id is not None else None
            if job is not None:
                job.heard = True

    def by_peer(self, peer: bytes) -> WorkerRecord | None:
        for record in self.workers.values():
            if record.peer == peer:
                return record
        return None

    def find_dead(self, now: float | None = None) -> list[Departure]:
        """Workers that exited, went silent or hang on a lease: (record, the reason, how: EXITED, SILENT, HUNG)."""
        now = time.monotonic() if now is None else now
        dead = []
        for record in self.workers.values():
            proc = record.process
            if proc is not None and not proc.is_alive():
                # A launcher's handle may say more than a code (a Ray actor lost with its node has none).
                why = getattr(proc, "exit_reason", None) or f"exited with code {proc.exitcode}"
                dead.append(Departure(record, why, EXITED))
            elif record.peer is not None and now - record.last_seen > self.heartbeat_timeout_s:
                dead.append(Departure(record, f"sent no heartbeat for {now - record.last_seen:.1f}s", SILENT))
            elif record.leases and now - record.progress_at > self.progress_timeout_s:
                why = f"made no progress on its lease for {now - record.progress_at:.1f}s (hung?)"
                dead.append(Departure(record, why, HUNG))
        return dead

    def remove_worker(self, record: WorkerRecord) -> list[Job]:
        """Drop a dead worker; its unfinished jobs go back to their queues (``_put_back``). Returned in the
        order granted: the first is the file it was reading, the rest waited behind it."""
        self.workers.pop(record.worker_id, None)
        held = list(record.leases.values())
        if held:
            self._busy_ended_s += time.monotonic() - record.busy_since
        for job in held:
            self._remember(record.worker_id, job)
            job.worker = None
            if self._put_back(job):
                self.re_leases += 1
        record.leases.clear()
        return held


__all__ = ["Coordinator", "Departure", "Job", "WorkerRecord"]
