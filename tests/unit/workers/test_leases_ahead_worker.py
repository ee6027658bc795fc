"""The worker's side of leases ahead: it asks for its next file when it starts one, reads leases in the
order they came, and drops a queued lease the daemon cancels without reading it."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from loader.config import LoaderConfig
from loader.service import protocol as P
from loader.service.transport.inproc import FakeChannel
from workers.main import run_worker


class _Link:
    """In place of an address: the worker's ends of a control and a data channel."""

    def __init__(self, control: FakeChannel, data: FakeChannel) -> None:
        self.control, self.data = control, data

    def open_channels(self) -> tuple[FakeChannel, FakeChannel]:
        return self.control, self.data

    def __str__(self) -> str:
        return "fake://daemon"


def _lease(n: int, path: str) -> P.Lease:
    return P.Lease(lease=n, stream=1, epoch=0, file=n, path=path, token=f"t{n}")


def _recv(channel: FakeChannel) -> P.Message:
    frames = channel.recv(10.0)
    assert frames is not None, "the worker said nothing"
    return P.decode(frames)[0]


def _next_request(control: FakeChannel) -> None:
    while not isinstance(message := _recv(control), P.LeaseRequest):
        assert isinstance(message, (P.Heartbeat, P.Hello)), message


def test_a_cancelled_queued_lease_is_dropped_unread_and_the_next_is_asked_for_at_start(tmp_path: Any) -> None:
    paths = []
    for n in range(3):
        paths.append(str(tmp_path / f"f{n}.npy"))
        np.save(paths[-1], np.arange(60 if n == 0 else 4) + 100 * n)
    # 2 ms a sample: the first file lasts long enough for the worker to read the cancel while on it.
    pipeline = {"batch_size": 2, "mappers": ["tests.helpers:slow_sample_2ms"]}
    config = LoaderConfig.from_dict(
        {"source": {"files": paths}, "workers": {"leases_ahead": 2, "shm_arena_mib": 0}, "pipeline": pipeline}
    )
    control, daemon_control = FakeChannel.pair()
    data, daemon_data = FakeChannel.pair()
    stop = threading.Event()
    worker = threading.Thread(target=run_worker, args=(_Link(control, data),), kwargs={"stop_event": stop}, daemon=True)
    worker.start()
    try:
        assert isinstance(_recv(daemon_control), P.Hello)
        daemon_control.send(P.encode(P.Welcome(worker="w", config=config.to_dict(), data="fake://data")))
        for _ in range(3):  # idle: one lease to read and two ahead
            _next_request(daemon_control)
        for n in range(3):
            daemon_control.send(P.encode(_lease(n, paths[n])))
        daemon_control.send(P.encode(P.Cancel(lease=1)))  # taken back before the worker got to it
        done = []
        while len(done) < 2:
            message = _recv(daemon_data)
            assert message.lease != 1, "a cancelled queued lease is never read"
            if isinstance(message, P.FileDone):
                done.append(message.lease)
        assert done == [0, 2], "the others are read in the order they came"
        _next_request(daemon_control)  # asked for more as it started them
    finally:
        stop.set()
        worker.join(10)
    assert not worker.is_alive()
