"""WorkerPool against a fake launcher: what a file that loses its workers fails with, and which departures
are routine (a stop signalled to the whole process group) rather than a warning."""

from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Any

from loader.service import protocol as P
from loader.service.daemon.coordinator import Coordinator
from loader.service.daemon.records import WorkerRecord
from loader.service.daemon.workforce import (
    HUNG_FILE_ATTEMPTS,
    MAX_FILE_ATTEMPTS,
    MAX_START_FAILURES,
    RETIRED_IDLE,
    START_BACKOFF_S,
    WorkerPool,
)

PROGRESS_TIMEOUT_S = 2.0
HEARTBEAT_TIMEOUT_S = 1.0


class FakeProcess:
    def __init__(self, pid: int) -> None:
        self.pid, self.exitcode = pid, None

    def is_alive(self) -> bool:
        return self.exitcode is None


class FakeLauncher:
    """Processes that end when the pool stops them (SIGTERM) or when a test says so."""

    def __init__(self) -> None:
        self.started: list[FakeProcess] = []

    def start(self, connect: Any, worker_id: str, entry: str) -> FakeProcess:
        self.started.append(FakeProcess(1000 + len(self.started)))
        return self.started[-1]

    def stop(self, handle: FakeProcess, join_timeout_s: float) -> int | None:
        if handle.exitcode is None:
            handle.exitcode = -signal.SIGTERM
        return handle.exitcode

    def close(self, join_timeout_s: float) -> None:
        pass


class Pool:
    """A WorkerPool of one file, its coordinator, and the failures it reports."""

    def __init__(self, on_error: str = "raise") -> None:
        self.coordinator = Coordinator(
            ["/data/part-2.npy"], heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S, progress_timeout_s=PROGRESS_TIMEOUT_S
        )
        self.coordinator.enqueue(1, 0, [0])
        self.launcher = FakeLauncher()
        self.failed: list[tuple[int, int, dict[str, Any]]] = []
        self.pool = WorkerPool(
            self.coordinator,
            send=lambda peer, frames: True,
            config={"pipeline": {"on_error": on_error}},
            data_endpoint="inproc://data",
            endpoint="inproc://control",
            entry="tests.helpers:die_at_start",
            on_file_failed=lambda stream, file, error: self.failed.append((stream, file, error)),
            next_record=lambda stream, file: 17,
            launcher=self.launcher,
        )
        self.pool.launch()

    def reading(self) -> WorkerRecord:
        """The newest worker, connected and holding the file's lease."""
        record = list(self.coordinator.workers.values())[-1]
        record.peer = b"peer-%d" % record.pid
        assert self.coordinator.next_job(record) is not None
        return record

    def hang(self) -> None:
        """The worker holding the file sends nothing past the progress timeout (its heartbeats come)."""
        record = self.reading()
        record.progress_at = time.monotonic() - PROGRESS_TIMEOUT_S - 1
        self.pool.reap()  # stops it, re-queues the file and starts a replacement

    def go_silent(self) -> None:
        record = self.reading()
        record.last_seen = time.monotonic() - HEARTBEAT_TIMEOUT_S - 1
        self.pool.reap()

    def die(self, exitcode: int) -> None:
        self.reading().process.exitcode = exitcode
        self.pool.reap()


def test_a_file_whose_workers_hang_fails_saying_so_not_with_the_daemons_own_sigterm():
    pool = Pool()
    for _ in range(HUNG_FILE_ATTEMPTS - 1):
        pool.hang()
    assert not pool.failed, "a file whose worker hung once is tried again"
    pool.hang()
    assert HUNG_FILE_ATTEMPTS < MAX_FILE_ATTEMPTS, "each hang costs progress_timeout_s: fewer tries than for deaths"
    ((stream, file, error),) = pool.failed
    assert (stream, file, error["type"], error["file"]) == (1, 0, "WorkerDiedError", "/data/part-2.npy")
    message = error["message"]
    assert message.startswith(f"file part-2.npy hung {HUNG_FILE_ATTEMPTS} workers in a row (no progress for 2 s each")
    assert "nothing arrived from record 17 on" in message
    assert "a mapper or reader blocks; raise workers.progress_timeout_s" in message
    assert "signal" not in message


def test_a_hang_names_the_record_the_workers_heartbeats_said_and_only_of_its_own_lease():
    pool = Pool()
    for _ in range(HUNG_FILE_ATTEMPTS - 1):
        pool.hang()
    record = pool.reading()
    (held,) = record.leases
    pool.pool.on_message(record, P.Heartbeat(at=[held + 1000, 5]))  # a lease it does not hold: ignored
    assert record.at is None
    pool.pool.on_message(record, P.Heartbeat(at=[held, 42]))
    record.progress_at = time.monotonic() - PROGRESS_TIMEOUT_S - 1
    pool.pool.reap()
    ((_, _, error),) = pool.failed
    assert "nothing arrived from record 17 on; the last was on record 42)" in error["message"], error["message"]
    assert error["record"] == 42


