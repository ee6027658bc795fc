"""The clients of a daemon: their hello, epochs, credits, read-ahead, failures and departures.

``ClientDesk`` is the client-facing half of the daemon (``loop.Daemon`` is
the loop; ``workforce.WorkerPool`` the worker-facing half). Each client is a
``stage.Session``; each epoch it asks for is a ``stage.Stream`` whose files the
coordinator leases. Once every file of a client's current epoch is leased, the
next epoch is read ahead (``read_ahead_when_leased``, each loop iteration;
unless the client said ``read_ahead=False`` or the config's ``epochs`` says
training stops there), so a worker that finishes its last file early starts on
the next epoch instead of idling until the slowest file is in; the stage's
lease gate still bounds what is buffered. A client that says BYE, cannot be
reached, or is silent for ``heartbeat_timeout_s`` is dropped and its streams'
leases are cancelled.
"""

from __future__ import annotations

import logging
from typing import Any

from loader.config import LoaderConfig
from loader.service import protocol as P
from loader.service.daemon.coordinator import Coordinator
from loader.service.daemon.stage import FileComplete, Session, Stage, Stream
from loader.service.daemon.workforce import WorkerPool
from loader.service.shm.pool import ArenaPool
from loader.service.transport import RouterLike

log = logging.getLogger("loader.daemon")


class ClientDesk:
    """Sessions of one daemon, served through its router; see the module docstring."""

    def __init__(
        self,
        config: LoaderConfig,
        *,
        router: RouterLike,
        stage: Stage,
        coordinator: Coordinator,
        pool: WorkerPool,
        file_count: int,
        arenas: ArenaPool | None = None,
    ) -> None:
        self.config = config
        self._router = router
        self.stage = stage
        self.coordinator = coordinator
        self.pool = pool
        self._file_count = file_count
        self._arenas = arenas
        self.heartbeat_timeout_s = float(config.workers.heartbeat_timeout_s)

    def hello(self, peer: bytes, hello: P.ClientHello) -> None:
        """CLIENT_HELLO: open a session (replacing this peer's old one) and answer CLIENT_WELCOME."""
        mismatch = P.version_mismatch(hello, "the client")
        if mismatch is not None:
            log.error("refused %s", mismatch)
            self._router.send(peer, P.encode(P.Error(refused="version", message=mismatch)))
            return
        rank, world_size = hello.rank, hello.world_size
        if not 0 <= rank < world_size:
            self._router.send(peer, P.encode(P.Error(message=f"rank {rank} is outside world_size {world_size}")))
            return
        session = self.stage.open_session(peer, rank, world_size, hello.prefetch)
        log.info("client %d attached (rank %d of %d)", session.session_id, rank, world_size)
        pipeline = self.config.pipeline
        welcome = P.ClientWelcome(
            session=session.session_id,
            batch_size=pipeline.batch_size,
            batch_format=pipeline.batch_format,
            files=self._file_count,
            # Clients are dropped after heartbeat_timeout_s of silence: they ping at the workers' pace.
            ping_s=self.config.workers.heartbeat_interval_s,
            # The client probes the arenas, and answers in each EPOCH.
            shm=self._arenas.describe() if self._arenas is not None else None,
        )
        self._router.send(peer, P.encode(welcome))

    def on_message(self, session: Session, message: P.Message) -> None:
        """CREDIT, PING, EPOCH or BYE from a known client."""
        if isinstance(message, P.Credit):
            self.stage.on_credit(session, message.gen, message.n)
            if message.wait_s is not None:
                session.wait_s = message.wait_s
        elif isinstance(message, P.Ping):
            self._router.send(session.peer, P.encode(P.Pong()))
        elif isinstance(message, P.Epoch):
            self.stage.on_epoch_request(session, message.shm)
            credits = message.credit if message.credit is not None else session.prefetch
            self._start_epoch(session, message.epoch, message.gen, credits, message.ahead)
        elif isinstance(message, P.Bye):
            self.drop(session, "said goodbye")

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

    def read_ahead_when_leased(self) -> None:
        """Read ahead for every client whose current epoch has no file left to lease."""
        for session in self.stage.sessions.values():
            current = session.current
            if current is not None and session.ahead is None and self.coordinator.queued(current.stream_id) == 0:
                self._read_ahead(session, current)

    def _read_ahead(self, session: Session, finished: Stream) -> None:
        """Warm start: lease the epoch after ``finished`` (the client's current one)."""
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

    def drop(self, session: Session, why: str) -> None:
        """Forget a client: free its rows and cancel the leases of its streams."""
        log.info("client %d detached: %s", session.session_id, why)
        for stream_id in self.stage.close_session(session):
            self.pool.cancel(stream_id)

    def send(self, peer: bytes, frames: list[Any]) -> bool:
        """The stage's way out: send to a client, dropping it when it cannot be reached."""
        if self._router.send(peer, frames):
            return True
        session = self.stage.sessions.get(peer)
        if session is not None:
            self.drop(session, "unreachable")
        return False

    def reap(self, now: float) -> None:
        """Drop the clients silent for ``heartbeat_timeout_s``."""
        for session in list(self.stage.sessions.values()):
            if now - session.last_seen > self.heartbeat_timeout_s:
                self.drop(session, f"silent for {now - session.last_seen:.1f}s")

    # -- stage events ---------------------------------------------------------
    def handle_events(self) -> None:
        """Act on what the stage reported: files complete, streams failed."""
        events, self.stage.events = self.stage.events, []
        for event in events:
            if isinstance(event, FileComplete):
                self.coordinator.job_finished(event.stream_id, event.file_index)
            else:
                self._fail_stream(event.session, event.stream, event.error)

    def _fail_stream(self, session: Session, stream: Stream, error: dict[str, Any]) -> None:
        """``stream`` failed (``Stage.on_file_error`` marked it): cancel it, tell its client if it reads it."""
        self.pool.cancel(self.stage.drop_stream(stream))
        if session.current is stream:
            session.current = None
            self._router.send(session.peer, P.encode(P.Error(gen=stream.gen, error=error)))
        elif session.ahead is stream:
            session.ahead = None  # read ahead failed: the epoch is read again when asked for


__all__ = ["ClientDesk"]
