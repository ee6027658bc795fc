"""A normal stop of `loader serve` by a signal to its whole process group (systemd, Slurm, `timeout`) is quiet."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from loader.errors import LoaderError, ServiceUnavailableError
from loader.examples import datagen
from tests.helpers import free_port, is_alive, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SERVE_READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
WORKERS = 3


def _workers(address: str) -> list[dict]:
    from loader.service.client.client import query_status

    try:
        return [w for w in query_status(address, timeout_s=0.5)["workers"] if w["connected"]]
    except LoaderError:
        return []


def test_a_stop_signalled_to_the_process_group_logs_no_warning(tmp_path) -> None:
    datagen.generate(str(tmp_path), files=2, samples=50, dim=4)
    (tmp_path / "c.toml").write_text('[source]\nfiles = ["*.npy"]\n')
    address = f"tcp://127.0.0.1:{free_port()}"
    command = [sys.executable, "-m", "loader.cli", "serve", str(tmp_path / "c.toml"), "--bind", address]
    # A session of its own: the group signalled below is the daemon and its workers, as under systemd or Slurm.
    daemon = subprocess.Popen(
        [*command, "--workers", str(WORKERS)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert wait_until(lambda: len(_workers(address)) == WORKERS, timeout_s=SERVE_READY_TIMEOUT_S, interval_s=0.2)
        pids = [w["pid"] for w in _workers(address)]
        os.killpg(daemon.pid, signal.SIGTERM)  # every worker gets it too, at the same moment as the daemon
        _, stderr = daemon.communicate(timeout=STOP_TIMEOUT_S)
        assert daemon.returncode == 0, stderr
        assert "WARNING" not in stderr and "Traceback" not in stderr, stderr
        assert "stopped" in stderr
        assert wait_until(lambda: not any(is_alive(pid) for pid in pids), timeout_s=5.0), "orphan workers"
    finally:
        if daemon.poll() is None:
            os.killpg(daemon.pid, signal.SIGKILL)
            daemon.wait(timeout=STOP_TIMEOUT_S)


@pytest.mark.parametrize("bind", ["tcp", "ipc"])
def test_a_client_finds_a_daemon_killed_with_sigkill_in_seconds_not_after_its_timeout(tmp_path, bind) -> None:
    """The OOM killer's SIGKILL leaves no goodbye: the client used to wait out its timeout_s of silence.
    Its connection drops and the address refuses reconnecting: it says so within about two seconds."""
    import loader

    datagen.generate(str(tmp_path), files=2, samples=2000, dim=4)
    (tmp_path / "c.toml").write_text('[source]\nfiles = ["*.npy"]\n[pipeline]\nbatch_size = 8\n')
    address = f"tcp://127.0.0.1:{free_port()}" if bind == "tcp" else f"ipc://{tmp_path}/daemon.sock"
    command = [sys.executable, "-m", "loader.cli", "serve", str(tmp_path / "c.toml"), "--bind", address]
    daemon = subprocess.Popen(
        [*command, "--workers", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        assert wait_until(lambda: len(_workers(address)) == 1, timeout_s=SERVE_READY_TIMEOUT_S, interval_s=0.2)
        with loader.Client(address, timeout_s=60, prefetch=1) as client:
            batches = client.epoch()
            next(batches)
            workers = [w["pid"] for w in _workers(address)]
            os.kill(daemon.pid, signal.SIGKILL)  # the daemon alone, as the OOM killer does: its workers clean up
            daemon.wait(timeout=STOP_TIMEOUT_S)
            killed = time.monotonic()
            with pytest.raises(ServiceUnavailableError, match="is gone: its connection closed"):
                for _ in batches:  # what was prefetched, then the error
                    pass
            assert time.monotonic() - killed < 15, "found by the connection, not by 60 s of silence"
        assert wait_until(lambda: not any(is_alive(pid) for pid in workers), timeout_s=10.0), "orphan workers"
    finally:
        if daemon.poll() is None:
            os.killpg(daemon.pid, signal.SIGKILL)
            daemon.wait(timeout=STOP_TIMEOUT_S)