def test_a_hang_after_other_deaths_says_both():
    pool = Pool()
    pool.die(-signal.SIGKILL)
    pool.die(-signal.SIGKILL)
    pool.hang()
    ((_, _, error),) = pool.failed  # the third loss: the hang says more than the exit code of the others
    assert "file part-2.npy hung 1 worker (2 more died on it) (no progress for 2 s each" in error["message"]


def test_a_file_whose_workers_go_silent_fails_saying_so():
    pool = Pool()
    for _ in range(MAX_FILE_ATTEMPTS):
        pool.go_silent()
    ((_, _, error),) = pool.failed
    assert "sent no heartbeat for 1 s and was stopped, 3 workers lost on file part-2.npy" in error["message"]
    assert "signal" not in error["message"]


def test_a_file_whose_workers_die_by_themselves_names_the_exit():
    pool = Pool()
    for _ in range(MAX_FILE_ATTEMPTS):
        pool.die(-signal.SIGSEGV)
    ((_, _, error),) = pool.failed
    # How many, and that this many end the file: a kill the daemon survives twice ended it the third time.
    assert (
        "killed by signal 11 without reporting an error, the 3rd worker lost while reading file part-2.npy (a "
        in (error["message"])
    )
    assert f"file is given up after {MAX_FILE_ATTEMPTS}" in error["message"]


def test_under_skip_a_hung_file_is_skipped_after_as_many_tries():
    pool = Pool(on_error="skip")
    for _ in range(HUNG_FILE_ATTEMPTS):
        pool.hang()
    ((_, _, error),) = pool.failed
    assert f"hung {HUNG_FILE_ATTEMPTS} workers in a row" in error["message"]


# -- a stop signalled to the process group (systemd, Slurm, `timeout`) ----------------------------------------


def test_workers_ended_by_sigterm_while_the_daemon_stops_are_routine(caplog):
    caplog.set_level(logging.INFO, logger="loader.daemon")
    pool = Pool()
    reading = pool.reading()
    pool.pool.launch()  # a second worker, holding no lease
    pool.pool.stop_requested = threading.Event()
    pool.pool.stop_requested.set()  # the daemon's own SIGTERM handler ran: its loop ends after this turn
    for process in pool.launcher.started:
        process.exitcode = -signal.SIGTERM  # the same signal reached every worker of the group
    pool.pool.reap()
    left = [r for r in caplog.records if "left:" in r.getMessage()]
    assert len(left) == 2 and all(r.levelno == logging.INFO for r in left), [r.getMessage() for r in left]
    assert "SIGTERM, the daemon is stopping" in left[0].getMessage()
    assert len(pool.launcher.started) == 2, "no replacement is started for a daemon that stops"
    assert not pool.failed and not pool.pool._losses, "a stop counts against no file"
    assert reading.worker_id not in pool.coordinator.workers


def test_a_worker_ended_by_sigterm_from_outside_warns_only_when_it_held_a_lease(caplog):
    caplog.set_level(logging.INFO, logger="loader.daemon")
    pool = Pool()
    (idle,) = pool.coordinator.workers.values()
    idle.files_done = 1  # it read files before: no start-up back-off for its replacement
    idle.process.exitcode = -signal.SIGTERM  # holding no lease: nothing is read again
    pool.pool.reap()
    assert caplog.records[-1].levelno == logging.INFO and "holding no lease" in caplog.records[-1].getMessage()
    assert len(pool.launcher.started) == 2, "it is replaced"
    pool.die(-signal.SIGTERM)  # the replacement, killed while it reads the file
    assert caplog.records[-1].levelno == logging.WARNING
    assert "exited with code -15; re-leasing 1 file(s)" in caplog.records[-1].getMessage()
    assert len(pool.launcher.started) == 3


def test_retiring_an_idle_worker_is_not_taken_for_a_sigterm_from_outside(caplog):
    caplog.set_level(logging.INFO, logger="loader.daemon")
    pool = Pool()
    (idle,) = pool.coordinator.workers.values()
    pool.pool.gone(idle, RETIRED_IDLE, replace=False)  # the autoscaler's; the pool sends the SIGTERM
    assert "SIGTERM" not in caplog.records[-1].getMessage()
    assert caplog.records[-1].levelno == logging.INFO  # routine: the autoscaler chose it


# -- a worker that says goodbye on its own ----------------------------------------------------------------------


