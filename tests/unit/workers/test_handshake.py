"""The worker's handshake: a daemon of another protocol version is refused with both versions named."""

from __future__ import annotations

import threading

import msgpack
import pytest

from loader.errors import ProtocolVersionError, TransportError
from loader.service import protocol as P
from loader.service.transport.inproc import FakeChannel
from workers.main import run_worker


class _FakeLink:
    """What ``workers.control.open_channels`` accepts in place of an address: a pair of channels."""

    def __init__(self, control: FakeChannel) -> None:
        self.control = control

    def open_channels(self):
        return self.control, FakeChannel.pair()[0]

    def __str__(self) -> str:
        return "fake://daemon"


def _daemon_answering(answer):
    """A fake daemon answering the first hello with ``answer`` (frames); returns (link, [(message, raw header)])."""
    near, far = FakeChannel.pair()
    hellos: list[tuple[P.Message, dict]] = []

    def serve():
        frames = far.recv(5.0)
        if frames is not None:
            hellos.append((P.decode(frames)[0], msgpack.unpackb(frames[0])))
            far.send(answer)

    threading.Thread(target=serve, daemon=True).start()
    return _FakeLink(near), hellos


def test_worker_refuses_a_welcome_of_another_protocol_version():
    welcome = P.Welcome(version=P.PROTOCOL_VERSION + 1, package="9.9", worker="w1", config={}, data="fake://data")
    link, hellos = _daemon_answering(P.encode(welcome))
    with pytest.raises(ProtocolVersionError) as info:
        run_worker(link, worker_id="w1", connect_timeout_s=5)
    assert hellos and isinstance(hellos[0][0], P.Hello) and hellos[0][0].version == P.PROTOCOL_VERSION
    assert hellos[0][1]["v"] == P.PROTOCOL_VERSION  # said on the wire, not the default for a peer that says none
    assert str(info.value).startswith(f"the daemon at fake://daemon speaks loader protocol {P.PROTOCOL_VERSION + 1}")


def test_a_peer_that_is_no_loader_daemon_is_named_in_one_line():
    # Another service on the port answers with bytes that are no loader message: the error names the address.
    link, _ = _daemon_answering([b"HTTP/1.1 400 Bad Request\r\n\r\n"])
    with pytest.raises(TransportError, match=r"^fake://daemon answered the worker's hello with a malformed message"):
        run_worker(link, worker_id="w1", connect_timeout_s=5)


def test_worker_stops_when_the_daemon_refuses_its_version():
    refusal = P.encode(P.Error(refused="version", message="worker w1 speaks loader protocol 1, this side speaks 2"))
    link, _ = _daemon_answering(refusal)
    with pytest.raises(ProtocolVersionError, match="refused this worker: worker w1 speaks loader protocol 1"):
        run_worker(link, worker_id="w1", connect_timeout_s=5)


def test_a_worker_whose_data_never_leaves_says_the_port_may_be_out_of_reach(monkeypatch, caplog):
    # The daemon sees only a worker that makes no progress (and takes it for hung); the worker said nothing.
    import logging
    import time

    import workers.main as worker_main

    class Unreachable:  # a PUSH socket whose peer never connects: nothing is taken until `until`
        def __init__(self, until: float) -> None:
            self.until = until

        def try_send(self, frames, timeout_s):
            time.sleep(timeout_s)
            return time.monotonic() >= self.until

    monkeypatch.setattr(worker_main, "DATA_UNREACHABLE_WARN_S", 0.1)
    worker = object.__new__(worker_main.Worker)
    worker.worker_id, worker.data_endpoint, worker.next_check = "w1", "tcp://10.0.0.5:40000", 0.0
    worker.data_sent, worker.data_warned = False, False
    worker._check = lambda: None
    caplog.set_level(logging.WARNING, logger="loader.worker")
    worker.data = Unreachable(time.monotonic() + 0.4)
    worker._send_data([b"x"])
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "has sent nothing to the daemon's data endpoint tcp://10.0.0.5:40000" in said[0]
    worker.data = Unreachable(time.monotonic() + 0.4)  # later waits: a busy stage, once data went out
    worker._send_data([b"x"])
    assert len(caplog.records) == 1
