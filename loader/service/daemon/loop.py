"""The daemon: one loop over two message sources, handing each message to its handler.

Sources: the well-known endpoint ``config.service.bind`` (a ROUTER: worker
control, clients, ``loader status``) and the data endpoint (worker chunks, file
results; ordered per worker, so a file's end marker follows its data). With
the "pipe" and "queue" transports the daemon's own workers use a pipe link each
(``transport.links``), joined to the same two sources, so this loop is the same
for every transport. Worker messages go to ``WorkerPool`` (``workforce``),
client messages to ``ClientDesk`` (``desk``), data to the ``Stage``. No locks:
one thread runs it all. The coordinator never sees sample bytes; per data
message it only notes that the sending worker made progress.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from typing import Any

from loader.config import LoaderConfig
from loader.errors import MalformedMessageError, TransportError
from loader.service import protocol as P
from loader.service import transport
from loader.service.daemon.coordinator import Coordinator
from loader.service.daemon.desk import ClientDesk
from loader.service.daemon.launcher import DEFAULT_WORKER_ENTRY
from loader.service.daemon.rate import RecentRate
from loader.service.daemon.stage import Stage
from loader.service.daemon.workforce import MAX_FILE_ATTEMPTS, WorkerPool
from loader.service.shm.pool import open_pool
from loader.service.transport import links

log = logging.getLogger("loader.daemon")

POLL_INTERVAL_S = 0.05
HOUSEKEEPING_INTERVAL_S = 0.1
MAX_DRAIN_MESSAGES = 64  # per socket per loop turn, so one busy socket cannot starve the other
WORKER_JOIN_TIMEOUT_S = 2.0


def _open_sources(transport_kind: str, bind: str) -> tuple[Any, Any, Any]:
    """(router, data source, worker links or None) for ``config.workers.transport``."""
    router = transport.Router(bind)
    try:
        if transport_kind in links.MP_TRANSPORTS:
            worker_links = links.WorkerLinks(transport_kind)
            return links.SplitRouter(router, worker_links.control), worker_links.data, worker_links
        return router, transport.pull(transport.data_endpoint_for(router.endpoint)), None
    except BaseException:
        router.close()
        raise


class Daemon:
    """Coordinator, stage and workers behind one control endpoint. Context manager."""

    def __init__(
        self, config: LoaderConfig, *, worker_entry: str = DEFAULT_WORKER_ENTRY, start_workers: bool = True
    ) -> None:
        """Serve ``config``; ``worker_entry`` names the worker function (tests swap in faulty ones), and
        ``start_workers=False`` waits for hand-started workers only."""
        self.config = config
        pipeline, workers = config.pipeline, config.workers
        self.files = config.source.expand_files()  # ConfigError for no match / empty list
        seed = pipeline.seed if pipeline.seed is not None else random.SystemRandom().randrange(2**32)
        self._closed = False
        self.rejected_messages = 0  # malformed messages dropped
        # Bind first: a daemon that cannot bind (port in use) touches nothing in /dev/shm.
        try:
            self._router, self._data, worker_links = _open_sources(workers.transport, config.service.bind)
        except TransportError as exc:  # a port in use is a config problem: say which file
            raise TransportError(f"{exc} (service.bind in {config.origin})") from exc
        try:
            self.arenas = open_pool(workers.shm_arena_mib * 1024 * 1024)
        except BaseException:
            self._router.close()
            self._data.close()
            raise
        self.endpoint = self._router.endpoint
        self.data_endpoint = self._data.endpoint
        self._poller = transport.Poller()
        self._poller.register(self._router)
        self._poller.register(self._data)
        self.stage = Stage(
            batch_size=pipeline.batch_size,
            drop_last=pipeline.drop_last,
            shuffle_buffer=pipeline.shuffle_buffer,
            seed=seed,
            samples_per_message=workers.samples_per_message,
            send=lambda peer, frames: self.clients.send(peer, frames),
            arenas=self.arenas,
            on_error=pipeline.on_error,
            batch_format=pipeline.batch_format,
            files=self.files,
            stall_timeout_s=2 * workers.progress_timeout_s,
        )
        self.coordinator = Coordinator(
            self.files,
            seed=seed,
            shuffle_files=pipeline.shuffle_buffer > 0,
            heartbeat_timeout_s=float(workers.heartbeat_timeout_s),
            may_lease=self.stage.may_lease,
            progress_timeout_s=workers.progress_timeout_s,
        )
        self.pool = WorkerPool(
            self.coordinator,
            send=self._router.send,
            config=config.to_dict(),
            data_endpoint=self.data_endpoint,
            endpoint=self.endpoint,
            entry=worker_entry,
            links=worker_links,
            on_file_failed=self.stage.fail_file,
            arenas=self.arenas,
            on_start_failed=self.stage.fail_waiting,
        )
        self.clients = ClientDesk(
            config,
            router=self._router,
            stage=self.stage,
            coordinator=self.coordinator,
            pool=self.pool,
            file_count=len(self.files),
            arenas=self.arenas,
        )
        self._started_at = time.monotonic()
        self._rate = RecentRate()
        self._next_housekeeping = 0.0
        self._data_accepting = True  # the data source is polled (Stage.accepting)
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
        bye = P.encode(P.Bye(reason="daemon stopping"))
        for session in list(self.stage.sessions.values()):
            self._router.send(session.peer, bye)
        self.pool.close(WORKER_JOIN_TIMEOUT_S)
        self._router.close()
        self._data.close()
        if self.arenas is not None:
            self.arenas.close()  # after the workers: nothing in /dev/shm outlives the daemon

    def __enter__(self) -> Daemon:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- the loop -----------------------------------------------------------
    def step(self, timeout_s: float) -> None:
        """One turn: read what is ready, move batches, lease files, check liveness."""
        self._pace_data()
        ready = self._poller.wait(timeout_s)
        if self._data in ready:
            for _ in range(MAX_DRAIN_MESSAGES):
                if not self.stage.accepting():
                    break  # full: the rest waits in the workers (Stage.accepting)
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
        self.clients.handle_events()
        for session in list(self.stage.sessions.values()):
            self.stage.pump(session)
        self.pool.dispatch()
        self.clients.read_ahead_when_leased()
        now = time.monotonic()
        if now >= self._next_housekeeping:
            self._next_housekeeping = now + HOUSEKEEPING_INTERVAL_S
            self._rate.record(now, self.stage.samples_in)
            self.pool.reap()
            self.clients.reap(now)
            if self.arenas is not None and self.arenas.has_retired:
                self.arenas.collect(self.stage.arenas_held(), now)

    def _pace_data(self) -> None:
        """Stop reading worker data while the stage is full (``Stage.accepting``): workers then wait
        for room mid-file. Their progress clocks are held meanwhile: waiting is not hanging."""
        accepting = self.stage.accepting()
        if accepting != self._data_accepting:
            self._data_accepting = accepting
            (self._poller.register if accepting else self._poller.unregister)(self._data)
        if not accepting:
            for record in self.coordinator.workers.values():
                if record.leases:
                    self.coordinator.progressed(record.worker_id)

    def _decode(self, frames: list[Any], source: str) -> tuple[P.Message, P.Columns] | None:
        try:
            return P.decode(frames)
        except MalformedMessageError as exc:  # what a peer sends never stops the daemon
            self.rejected_messages += 1
            log.warning("dropping a malformed %s message: %s", source, exc)
            return None

    def _on_data(self, frames: list[Any]) -> None:
        decoded = self._decode(frames, "data")
        if decoded is None:
            return
        message, columns = decoded
        if not isinstance(message, P.FileMessage):
            self.rejected_messages += 1
            log.warning("dropping a %s message on the data endpoint", message.KIND)
            return
        # The coordinator only notes the time: a worker that sends data is not hung.
        self.coordinator.progressed(message.worker)
        if isinstance(message, P.Chunk):
            self.stage.on_chunk(message, columns)
        elif isinstance(message, P.FileDone):
            self.stage.on_done(message)
        elif isinstance(message, P.FileError):
            self.stage.on_file_error(message)

    def _on_control(self, peer: bytes, frames: list[Any]) -> None:
        decoded = self._decode(frames, "control")
        if decoded is None:
            return
        message = decoded[0]
        worker = self.coordinator.by_peer(peer)
        if worker is not None:
            self.pool.on_message(worker, message)
            return
        session = self.stage.sessions.get(peer)
        if session is not None:
            session.last_seen = time.monotonic()
        if isinstance(message, P.Hello):
            self.pool.hello(peer, message)
        elif isinstance(message, P.ClientHello):
            self.clients.hello(peer, message)
        elif isinstance(message, P.Status):
            self._router.send(peer, P.encode(P.Status(status=self.status())))
        elif session is None:
            if not isinstance(message, P.Bye):
                self._router.send(
                    peer,
                    P.encode(
                        P.Error(unknown_session=True, message="the daemon does not know this client (restarted?)")
                    ),
                )
        else:
            self.clients.on_message(session, message)

    # -- status -------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """A JSON-able snapshot: workers, files, rates, queue depths, clients, skipped records."""
        now = time.monotonic()
        elapsed = max(1e-9, now - self._started_at)
        return {
            "endpoint": self.endpoint,
            "data_endpoint": self.data_endpoint,
            "uptime_s": round(elapsed, 3),
            "files": {
                "total": len(self.files),
                "leased": self.coordinator.leased(),
                "queued": self.coordinator.queued(),
            },
            "transport": self.config.workers.transport,
            "workers": self.pool.describe(now),
            "worker_restarts": self.coordinator.restarts,
            "samples_in": self.stage.samples_in,
            "samples_per_s": round(self._rate.per_second(now, self.stage.samples_in), 1),  # last ~10 s
            "samples_per_s_average": round(self.stage.samples_in / elapsed, 1),  # since the daemon started
            "buffered_samples": self.stage.buffered_rows(),
            "duplicates_dropped": self.stage.dropped_duplicates,
            "skipped_records": self.stage.skipped_records,
            "rejected_messages": self.rejected_messages,
            "shm_arenas": len(self.arenas.arenas) if self.arenas is not None else 0,
            "clients": [
                {
                    "session": s.session_id,
                    "rank": s.rank,
                    "world_size": s.world_size,
                    "credits": s.credits,
                    "epoch": s.current.epoch if s.current else None,
                    "batches_sent": s.batches_sent,
                    "samples_sent": s.samples_sent,
                }
                for s in self.stage.sessions.values()
            ],
        }


__all__ = ["Daemon", "MAX_FILE_ATTEMPTS"]
