"""The daemon: one loop over two message sources, coordinator + stage, and the clients it serves.

Sources (see docs/architecture.md, "Service"):

* ``config.service.bind`` (ROUTER): the one well-known endpoint. Workers say
  HELLO here and get WELCOME with the config and the data endpoint; clients say
  CLIENT_HELLO and receive their batches here; ``loader status`` asks here.
* the data endpoint (PULL, next to the control endpoint): workers PUSH chunks,
  FILE_DONE and FILE_ERROR, so a file's end marker is ordered after its data.

With ``config.workers.transport`` "pipe" or "queue" the daemon's own workers
use a pipe link each instead (``mp_transport``): their control messages join
the router (``SplitRouter``) and their data the data source (``LinkData``),
so the loop below is the same for every transport.

``serve(stop_event)`` runs one loop with a poller: no locks, and the
coordinator is never on the data path. Worker management is ``WorkerPool``
(``workforce.py``); this module serves clients.

Shared-memory fast path (``shm=True``, the default): the daemon owns an
``ArenaPool`` (``shm.py``); each worker writes its large rows into its own
arena and sends references, the stage moves references, and a client on this
host copies the rows out of the arenas (see docs/architecture.md, "Service").
"""

from __future__ import annotations

import logging
import random
import threading
import time
from typing import Any

from loader.service import mp_transport
from loader.service import protocol as P
from loader.service import transport
from loader.service.coordinator import LEASE_PROGRESS_TIMEOUT_S, Coordinator
from loader.service.launcher import DEFAULT_WORKER_ENTRY
from loader.service.shm import open_pool
from loader.service.stage import Session, Stage, Stream
from loader.service.workforce import MAX_FILE_ATTEMPTS, WorkerPool

log = logging.getLogger("loader.daemon")

POLL_INTERVAL_S = 0.05
HOUSEKEEPING_INTERVAL_S = 0.1
MAX_DRAIN_MESSAGES = 64  # per socket per loop turn, so one busy socket cannot starve the other
WORKER_JOIN_TIMEOUT_S = 2.0
# The shared-memory fast path for large rows; Daemon(shm=False) or this turns it off.
SHM_ENABLED = True


def _open_sources(transport_kind: str, bind: str) -> tuple[Any, Any, Any]:
    """(router, data source, worker links or None) for ``config.workers.transport``."""
    router = transport.Router(bind)
    try:
        if transport_kind in mp_transport.MP_TRANSPORTS:
            links = mp_transport.WorkerLinks(transport_kind)
            return mp_transport.SplitRouter(router, links.control), links.data, links
        return router, transport.pull(transport.data_endpoint_for(router.endpoint)), None
    except BaseException:
        router.close()
        raise


