"""The daemon's workers: starting them, their control messages, leases, liveness and replacement.

``WorkerPool`` is the worker-facing half of the daemon (``loop.Daemon`` is
the loop, ``desk.ClientDesk`` the client-facing half). It talks to workers through the
daemon's router (``send(peer, frames) -> bool``) and owns the processes it
started: a dead or hung one (``Coordinator.find_dead``) is stopped, its
files are re-leased and a replacement is started. Workers are reached by the
daemon's control address (zmq), or by a pipe link made for each of them
(``transport.links.WorkerLinks``, transports "pipe" and "queue"). Where the
workers it starts run is its ``launcher``'s business (``launcher.py``: child
processes, or Ray actors); the pool owns that launcher and closes it last.

With the shared-memory fast path on (``arenas``, an ``shm.pool.ArenaPool``) every
HELLO gets a fresh arena named in its WELCOME, and the worker's previous one,
if any, is retired (unlinked once nothing refers to it): an arena has one
writer at a time, and the blocks a killed writer had taken die with its arena.

Worker ids are the daemon's to give. A worker this daemon starts is told its
id with a secret claim (``<id>#<claim>``) that only its first HELLO can use;
any other HELLO (a hand-started worker, or one that was forgotten) gets the
name it asks for only when no record has it, else a fresh one, so no HELLO
can take over a live worker's record, and its BYE can only end its own. Hand-started workers are capped at ``max_workers`` and
arenas at ``max_arenas`` (beyond it a worker sends its rows inline): a flood
of HELLOs is refused, one line each, instead of exhausting descriptors.
"""

from __future__ import annotations

import hmac
import itertools
import logging
import os
import secrets
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from loader.errors import WorkerDiedError, WorkerError
from loader.service import protocol as P
from loader.service.daemon.coordinator import Coordinator, Job, WorkerRecord
from loader.service.daemon.launcher import CLAIM_SEP, Launcher, LocalLauncher
from loader.service.daemon.records import EXITED, HUNG, LEFT, SILENT, UNREADABLE
from loader.service.daemon.rejects import LOG_EVERY_S, PeerLines
from loader.service.shm.pool import ArenaPool
from loader.service.transport.auth import CurveClient, Dial
from loader.service.transport.links import WorkerLinks

log = logging.getLogger("loader.daemon")
RETIRED_IDLE = "retired (idle)"  # why the autoscaler stopped a worker (routine: logged at INFO)

MAX_FILE_ATTEMPTS = 3  # worker deaths while holding one file before that file fails the epoch
CLAIM_BYTES = 16
MAX_ID_PREFIX = 64  # characters of a hand-started worker's own name kept in the id the daemon issues
MAX_BYE_REASON = 200  # characters of a worker's goodbye reason kept in the log's line
# Under on_error = "skip": worker deaths while holding one file before the file is skipped (its records
# delivered so far kept, the rest counted as one skipped record), so a poison file cannot fail every epoch.
SKIP_FILE_ATTEMPTS = 2
# Workers stopped for making no progress on one file before that file fails (or, under "skip", is skipped). A
# file whose workers hang is retried once (a network filesystem may stall once), not twice: a hang is mostly
# a sample that blocks every time, and each try costs workers.progress_timeout_s (120 s by default).
HUNG_FILE_ATTEMPTS = 2
# A worker holding a lease that sent nothing for this long (or half of progress_timeout_s, if less) is logged once.
SLOW_NOTE_S = 30.0
# Workers that die before their first file (a broken environment, an entry point that exits) are
# replaced after a growing pause, START_BACKOFF_S doubling up to MAX_START_BACKOFF_S; after
# MAX_START_FAILURES such deaths in a row every epoch waiting for data fails with the cause.
START_BACKOFF_S = 0.1
MAX_START_BACKOFF_S = 10.0
MAX_START_FAILURES = 5
# Called with WorkerError.to_dict() when workers keep dying before their first file.
StartFailedFn = Callable[[dict[str, Any]], None]

SendFn = Callable[[bytes, list[Any]], bool]
# (stream id, file index, WorkerError.to_dict()): a file failed for good.
FileFailedFn = Callable[[int, int, dict[str, Any]], None]
# (stream id, file index) -> the first record of the file the stream has not received (None: unknown).
NextRecordFn = Callable[[int, int], "int | None"]