def test_a_started_worker_that_took_the_daemon_for_gone_is_replaced_and_its_reason_logged(caplog):
    """A daemon-started worker leaves on its own only when it took the daemon for gone (its loop held up past
    the heartbeat timeout). It was not replaced: with every worker gone so, each epoch stalled for good."""
    caplog.set_level(logging.INFO, logger="loader.daemon")
    pool = Pool()
    reading = pool.reading()
    refused = pool.pool.on_message(reading, P.Bye(reason="daemon silent for 8.1s\nforged line"))
    assert refused is None
    assert reading.worker_id not in pool.coordinator.workers
    line = caplog.records[-1]
    assert line.levelno == logging.WARNING
    assert line.getMessage().endswith("said goodbye (daemon silent for 8.1s?forged line); re-leasing 1 file(s)")
    assert pool.coordinator.restarts == 1 and pool.pool._launch_at, "a replacement is due"
    assert pool.coordinator.queued(1) == 1, "its file is queued again"
    assert not pool.failed and not pool.pool._losses, "a goodbye counts against no file"
    pool.pool._launch_at = [0.0]
    pool.pool.reap()
    assert len(pool.launcher.started) == 2


def test_workers_that_cannot_read_their_lease_fail_the_file_instead_of_leasing_it_for_ever(caplog):
    """A lease a worker cannot decode (a daemon's bug, or a value it let through) was given to each replacement
    again without end: its goodbye counted against no file, and the epoch never ended."""
    caplog.set_level(logging.INFO, logger="loader.daemon")
    pool = Pool()
    for attempt in range(MAX_FILE_ATTEMPTS):
        reading = pool.reading()
        pool.pool.on_message(reading, P.Bye(reason=f"{P.UNREADABLE_FROM_DAEMON}: lease: seed out of range"))
        assert caplog.records[-1].levelno == logging.WARNING
        pool.pool._launch_at = [0.0]
        pool.pool.reap()
        assert len(pool.failed) == (attempt + 1 == MAX_FILE_ATTEMPTS)
    ((_, _, error),) = pool.failed
    assert error["file"] == "/data/part-2.npy" and error["type"] == "WorkerDiedError"
    assert (
        f"{MAX_FILE_ATTEMPTS} workers could not read what the daemon sent them for file part-2.npy"
        in (error["message"])
    ), error["message"]
    assert "seed out of range" in error["message"]


def test_a_peers_claim_that_it_cannot_read_its_lease_counts_against_no_file(caplog):
    caplog.set_level(logging.INFO, logger="loader.daemon")
    pool = Pool()
    for n in range(2 * MAX_FILE_ATTEMPTS):
        peer = pool.coordinator.add_worker(f"hand-started-{n}")
        peer.peer = b"hand-%d" % n
        assert pool.coordinator.next_job(peer) is not None, "it holds the file's lease"
        pool.pool.on_message(peer, P.Bye(reason=f"{P.UNREADABLE_FROM_DAEMON}: forged"))
        assert caplog.records[-1].levelno == logging.INFO, "a peer's goodbye is routine, whatever it says"
    assert not pool.failed and not pool.pool._losses
    assert pool.coordinator.restarts == 0, "a peer is not ours to restart"


def test_goodbyes_before_a_first_file_back_off_and_in_the_end_fail_the_waiting_epochs():
    """A worker that says goodbye before its first file, each time, is not restarted in a busy loop for ever."""
    failed: list[dict[str, Any]] = []
    pool = Pool()
    pool.pool._on_start_failed = failed.append
    delays = []
    for _ in range(MAX_START_FAILURES):
        fresh = list(pool.coordinator.workers.values())[-1]
        fresh.peer = b"fresh-%d" % fresh.pid
        before = time.monotonic()
        pool.pool.on_message(fresh, P.Bye(reason="lost the daemon: refused"))
        (due,) = pool.pool._launch_at
        delays.append(due - before)
        pool.pool._launch_at = [0.0]
        pool.pool.reap()
    assert delays[0] >= START_BACKOFF_S and delays[-1] > 2 * delays[0], delays
    ((error),) = failed
    assert error["message"].endswith("said goodbye (lost the daemon: refused)"), error["message"]


def test_a_peers_goodbye_and_workers_leaving_while_the_daemon_stops_start_nothing(caplog):
    caplog.set_level(logging.INFO, logger="loader.daemon")
    pool = Pool()
    peer = pool.coordinator.add_worker("hand-started")
    peer.peer = b"hand"
    pool.pool.on_message(peer, P.Bye())  # a worker someone started by hand: not ours to restart
    assert caplog.records[-1].levelno == logging.INFO
    pool.pool.stop_requested = threading.Event()
    pool.pool.stop_requested.set()
    reading = pool.reading()
    pool.pool.on_message(reading, P.Bye(reason="daemon stopping"))
    assert caplog.records[-1].levelno == logging.INFO
    assert not pool.pool._launch_at and pool.coordinator.restarts == 0