class Daemon:
    """Coordinator, stage and workers behind one control endpoint. Context manager."""

    def __init__(self, config: Any, *, worker_entry: str = DEFAULT_WORKER_ENTRY, start_workers: bool = True,
                 bind: str | None = None, progress_timeout_s: float = LEASE_PROGRESS_TIMEOUT_S,
                 shm: bool | None = None, arena_bytes: int | None = None) -> None:
        self.config = config
        pipeline, workers = config.pipeline, config.workers
        self.files = config.source.expand_files()  # ConfigError for no match / empty list
        seed = pipeline.seed if pipeline.seed is not None else random.SystemRandom().randrange(2**32)
        self.heartbeat_timeout_s = float(workers.heartbeat_timeout_s)
        self._closed = False
        if arena_bytes is None:
            arena_bytes = config.workers.shm_arena_mib * 1024 * 1024
        self.arenas = open_pool(SHM_ENABLED if shm is None else shm, arena_bytes)
        try:
            self._router, self._data, links = _open_sources(workers.transport, bind or config.service.bind)
        except BaseException:
            if self.arenas is not None:
                self.arenas.close()
            raise
        self.endpoint = self._router.endpoint
        self.data_endpoint = self._data.endpoint
        self._poller = transport.Poller()
        self._poller.register(self._router)
        self._poller.register(self._data)
        self.stage = Stage(
            batch_size=pipeline.batch_size, drop_last=pipeline.drop_last, shuffle_buffer=pipeline.shuffle_buffer,
            seed=seed, samples_per_message=workers.samples_per_message, send=self._send_client,
            arenas=self.arenas,
        )
        self.coordinator = Coordinator(
            self.files, seed=seed, shuffle_files=pipeline.shuffle_buffer > 0,
            heartbeat_timeout_s=self.heartbeat_timeout_s, may_lease=self.stage.may_lease,
            progress_timeout_s=progress_timeout_s,
        )
        self.pool = WorkerPool(
            self.coordinator, send=self._router.send, welcome={"config": config.to_dict(), "data": self.data_endpoint},
            endpoint=self.endpoint, entry=worker_entry, links=links, on_file_error=self.stage.on_file_error,
            arenas=self.arenas,
        )
        self._started_at = time.monotonic()
        self._next_housekeeping = 0.0
        try:
            for _ in range(workers.count if start_workers else 0):
                self.pool.launch()
        except BaseException:
            self.close()
            raise

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
        for session in list(self.stage.sessions.values()):
            self._router.send(session.peer, bye)
        self.pool.close(WORKER_JOIN_TIMEOUT_S)
        self._router.close()
        self._data.close()
        if self.arenas is not None:
            self.arenas.close()  # after the workers: nothing in /dev/shm outlives the daemon

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
        self.pool.dispatch()
        now = time.monotonic()
        if now >= self._next_housekeeping:
            self._next_housekeeping = now + HOUSEKEEPING_INTERVAL_S
            self.pool.reap()
            self._reap_clients(now)
            if self.arenas is not None and self.arenas.has_retired:
                self.arenas.collect(self.stage.arenas_held(), now)

    def _on_data(self, frames: list[Any]) -> None:
        try:
            head, columns = P.decode(frames)
        except Exception as exc:  # a malformed message must not stop the daemon
            log.warning("dropping malformed data message: %s", exc)
            return
        kind = head["k"]
        self.coordinator.progressed(head.get("w"))
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
            self.pool.on_message(worker, kind, head)
            return
        session = self.stage.sessions.get(peer)
        if session is not None:
            session.last_seen = time.monotonic()
        if kind == P.HELLO:
            self.pool.hello(peer, head)
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

    # -- clients ------------------------------------------------------------
    def _client_hello(self, peer: bytes, head: dict[str, Any]) -> None:
        rank, world_size = int(head.get("rank", 0)), int(head.get("world_size", 1))
        if not 0 <= rank < world_size:
            self._router.send(peer, P.encode(P.ERROR, {"message": f"rank {rank} is outside world_size {world_size}"}))
            return
        session = self.stage.open_session(peer, rank, world_size, int(head.get("prefetch", 4)))
        log.info("client %d attached (rank %d of %d)", session.session_id, rank, world_size)
        pipeline = self.config.pipeline
        welcome = {
            "session": session.session_id, "batch_size": pipeline.batch_size,
            "batch_format": pipeline.batch_format, "files": len(self.files),
            # Clients are dropped after heartbeat_timeout_s of silence: they ping at the workers' pace.
            "ping_s": self.config.workers.heartbeat_interval_s,
        }
        if self.arenas is not None:
            welcome[P.SHM] = self.arenas.describe()  # the client probes, and answers in each EPOCH
        self._router.send(peer, P.encode(P.CLIENT_WELCOME, welcome))

    def _on_client(self, session: Session, kind: str, head: dict[str, Any]) -> None:
        if kind == P.CREDIT:
            # Credits for an epoch the client abandoned must not inflate the next one's window.
            if session.current is not None and head.get("g") == session.current.gen:
                session.credits += int(head.get("n", 1))
            self.stage.on_credit(session, head.get("g"), int(head.get("n", 1)))
        elif kind == P.PING:
            self._router.send(session.peer, P.encode(P.PONG))
        elif kind == P.EPOCH:
            self.stage.on_epoch_request(session, bool(head.get(P.SHM, False)))
            self._start_epoch(session, int(head["e"]), int(head["g"]), int(head.get("credit", session.prefetch)),
                              bool(head.get("ahead", True)))
        elif kind == P.BYE:
            self._drop_session(session, "said goodbye")

    def _start_epoch(self, session: Session, epoch: int, gen: int, credits: int, read_ahead: bool) -> None:
        self.pool.cancel(self.stage.drop_stream(session.current))
        session.current = None
        ahead = session.ahead
        session.ahead = None
        if ahead is not None and ahead.epoch == epoch and not ahead.failed:
            stream = ahead
        else:
            self.pool.cancel(self.stage.drop_stream(ahead))
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
        if 0 < self.config.pipeline.epochs <= epoch:
            # The config says training stops after `epochs` (numbered from 0); a client
            # may still ask for more, but reading them ahead would be wasted work.
            return
        files = self.coordinator.share(epoch, session.rank, session.world_size)
        session.ahead = self.stage.new_stream(session, epoch, files)
        self.coordinator.enqueue(session.ahead.stream_id, epoch, files)

    def _drop_session(self, session: Session, why: str) -> None:
        log.info("client %d detached: %s", session.session_id, why)
        for stream_id in self.stage.close_session(session):
            self.pool.cancel(stream_id)

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

    # -- events ---------------------------------------------------------------
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
        self.pool.cancel(self.stage.drop_stream(stream))
        if session.current is stream:
            session.current = None
            self._router.send(session.peer, P.encode(P.ERROR, {"g": stream.gen, "error": error}))
        elif session.ahead is stream:
            session.ahead = None  # read ahead failed: the epoch is read again when asked for

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
            "transport": self.config.workers.transport,
            "workers": self.pool.describe(now),
            "worker_restarts": self.coordinator.restarts,
            "samples_in": self.stage.samples_in,
            "samples_per_s": round(self.stage.samples_in / elapsed, 1),
            "buffered_samples": self.stage.buffered_rows(),
            "duplicates_dropped": self.stage.dropped_duplicates,
            "skipped_records": self.stage.skipped_records,
            "shm_arenas": len(self.arenas.arenas) if self.arenas is not None else 0,
            "clients": [
                {"session": s.session_id, "rank": s.rank, "world_size": s.world_size, "credits": s.credits,
                 "epoch": s.current.epoch if s.current else None, "batches_sent": s.batches_sent,
                 "samples_sent": s.samples_sent}
                for s in self.stage.sessions.values()
            ],
        }


__all__ = ["Daemon", "MAX_FILE_ATTEMPTS", "SHM_ENABLED"]
