"""The clients of a daemon: their hello, epochs, credits, read-ahead, failures and departures.

``ClientDesk`` is the client-facing half of the daemon (``loop.Daemon`` is
the loop; ``workforce.WorkerPool`` the worker-facing half). Each client is a
``streams.Session``. Clients read as *jobs*: the ranks of one training job (the
same dataset, ``job`` name and ``world_size > 1``) share one ``streams.Stream``
per epoch, so every rank gets its slice of the same global steps; a client with
``world_size == 1`` is a job of its own. A new client for a rank another client
of the job holds replaces it when that one is of the same process (a dataloader
made anew) or quiet (a restarted trainer's old process); a live one of another
process keeps it, and the new client asks again (``_rank_held``). Two jobs
started together without ``job=`` names still pair their ranks as they come:
the names are what tells jobs apart. An epoch may start at a
checkpoint's position (``Epoch.position``/``anchor``): its files are read from
the anchor on (``order.py``).

Once every file of a job's latest epoch is leased, the next epoch is read ahead
(``read_ahead_when_leased``, each loop iteration; unless its clients said
``read_ahead=False`` or the config's ``epochs`` says training stops there), so a
worker that finishes its last file early starts on the next epoch; the stage's
lease gate still bounds what is buffered. A client that says BYE, cannot be
reached, or is silent for ``heartbeat_timeout_s`` is dropped; a stream no rank
needs any more is dropped and its leases cancelled.

What a client asks for is checked before it is acted on (rank inside
world_size, prefetch and credits at most ``MAX_PREFETCH``, at most
``service.max_clients`` sessions, a resume position that names a window of the
epoch); a refused request gets an ERROR saying why and its reason goes back to
the loop, which counts it.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

from loader.config import LoaderConfig
from loader.errors import WorkerError
from loader.io.survey import count_samples
from loader.service import protocol as P
from loader.service.daemon.coordinator import Coordinator
from loader.service.daemon.datasets import Dataset, DatasetTable
from loader.service.daemon.rejects import PeerLines
from loader.service.daemon.stage import SAME_STATE_ADVICE, Stage, shown_ranks
from loader.service.daemon.streams import FileComplete, FileCut, Session, Stream
from loader.service.daemon.workforce import WorkerPool
from loader.service.order import Anchor, epoch_batches, start_anchor, window_rows
from loader.service.shm.pool import ArenaPool
from loader.service.transport import RouterLike

log = logging.getLogger("loader.daemon")

# Most batches a client may have in flight: its prefetch sizes the stage's buffer, so it must be bounded.
MAX_PREFETCH = 1024
# Streams one job keeps at once (its ranks' current epochs, one read ahead); beyond, the oldest unread goes.
MAX_STREAMS_PER_JOB = 4
# The longest the loop spends reading file headers to count an epoch's samples (``len()`` of an epoch)
# at a dataset's first client; beyond it the count is given up, not the heartbeats.
SURVEY_BUDGET_S = 1.0
# Starting an epoch costs the loop O(files) (a stream, a queued lease per file, the old stream cancelled), as does
# dropping a client's streams: 0.1-0.7 s for 20,000 leases. The next EPOCH, of any client, starts no sooner than
# this many times that cost after it; one asked sooner waits its turn (clients in the order they asked). So
# clients asking for epoch after epoch, however many and however they reconnect, take at most about
# 1/(1 + EPOCH_PACING) of the loop, not all of it (another client's epoch stalled). An epoch of a few hundred
# files costs about a millisecond: its pace goes unseen.
EPOCH_PACING = 4.0
# A rank's client heard from within this many of its pings (every min(CLIENT_PING_S, workers.heartbeat_interval_s),
# and at most the heartbeat timeout) is live: a hello of another process for its rank waits (the new client asks
# again) rather than ending it.
RANK_QUIET_PINGS = 4


@dataclass
class Job:
    """The clients reading one dataset together, and the streams (epochs) they read."""

    key: str
    dataset: Dataset
    world_size: int
    streams: list[Stream] = field(default_factory=list)
    read_ahead: bool = True


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
        arenas: ArenaPool | None = None,
        datasets: DatasetTable | None = None,
    ) -> None:
        self.config = config
        # Told to each client (``ClientWelcome.config``): a config given as a client's address names its daemon.
        self._config_file = os.path.abspath(config.origin) if os.path.isfile(config.origin) else None
        self._router = router
        self.stage = stage
        self.coordinator = coordinator
        self.pool = pool
        self._arenas = arenas
        self.datasets = datasets if datasets is not None else DatasetTable(config)
        self.jobs: dict[str, Job] = {}
        # Samples of an epoch of each dataset, counted at its first client (it reads file headers); None: unknown.
        self._samples: dict[str, int | None] = {}
        self.heartbeat_timeout_s = float(config.workers.heartbeat_timeout_s)
        self._lines = PeerLines()  # a peer saying hello and goodbye in a loop gets a line a minute
        # Sessions whose EPOCH waits for the pace (``EPOCH_PACING``), in the order they asked, and when the next
        # epoch may start.
        self._parked: dict[bytes, Session] = {}
        self._epoch_due = 0.0

    def _epoch_samples(self, dataset: Dataset) -> int | None:
        if dataset.name not in self._samples:
            self._samples[dataset.name] = None
            started = time.monotonic()
            try:
                # Inside the daemon's loop: bounded, so heartbeats go on being answered (a dataset of 10,000
                # small files takes about 3 s here; workers take a daemon silent for 5 s for dead).
                rows = count_samples(dataset.config.source, dataset.files, budget_s=SURVEY_BUDGET_S)
                self._samples[dataset.name] = sum(rows) if rows is not None else None
                if rows is not None and not sum(rows):
                    # Served as it is (files may be filled later), but said: every epoch gives no batch at all,
                    # which `loader check` refuses and a training loop meets as a loop that never runs.
                    log.warning(
                        "dataset %r holds no samples: its %d file(s) have no rows (every epoch is empty; "
                        "`loader check` says which)",
                        dataset.name,
                        len(dataset.files),
                    )
                if rows is None and time.monotonic() - started >= SURVEY_BUDGET_S:
                    log.info(
                        "not counting the samples of dataset %r: its %d files' headers take over %.0f s to read "
                        "(len() of an epoch is unknown to its clients)",
                        dataset.name,
                        len(dataset.files),
                        SURVEY_BUDGET_S,
                    )
            except Exception as exc:  # an unreadable header: the workers will report it with the file
                log.warning("could not count the samples of an epoch of dataset %r: %s", dataset.name, exc)
        return self._samples[dataset.name]

    def _refuse(self, peer: bytes, why: str, refused: str | None = None) -> str:
        self._router.send(peer, P.encode(P.Error(refused=refused, message=why)))
        return why

    def hello(self, peer: bytes, hello: P.ClientHello) -> str | None:
        """CLIENT_HELLO: open a session (replacing this peer's old one) and answer CLIENT_WELCOME; or why not."""
        mismatch = P.version_mismatch(hello, "the client")
        if mismatch is not None:  # logged by the loop's ``Rejects``: once a minute per peer, not per hello
            return self._refuse(peer, mismatch, "version")
        rank, world_size = hello.rank, hello.world_size
        if world_size > P.MAX_WORLD_SIZE:
            return self._refuse(peer, f"world_size {world_size} is over {P.MAX_WORLD_SIZE}")
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
        held = self._rank_held(peer, dataset, hello)
        if held is not None:
            # A restarted trainer's usual wait (its old process not yet quiet), not a bad message: said to the
            # peer, which asks again, and logged as a wait, not counted among rejected messages.
            self._refuse(peer, held, "rank")
            log.log(self._lines.level(peer, "waits"), "a client's hello waits: %s", held)
            return None
        old = self.stage.sessions.get(peer)
        if old is not None:
            self.drop(old, "said hello again", done_reading=True)  # its job's streams go with it, not just the session
        session = self.stage.open_session(peer, rank, world_size, hello.prefetch)
        session.dataset, session.settings, session.owner = dataset.name, dataset.settings, hello.owner
        self._join_job(session, dataset, hello.job)
        log.log(
            self._lines.level(peer, "attached"),
            "client %d attached (dataset %s, rank %d of %d, job %r)",  # %r: a client names its job, newlines too
            session.session_id,
            dataset.name,
            rank,
            world_size,
            session.job,  # what `loader status` shows: a lone client (world size 1) is a job of its own
        )
        pipeline = dataset.config.pipeline
        samples = self._epoch_samples(dataset)
        welcome = P.ClientWelcome(
            session=session.session_id,
            batch_size=pipeline.batch_size,
            batch_format=pipeline.batch_format,
            files=len(dataset.files),
            # Clients are dropped after heartbeat_timeout_s of silence: they ping at the workers' pace.
            ping_s=self.config.workers.heartbeat_interval_s,
            # The client probes the arenas, and answers in each EPOCH.
            shm=self._arenas.describe() if self._arenas is not None else None,
            batches=epoch_batches(samples, 0, world_size, pipeline.batch_size, pipeline.drop_last),
            samples=samples,
            fingerprint=dataset.fingerprint(),
            config=self._config_file,
            clock=time.monotonic(),
        )
        self._router.send(peer, P.encode(welcome))
        return None

    def _rank_held(self, peer: bytes, dataset: Dataset, hello: P.ClientHello) -> str | None:
        """Why ``hello`` may not take its rank yet: another client of its job holds it and was heard from within
        ``RANK_QUIET_PINGS`` pings, from another process. A restarted trainer's old process is dead and soon
        quiet, and its client asks again until then; a live one pings, so a hello from anyone else cannot end it
        (one hello, job names being easy to guess, ended a rank of a running job, and the job with it). A hello
        of the holder's own process replaces it at once: a dataloader made anew (Lightning's
        reload_dataloaders_every_n_epochs makes the new one before it drops the old), a notebook cell run again."""
        if hello.world_size == 1:
            return None
        key = _job_key(dataset, hello.job, hello.world_size)
        # Clients ping at most CLIENT_PING_S apart; and one silent for heartbeat_timeout_s is dropped anyway.
        ping_s = min(P.CLIENT_PING_S, self.config.workers.heartbeat_interval_s)
        quiet_s = min(RANK_QUIET_PINGS * ping_s, self.heartbeat_timeout_s)
        now = time.monotonic()
        for other in self.stage.sessions.values():
            if other.peer == peer or other.job != key or other.rank != hello.rank:
                continue
            if hello.owner is not None and other.owner == hello.owner:
                continue  # this very process: a dataloader made anew (Lightning's reload), a notebook cell again
            if now - other.last_seen < quiet_s:
                return (
                    f"rank {hello.rank} of job {hello.job!r} (world_size {hello.world_size}, dataset "
                    f"{dataset.name}) is held by client {other.session_id} of another process, heard from "
                    f"{now - other.last_seen:.1f}s ago: a restarted trainer takes it once the old one has been "
                    f"silent for {quiet_s:g}s; a second job needs a job= of its own"
                )
        return None

    def _join_job(self, session: Session, dataset: Dataset, name: str) -> None:
        """Put ``session`` in its job; the client of the same job and rank it may replace (``_rank_held``) is."""
        if session.world_size == 1:
            key = f"client {session.session_id}"
        else:
            key = _job_key(dataset, name, session.world_size)
            for other in list(self.stage.sessions.values()):
                if other is not session and other.job == key and other.rank == session.rank:
                    why = f"replaced by client {session.session_id} of the same job and rank"
                    if session.owner is not None and other.owner == session.owner:
                        told = (
                            f"{why} in this same process (a dataloader made anew replaces the one before; two "
                            "that read at once need a job= each)"
                        )
                    else:
                        told = f"{why} (a restarted trainer; two jobs need job=)"
                    self._close_streams_of(other)  # the trainer restarted: its ranks start afresh, all of them
                    # Told why, or its next message would only hear "no longer knows this client".
                    self._router.send(other.peer, P.encode(P.Bye(reason=told)))
                    self.drop(other, why)
        session.job = key
        if key not in self.jobs:
            self.jobs[key] = Job(key, dataset, session.world_size)

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
            self._router.send(session.peer, P.encode(P.Pong(clock=time.monotonic())))
            if message.wait_s is not None:
                session.wait_s = message.wait_s
        elif isinstance(message, P.Epoch):
            return self._on_epoch(session, message)
        elif isinstance(message, P.Bye):
            self.drop(session, "said goodbye", done_reading=True)
        return None

    def _on_epoch(self, session: Session, message: P.Epoch) -> str | None:
        """Refuse a bad EPOCH at once; start a good one now, or in its turn once the pace allows (``EPOCH_PACING``)."""
        # Whatever becomes of this request, the client gave up the one before it (a request waiting goes to the back).
        session.parked_epoch = None
        self._parked.pop(session.peer, None)
        if message.credit is not None and not 1 <= message.credit <= MAX_PREFETCH:
            # With the request's gen: an ERROR of no request is dropped by the client, which then waited its timeout.
            why = f"an epoch credit of {message.credit} is outside 1..{MAX_PREFETCH}"
            return self._refuse_epoch(session, message, why, "ConfigError")
        anchor = self._anchor(self.jobs[session.job], message)
        if isinstance(anchor, str):
            return self._refuse_epoch(session, message, anchor, "ConfigError")
        if self._parked or time.monotonic() < self._epoch_due:
            session.parked_epoch = message
            session.credits = 0  # the epoch it leaves is not read on meanwhile: the client dropped it
            self._parked[session.peer] = session
            return None
        return self._start_epoch(session, message, anchor)

    def _refuse_epoch(self, session: Session, message: P.Epoch, why: str, kind: str) -> str:
        error = WorkerError(kind, why).to_dict()
        self._router.send(session.peer, P.encode(P.Error(gen=message.gen, error=error, message=why)))
        return why

    def start_parked_epochs(self) -> list[tuple[bytes, str]]:
        """Start the EPOCHs that waited, in the order asked, while the pace allows (each loop turn); the
        (peer, why) of those refused."""
        refused = []
        while self._parked and time.monotonic() >= self._epoch_due:
            peer = next(iter(self._parked))
            session = self._parked.pop(peer)
            message, session.parked_epoch = session.parked_epoch, None
            if self.stage.sessions.get(peer) is not session or message is None:
                continue  # the session left (or said hello again): its request went with it
            anchor = self._anchor(self.jobs[session.job], message)  # checked when it came: the same job
            if isinstance(anchor, str):
                why: str | None = self._refuse_epoch(session, message, anchor, "ConfigError")
            else:
                why = self._start_epoch(session, message, anchor)
            if why:
                refused.append((peer, why))
        return refused

    def parked_due_in(self, now: float) -> float:
        """Seconds until a parked EPOCH may start (inf: none waits), so the loop does not sleep past it."""
        return self._epoch_due - now if self._parked else float("inf")

    def _paced(self, started: float) -> None:
        """Work of O(files) began at ``started`` and ends now: the next epoch waits ``EPOCH_PACING`` times it."""
        ended = time.monotonic()
        self._epoch_due = max(self._epoch_due, ended + EPOCH_PACING * (ended - started))

    def _start_epoch(self, session: Session, message: P.Epoch, anchor: Anchor) -> str | None:
        """Attach ``session`` to the stream of the epoch it asked for (new, or its job's); why not, if it failed."""
        started = time.monotonic()
        try:
            self._attach_epoch(session, message, anchor)
        except Exception as exc:  # what no check foresaw: this request fails, not the daemon (nor a client's wait)
            log.debug("starting epoch %d for client %d failed", message.epoch, session.session_id, exc_info=True)
            return self._refuse_epoch(session, message, f"EPOCH failed: {type(exc).__name__}: {exc}", "EpochError")
        finally:
            self._paced(started)
        return None

    def _attach_epoch(self, session: Session, message: P.Epoch, anchor: Anchor) -> None:
        job = self.jobs[session.job]
        self.stage.on_epoch_request(session, message.shm, message.pack)
        self.stage.detach(session)
        self._note_resumed_apart(session, job, message)
        stream = self._stream_for(job, session.rank, message.epoch, message.position, anchor)
        credits = message.credit if message.credit is not None else session.prefetch
        self.stage.attach(session, stream, message.gen, credits)
        session.read_ahead = job.read_ahead = message.ahead
        self._tidy(job)

    def _anchor(self, job: Job, message: P.Epoch) -> Anchor | str:
        """The anchor an epoch request starts from, or why it cannot be used."""
        if max(message.epoch, message.position, *(message.anchor or ())) >= P.MAX_PLACE:
            return f"an epoch, resume position or anchor of 2**60 or more (epoch {message.epoch}, a bad state)"
        if message.anchor is None:
            if message.position:
                return f"a resume position ({message.position}) needs its anchor"
            return start_anchor()
        window, order_index, record = message.anchor
        size = window_rows(job.dataset.config.pipeline.shuffle_buffer)
        if not window * size <= message.position <= (window + 1) * size or order_index > len(job.dataset.leases):
            return f"the resume position {message.position} does not lie in its anchor {message.anchor} (a bad state)"
        return (window, order_index, record)

    def _note_resumed_apart(self, session: Session, job: Job, message: P.Epoch) -> None:
        """A WARNING when ``session``'s rank starts an epoch at another place than ranks of its job that read it.

        Each rank then gets a stream of its own, so the ranks get different numbers of batches for the rest of
        the epoch and data-parallel collectives hang at its end. Not refused: a job restarted before the
        daemon saw its old ranks leave looks the same for a moment, and its new ranks are right."""
        for stream in job.streams:
            if (
                stream.epoch == message.epoch
                and stream.position != message.position
                and stream.attached_ever
                and session.rank not in stream.attached_ever
                and stream.joinable
                and not stream.failed
                and stream.stream_id in self.stage.streams
            ):
                log.log(
                    self._lines.level(session.peer, "resumed apart", logging.WARNING),
                    "job %r: rank %d starts epoch %d at sample %d of it, but rank(s) %s of the job read it from "
                    "sample %d: ranks that loaded states of different steps get different numbers of batches for "
                    "the rest of the epoch (data-parallel collectives hang at its end); %s",
                    job.key,
                    session.rank,
                    message.epoch,
                    message.position,
                    shown_ranks(sorted(stream.attached_ever)),
                    stream.position,
                    SAME_STATE_ADVICE,
                )
                return

    def _stream_for(self, job: Job, rank: int, epoch: int, position: int, anchor: Anchor) -> Stream:
        """The job's stream of this epoch and start that ``rank`` has not read yet, or a new one."""
        for stream in job.streams:
            if (
                stream.epoch == epoch
                and stream.position == position
                and stream.stream_id in self.stage.streams
                and not stream.failed
                and stream.joinable
                and rank not in stream.attached_ever
            ):
                return stream
        return self._new_stream(job, epoch, position, anchor)

    def _new_stream(self, job: Job, epoch: int, position: int, anchor: Anchor) -> Stream:
        order = job.dataset.order(epoch)
        stream = self.stage.new_stream(
            settings=job.dataset.settings,
            epoch=epoch,
            world_size=job.world_size,
            order=order,
            job=job.key,
            prefetch=max((s.prefetch for s in self._sessions_of(job)), default=1),
            position=position,
            anchor=anchor,
            dataset=job.dataset.name,
        )
        self.coordinator.enqueue(stream.stream_id, epoch, order[anchor[1] :])
        job.streams.append(stream)
        return stream

    def _sessions_of(self, job: Job) -> list[Session]:
        return [s for s in self.stage.sessions.values() if s.job == job.key]

    def _close_streams_of(self, session: Session) -> None:
        """No rank joins a stream ``session`` read any more (its job restarted)."""
        job = self.jobs.get(session.job)
        for stream in job.streams if job is not None else ():
            if session.session_id in stream.sessions_ever:
                stream.joinable = False

    def _tidy(self, job: Job) -> None:
        """Drop the job's streams no rank needs: every rank left or finished them, no rank reads one that none
        may join, or too many are kept."""
        for stream in list(job.streams):
            gone = stream.stream_id not in self.stage.streams or len(stream.released) >= job.world_size
            if gone or (not stream.joinable and not stream.members):
                self._drop_stream(job, stream)
        idle = [s for s in job.streams if not s.members]
        while len(job.streams) > MAX_STREAMS_PER_JOB and idle:
            self._drop_stream(job, idle.pop(0))

    def _drop_stream(self, job: Job, stream: Stream) -> None:
        self.pool.cancel(self.stage.drop_stream(stream))
        if stream in job.streams:
            job.streams.remove(stream)

    def read_ahead_when_leased(self) -> None:
        """Read ahead for every job whose latest epoch has no file left to lease."""
        for job in self.jobs.values():
            if not job.read_ahead or not job.streams:
                continue
            latest = max(job.streams, key=lambda s: (s.epoch, s.stream_id))
            if not latest.members or self.coordinator.queued(latest.stream_id):
                continue
            epoch = latest.epoch + 1
            if 0 < job.dataset.config.pipeline.epochs <= epoch:
                # The config says training stops after `epochs` (numbered from 0); a client
                # may still ask for more, but reading them ahead would be wasted work.
                continue
            self._new_stream(job, epoch, 0, start_anchor())

    def drop(self, session: Session, why: str, *, done_reading: bool = False) -> None:
        """Forget a client: free its rows; streams its job no longer needs are dropped (that work paces the next
        epoch: a client saying hello, asking for an epoch and saying goodbye in a loop keeps the pace too).

        ``done_reading``: the client itself left (goodbye, or hello again), so it reads no batch sent to it;
        a client dropped otherwise (silent, unreachable, replaced) may still copy the batches on their way to
        it, so their rows stay reserved as long as if it were there (``RefKeeper.set_aside``)."""
        started = time.monotonic()
        try:
            self._drop(session, why, done_reading)
        finally:
            self._paced(started)

    def _drop(self, session: Session, why: str, done_reading: bool) -> None:
        log.log(self._lines.level(session.peer, "detached"), "client %d detached: %s", session.session_id, why)
        if self._parked.get(session.peer) is session:
            del self._parked[session.peer]  # its waiting request goes with it
        stream = session.current
        if stream is not None and stream.members.get(session.rank) is session:
            # It leaves the stream unfinished: its rank's part is never read, so another rank that joined it now
            # would wait, on it, for the rank that (restarted) reads a new one. A finished stream stays joinable.
            stream.joinable = False
        self.stage.close_session(session, done_reading=done_reading)
        job = self.jobs.get(session.job)
        if job is None:
            return
        if not self._sessions_of(job):
            for stream in list(job.streams):
                self._drop_stream(job, stream)
            del self.jobs[job.key]
        else:
            self._tidy(job)

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
        """Act on what the stage reported: files complete or cut, streams failed."""
        events, self.stage.events = self.stage.events, []
        for event in events:
            if isinstance(event, FileComplete):
                self.coordinator.job_finished(event.stream_id, event.file_index)
            elif isinstance(event, FileCut):
                self.pool.cut(event.stream_id, event.file_index)
            else:
                self._fail_stream(event.stream, event.error)

    def _fail_stream(self, stream: Stream, error: dict[str, Any]) -> None:
        """``stream`` failed: tell the clients reading it, and drop it (read ahead: it is read again when asked)."""
        for session in list(stream.members.values()):
            if session.current is stream:
                self._router.send(session.peer, P.encode(P.Error(gen=stream.gens[session.rank], error=error)))
        job = self.jobs.get(stream.job)
        if job is not None:
            self._drop_stream(job, stream)
        else:
            self.pool.cancel(self.stage.drop_stream(stream))


def _job_key(dataset: Dataset, name: str, world_size: int) -> str:
    """The job of a client of ``world_size`` > 1 (a lone client is a job of its own)."""
    return f"{dataset.name}/{name}/{world_size}"


__all__ = ["ClientDesk", "Job"]
