"""loader.processes: the parent watch that stops an orphaned child."""

from __future__ import annotations

import os
import threading

from loader import processes

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
