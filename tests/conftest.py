"""Shared fixtures: fail instead of hang, and catch leaked threads and processes."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import multiprocessing.process
import os
import subprocess
import threading
import time
from typing import Any

import pytest

from tests.helpers import child_pids, free_port

LEAK_GRACE_S = 5.0


@contextlib.contextmanager
def _run_alone_or_beside(item: pytest.Item) -> Any:
    """Under pytest-xdist, a test marked ``alone`` runs while no test runs on another xdist worker.

    Every daemon that starts sweeps ``/dev/shm`` of the arena files of dead daemons (``shm.stale``), so a
    test that checks what happens to a dead process's files (kept until the next daemon sweeps them, or
    none left behind) must not have daemons of other tests starting beside it. A readers-writer lock
    shared by the run's workers (a file beside their temporary directories): every test holds it shared,
    an ``alone`` test exclusively; the turnstile keeps tests that start meanwhile from overtaking it.
    """
    if "PYTEST_XDIST_WORKER" not in os.environ:
        yield
        return
    shared = item.config._tmp_path_factory.getbasetemp().parent  # type: ignore[attr-defined]
    alone = item.get_closest_marker("alone") is not None
    with open(shared / "loader-alone.lock", "a") as lock, open(shared / "loader-turnstile.lock", "a") as turnstile:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)  # alone: until the others' tests end
        finally:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    """Setup (module fixtures' daemons too), call and teardown of each test under ``_run_alone_or_beside``."""
    with _run_alone_or_beside(item):
        yield


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
        extra_threads = [
            t for t in threading.enumerate() if t not in threads_before and t.is_alive() and not _process_wide(t)
        ]
        extra_children = child_pids() - children_before
        if not extra_threads and not extra_children:
            return
        time.sleep(0.05)
    assert not extra_threads, f"leaked threads: {[t.name for t in extra_threads]}"
    assert not extra_children, f"leaked child processes: {sorted(extra_children)}"


def _process_wide(thread: threading.Thread) -> bool:
    """pyzmq's garbage collector thread: started by its first zero-copy send of the process and kept for the
    process's life, whichever test came first (test_torch_digits alone counted it as its leak)."""
    return type(thread).__name__ == "GarbageCollectorThread" and type(thread).__module__.startswith("zmq.")


class _StartedProcesses:
    """The pids of every process this test run starts (``subprocess.Popen``, ``multiprocessing``).

    Recorded while installed, so a session-end check can tell this run's shared-memory files
    from those of other test runs or daemons on the same host.
    """

    def __init__(self) -> None:
        self.pids: set[int] = {os.getpid()}
        self._originals: list[tuple[type, str, object]] = []

    def install(self) -> None:
        self._wrap(subprocess.Popen, "__init__")
        self._wrap(multiprocessing.process.BaseProcess, "start")

    def uninstall(self) -> None:
        for cls, name, original in reversed(self._originals):
            setattr(cls, name, original)
        self._originals.clear()

    def _wrap(self, cls: type, name: str) -> None:
        original = getattr(cls, name)
        pids = self.pids

        @functools.wraps(original)
        def recording(obj: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return original(obj, *args, **kwargs)
            finally:
                if getattr(obj, "pid", None):
                    pids.add(obj.pid)

        self._originals.append((cls, name, original))
        setattr(cls, name, recording)


@pytest.fixture(scope="session", autouse=True)
def no_shared_memory_left_behind():
    """The daemon unlinks its arenas on close: after the whole suite, none of this run's may remain.

    Only files made by this run count: arena files are named ``loader-<pid namespace>-<pid>-...``
    (``loader.service.shm.stale``), and a daemon runs in this process or in one this run started.
    Other test runs and daemons on the host use the same directory and are none of our business.
    """
    from loader.service.shm.arena import shm_directory
    from loader.service.shm.stale import parse_name, pid_namespace

    directory = shm_directory()
    namespace = pid_namespace() or 0
    started = _StartedProcesses()

    def ours() -> set[str]:
        try:
            names = os.listdir(directory)
        except OSError:
            return set()
        owners = {name: parse_name(name) for name in names}
        return {
            name
            for name, owner in owners.items()
            if owner is not None and owner[0] == namespace and owner[1] in started.pids
        }

    before = ours()
    started.install()
    try:
        yield
    finally:
        started.uninstall()
    deadline = time.monotonic() + LEAK_GRACE_S
    while (ours() - before) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = ours() - before
    assert not left, f"shared-memory files left in {directory} by this test run: {sorted(left)}"
