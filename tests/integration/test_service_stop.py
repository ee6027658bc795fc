"""A normal stop of `loader serve` by a signal to its whole process group (systemd, Slurm, `timeout`) is quiet."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from loader.errors import LoaderError
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
