"""loader.runtime.processes: the parent watch that stops an orphaned child."""

from __future__ import annotations

import os
import threading

from loader.runtime import processes

WATCH_JOIN_TIMEOUT_S = 5.0


def test_stop_is_set_when_the_parent_is_not_the_one_given():
    # As in a child whose parent died before it started watching: it was reparented already.
    stop = threading.Event()
    thread = processes.stop_when_orphaned(stop, parent_pid=os.getppid() + 100_000, interval_s=0.01)
    assert stop.wait(WATCH_JOIN_TIMEOUT_S)
    thread.join(WATCH_JOIN_TIMEOUT_S)
    assert not thread.is_alive()


def test_a_live_parent_leaves_stop_alone_and_the_watch_ends_with_stop():
    stop = threading.Event()
    thread = processes.stop_when_orphaned(stop, parent_pid=os.getppid(), interval_s=0.01)
    assert not stop.wait(0.2)
    stop.set()
    thread.join(WATCH_JOIN_TIMEOUT_S)
    assert not thread.is_alive()


def _sleep_forever() -> None:
    import time

    while True:
        time.sleep(1)


def test_a_stopped_process_is_stopped_by_sigterm_without_waiting_for_sigkill():
    import signal
    import time

    proc = processes.start_process(_sleep_forever, name="loader-test-stopped", method="spawn")
    os.kill(proc.pid, signal.SIGSTOP)
    start = time.monotonic()
    code = processes.stop_process(proc, join_timeout_s=0.0)  # always ends it (SIGKILL at worst)
    assert code == -signal.SIGTERM  # SIGTERM acted: SIGKILL was not needed
    assert time.monotonic() - start < processes.PROCESS_KILL_TIMEOUT_S


def test_a_child_that_ignores_interrupts_survives_one_sent_while_it_is_still_starting():
    # Ctrl-C in a terminal reaches every process of the group, also a spawned worker still importing
    # (the first ~0.1 s), where an interrupt used to end it with a KeyboardInterrupt traceback.
    import signal
    import time

    proc = processes.start_process(
        time.sleep, (0.5,), name="test-ignores-interrupts", import_main=False, ignore_interrupts=True
    )
    for _ in range(5):
        os.kill(proc.pid, signal.SIGINT)
        time.sleep(0.01)
    proc.join(WATCH_JOIN_TIMEOUT_S)
    assert proc.exitcode == 0


def test_a_child_that_ignores_interrupts_survives_one_while_it_imports_its_target(monkeypatch):
    # The child unpickles its target, importing its module: an interrupt then (Ctrl-C reaching a worker still
    # importing numpy) ended it with a KeyboardInterrupt traceback. multiprocessing starts a spawned child with
    # no signal blocked, so the parent's blocked mask did not hold it off.
    from tests import interrupted_import

    monkeypatch.setenv(interrupted_import.INTERRUPT_IMPORT_OF, str(os.getpid()))
    proc = processes.start_process(
        interrupted_import.finish, name="test-import-interrupted", import_main=False, ignore_interrupts=True
    )
    proc.join(WATCH_JOIN_TIMEOUT_S)
    assert proc.exitcode == 0


def test_an_interrupt_for_the_parent_while_a_child_starts_is_delivered_after():
    import signal
    import time

    # Sent to this thread: a process-directed signal may go to any thread that does not block it.
    got: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: got.append(signum))
    try:
        with processes._interrupts_held(True):
            signal.pthread_kill(threading.get_ident(), signal.SIGINT)
            time.sleep(0.05)
            assert got == []  # held while the child would start
        deadline = time.monotonic() + WATCH_JOIN_TIMEOUT_S
        while not got and time.monotonic() < deadline:
            time.sleep(0.01)
        assert got == [signal.SIGINT]
    finally:
        signal.signal(signal.SIGINT, previous)


def _report_a_programs_sigint(path: str) -> None:
    import subprocess
    import sys

    code = "import signal; print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    with open(path, "w") as fh:
        fh.write(done.stdout.strip())


def test_a_program_started_by_a_child_that_ignores_interrupts_still_gets_them(tmp_path):
    # The child ignores SIGINT with a handler, not SIG_IGN, which a program it starts would inherit (a mapper's
    # ffmpeg would go on after Ctrl-C).
    path = str(tmp_path / "ignored")
    proc = processes.start_process(
        _report_a_programs_sigint, (path,), name="test-grandchild", import_main=False, ignore_interrupts=True
    )
    proc.join(30)
    assert proc.exitcode == 0
    with open(path) as fh:
        assert fh.read() == "False"
