"""The autoscaler's rule against a fake daemon: bounds, hysteresis, and never retiring a worker with a lease."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from loader.service.daemon.autoscale import GROW_AFTER_S, SHRINK_AFTER_S, Autoscaler


@dataclass
class FakeWorker:
    worker_id: str
    peer: bytes | None = b"peer"
    process: Any = True
    leases: dict = field(default_factory=dict)
    alive: bool = True


class FakeDaemon:
    def __init__(self, count: int, minimum: int, maximum: int) -> None:
        self.config = SimpleNamespace(workers=SimpleNamespace(count=count))
        self.workers: dict[str, FakeWorker] = {}
        self.queue = 0
        self.coordinator = SimpleNamespace(workers=self.workers, queued=lambda: self.queue)
        self.sessions: dict = {}
        self.stage = SimpleNamespace(sessions=self.sessions)
        self.retired: list[FakeWorker] = []
        self.pool = SimpleNamespace(launch=self.launch, try_launch=lambda retry=True: self.launch(), gone=self.gone)
        self._ids = 0
        for _ in range(count):
            self.launch(connected=True)

    def launch(self, connected: bool = False) -> None:
        self._ids += 1
        self.workers[str(self._ids)] = FakeWorker(str(self._ids), peer=b"p" if connected else None)

    def gone(self, record: FakeWorker, why: str, *, replace: bool = True) -> None:
        assert not replace
        assert not record.leases, "retired a worker that holds a lease"
        self.retired.append(self.workers.pop(record.worker_id))

    def client(self, waiting: bool) -> None:
        self.sessions.clear()
        if waiting:
            self.sessions[b"c"] = SimpleNamespace(current=object(), credits=1)


def step_until(daemon: FakeDaemon, scaler: Autoscaler, start: float, seconds: float) -> float:
    now = start
    while now < start + seconds:
        now += 0.1
        scaler.tick(now)
    return now


def test_grows_one_at_a_time_to_max_while_starved_and_shrinks_to_min_when_idle():
    daemon = FakeDaemon(1, 1, 3)
    scaler = Autoscaler(daemon, 1, 3)
    daemon.client(waiting=True)
    daemon.queue = 10
    now = 0.0
    for expected in (2, 3, 3):
        for w in daemon.workers.values():  # everyone connected and busy
            w.peer, w.leases = b"p", {1: "job"}
        now = step_until(daemon, scaler, now, GROW_AFTER_S + 0.2)
        assert len(daemon.workers) == expected
    daemon.client(waiting=False)
    for w in daemon.workers.values():
        w.leases = {}
    now = step_until(daemon, scaler, now, 3 * (SHRINK_AFTER_S + 0.2))
    assert len(daemon.workers) == 1 and scaler.desired == 1


def test_a_starting_worker_stops_growth():
    daemon = FakeDaemon(1, 1, 4)
    scaler = Autoscaler(daemon, 1, 4)
    daemon.client(waiting=True)
    daemon.queue = 10
    next(iter(daemon.workers.values())).leases = {1: "job"}
    step_until(daemon, scaler, 0.0, 5 * GROW_AFTER_S)
    assert len(daemon.workers) == 2  # the second is launched but never connects: no third


def test_advising_only_starts_and_stops_nothing():
    daemon = FakeDaemon(2, 1, 0)
    scaler = Autoscaler(daemon, 1, 0, act=False)
    daemon.client(waiting=True)
    daemon.queue = 10
    for w in daemon.workers.values():
        w.leases = {1: "job"}
    step_until(daemon, scaler, 0.0, GROW_AFTER_S + 0.2)
    assert len(daemon.workers) == 2 and scaler.desired == 3


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 3).flatmap(lambda lo: st.tuples(st.just(lo), st.integers(lo, 5))),
    st.lists(
        st.tuples(st.booleans(), st.integers(0, 3), st.lists(st.booleans(), max_size=6), st.booleans()),
        max_size=40,
    ),
)
def test_bounds_hold_and_no_leased_worker_is_retired(bounds, steps):
    lo, hi = bounds
    daemon = FakeDaemon(lo, lo, hi)
    scaler = Autoscaler(daemon, lo, hi)
    now = 0.0
    for waiting, queue, leased, connect in steps:
        daemon.client(waiting)
        daemon.queue = queue
        for w, has_lease in zip(daemon.workers.values(), leased):
            w.leases = {1: "job"} if has_lease else {}
            if connect:
                w.peer = b"p"
        now = step_until(daemon, scaler, now, 1.0)
        assert lo <= len(daemon.workers) <= hi  # gone() asserts no retired worker held a lease
        assert lo <= scaler.desired <= hi
