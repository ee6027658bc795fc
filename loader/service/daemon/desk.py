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

What a client asks for is checked before it is acted on (rank inside
world_size, prefetch and credits at most ``MAX_PREFETCH``, at most
``service.max_clients`` sessions); a refused request gets an ERROR saying why
and its reason goes back to the loop, which counts it.
"""

from __future__ import annotations

import logging
from typing import Any

from loader.config import LoaderConfig
from loader.io.survey import count_samples
from loader.service import protocol as P
from loader.service.daemon.coordinator import Coordinator
from loader.service.daemon.datasets import Dataset, DatasetTable
from loader.service.daemon.stage import FileComplete, Session, Stage, Stream
from loader.service.daemon.workforce import WorkerPool
from loader.service.shm.pool import ArenaPool
from loader.service.transport import RouterLike

log = logging.getLogger("loader.daemon")

# Most batches a client may have in flight: its prefetch sizes the stage's buffer, so it must be bounded.
MAX_PREFETCH = 1024


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
        datasets: DatasetTable | None = None,
    ) -> None:
        self.config = config
        self._router = router
        self.stage = stage
        self.coordinator = coordinator
        self.pool = pool
        self._file_count = file_count
        self._arenas = arenas
        self.datasets = datasets if datasets is not None else DatasetTable(config)
        # Rows per file of each dataset, counted at its first client (it reads file headers); None: unknown.
        self._rows: dict[str, list[int] | None] = {}
        self.heartbeat_timeout_s = float(config.workers.heartbeat_timeout_s)

    def _epoch_batches(self, dataset: Dataset, rank: int, world_size: int) -> int | None:
        """Batches of each epoch for this rank, when known: the files' rows are known, and the rank's
        share of them is the same in every epoch (one rank, or files of equal length)."""
        if dataset.name not in self._rows:
            self._rows[dataset.name] = None
            try:
                self._rows[dataset.name] = count_samples(dataset.config.source, dataset.files)
            except Exception as exc:  # an unreadable header: the workers will report it with the file
                log.warning("could not count the samples of an epoch of dataset %r: %s", dataset.name, exc)
        rows = self._rows[dataset.name]
        if rows is None or (world_size > 1 and len(set(rows)) > 1):
            return None
        samples = sum(rows) if world_size == 1 else len(range(rank, len(rows), world_size)) * rows[0]
        pipeline = dataset.config.pipeline
        full, partial = divmod(samples, pipeline.batch_size)
        return full + (1 if partial and not pipeline.drop_last else 0)

    def _refuse(self, peer: bytes, why: str, refused: str | None = None) -> str:
        self._router.send(peer, P.encode(P.Error(refused=refused, message=why)))
        return why

    def hello(self, peer: bytes, hello: P.ClientHello) -> str | None:
        """CLIENT_HELLO: open a session (replacing this peer's old one) and answer CLIENT_WELCOME; or why not."""
        mismatch = P.version_mismatch(hello, "the client")
        if mismatch is not None:
            log.error("refused %s", mismatch)
            return self._refuse(peer, mismatch, "version")
        rank, world_size = hello.rank, hello.world_size
        if not 0 <= rank < world_size:
            return self._refuse(peer, f"rank {rank} is outside world_size {world_size}")
        if not 1 <= hello.prefetch <= MAX_PREFETCH:
            return self._refuse(peer, f"prefetch {hello.prefetch} is outside 1..{MAX_PREFETCH}")
        dataset = self.datasets.by_name.get(hello.dataset)
        if dataset is None:
            known = ", ".join(repr(name) for name in self.datasets.by_name)
            return self._refuse(
                peer, f"this daemon serves no dataset named {hello.dataset!r} (it serves {known})", "dataset"
            )
        cap = self.config.service.max_clients
        if peer not in self.stage.sessions and len(self.stage.sessions) >= cap:
            return self._refuse(peer, f"the daemon serves {cap} clients, its cap (service.max_clients)", "capacity")
        session = self.stage.open_session(peer, rank, world_size, hello.prefetch)
        session.dataset, session.settings = dataset.name, dataset.settings
        log.info("client %d attached (dataset %s, rank %d of %d)", session.session_id, dataset.name, rank, world_size)
        pipeline = dataset.config.pipeline
        welcome = P.ClientWelcome(
            session=session.session_id,
            batch_size=pipeline.batch_size,
            batch_format=pipeline.batch_format,
            files=len(dataset.files),
            # Clients are dropped after heartbeat_timeout_s of silence: they ping at the workers' pace.
            ping_s=self.config.workers.heartbeat_interval_s,
            # The client probes the arenas, and answers in each EPOCH.
            shm=self._arenas.describe() if self._arenas is not None else None,
            batches=self._epoch_batches(dataset, rank, world_size),
        )
        self._router.send(peer, P.encode(welcome))
        return None

    def on_message(self, session: Session, message: P.Message) -> str | None:
        """CREDIT, PING, EPOCH or BYE from a known client; why it was refused, if it was."""
        if isinstance(message, P.Credit):
            if message.n > MAX_PREFETCH:
                return f"a credit of {message.n} batches is over {MAX_PREFETCH}"
            self.stage.on_credit(session, message.gen, message.n)
            # Credits beyond what a client can have in flight would only let it flood its own socket.
            session.credits = min(session.credits, MAX_PREFETCH)
            if message.wait_s is not None:
                session.wait_s = message.wait_s
        elif isinstance(message, P.Ping):
            self._router.send(session.peer, P.encode(P.Pong()))
        elif isinstance(message, P.Epoch):
            if message.credit is not None and not 1 <= message.credit <= MAX_PREFETCH:
                return self._refuse(session.peer, f"an epoch credit of {message.credit} is outside 1..{MAX_PREFETCH}")
            self.stage.on_epoch_request(session, message.shm)
            credits = message.credit if message.credit is not None else session.prefetch
            self._start_epoch(session, message.epoch, message.gen, credits, message.ahead)
        elif isinstance(message, P.Bye):
            self.drop(session, "said goodbye")
        return None

    def _start_epoch(self, session: Session, epoch: int, gen: int, credits: int, read_ahead: bool) -> None:
        self.pool.cancel(self.stage.drop_stream(session.current))
        session.current = None
        ahead = session.ahead
        session.ahead = None
        if ahead is not None and ahead.epoch == epoch and not ahead.failed:
            stream = ahead
        else:
            self.pool.cancel(self.stage.drop_stream(ahead))
            files = self._share(session, epoch)
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
        if 0 < self.datasets.get(session.dataset).config.pipeline.epochs <= epoch:
            # The config says training stops after `epochs` (numbered from 0); a client
            # may still ask for more, but reading them ahead would be wasted work.
            return
        files = self._share(session, epoch)
        session.ahead = self.stage.new_stream(session, epoch, files)
        self.coordinator.enqueue(session.ahead.stream_id, epoch, files)

    def _share(self, session: Session, epoch: int) -> list[int]:
        """The files of ``session``'s share of ``epoch`` (of the dataset it reads)."""
        if len(self.datasets.by_name) == 1:  # one dataset: the coordinator's own order
            return self.coordinator.share(epoch, session.rank, session.world_size)
        return self.datasets.get(session.dataset).share(epoch, session.rank, session.world_size)

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
