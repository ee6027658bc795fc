"""The daemon: two sockets, one thread, coordinator + stage, and the worker processes it owns.

Sockets (see docs/architecture.md, "Service"):

* ``config.service.bind`` (ROUTER): the one well-known endpoint. Workers say
  HELLO here and get WELCOME with the config and the data endpoint; clients say
  CLIENT_HELLO and receive their batches here; ``loader status`` asks here.
* the data endpoint (PULL, next to the control endpoint): workers PUSH chunks,
  FILE_DONE and FILE_ERROR, so a file's end marker is ordered after its data.

``serve(stop_event)`` runs one loop with a poller: no locks, and the
coordinator is never on the data path.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
import time
from typing import Any

from loader import processes
from loader.errors import WorkerDiedError
from loader.service import protocol as P
from loader.service import transport
from loader.service.coordinator import Coordinator, WorkerRecord
from loader.service.launcher import DEFAULT_WORKER_ENTRY, start_worker
from loader.service.stage import Session, Stage, Stream

log = logging.getLogger("loader.daemon")

POLL_INTERVAL_S = 0.05
HOUSEKEEPING_INTERVAL_S = 0.1
MAX_DRAIN_MESSAGES = 64  # per socket per loop turn, so one busy socket cannot starve the other
MAX_FILE_ATTEMPTS = 3  # worker deaths while holding one file before that file fails the epoch
WORKER_JOIN_TIMEOUT_S = 2.0


class Daemon:
    """Coordinator, stage and workers behind one control endpoint. Context manager."""

    def __init__(self, config: Any, *, worker_entry: str = DEFAULT_WORKER_ENTRY, start_workers: bool = True,
                 bind: str | None = None) -> None:
        self.config = config
        pipeline, workers = config.pipeline, config.workers
        self.files = config.source.expand_files()  # ConfigError for no match / empty list
        seed = pipeline.seed if pipeline.seed is not None else random.SystemRandom().randrange(2**32)
        self.heartbeat_timeout_s = float(workers.heartbeat_timeout_s)
        self._worker_entry = worker_entry
        self._closed = False
        self._router = transport.Router(bind or config.service.bind)
        try:
            self._data = transport.pull(transport.data_endpoint_for(self._router.endpoint))
        except BaseException:
            self._router.close()
            raise
        self.endpoint = self._router.endpoint
        self.data_endpoint = self._data.endpoint
        self._poller = transport.Poller()
        self._poller.register(self._router)
        self._poller.register(self._data)
        self.stage = Stage(
            batch_size=pipeline.batch_size, drop_last=pipeline.drop_last, shuffle_buffer=pipeline.shuffle_buffer,
            seed=seed, samples_per_message=workers.samples_per_message, send=self._send_client,
        )
        self.coordinator = Coordinator(
            self.files, seed=seed, shuffle_files=pipeline.shuffle_buffer > 0,
            heartbeat_timeout_s=self.heartbeat_timeout_s, may_lease=self.stage.may_lease,
        )
        self._welcome = {"config": config.to_dict(), "data": self.data_endpoint}
        self._attempts: dict[tuple[int, int], int] = {}
        self._worker_seq = 0
        self._started_at = time.monotonic()
        self._next_housekeeping = 0.0
        if start_workers:
            for _ in range(workers.count):
                self._launch_worker()

    # -- lifecycle ----------------------------------------------------------
    def serve(self, stop_event: threading.Event | None = None) -> None:
        """Run until ``stop_event`` is set (forever without one)."""
        stop_event = stop_event or threading.Event()
        while not stop_event.is_set() and not self._closed:
            self.step(POLL_INTERVAL_S)

    def close(self) -> None:
        """Say BYE to workers and clients, stop our worker processes, close sockets. Idempotent."""
        if self._closed:
            return
        self._closed = True
        bye = P.encode(P.BYE, {"reason": "daemon stopping"})
        for record in self.coordinator.workers.values():
            if record.peer is not None:
                self._router.send(record.peer, bye)
        for session in list(self.stage.sessions.values()):
            self._router.send(session.peer, bye)
        deadline = time.monotonic() + WORKER_JOIN_TIMEOUT_S
        for record in list(self.coordinator.workers.values()):
            if record.process is not None:
                processes.stop_process(record.process, join_timeout_s=max(0.0, deadline - time.monotonic()))
        self._router.close()
        self._data.close()

    def __enter__(self) -> "Daemon":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- the loop -----------------------------------------------------------
    def step(self, timeout_s: float) -> None:
        """One turn: read what is ready, move batches, lease files, check liveness."""
        ready = self._poller.wait(timeout_s)
        if self._data in ready:
            for _ in range(MAX_DRAIN_MESSAGES):
                frames = self._data.recv(0)
                if frames is None:
                    break
                self._on_data(frames)
        if self._router in ready:
            for _ in range(MAX_DRAIN_MESSAGES):
                got = self._router.recv(0)
                if got is None:
                    break
                self._on_control(*got)
        self._handle_events()
        for session in list(self.stage.sessions.values()):
            self.stage.pump(session)
        self._dispatch_leases()
        now = time.monotonic()
        if now >= self._next_housekeeping:
            self._next_housekeeping = now + HOUSEKEEPING_INTERVAL_S
            self._reap_workers()
            self._reap_clients(now)

    def _on_data(self, frames: list[Any]) -> None:
        try:
            head, columns = P.decode(frames)
        except Exception as exc:  # a malformed message must not stop the daemon
            log.warning("dropping malformed data message: %s", exc)
            return
        kind = head["k"]
        if kind == P.CHUNK:
            self.stage.on_chunk(head, columns)
        elif kind == P.FILE_DONE:
            self.stage.on_done(head)
        elif kind == P.FILE_ERROR:
            self.stage.on_file_error(head)

    def _on_control(self, peer: bytes, frames: list[Any]) -> None:
        try:
            head, _ = P.decode(frames)
        except Exception as exc:
            log.warning("dropping malformed control message: %s", exc)
            return
        kind = head["k"]
        worker = self.coordinator.by_peer(peer)
        if worker is not None:
            self._on_worker(worker, kind, head)
            return
        session = self.stage.sessions.get(peer)
        if session is not None:
            session.last_seen = time.monotonic()
        if kind == P.HELLO:
            record = self.coordinator.hello(str(head.get("worker") or peer.hex()), peer, head.get("pid"))
            self._router.send(peer, P.encode(P.WELCOME, {**self._welcome, "worker": record.worker_id}))
        elif kind == P.CLIENT_HELLO:
            self._client_hello(peer, head)
        elif kind == P.STATUS:
            self._router.send(peer, P.encode(P.STATUS, {"status": self.status()}))
        elif session is None:
            if kind not in (P.BYE,):
                self._router.send(peer, P.encode(P.ERROR, {"unknown_session": True,
                                                          "message": "the daemon does not know this client (restarted?)"}))
        else:
            self._on_client(session, kind, head)

    def _on_worker(self, worker: WorkerRecord, kind: str, head: dict[str, Any]) -> None:
        worker.last_seen = time.monotonic()
        if kind == P.LEASE_REQ:
            worker.waiting = True
        elif kind == P.HEARTBEAT:
            self._router.send(worker.peer, P.encode(P.HEARTBEAT))
        elif kind == P.BYE:
            self._worker_gone(worker, "said goodbye")
        elif kind == P.HELLO:  # a restarted worker reusing its id
            self._router.send(worker.peer, P.encode(P.WELCOME, {**self._welcome, "worker": worker.worker_id}))

    # -- clients ------------------------------------------------------------
    def _client_hello(self, peer: bytes, head: dict[str, Any]) -> None:
        rank, world_size = int(head.get("rank", 0)), int(head.get("world_size", 1))
        if not 0 <= rank < world_size:
            self._router.send(peer, P.encode(P.ERROR, {"message": f"rank {rank} is outside world_size {world_size}"}))
            return
        session = self.stage.open_session(peer, rank, world_size, int(head.get("prefetch", 4)))
        log.info("client %d attached (rank %d of %d)", session.session_id, rank, world_size)
        pipeline = self.config.pipeline
        self._router.send(peer, P.encode(P.CLIENT_WELCOME, {
            "session": session.session_id, "batch_size": pipeline.batch_size,
            "batch_format": pipeline.batch_format, "files": len(self.files),
        }))

    def _on_client(self, session: Session, kind: str, head: dict[str, Any]) -> None:
        if kind == P.CREDIT:
            # Credits for an epoch the client abandoned must not inflate the next one's window.
            if session.current is not None and head.get("g") == session.current.gen:
                session.credits += int(head.get("n", 1))
        elif kind == P.PING:
            self._router.send(session.peer, P.encode(P.PONG))
        elif kind == P.EPOCH:
            self._start_epoch(session, int(head["e"]), int(head["g"]), int(head.get("credit", session.prefetch)),
                              bool(head.get("ahead", True)))
        elif kind == P.BYE:
            self._drop_session(session, "said goodbye")

    def _start_epoch(self, session: Session, epoch: int, gen: int, credits: int, read_ahead: bool) -> None:
        self._cancel(self.stage.drop_stream(session.current))
        session.current = None
        ahead = session.ahead
        session.ahead = None
        if ahead is not None and ahead.epoch == epoch and not ahead.failed:
            stream = ahead
        else:
            self._cancel(self.stage.drop_stream(ahead))
            files = self.coordinator.share(epoch, session.rank, session.world_size)
            stream = self.stage.new_stream(session, epoch, files)
            self.coordinator.enqueue(stream.stream_id, epoch, files)
        stream.gen = gen
        session.current = stream
        session.credits = credits
        session.read_ahead = read_ahead
        if stream.input_done:
            self._read_ahead(session, stream)

    def _read_ahead(self, session: Session, finished: Stream) -> None:
        """Warm start: once an epoch's input is all in, start reading the next one."""
        if not session.read_ahead or session.ahead is not None or session.current is not finished:
            return
        epoch = finished.epoch + 1
        files = self.coordinator.share(epoch, session.rank, session.world_size)
        session.ahead = self.stage.new_stream(session, epoch, files)
        self.coordinator.enqueue(session.ahead.stream_id, epoch, files)

    def _drop_session(self, session: Session, why: str) -> None:
        log.info("client %d detached: %s", session.session_id, why)
        for stream_id in self.stage.close_session(session):
            self._cancel(stream_id)

    def _send_client(self, peer: bytes, frames: list[Any]) -> bool:
        if self._router.send(peer, frames):
            return True
        session = self.stage.sessions.get(peer)
        if session is not None:
            self._drop_session(session, "unreachable")
        return False

    def _reap_clients(self, now: float) -> None:
        for session in list(self.stage.sessions.values()):
            if now - session.last_seen > self.heartbeat_timeout_s:
                self._drop_session(session, f"silent for {now - session.last_seen:.1f}s")

    # -- events, leases, workers --------------------------------------------
    def _handle_events(self) -> None:
        events, self.stage.events = self.stage.events, []
        for event in events:
            if event[0] == "file_complete":
                self.coordinator.job_finished(event[1], event[2])
            elif event[0] == "input_complete":
                self._read_ahead(event[1], event[2])
            elif event[0] == "failed":
                self._fail_stream(event[1], event[2], event[3])

    def _fail_stream(self, session: Session, stream: Stream, error: dict[str, Any]) -> None:
        stream.failed = True
        self._cancel(self.stage.drop_stream(stream))
        if session.current is stream:
            session.current = None
            self._router.send(session.peer, P.encode(P.ERROR, {"g": stream.gen, "error": error}))
        elif session.ahead is stream:
            session.ahead = None  # read ahead failed: the epoch is read again when asked for

    def _cancel(self, stream_id: int | None) -> None:
        if stream_id is None:
            return
        for worker_id, lease_id in self.coordinator.cancel_stream(stream_id):
            record = self.coordinator.workers.get(worker_id)
            if record is not None and record.peer is not None:
                self._router.send(record.peer, P.encode(P.CANCEL, {"lease": lease_id}))

    def _dispatch_leases(self) -> None:
        for record in self.coordinator.workers.values():
            if not record.waiting or record.peer is None:
                continue
            job = self.coordinator.next_job(record)
            if job is None:
                return  # nothing leasable now; no other worker would get anything either
            self._router.send(record.peer, P.encode(P.LEASE, {
                "lease": job.lease_id, "s": job.stream_id, "e": job.epoch, "f": job.file_index, "path": job.path,
            }))

    def _launch_worker(self) -> None:
        self._worker_seq += 1
        worker_id = f"{socket.gethostname()}-{os.getpid()}-{self._worker_seq}"
        proc = start_worker(self.endpoint, worker_id, self._worker_entry)
        self.coordinator.add_worker(worker_id, proc)

    def _reap_workers(self) -> None:
        for record, why in self.coordinator.find_dead():
            self._worker_gone(record, why)

    def _worker_gone(self, record: WorkerRecord, why: str) -> None:
        log.warning("worker %s (pid %s) %s; re-leasing %d file(s)", record.worker_id, record.pid, why, len(record.leases))
        exitcode = None
        if record.process is not None:
            exitcode = processes.stop_process(record.process, join_timeout_s=0.0)
        for job in self.coordinator.remove_worker(record):
            key = (job.stream_id, job.file_index)
            self._attempts[key] = self._attempts.get(key, 0) + 1
            if self._attempts[key] >= MAX_FILE_ATTEMPTS:
                died = WorkerDiedError(f"worker {record.worker_id}", exitcode, worker=record.worker_id, file=job.path)
                self.stage.on_file_error({"s": job.stream_id, "f": job.file_index, "error": died.to_dict()})
        if record.process is not None and not self._closed and why != "said goodbye":
            self.coordinator.restarts += 1
            self._launch_worker()

    # -- status -------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """A JSON-able snapshot: workers, files, rates, queue depths, clients, skipped records."""
        elapsed = max(1e-9, time.monotonic() - self._started_at)
        now = time.monotonic()
        return {
            "endpoint": self.endpoint,
            "data_endpoint": self.data_endpoint,
            "uptime_s": round(elapsed, 3),
            "files": {"total": len(self.files), "leased": self.coordinator.leased(),
                      "queued": self.coordinator.queued()},
            "workers": [
                {"id": r.worker_id, "pid": r.pid, "alive": r.alive, "connected": r.peer is not None,
                 "files_done": r.files_done, "leases": len(r.leases),
                 "last_heartbeat_s": round(now - r.last_seen, 3)}
                for r in self.coordinator.workers.values()
            ],
            "worker_restarts": self.coordinator.restarts,
            "samples_in": self.stage.samples_in,
            "samples_per_s": round(self.stage.samples_in / elapsed, 1),
            "buffered_samples": self.stage.buffered_rows(),
            "duplicates_dropped": self.stage.dropped_duplicates,
            "skipped_records": self.stage.skipped_records,
            "clients": [
                {"session": s.session_id, "rank": s.rank, "world_size": s.world_size, "credits": s.credits,
                 "epoch": s.current.epoch if s.current else None, "batches_sent": s.batches_sent,
                 "samples_sent": s.samples_sent}
                for s in self.stage.sessions.values()
            ],
        }


__all__ = ["Daemon"]
