"""A worker frozen (SIGSTOP) in the middle of writing a data message stalls nobody but itself.

Transports "pipe" and "queue". The worker entry below is the real worker with one
fault injected: the first worker (of any process: an O_EXCL marker file decides)
to send a data message bigger than a pipe's buffer writes half of it and stops
itself with SIGSTOP. Before the daemon's ends were non-blocking, its loop then
waited in ``recv_bytes`` for the rest, and every other worker and client with it.
Now the other worker's data flows on, the progress timeout replaces the frozen
worker (it is killed, so its link ends and the half message is dropped), and the epoch
has every sample exactly once.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import signal
import struct
import threading
from typing import Any

import numpy as np
import pytest
import zmq

from loader import Client
from tests.helpers import child_pids, wait_until
from tests.integration.conftest import make_config, running_daemon

pytestmark = pytest.mark.integration

FREEZE_MARKER_ENV = "LOADER_TEST_FREEZE_MARKER"
FREEZING_ENTRY = "tests.integration.test_service_pipe_stall:freezing_worker"
ROW_FLOATS = 256 * 1024  # 1 MiB rows: every data message is bigger than a pipe's buffer
FREEZE_OVER_BYTES = 1 << 20


@pytest.fixture(scope="module", autouse=True)
def _zmq_garbage_collector() -> None:
    """Start pyzmq's garbage-collector thread (it lives for the session; the first zero-copy frame
    starts it) before ``no_leaks`` counts threads: big batches reach the client zero-copy."""
    zmq.Frame(bytearray(1 << 20), copy=False)


def freezing_worker(connect: Any, **kwargs: Any) -> int:
    """``workers.main:run_worker``, but the first data message over 1 MiB (once, of all workers) freezes mid-way."""
    from loader.service.transport import pipes
    from workers.main import run_worker

    send_whole = pipes.PipeChannel._write

    def write(channel: Any, blob: bytes) -> None:
        if channel.endpoint.endswith("/data") and len(blob) > FREEZE_OVER_BYTES and _claim_freeze():
            framed = memoryview(struct.pack("!i", len(blob)) + blob)  # as send_bytes frames it
            half = framed[: len(framed) // 2]
            while half:
                half = half[os.write(channel.fileno_obj(), half) :]
            # Stops every thread; sent to this one so that it stops before its next line (a signal
            # sent to the process is taken by the main thread, and the "queue" feeder could write on).
            signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
        send_whole(channel, blob)

    pipes.PipeChannel._write = write  # type: ignore[method-assign]
    return run_worker(connect, **kwargs)


def _claim_freeze() -> bool:
    """True in the one process that creates the marker file (it writes its pid there)."""
    try:
        fd = os.open(os.environ[FREEZE_MARKER_ENV], os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    return True


def _write_row_files(directory: Any, n_files: int, rows: int) -> list[int]:
    """``f<i>.npy`` files of 1 MiB float32 rows whose first value is a unique id; returns the ids."""
    ids = []
    for f in range(n_files):
        values = np.zeros((rows, ROW_FLOATS), dtype=np.float32)
        values[:, 0] = np.arange(rows) + 1000 * f
        np.save(directory / f"f{f:03d}.npy", values)
        ids.extend(int(v) for v in values[:, 0])
    return ids


def _thaw_and_kill(marker: Any) -> None:
    """Whatever the test did, leave no frozen child behind (the daemon normally killed it already)."""
    with contextlib.suppress(OSError, ValueError):
        pid = int(marker.read_text())
        if pid in child_pids():
            os.kill(pid, signal.SIGKILL)
            os.kill(pid, signal.SIGCONT)


@pytest.mark.parametrize("transport", ["pipe", "queue"])
def test_worker_frozen_mid_message_stalls_nobody_and_is_replaced(tmp_path, monkeypatch, caplog, transport, no_leaks):
    caplog.set_level(logging.WARNING, logger="loader.daemon")
    ids = _write_row_files(tmp_path, 4, 12)
    marker = tmp_path / "frozen.pid"
    monkeypatch.setenv(FREEZE_MARKER_ENV, str(marker))
    # The frozen worker is found by the 1 s progress timeout. Stopping it costs the daemon's loop up to
    # processes.PROCESS_KILL_TIMEOUT_S (a stopped process acts on SIGTERM only once continued), during
    # which nobody's heartbeats are answered: a heartbeat timeout above that keeps the healthy worker.
    config = make_config(
        tmp_path,
        pipeline={"batch_size": 4, "shuffle_buffer": 0},
        workers={
            "transport": transport,
            "samples_per_message": 4,
            "shm_arena_mib": 0,
            "heartbeat_timeout_s": 6.0,
            "progress_timeout_s": 1.0,
        },
    )
    try:
        with (
            running_daemon(config, worker_entry=FREEZING_ENTRY) as daemon,
            Client(daemon.endpoint, timeout_s=10) as client,
        ):
            got = [int(v) for batch in client.epoch() for v in batch["data"][:, 0]]
            assert marker.exists()  # a worker did freeze mid-message
            assert collections.Counter(got) == collections.Counter(ids)
            assert "made no progress on its lease" in caplog.text
            assert daemon.coordinator.restarts == 1  # the frozen worker only: the other never stalled
            # The frozen worker's data link was dropped with its half message, not kept.
            assert wait_until(lambda: len(daemon._data.poll_keys()) == len(daemon.coordinator.workers), timeout_s=5)
    finally:
        _thaw_and_kill(marker)
