"""The worker main loop: hello, take a lease, read the file, push columnar chunks, repeat.

A worker needs only the daemon's control address (or, under the in-process
``Loader`` with transport "pipe" or "queue", its end of a pipe link): the
WELCOME answer carries the config and the data endpoint. After the handshake
the control channel belongs to a ``ControlLink`` thread that heartbeats while
the main thread reads and maps, so a slow user call never gets a live worker
declared dead; a hung one is found by the coordinator's per-lease progress
timeout. The main thread checks for control messages (cancel, bye) between
samples, at most every ``CONTROL_CHECK_INTERVAL_S``.

Every exception while opening, reading or mapping is caught and reported as
FILE_ERROR naming the file and record (``on_error = "raise"``), or the record
is skipped and counted in FILE_DONE (``on_error = "skip"``). The worker exits
on BYE, on its stop event, or when the daemon has been silent for
``heartbeat_timeout_s``.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import Any

from loader.config import LoaderConfig
from loader.errors import TransportError, WorkerError
from loader.service import protocol as P
from loader.service import transport
from loader.service.batching import block_nbytes, block_rows
from workers.columns import ChunkBuilder, rows_for_bytes
from workers.control import ControlLink, open_channels
from workers.shm import ArenaWriter
from workers.sources import FileSource

log = logging.getLogger("loader.worker")

HELLO_RETRY_S = 0.5
CONNECT_TIMEOUT_S = 30.0  # how long a worker waits for a daemon that does not answer at all
EXIT_NO_DAEMON = 3  # run_worker's exit code when no daemon answered (the CLI turns it into one error line)
CONTROL_CHECK_INTERVAL_S = 0.05


class _Stop(Exception):
    """The worker must stop now (BYE, stop event, silent daemon)."""


class _Cancelled(Exception):
    """The current lease was cancelled by the coordinator."""


def run_worker(
    connect: Any,
    *,
    worker_id: str | None = None,
    stop_event: threading.Event | None = None,
    connect_timeout_s: float = CONNECT_TIMEOUT_S,
) -> int:
    """Serve the daemon at ``connect`` (an address, or a pipe link) until told to stop; returns an exit code.

    ``EXIT_NO_DAEMON`` when no daemon answered within ``connect_timeout_s``.
    """
    worker = Worker(connect, worker_id or f"{socket.gethostname()}-{os.getpid()}", stop_event, connect_timeout_s)
    try:
        return worker.run()
    finally:
        worker.close()


class Worker:
    def __init__(self, connect: Any, worker_id: str, stop_event: threading.Event | None,
                 connect_timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        self.worker_id = worker_id
        self.stop_event = stop_event or threading.Event()
        self.ctl, self.data, self.connect = open_channels(connect)
        self.link: ControlLink | None = None
        self.config: Any = None
        self.mappers: list[Any] = []
        self.hb_interval_s = 0.5
        self.next_check = 0.0
        self.lease: dict[str, Any] | None = None
        self.pending: list[dict[str, Any]] = []
        self.arena: ArenaWriter | None = None  # the shared-memory fast path for large rows (workers/shm.py)
        self.connect_timeout_s = connect_timeout_s

    # -- lifecycle ----------------------------------------------------------
    def run(self) -> int:
        if not self._handshake():
            log.debug("no loader daemon answered at %s within %.0fs", self.connect, self.connect_timeout_s)
            return EXIT_NO_DAEMON
        self.link = ControlLink(self.ctl, self.hb_interval_s, self.config.workers.heartbeat_timeout_s)
        self.link.start()
        try:
            self._send_ctl(P.LEASE_REQ)
            while True:
                msg = self.pending.pop(0) if self.pending else self._recv_ctl(self.hb_interval_s / 2)
                if msg is not None and msg["k"] == P.LEASE:
                    self._serve_lease(msg)
                    self._send_ctl(P.LEASE_REQ)
                self._tick()
        except _Stop as stop:
            log.info("worker %s stopping: %s", self.worker_id, stop)
        except TransportError as exc:
            log.warning("worker %s lost the daemon: %s", self.worker_id, exc)
        self._send_ctl(P.BYE)
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

    def _hello(self) -> dict[str, Any]:
        return {"worker": self.worker_id, "pid": os.getpid(), "v": P.PROTOCOL_VERSION}

    def _handshake(self) -> bool:
        deadline = time.monotonic() + self.connect_timeout_s
        while time.monotonic() < deadline and not self.stop_event.is_set():
            tried_at = time.monotonic()
            try:
                self.ctl.send(P.encode(P.HELLO, self._hello()), timeout_s=HELLO_RETRY_S)
                frames = self.ctl.recv(HELLO_RETRY_S)
            except TransportError:
                # The daemon is not there (no room), or its end is closed (a pipe fails at once: no busy loop).
                self.stop_event.wait(max(0.0, tried_at + HELLO_RETRY_S - time.monotonic()))
                continue
            if frames is None:
                continue
            head, _ = P.decode(frames)
            if head["k"] == P.WELCOME:
                self._configure(head)
                return True
        return False

    def _configure(self, head: dict[str, Any]) -> None:
        self.worker_id = head.get("worker", self.worker_id)
        self.config = LoaderConfig.from_dict(head["config"], origin=f"daemon at {self.connect}")
        self.hb_interval_s = self.config.workers.heartbeat_interval_s
        if self.arena is not None:
            self.arena.close()  # a re-welcome names a fresh arena; what we sent from the old one stays valid
        self.arena = ArenaWriter.from_welcome(head.get(P.SHM))
        if self.data is None:
            self.data = transport.push(transport.reachable_endpoint(head["data"], self.connect))

    # -- control ------------------------------------------------------------
    def _send_ctl(self, kind: str, header: dict[str, Any] | None = None) -> None:
        assert self.link is not None
        self.link.send(kind, header)

    def _recv_ctl(self, timeout_s: float) -> dict[str, Any] | None:
        assert self.link is not None
        head = self.link.recv(timeout_s)
        if head is None:
            return None
        kind = head["k"]
        if kind == P.BYE:
            raise _Stop(head.get("reason", "daemon said goodbye"))
        if kind == P.CANCEL:
            if self.lease is not None and head.get("lease") == self.lease["lease"]:
                raise _Cancelled
            return None
        if kind == P.ERROR and head.get("unknown_session"):
            # The daemon forgot us (it declared us dead, or restarted): introduce ourselves again.
            self._send_ctl(P.HELLO, self._hello())
            return None
        if kind == P.WELCOME:
            self._configure(head)
            self._send_ctl(P.LEASE_REQ)
            return None
        return head if kind == P.LEASE else None

    def _tick(self) -> None:
        """Stop on request or when the control link lost the daemon (silent, or gone)."""
        if self.stop_event.is_set():
            raise _Stop("stop requested")
        if self.link is not None and self.link.lost:
            raise _Stop(self.link.lost)

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
            self.pending.append(msg)  # a lease can only arrive unasked after a re-hello
        self._tick()

    def _send_data(self, frames: list[Any]) -> None:
        assert self.data is not None
        while not self.data.try_send(frames, timeout_s=CONTROL_CHECK_INTERVAL_S):
            self.next_check = 0.0
            self._check()  # the stage is busy: still obey cancel, bye and stop while we wait

    # -- one file -----------------------------------------------------------
    def _serve_lease(self, lease: dict[str, Any]) -> None:
        self.lease = lease
        try:
            self._read_file(lease)
        except _Cancelled:
            log.info("worker %s: lease %s cancelled", self.worker_id, lease["lease"])
        finally:
            self.lease = None

    def _tag(self, lease: dict[str, Any], **extra: Any) -> dict[str, Any]:
        return {"s": lease["s"], "f": lease["f"], "l": lease["lease"], "w": self.worker_id, **extra}

    def _read_file(self, lease: dict[str, Any]) -> None:
        path = lease["path"]
        try:
            source = FileSource(self.config, path)
            if not self.mappers and self.config.pipeline.mappers:
                self.mappers = self.config.pipeline.resolve_mappers()
        except Exception as exc:  # noqa: BLE001 - every failure travels as a message
            if self._failed(lease, exc, None):
                self._send_data(P.encode(P.FILE_DONE, self._tag(lease, sent=0, skipped=1)))
            return
        try:
            if source.can_read_blocks and not self.config.pipeline.mappers:
                counts = self._send_blocks(lease, source)
            else:
                counts = self._send_samples(lease, source)
        finally:
            source.close()
        if counts is not None:
            sent, skipped = counts
            self._send_data(P.encode(P.FILE_DONE, self._tag(lease, sent=sent, skipped=skipped)))

    def _failed(self, lease: dict[str, Any], exc: BaseException, record: int | None) -> bool:
        """Report a failure; True when the record is skipped (on_error = "skip")."""
        error = WorkerError.from_exception(exc, worker=self.worker_id, file=lease["path"], record=record)
        if self.config.pipeline.on_error == "skip":
            log.warning("skipping record %s of %s: %s: %s", record, lease["path"], type(exc).__name__, exc)
            return True
        self._send_data(P.encode(P.FILE_ERROR, self._tag(lease, error=error.to_dict())))
        return False

    def _send_blocks(self, lease: dict[str, Any], source: FileSource) -> tuple[int, int] | None:
        wanted = self.config.workers.samples_per_message
        batch_size = self.config.pipeline.batch_size
        # A first block of one row tells the row size, so big rows never make a huge first message.
        rows, record = 1, 0
        while True:
            self._check()
            try:
                block = source.read_block(rows)
            except Exception as exc:  # noqa: BLE001
                if not self._failed(lease, exc, record):
                    return None
                return record, 1  # a reader that failed cannot go on: the rest of the file is skipped
            if block is None:
                return record, 0
            n = block_rows(block)
            self._send_chunk(self._tag(lease, r=record, n=n, sk="tuple"), dict(block))
            record += n
            rows = rows_for_bytes(block_nbytes(block) // max(1, n), wanted, batch_size)

    def _send_samples(self, lease: dict[str, Any], source: FileSource) -> tuple[int, int] | None:
        builder = ChunkBuilder(source.fields, self.config.workers.samples_per_message)
        samples = source.samples()
        record = sent = skipped = 0
        while True:
            self._check()
            try:
                sample = next(samples)
            except StopIteration:
                break
            except Exception as exc:  # noqa: BLE001
                if not self._failed(lease, exc, record):
                    return None
                skipped += 1
                break  # a reader that raised cannot go on
            try:
                for mapper in self.mappers:
                    sample = mapper(sample)
                builder.add(record, sample)
            except Exception as exc:  # noqa: BLE001
                if not self._failed(lease, exc, record):
                    return None
                skipped += 1
            record += 1
            if builder.due:
                sent += self._flush(lease, builder)
        if len(builder):
            sent += self._flush(lease, builder)
        return sent, skipped

    def _flush(self, lease: dict[str, Any], builder: ChunkBuilder) -> int:
        columns, records = builder.take()
        n = int(records.size)
        head = self._tag(lease, r=int(records[0]), n=n, sk=builder.kind)
        if int(records[-1]) - int(records[0]) + 1 != n:
            columns[P.INDEX_COLUMN] = records  # records were skipped inside this chunk
        self._send_chunk(head, columns)
        return n

    def _send_chunk(self, head: dict[str, Any], columns: dict[str, Any]) -> None:
        """Send a chunk, its large columns as arena references when they fit."""
        written = self.arena.put(head, columns) if self.arena is not None else []
        try:
            self._send_data(P.encode(P.CHUNK, head, columns))
        except BaseException:
            if written and self.arena is not None:
                self.arena.free(written)  # cancelled or stopping while the stage was busy: never sent
            raise


__all__ = ["run_worker", "Worker"]
