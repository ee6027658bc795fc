"""Shared fixtures: fail instead of hang, and catch leaked threads and processes."""

from __future__ import annotations

import os
import threading
import time

import pytest

from tests.helpers import child_pids, free_port

LEAK_GRACE_S = 5.0


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture
def no_leaks():
    """Assert a test leaves no new threads or child processes behind (bounded wait)."""
    threads_before = set(threading.enumerate())
    children_before = child_pids()
    yield
    deadline = time.monotonic() + LEAK_GRACE_S
    while time.monotonic() < deadline:
        extra_threads = [t for t in threading.enumerate() if t not in threads_before and t.is_alive()]
        extra_children = child_pids() - children_before
        if not extra_threads and not extra_children:
            return
        time.sleep(0.05)
    assert not extra_threads, f"leaked threads: {[t.name for t in extra_threads]}"
    assert not extra_children, f"leaked child processes: {sorted(extra_children)}"


@pytest.fixture(scope="session", autouse=True)
def no_shared_memory_left_behind():
    """The daemon unlinks its arenas on close: after the whole suite, none of ours may remain."""
    from loader.service.shm.arena import shm_directory

    directory = shm_directory()

    def ours() -> set[str]:
        try:
            return {name for name in os.listdir(directory) if name.startswith("loader-")}
        except OSError:
            return set()

    before = ours()
    yield
    deadline = time.monotonic() + LEAK_GRACE_S
    while (ours() - before) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = ours() - before
    assert not left, f"shared-memory files left in {directory}: {sorted(left)}"