def test_a_worker_silent_on_its_lease_is_logged_once_long_before_it_is_stopped(caplog):
    """A hanging mapper was silent for the whole progress_timeout_s (120 s by default) before anything said so."""
    caplog.set_level(logging.INFO, logger="loader.daemon")
    pool = Pool()
    reading = pool.reading()
    reading.at = (next(iter(reading.leases)), 7)
    reading.progress_at = time.monotonic() - PROGRESS_TIMEOUT_S / 2 - 0.1  # half the timeout: noted, not stopped
    pool.pool.reap()
    pool.pool.reap()  # the same stall: one line
    notes = [r for r in caplog.records if "has sent nothing from file" in r.getMessage()]
    assert len(notes) == 1 and notes[0].levelno == logging.WARNING
    said = notes[0].getMessage()
    assert said.startswith(f"worker {reading.worker_id} has sent nothing from file part-2.npy for 1 s, at record 7")
    assert f"after {PROGRESS_TIMEOUT_S:g} s without progress (workers.progress_timeout_s)" in said
    assert reading.worker_id in pool.coordinator.workers, "not stopped yet"
    reading.progress_at = time.monotonic() - PROGRESS_TIMEOUT_S / 2 - 0.1  # data came, then another stall
    pool.pool.reap()
    assert len([r for r in caplog.records if "has sent nothing from file" in r.getMessage()]) == 2


def test_a_worker_that_cannot_be_started_is_tried_again_later_and_the_daemon_goes_on(caplog):
    # A flood of connections held the daemon's descriptors when a worker died: os.pipe() raised EMFILE in its
    # replacement's start, out of reap(), and the daemon stopped ("the daemon failed"), every client with it.
    import errno

    pool = Pool()
    starts = pool.launcher.start
    refusing = [True]

    def start(connect: Any, worker_id: str, entry: str) -> FakeProcess:
        if refusing[0]:
            raise OSError(errno.EMFILE, "Too many open files")
        return starts(connect, worker_id, entry)

    pool.launcher.start = start  # type: ignore[method-assign]
    caplog.set_level(logging.WARNING, logger="loader.daemon")
    pool.die(-signal.SIGKILL)  # its replacement is due now, and cannot start
    pool.pool.reap()
    (said,) = [r.getMessage() for r in caplog.records if "could not start a worker" in r.getMessage()]
    assert "Too many open files" in said and "trying again in" in said
    assert not [r for r in pool.coordinator.workers.values() if r.alive]
    time.sleep(START_BACKOFF_S * 2 + 0.05)
    pool.pool.reap()  # still refused: tried again, not said again within the minute
    assert len([r for r in caplog.records if "could not start a worker" in r.getMessage()]) == 1
    refusing[0] = False
    deadline = time.monotonic() + 5.0
    while not [r for r in pool.coordinator.workers.values() if r.alive] and time.monotonic() < deadline:
        time.sleep(0.05)
        pool.pool.reap()
    assert [r for r in pool.coordinator.workers.values() if r.alive], "started once the machine allows it"


def test_starts_that_keep_failing_fail_the_waiting_epochs_only_with_no_worker_left():
    # The autoscaler asks for a worker each second while clients starve: each failed ask queued a retry of its
    # own, and when starts worked again the pool overshot workers.max (6 workers for a max of 2). A start that
    # can never work (the Python gone from under the daemon) stalled the epochs to their progress timeout; but
    # a few seconds of EMFILE while a worker still reads must not fail them.
    import errno

    pool = Pool()
    failed: list[dict[str, Any]] = []
    pool.pool._on_start_failed = failed.append

    def start(connect: Any, worker_id: str, entry: str) -> FakeProcess:
        raise OSError(errno.ENOENT, "No such file or directory", "/gone/python")

    pool.launcher.start = start  # type: ignore[method-assign]
    for _ in range(2 * MAX_START_FAILURES):
        assert not pool.pool.try_launch(retry=False)
    assert not pool.pool._launch_at, "the autoscaler's asks leave no retries behind"
    assert not failed, "a worker is still alive and reading"
    pool.die(-signal.SIGKILL)  # the last one: its replacement cannot start either
    assert len(pool.pool._launch_at) == 1  # the pool's own replacement is tried again
    ((error),) = failed
    assert error["type"] == "FileNotFoundError"
    assert " worker starts in a row failed and no worker is left; the last: " in error["message"]
    assert "/gone/python" in error["message"]
    assert not pool.pool.try_launch()
    assert len(failed) == 2, "and at every failed start after, for the epochs asked for later"
