"""The pipe transport (``mp_transport``) and the worker's control link, without worker processes."""

from __future__ import annotations

import time

import numpy as np
import pytest

from loader.errors import TransportError
from loader.service import protocol as P
from loader.service import transport
from loader.service.inproc import FakeChannel
from loader.service.mp_transport import WorkerLinks, pack_frames, unpack_frames
from tests.helpers import wait_until
from workers.control import ControlLink


def test_frames_round_trip_without_pickle():
    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    frames = P.encode(P.CHUNK, {"s": 1, "n": 3}, {"x": array, "empty": np.zeros((0, 2)), "o": [b"a", [1, 2]]})
    blob = pack_frames(frames)
    assert b"pickle" not in blob and isinstance(blob, bytes)
    head, columns = P.decode(unpack_frames(blob))
    assert head["s"] == 1 and np.array_equal(columns["x"], array) and columns["empty"].shape == (0, 2)
    assert list(columns["o"]) == [b"a", [1, 2]]
    assert unpack_frames(pack_frames([])) == []


def test_malformed_blob_is_a_transport_error():
    with pytest.raises(TransportError):
        unpack_frames(b"\x01")
    with pytest.raises(TransportError):
        unpack_frames(pack_frames([b"abc"])[:-1])


@pytest.mark.parametrize("kind", ["pipe", "queue"])
def test_link_carries_control_both_ways_and_data_in_order(kind):
    links = WorkerLinks(kind)
    end = links.new_link()
    control, data = end.open_channels()
    try:
        poller = transport.Poller()
        poller.register(links.control)
        poller.register(links.data)
        control.send(P.encode(P.HELLO, {"worker": "w1"}))
        for i in range(200):
            assert data.try_send(P.encode(P.CHUNK, {"i": i}, {"x": np.full(10, i)}), timeout_s=5)  # fits the pipe unread
        assert links.control in poller.wait(5)
        peer, frames = links.control.recv(0)
        assert P.decode(frames)[0]["worker"] == "w1"
        assert links.control.send(peer, P.encode(P.WELCOME))
        assert P.decode(control.recv(5))[0]["k"] == P.WELCOME
        got = []
        while len(got) < 200:
            frames = links.data.recv(0) if links.data in poller.wait(5) else None
            if frames is not None:
                head, columns = P.decode(frames)
                assert columns["x"][0] == head["i"]
                got.append(head["i"])
        assert got == list(range(200))
    finally:
        data.close()
        control.close()
        links.close()


def test_closed_worker_end_is_dropped_not_polled_forever():
    links = WorkerLinks("pipe")
    end = links.new_link()
    control, data = end.open_channels()
    assert len(links.data.poll_keys()) == 1
    data.try_send([b"last words"], timeout_s=1)
    data.close()
    control.close()
    assert links.data.recv(1) == [b"last words"]  # data written before the end still arrives
    assert links.data.recv(1) is None
    assert links.data.poll_keys() == [] and links.control.recv(1) is None and links.control.poll_keys() == []
    assert not links.control.send(b"pipe-1", [b"x"])
    links.close()


def test_control_link_heartbeats_while_the_main_thread_is_busy():
    worker_side, daemon_side = FakeChannel.pair()
    link = ControlLink(worker_side, interval_s=0.05, timeout_s=0.5)
    link.start()
    try:
        beats = 0
        deadline = time.monotonic() + 0.4
        while time.monotonic() < deadline:  # the "main thread" never touches the link meanwhile
            frames = daemon_side.recv(0.05)
            if frames is not None and P.decode(frames)[0]["k"] == P.HEARTBEAT:
                beats += 1
                daemon_side.send(P.encode(P.HEARTBEAT))
        assert beats >= 4 and link.lost is None
        daemon_side.send(P.encode(P.LEASE, {"lease": 1}))
        assert link.recv(2)["k"] == P.LEASE  # heartbeat answers are not passed on
        assert wait_until(lambda: link.lost is not None, timeout_s=3)  # now the "daemon" stays silent
        assert "silent" in link.lost
    finally:
        link.close()
        daemon_side.close()