@dataclass
class FileLosses:
    """Workers this daemon started that were lost while reading one file of one stream."""

    deaths: int = 0  # every cause
    hung: int = 0  # of them, stopped for making no progress


class WorkerPool:
    """Workers of one daemon; see the module docstring."""

    def __init__(
        self,
        coordinator: Coordinator,
        *,
        send: SendFn,
        config: dict[str, Any],
        data_endpoint: str,
        endpoint: str,
        entry: str,
        links: WorkerLinks | None = None,
        on_file_failed: FileFailedFn,
        arenas: ArenaPool | None = None,
        lease_fields: Callable[[int], dict[str, Any]] = lambda file_index: {},
        lease_note: Callable[[int], str] = lambda file_index: "",
        next_record: NextRecordFn = lambda stream_id, file_index: None,
        file_record: Callable[[int, int], int] = lambda file_index, record: record,
        max_workers: int = 64,
        max_arenas: int = 256,
        own_keys: CurveClient | None = None,
        on_start_failed: StartFailedFn | None = None,
        launcher: Launcher | None = None,
    ) -> None:
        self.coordinator = coordinator
        self._launcher: Launcher = launcher if launcher is not None else LocalLauncher()
        self._send = send
        self._config = config  # what every WELCOME carries: workers build their readers from it
        self._data_endpoint = data_endpoint
        self._endpoint = endpoint
        self._entry = entry
        self._links = links
        self._on_file_failed = on_file_failed
        self._on_start_failed = on_start_failed
        self.start_failures = 0  # workers in a row that died before their first file
        self._launch_at: list[float] = []  # replacements due (monotonic times), backing off
        self._launch_failures = 0  # starts in a row that failed with an OSError (``try_launch``)
        self._losses: dict[tuple[int, int], FileLosses] = {}
        skip = config.get("pipeline", {}).get("on_error") == "skip"
        self._max_attempts = SKIP_FILE_ATTEMPTS if skip else MAX_FILE_ATTEMPTS
        self._max_hung = min(self._max_attempts, HUNG_FILE_ATTEMPTS)
        self._next_record = next_record
        self._file_record = file_record  # (file index, a lease's record) -> the record's number in its file
        self._arenas = arenas
        # file index -> the Lease fields of its dataset: name (whose source and pipeline read it), seed, file key
        self._lease_fields = lease_fields
        self._lease_note = lease_note  # file index -> what its errors say of a lease of several files
        self._arena_of: dict[str, int] = {}  # worker id -> its arena id
        self._seq = 0
        self._issued = itertools.count(1)
        self._max_workers, self._max_arenas = max_workers, max_arenas
        self._cap_logged_at = -LOG_EVERY_S
        self._lines = PeerLines()  # a peer saying hello and goodbye in a loop gets a line a minute
        self._own_keys = own_keys  # the CURVE keys of the workers this daemon starts (None: no authentication)
        self.closing = False
        # The daemon's stop event (``Daemon.serve``): once set, the loop ends after this turn. A stop by a signal
        # to the whole process group (systemd, Slurm, ``timeout``) reaches the workers too, at the same moment.
        self.stop_requested: Any = None

    @property
    def stopping(self) -> bool:
        """The daemon closes, or was asked to stop: workers that leave now are neither replaced nor counted."""
        return self.closing or (self.stop_requested is not None and self.stop_requested.is_set())

    # -- processes ----------------------------------------------------------
    def launch(self) -> None:
        """Start one worker (a process, or an actor) and register it."""
        self._seq += 1
        worker_id = f"{socket.gethostname()}-{os.getpid()}-{self._seq}"
        claim = secrets.token_hex(CLAIM_BYTES)
        claimed_id = f"{worker_id}{CLAIM_SEP}{claim}"  # in spawn's pipe or a Ray call's arguments, never in argv
        if self._links is None:
            connect: Any = Dial(self._endpoint, self._own_keys) if self._own_keys is not None else self._endpoint
            proc = self._launcher.start(connect, claimed_id, self._entry)
        else:
            link = self._links.new_link()
            try:
                proc = self._launcher.start(link, claimed_id, self._entry)
            finally:
                link.close()  # the child has its copies; ours would hide its death
        self.coordinator.add_worker(worker_id, proc).claim = claim

    def try_launch(self, *, retry: bool = True) -> bool:
        """``launch()``, where a failure to start one is the machine's, not the daemon's: a process, pipe or
        descriptor limit reached (a flood of connections holds descriptors), memory short. The daemon stopped
        there, and every client with it, when a worker died while those lasted. Now the start is tried again
        after a growing pause (``retry``: the pool's own replacements; the autoscaler asks again by itself, and
        its retries piled up past ``workers.max``), one warning a minute, and after ``MAX_START_FAILURES`` in a
        row with no worker left alive the epochs waiting for data fail with the cause (a permanent one, such as
        a Python removed from under the daemon, would else stall them to their progress timeout)."""
        try:
            self.launch()
        except OSError as exc:
            self._launch_failures += 1
            delay = min(MAX_START_BACKOFF_S, START_BACKOFF_S * 2 ** min(self._launch_failures, 30))
            if retry:
                self._launch_at.append(time.monotonic() + delay)
            if self._lines.level("daemon", "worker start", logging.WARNING) == logging.WARNING:
                log.warning(
                    "could not start a worker (%s)%s, with %d worker(s) running (%d failed start(s) in a row)",
                    exc,
                    f"; trying again in {delay:.1f} s" if retry else "",
                    len(self.coordinator.workers),
                    self._launch_failures,
                )
            # Only with no worker left to read: a few seconds of EMFILE while others read slows an epoch down,
            # it must not fail it. From then on at every failed start, so epochs asked for later fail too.
            alive = any(record.alive for record in self.coordinator.workers.values())
            if self._launch_failures >= MAX_START_FAILURES and not alive and self._on_start_failed is not None:
                message = (
                    f"{self._launch_failures} worker starts in a row failed and no worker is left; the last: {exc}"
                )
                self._on_start_failed(WorkerError(type(exc).__name__, message).to_dict())
            return False
        self._launch_failures = 0
        return True

    def reap(self) -> None:
        for record, why, how in self.coordinator.find_dead():
            self.gone(record, why, how=how)
        now = time.monotonic()
        self._note_slow(now)
        due = [t for t in self._launch_at if t <= now]
        if due and not self.stopping:
            self._launch_at = [t for t in self._launch_at if t > now]
            for _ in due:
                self.try_launch()

    def _note_slow(self, now: float) -> None:
        """One warning per stall of a worker that has sent nothing from its lease for a while, well before
        ``progress_timeout_s`` stops it (120 s by default, which a hanging mapper spent silent)."""
        after = min(SLOW_NOTE_S, self.coordinator.progress_timeout_s / 2)
        for record in self.coordinator.workers.values():
            if not record.leases or now - record.progress_at <= after or record.slow_noted == record.progress_at:
                continue
            record.slow_noted = record.progress_at
            job = next(iter(record.leases.values()))  # the first granted: the one it reads
            # The record its heartbeats name, but not in a lease of several files (numbered across the group).
            at = None if self._grouped(job) else self._heard_record(record, job)
            where = f", at record {at}" if at is not None else ""
            log.warning(
                "worker %s has sent nothing from file %s for %.0f s%s: a slow or blocked mapper or reader? It is "
                "stopped, and the file read again, after %g s without progress (workers.progress_timeout_s)",
                record.worker_id,
                os.path.basename(job.path),
                now - record.progress_at,
                where,
                self.coordinator.progress_timeout_s,
            )

    def gone(self, record: WorkerRecord, why: str, *, replace: bool = True, how: str = EXITED) -> None:
        """Forget a worker: stop its process, re-lease its files, start a replacement (unless ``replace`` is False
        or the daemon is stopping). ``how``: ``records.EXITED``, ``SILENT``, ``HUNG`` (the daemon stops it),
        ``LEFT`` (it said goodbye) or ``UNREADABLE`` (it said goodbye, unable to read a message of the daemon's)."""
        stopping = self.stopping
        # Ended by SIGTERM before the daemon stopped it: a signal from outside (the process group's, when stopping).
        proc = record.process
        sigterm = how == EXITED and proc is not None and not proc.is_alive() and proc.exitcode == -signal.SIGTERM
        exitcode = None
        if proc is not None:
            exitcode = self._launcher.stop(proc, join_timeout_s=0.0)
        self._log_gone(record, why, sigterm, stopping, how)
        if self._links is not None and record.peer is not None:
            self._links.control.drop(record.peer)
        if self._arenas is not None:
            self._arenas.retire(self._arena_of.pop(record.worker_id, None))
        jobs = self.coordinator.remove_worker(record)
        started_here = record.process is not None
        # Deaths before a first file, of workers this daemon started and did not retire, back off the next start.
        early = replace and started_here and not jobs and record.files_done == 0
        left = how == LEFT
        self._note_start(record, early, exitcode, why if how in (LEFT, UNREADABLE) else None)
        # Only deaths of workers this daemon started count against a file: a peer that takes a lease and
        # leaves (says BYE, goes silent) must not be able to fail an epoch by doing it three times.
        # Only the file it was reading (the first granted): the files queued behind it did not kill it.
        # Not while the daemon stops: a stop signalled to the process group ended them, not the file.
        # A worker of ours that could not read its lease does count: each replacement would be given the same.
        counted = jobs[:1] if started_here and not left and not stopping else []
        for job in counted:
            self._count_loss(record, job, how, exitcode, why)
        # A worker this daemon started says goodbye only when the daemon said so, or when it took the daemon for
        # gone (silent past heartbeat_timeout_s: a loop held up). Now that such a goodbye reaches the daemon
        # (workers/control.py), not replacing it would leave a daemon with no workers and every epoch stalled: the
        # pool keeps its size whatever made a worker leave.
        if started_here and not stopping and replace:
            self.coordinator.restarts += 1
            delay = 0.0
            if early:
                delay = min(MAX_START_BACKOFF_S, START_BACKOFF_S * 2 ** min(self.start_failures - 1, 30))
            self._launch_at.append(time.monotonic() + delay)  # reap() starts it when due

    def _log_gone(self, record: WorkerRecord, why: str, sigterm: bool, stopping: bool, how: str) -> None:
        """One line per worker that leaves: a warning, unless it is routine.

        Routine: a peer's own goodbye (a peer could send them in a loop; not a worker this daemon started, which
        leaves only when told to or when it lost the daemon), and a worker that exited by SIGTERM while the daemon
        stops (a stop signalled to the process group reaches every worker too) or while it held no lease (nothing
        to read again). SIGTERM from outside to a worker holding a lease is a warning."""
        level = logging.WARNING
        if how in (LEFT, UNREADABLE) and (record.process is None or stopping):
            level = self._lines.level(record.peer, "left")
        elif why == RETIRED_IDLE:  # the autoscaler's own choice
            level = logging.INFO
        elif sigterm and (stopping or not record.leases):
            level = logging.INFO
            why = f"{why} (SIGTERM, {'the daemon is stopping' if stopping else 'holding no lease'})"
        count = len(record.leases)
        log.log(level, "worker %s (pid %s) left: %s; re-leasing %d file(s)", record.worker_id, record.pid, why, count)

    def _count_loss(self, record: WorkerRecord, job: Job, how: str, exitcode: int | None, why: str) -> None:
        """Count a worker lost on ``job``'s file; fail the file (or skip it) once too many were."""
        losses = self._losses.setdefault((job.stream_id, job.file_index), FileLosses())
        losses.deaths += 1
        losses.hung += how == HUNG
        if losses.deaths < self._max_attempts and losses.hung < self._max_hung:
            return
        error = self._loss_error(record, job, how, exitcode, losses, why)
        error["message"] += self._lease_note(job.file_index)  # which of a lease's files: any of them
        self._on_file_failed(job.stream_id, job.file_index, error)

    def _loss_error(
        self, record: WorkerRecord, job: Job, how: str, exitcode: int | None, losses: FileLosses, why: str
    ) -> dict[str, Any]:
        """``WorkerError.to_dict()`` for a file that lost too many workers, saying how the last was lost: the
        daemon stopped a hung or silent one itself, so its exit code (SIGTERM) would name no cause."""
        worker, path = record.worker_id, job.path
        name = os.path.basename(job.path)
        if how == HUNG:
            at = self._next_record(job.stream_id, job.file_index)
            since = f", nothing arrived from record {at} on" if at is not None else ""
            # Where the last of them was stuck, as its heartbeats said: the record to look at.
            stuck = self._heard_record(record, job)
            on = f"; the last was on record {stuck}" if stuck is not None else ""
            others = losses.deaths - losses.hung
            row = " in a row" if not others else f" ({others} more died on it)"
            message = (
                f"file {name} hung {_workers(losses.hung)}{row} (no progress for "
                f"{self.coordinator.progress_timeout_s:g} s each{since}{on}): a mapper or reader blocks; raise "
                f"workers.progress_timeout_s if one sample legitimately takes longer"
            )
            # In a lease of several files the record is the group's (the note says how they are numbered), not one of
            # ``path``'s: the error's record field stays None rather than name a record the file may not have.
            return WorkerError(
                "WorkerDiedError", message, worker=worker, file=path, record=None if self._grouped(job) else stuck
            ).to_dict()
        if how == UNREADABLE:
            message = (
                f"{_workers(losses.deaths)} could not read what the daemon sent them for file {name} and left; the "
                f"last {why}. This is a fault of the loader's (please report it), or a value of this dataset's it "
                f"cannot carry"
            )
        elif how == SILENT:
            message = (
                f"worker {record.worker_id} sent no heartbeat for {self.coordinator.heartbeat_timeout_s:g} s and was "
                f"stopped, {_workers(losses.deaths)} lost on file {name} in all: a mapper or reader holding the GIL "
                f"(C code), a stopped process or an unreachable host"
            )
        else:
            # How many were lost, and that this many end the file: "killed by signal 9" alone did not say why a
            # kill the daemon survives (it re-leases the file) ended this one.
            said = (
                f"without reporting an error, the {_ordinal(losses.deaths)} worker lost while reading file {name} "
                f"(a file is given up after {self._max_attempts}: the out-of-memory killer? a crash in native code?)"
            )
            return WorkerDiedError(f"worker {worker}", exitcode, said=said, worker=worker, file=path).to_dict()
        return WorkerError("WorkerDiedError", message, worker=worker, file=path).to_dict()

    def _heard_record(self, record: WorkerRecord, job: Job) -> int | None:
        """The record of ``job``'s lease that ``record``'s last heartbeat said it was reading, numbered in its file
        (in a lease group: across the group), or None when its heartbeats named none of this lease."""
        if record.at is None or record.at[0] != job.lease_id:
            return None
        return self._file_record(job.file_index, record.at[1])

    def _grouped(self, job: Job) -> bool:
        """Whether ``job``'s lease holds several files (``source.files_per_lease``)."""
        return "more" in self._lease_fields(job.file_index)

    def _note_start(self, record: WorkerRecord, early: bool, exitcode: int | None, goodbye: str | None) -> None:
        """Count deaths (and goodbyes: ``goodbye`` is why it left) before a first file; fail the waiting epochs
        once there were too many in a row."""
        self.start_failures = self.start_failures + 1 if early else 0
        if not early or self.start_failures < MAX_START_FAILURES or self._on_start_failed is None:
            return
        if goodbye is not None:
            last = f"worker {record.worker_id} {goodbye}"
        else:
            last = WorkerDiedError(f"worker {record.worker_id}", exitcode, worker=record.worker_id).message
        message = f"{self.start_failures} workers in a row died before reading a file; the last: {last}"
        self._on_start_failed(WorkerError("WorkerDiedError", message, worker=record.worker_id).to_dict())

    def close(self, join_timeout_s: float) -> None:
        """Say BYE to every worker, stop the workers this daemon started (bounded), close the launcher."""
        self.closing = True
        bye = P.encode(P.Bye(reason="daemon stopping"))
        for record in self.coordinator.workers.values():
            if record.peer is not None:
                self._send(record.peer, bye)
            elif record.process is not None:
                # Started and not connected yet (starting, or waiting for a CPU): no BYE can reach it and
                # no WELCOME will (the loop has stopped), so waiting for it to end by itself waits out the
                # whole join timeout. It holds no lease and no arena yet: stop it now.
                self._launcher.stop(record.process, join_timeout_s=0.0)
        # What the launcher started and has not stopped are exactly the workers of our records.
        self._launcher.close(join_timeout_s)

    # -- messages -----------------------------------------------------------
    def hello(self, peer: bytes, hello: P.Hello, known: WorkerRecord | None = None) -> str | None:
        """Admit a worker (``known``: one already admitted on this connection, saying hello again) and
        answer WELCOME; None, or why it was refused (the refusal is sent to the peer too)."""
        public = P.printable((hello.worker or "").partition(CLAIM_SEP)[0][:MAX_ID_PREFIX])
        mismatch = P.version_mismatch(hello, f"worker {public or peer.hex()} (pid {hello.pid})")
        if mismatch is not None:  # logged by the loop's ``Rejects``: once a minute per peer, not per hello
            self._send(peer, P.encode(P.Error(refused="version", message=mismatch)))
            return mismatch
        record = known if known is not None else self._admit(peer, hello)
        if isinstance(record, str):
            self._send(peer, P.encode(P.Error(refused="worker", message=record)))
            return record
        record.peer, record.pid, record.last_seen = peer, hello.pid, time.monotonic()
        log.log(self._lines.level(peer, "joined"), "worker %s (pid %s) joined", record.worker_id, hello.pid)
        shm = None
        if self._arenas is not None:
            self._arenas.retire(self._arena_of.pop(record.worker_id, None))
            if len(self._arenas.arenas) >= self._max_arenas:
                now = time.monotonic()
                if now - self._cap_logged_at >= LOG_EVERY_S:  # a HELLO flood gets one line a minute
                    self._cap_logged_at = now
                    log.warning(
                        "no shared-memory arena for worker %s: the daemon has its cap of arenas", record.worker_id
                    )
            else:
                shm = self._new_arena(record)
        self._send(
            peer, P.encode(P.Welcome(worker=record.worker_id, config=self._config, data=self._data_endpoint, shm=shm))
        )
        return None

    def _admit(self, peer: bytes, hello: P.Hello) -> WorkerRecord | str:
        """The record of a new connection's worker, or why not: a started worker's claim, or a fresh id."""
        public, sep, claim = (hello.worker or "").partition(CLAIM_SEP)
        if sep:
            record = self.coordinator.workers.get(public)
            if record is None or record.claim is None or not hmac.compare_digest(record.claim.encode(), claim.encode()):
                return f"worker id {public[:MAX_ID_PREFIX]!r} is not this peer's to claim"
            record.claim = None  # used: nobody can claim this record again
            return record
        hand_started = sum(1 for r in self.coordinator.workers.values() if r.process is None)
        if hand_started >= self._max_workers:
            return f"the daemon has {hand_started} workers started by hand, its cap (service.max_workers)"
        # The name asked for only while no record has it: a HELLO naming a live worker gets a fresh id,
        # never its record (so never its leases, and its BYE ends only itself). Printable: the id is logged.
        asked = P.printable(public[:MAX_ID_PREFIX])
        name = asked
        if not name or name in self.coordinator.workers:
            name = f"{asked or 'worker'}~{next(self._issued)}"
            while name in self.coordinator.workers:
                name = f"{asked or 'worker'}~{next(self._issued)}"
        return self.coordinator.add_worker(name)

    def arena_of(self, worker_id: str) -> int | None:
        """The id of the arena ``worker_id`` writes (None: it has none)."""
        return self._arena_of.get(worker_id)

    def _new_arena(self, record: WorkerRecord) -> dict[str, Any] | None:
        assert self._arenas is not None
        try:
            arena = self._arenas.create()
        except OSError as exc:  # /dev/shm full or unusable: this worker sends inline frames
            log.warning("no shared-memory arena for worker %s: %s", record.worker_id, exc)
            return None
        self._arena_of[record.worker_id] = arena.arena_id
        return {**self._arenas.describe(), "arena": arena.arena_id}

    def on_message(self, worker: WorkerRecord, message: P.Message) -> str | None:
        """Act on a control message of an admitted worker; why it was refused, or None."""
        worker.last_seen = time.monotonic()
        if isinstance(message, P.LeaseRequest):
            # Capped at what a worker may hold: a peer asking in a loop cannot make the daemon owe it more.
            worker.asked = min(worker.asked + 1, 1 + self.coordinator.leases_ahead)
        elif isinstance(message, P.Heartbeat):
            assert worker.peer is not None
            # Kept only for a lease it holds: a peer's claim names a record of its own lease, nothing else.
            worker.at = (message.at[0], message.at[1]) if message.at and message.at[0] in worker.leases else None
            self._send(worker.peer, P.encode(P.Heartbeat()))
        elif isinstance(message, P.Bye):
            # Its reason, when it gives one (a worker that took the daemon for gone says so), in the log's line.
            reason = P.printable(message.reason[:MAX_BYE_REASON])
            # Only a worker of ours is taken at its word (``gone`` counts nothing against a file for a peer's).
            how = UNREADABLE if message.reason.startswith(P.UNREADABLE_FROM_DAEMON) else LEFT
            self.gone(worker, f"said goodbye ({reason})" if reason else "said goodbye", how=how)
        elif isinstance(message, P.Hello):  # the same connection again: the worker lost its welcome
            assert worker.peer is not None
            return self.hello(worker.peer, message, known=worker)
        return None

    # -- leases -------------------------------------------------------------
    def dispatch(self) -> None:
        """Lease files to the workers that asked, while there are leasable files: first to workers holding
        none, then leases ahead (``Coordinator.wants_lease``); leases queued behind a slow file go back first."""
        now = time.monotonic()
        self._cancel_leases(self.coordinator.take_back(now))
        workers = list(self.coordinator.workers.values())
        # One file to each worker with nothing to read before any lease ahead: no file is hoarded while one idles.
        for record in [r for r in workers if not r.leases]:
            if self.coordinator.wants_lease(record, now) and not self._grant(record):
                return
        for record in workers:
            while self.coordinator.wants_lease(record, now):
                if not self._grant(record):
                    return

    def _grant(self, record: WorkerRecord) -> bool:
        """Lease the next leasable file to ``record``; False when there is none (for any worker, then)."""
        job = self.coordinator.next_job(record)
        if job is None:
            return False
        assert record.peer is not None  # wants_lease says so
        self._send(record.peer, self._lease_message(job))
        return True

    def _lease_message(self, job: Job) -> list[Any]:
        lease = P.Lease(
            lease=job.lease_id,
            stream=job.stream_id,
            epoch=job.epoch,
            file=job.file_index,
            path=job.path,
            token=job.token,
            start=job.start,
            **self._lease_fields(job.file_index),
        )
        return P.encode(lease)

    def cancel(self, stream_id: int | None) -> None:
        """Forget a stream's jobs and tell the workers reading its files to stop."""
        if stream_id is None:
            return
        self._cancel_leases(self.coordinator.cancel_stream(stream_id))

    def cut(self, stream_id: int, file_index: int) -> None:
        """Stop the lease of one file of a stream and queue it again (the stage's reorder window is full)."""
        self._cancel_leases(self.coordinator.requeue(stream_id, file_index))

    def _cancel_leases(self, leases: list[tuple[str, int]]) -> None:
        for worker_id, lease_id in leases:
            record = self.coordinator.workers.get(worker_id)
            if record is not None and record.peer is not None:
                self._send(record.peer, P.encode(P.Cancel(lease=lease_id)))

    def describe(self, now: float) -> list[dict[str, Any]]:
        """The workers part of ``status()``."""
        return [
            {
                "id": r.worker_id,
                "pid": r.pid,
                "alive": r.alive,
                "connected": r.peer is not None,
                "files_done": r.files_done,
                "leases": len(r.leases),
                "last_heartbeat_s": round(now - r.last_seen, 3),
            }
            for r in self.coordinator.workers.values()
        ]


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _workers(n: int) -> str:
    return f"{n} worker" if n == 1 else f"{n} workers"


__all__ = ["WorkerPool", "MAX_FILE_ATTEMPTS", "SKIP_FILE_ATTEMPTS", "HUNG_FILE_ATTEMPTS", "MAX_START_FAILURES"]
