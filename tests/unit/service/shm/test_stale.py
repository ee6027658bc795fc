"""The sweep of shared-memory files left by a daemon killed with SIGKILL."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from loader.service.shm import stale as stale_shm
from loader.service.shm.pool import ArenaPool

MIB = 1024 * 1024

pytestmark = pytest.mark.skipif(stale_shm.pid_namespace() is None, reason="no /proc/self/ns/pid here")


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=30)
    return child.pid


def _touch(directory, name: str) -> str:
    path = os.path.join(directory, name)
    with open(path, "wb") as f:
        f.write(b"x")
    return name


def test_prefix_names_namespace_pid_and_a_random_part():
    prefix = stale_shm.owner_prefix()
    assert prefix.startswith(f"loader-{stale_shm.pid_namespace()}-{os.getpid()}-")
    assert prefix != stale_shm.owner_prefix()


def test_sweep_removes_only_files_of_dead_daemons_of_this_namespace(tmp_path, caplog):
    ns, dead = stale_shm.pid_namespace(), _dead_pid()
    stale = [_touch(tmp_path, f"loader-{ns}-{dead}-0123abcd-{i}") for i in range(3)]
    kept = [
        _touch(tmp_path, f"loader-{ns}-{os.getpid()}-0123abcd-1"),  # a live daemon (this process)
        _touch(tmp_path, f"loader-{ns}-1-0123abcd-1"),  # pid 1 is alive
        _touch(tmp_path, f"loader-{ns + 1}-{dead}-0123abcd-1"),  # another pid namespace: proves nothing
        _touch(tmp_path, f"loader-{dead}-0123abcd-1"),  # not our shape
        _touch(tmp_path, f"loader-{ns}-{dead}-0123abcd-1.tmp"),
        _touch(tmp_path, "unrelated"),
    ]
    with caplog.at_level(logging.INFO, logger="loader.daemon"):
        removed = stale_shm.sweep(str(tmp_path))
    assert sorted(removed) == sorted(stale)
    assert sorted(os.listdir(tmp_path)) == sorted(kept)
    assert f"removed 3 shared-memory file(s) left in {tmp_path} by dead loader daemon(s) (pids {dead})" in caplog.text


def test_a_new_pool_sweeps_before_creating_its_own(tmp_path):
    ns, dead = stale_shm.pid_namespace(), _dead_pid()
    _touch(tmp_path, f"loader-{ns}-{dead}-0123abcd-0")
    with ArenaPool(MIB, directory=str(tmp_path)) as pool:
        pool.create()
        names = os.listdir(tmp_path)
        assert len(names) == 2 and all(name.startswith(pool.prefix + "-") for name in names)
    assert os.listdir(tmp_path) == []


def test_sweep_of_a_missing_directory_is_empty(tmp_path):
    assert stale_shm.sweep(str(tmp_path / "nope")) == []


def test_an_orphaned_workers_sweep_removes_only_its_own_daemons_files(tmp_path):
    ns, dead, other_dead = stale_shm.pid_namespace(), _dead_pid(), _dead_pid()
    mine = [_touch(tmp_path, f"loader-{ns}-{dead}-0123abcd-{i}") for i in range(2)]
    others = _touch(tmp_path, f"loader-{ns}-{other_dead}-0123abcd-0")  # left for the next daemon's sweep
    assert sorted(stale_shm.sweep_after(dead, str(tmp_path), wait_s=1.0)) == sorted(mine)
    assert os.listdir(tmp_path) == [others]


def test_an_orphaned_worker_waits_a_bounded_time_for_its_daemon_to_be_reaped(tmp_path):
    # A dead daemon is a zombie until its parent reaps it: ``kill(pid, 0)`` still finds it.
    ns = stale_shm.pid_namespace()
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    name = _touch(tmp_path, f"loader-{ns}-{zombie.pid}-0123abcd-0")
    try:
        assert stale_shm.sweep_after(zombie.pid, str(tmp_path), wait_s=0.3) == []  # never reaped in time: kept
        assert os.listdir(tmp_path) == [name]
    finally:
        zombie.wait(timeout=30)
    assert stale_shm.sweep_after(zombie.pid, str(tmp_path), wait_s=0.3) == [name]
