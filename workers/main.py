"""The worker main loop: hello, take a lease, read the file, push columnar chunks, repeat.

A worker needs only the daemon's control address (or, under the in-process
``Loader`` with transport "pipe" or "queue", its end of a pipe link): the
WELCOME answer carries the config and the data endpoint. After the handshake
the control channel belongs to a ``ControlLink`` thread that heartbeats while
the main thread reads and maps, so a slow user call never gets a live worker
declared dead; a hung one is found by the coordinator's per-lease progress
timeout. The main thread checks for control messages (cancel, bye) between
samples, at most every ``CONTROL_CHECK_INTERVAL_S``.

Each lease is read by a ``FileJob`` (``workers/file_job.py``), which reports
every failure as a message. A worker asks for its next lease when it starts
one (``workers.leases_ahead`` queued at most), so small files follow each
other without waiting a round trip to the coordinator; leases are read in the
order they came, and a CANCEL of a queued one drops it unread. The worker
exits on BYE, on its stop event, or when the daemon has been silent for
``heartbeat_timeout_s``. A daemon that
speaks another protocol version refuses the worker's HELLO (or the worker
refuses its WELCOME): ``run_worker`` raises ``ProtocolVersionError`` saying both
versions.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import Any

from loader.config import LoaderConfig
from loader.errors import ConfigError, MalformedMessageError, ProtocolVersionError, TransportError
from loader.runtime.memory import keep_freed_memory
from loader.service import protocol as P
from loader.service import transport
from loader.service.transport import ChannelOpener
from workers.arena_writer import ArenaWriter
from workers.control import ControlLink, open_channels
from workers.file_job import FileJob

log = logging.getLogger("loader.worker")

WAITING_NOTE_S = 5.0  # a worker whose daemon has not answered for this long says what it waits for, once
HELLO_RETRY_S = 0.5
CONNECT_TIMEOUT_S = 30.0  # how long a worker waits for a daemon that does not answer at all
EXIT_NO_DAEMON = 3  # run_worker's exit code when no daemon answered (the CLI turns it into one error line)
CONTROL_CHECK_INTERVAL_S = 0.05
# A first data message not taken in this long means the data port is out of reach (said once, as a warning).
DATA_UNREACHABLE_WARN_S = 10.0


class _Stop(Exception):
    """The worker must stop now (BYE, stop event, silent daemon); ``trouble``: not a stop anyone asked for."""

    def __init__(self, why: str, trouble: bool = False) -> None:
        super().__init__(why)
        self.trouble = trouble


class _Cancelled(Exception):
    """The current lease was cancelled by the coordinator."""


def run_worker(
    connect: str | transport.Dial | ChannelOpener,
    *,
    worker_id: str | None = None,
    stop_event: threading.Event | None = None,
    connect_timeout_s: float = CONNECT_TIMEOUT_S,
) -> int:
    """Serve the daemon at ``connect`` (an address, or a pipe link) until told to stop; returns an exit code.

    ``EXIT_NO_DAEMON`` when no daemon answered within ``connect_timeout_s``; raises
    ``ProtocolVersionError`` when the daemon speaks another protocol version.
    """
    worker = Worker(connect, worker_id or f"{socket.gethostname()}-{os.getpid()}", stop_event, connect_timeout_s)
    try:
        return worker.run()
    finally:
        worker.close()


class Worker:
    def __init__(
        self,
        connect: str | transport.Dial | ChannelOpener,
        worker_id: str,
        stop_event: threading.Event | None,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
    ) -> None:
        self.worker_id = worker_id
        self.stop_event = stop_event or threading.Event()
        self.ctl, self.data, self.connect = open_channels(connect)
        self.curve = connect.curve if isinstance(connect, transport.Dial) else None  # keys for the data socket too
        self.data_endpoint = "the daemon's data link"  # its address, once a welcome names it (zmq)
        self.data_sent = False  # a data message went out: a later wait is a busy stage, not an unreachable port
        self.data_warned = False
        self.link: ControlLink | None = None
        self.config: Any = None
        self.mappers: dict[tuple[str, str], list[Any]] = {}  # per (dataset, key), resolved at its first lease
        self.hb_interval_s = 0.5
        self.next_check = 0.0
        self.lease: P.Lease | None = None
        self.pending: list[P.Lease] = []  # leases received and not started, read in the order they came
        self.asked = 0  # lease requests sent and not answered yet
        self.arena: ArenaWriter | None = None  # the shared-memory fast path for large rows (workers/arena_writer.py)
        self.connect_timeout_s = connect_timeout_s

    # -- lifecycle ----------------------------------------------------------
    def run(self) -> int:
        if not self._handshake():
            log.debug("no loader daemon answered at %s within %.0fs", self.connect, self.connect_timeout_s)
            return EXIT_NO_DAEMON
        self.link = ControlLink(self.ctl, self.hb_interval_s, self.config.workers.heartbeat_timeout_s)
        self.link.start()
        try:
            while True:
                self._ask()
                lease = self.pending.pop(0) if self.pending else self._recv_ctl(self.hb_interval_s / 2)
                if lease is not None:
                    self._serve_lease(lease)
                self._tick()
        except _Stop as stop:
            log.log(logging.WARNING if stop.trouble else logging.INFO, "worker %s stopping: %s", self.worker_id, stop)
            reason = str(stop)
        except ProtocolVersionError:
            raise
        except TransportError as exc:
            log.warning("worker %s lost the daemon: %s", self.worker_id, exc)
            reason = f"lost the daemon: {exc}"
        # Why, for the daemon's log: one still there replaces a worker that took it for gone (a loop held up).
        self._send_ctl(P.Bye(reason=reason))
        return 0

    def close(self) -> None:
        # The data channel first: a queued channel flushes, so the daemon has our data before BYE.
        if self.data is not None:
            self.data.close()
        if self.arena is not None:
            self.arena.close()
            self.arena = None
        if self.link is not None:
            self.link.close()  # sends the BYE, then closes the control channel
        else:
            self.ctl.close()

    def _hello(self) -> P.Hello:
        return P.Hello(worker=self.worker_id, pid=os.getpid())

    def _check_version(self, message: P.Message) -> None:
        """Raise ``ProtocolVersionError`` for a refusal or a welcome of another protocol version."""
        if isinstance(message, P.Error) and message.refused == "version":
            raise ProtocolVersionError(f"the daemon at {self.connect} refused this worker: {message.message}")
        if isinstance(message, P.Welcome):
            mismatch = P.version_mismatch(message, f"the daemon at {self.connect}")
            if mismatch is not None:
                raise ProtocolVersionError(mismatch)

    def _handshake(self) -> bool:
        log.debug("worker %s connecting to %s", self.worker_id, self.connect)
        started = time.monotonic()
        deadline = started + self.connect_timeout_s
        waiting_said = False
        while time.monotonic() < deadline and not self.stop_event.is_set():
            tried_at = time.monotonic()
            if not waiting_said and tried_at - started >= WAITING_NOTE_S:
                # A worker started by hand before its daemon printed nothing until one came up: say what it waits for.
                waiting_said = True
                log.info(
                    "worker %s: no loader daemon answers at %s yet; trying for up to %.0f s more",
                    self.worker_id,
                    self.connect,
                    deadline - tried_at,
                )
            try:
                self.ctl.send(P.encode(self._hello()), timeout_s=HELLO_RETRY_S)
                frames = self.ctl.recv(HELLO_RETRY_S)
            except TransportError:
                # The daemon is not there (no room), or its end is closed (a pipe fails at once: no busy loop).
                self.stop_event.wait(max(0.0, tried_at + HELLO_RETRY_S - time.monotonic()))
                continue
            if frames is None:
                continue
            try:
                message, _ = P.decode(frames)
            except MalformedMessageError as exc:  # not a loader daemon (another service on that port)
                raise TransportError(
                    f"{self.connect} answered the worker's hello with a malformed message: {exc}"
                ) from None
            self._check_version(message)
            if isinstance(message, P.Welcome):
                self._configure(message)
                log.info("worker %s (pid %d) connected to %s", self.worker_id, os.getpid(), self.connect)
                return True
        return False

    def _configure(self, welcome: P.Welcome) -> None:
        self.worker_id = welcome.worker
        self.config = LoaderConfig.from_dict(welcome.config, origin=f"daemon at {self.connect}")
        self.config.add_import_path()  # mapper/reader modules beside the daemon's config file
        self.hb_interval_s = self.config.workers.heartbeat_interval_s
        keep_freed_memory(self.config.workers.keep_freed_mib)  # mapped samples reuse pages (runtime/memory.py)
        if self.arena is not None:
            self.arena.close()  # a re-welcome names a fresh arena; what we sent from the old one stays valid
        self.arena = ArenaWriter.from_welcome(welcome.shm)
        if self.data is None:
            self.data_endpoint = transport.reachable_endpoint(welcome.data, self.connect)
            self.data = transport.push(self.data_endpoint, curve=self.curve)

    # -- control ------------------------------------------------------------
    def _ask(self) -> None:
        """Ask for leases until the one being read, those queued and those asked for make 1 + leases_ahead."""
        held = (self.lease is not None) + len(self.pending) + self.asked
        for _ in range(1 + self.config.workers.leases_ahead - held):
            self._send_ctl(P.LeaseRequest())
            self.asked += 1

    def _send_ctl(self, message: P.Message) -> None:
        assert self.link is not None
        self.link.send(message)

    def _recv_ctl(self, timeout_s: float) -> P.Lease | None:
        """Act on the next control message; a lease is returned to be served."""
        assert self.link is not None
        message = self.link.recv(timeout_s)
        if message is None:
            return None
        self._check_version(message)
        if isinstance(message, P.Bye):
            raise _Stop(message.reason or "daemon said goodbye")
        if isinstance(message, P.Cancel):
            if self.lease is not None and message.lease == self.lease.lease:
                raise _Cancelled
            # A queued lease taken back (its file waited behind a slow one) or cut: dropped unread.
            self.pending = [lease for lease in self.pending if lease.lease != message.lease]
            return None
        if isinstance(message, P.Error) and message.unknown_session:
            # The daemon forgot us (it declared us dead, or restarted): introduce ourselves again.
            self._send_ctl(self._hello())
            return None
        if isinstance(message, P.Welcome):
            # A fresh session: the daemon forgot the leases and requests of the old one.
            self.pending, self.asked = [], 0
            self._configure(message)
            self._ask()
            return None
        if isinstance(message, P.Lease):
            self.asked = max(0, self.asked - 1)
            return message
        return None

    def _tick(self) -> None:
        """Stop on request or when the control link lost the daemon (silent, or gone)."""
        if self.stop_event.is_set():
            raise _Stop("stop requested")
        if self.link is not None and self.link.lost:
            raise _Stop(self.link.lost, trouble=True)

    def _check(self) -> None:
        """Cheap between samples; every CONTROL_CHECK_INTERVAL_S it reads control messages."""
        now = time.monotonic()
        if now < self.next_check:
            return
        self.next_check = now + CONTROL_CHECK_INTERVAL_S
        while True:
            msg = self._recv_ctl(0)
            if msg is None:
                break
            self.pending.append(msg)  # a lease asked for ahead: read after this one
        self._tick()

    def _send_data(self, frames: list[Any]) -> None:
        assert self.data is not None
        started = time.monotonic()
        while not self.data.try_send(frames, timeout_s=CONTROL_CHECK_INTERVAL_S):
            self.next_check = 0.0
            self._check()  # the stage is busy: still obey cancel, bye and stop while we wait
            if not self.data_sent and not self.data_warned and time.monotonic() - started > DATA_UNREACHABLE_WARN_S:
                # Nothing ever went out: not a busy stage (that takes some first), a data port this host cannot
                # reach. The daemon only sees a worker that makes no progress, and takes it for a hung one.
                self.data_warned = True
                log.warning(
                    "worker %s has sent nothing to the daemon's data endpoint %s in %.0f s: can this host reach "
                    "that port (a firewall? service.data_port fixes it)",
                    self.worker_id,
                    self.data_endpoint,
                    time.monotonic() - started,
                )
        self.data_sent = True

    # -- one file -----------------------------------------------------------
    def _serve_lease(self, lease: P.Lease) -> None:
        self.lease = lease
        self._ask()  # the next lease travels while this file is read
        job = FileJob(
            lease,
            config=self._dataset_config(lease.dataset),
            worker_id=self.worker_id,
            mappers=lambda: self._resolved_mappers(lease.dataset, "mappers"),
            batch_mappers=lambda: self._resolved_mappers(lease.dataset, "batch_mappers"),
            arena=lambda: self.arena,
            send_data=self._send_data,
            check=self._check,
            whereabouts=self.link.whereabouts if self.link is not None else None,
        )
        try:
            job.run()
        except _Cancelled:
            log.info("worker %s: lease %s cancelled", self.worker_id, lease.lease)
        finally:
            self.lease = None

    def _dataset_config(self, name: str) -> Any:
        """The config with the source and pipeline of dataset ``name`` (the default one if unknown:
        a daemon only names datasets of the config it sent; the file then fails as the default reads it)."""
        try:
            return self.config.dataset(name)
        except ConfigError:
            log.error("worker %s: the daemon named an unknown dataset %r", self.worker_id, name)
            return self.config

    def _resolved_mappers(self, dataset: str, key: str) -> list[Any]:
        """``pipeline.mappers`` or ``pipeline.batch_mappers`` of ``dataset``, imported on its first lease, inside
        the job, so an import error is reported like a file error."""
        if (dataset, key) not in self.mappers:
            self.mappers[(dataset, key)] = self._dataset_config(dataset).pipeline.resolve_mappers(key)
        return self.mappers[(dataset, key)]


__all__ = ["run_worker", "Worker"]
