"""The pipe transport (``mp_transport``, ``pipes``) and the worker's control link, without worker processes.

The daemon's end of a link never waits for the rest of a message: pieces, stalls, end-of-file and
garbled lengths are fed to it by hand here, through real pipes.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing.connection
import os
import struct
import tempfile
import threading
import time
import tracemalloc
from typing import Any

import numpy as np
import pytest

from loader.errors import TransportError
from loader.service import protocol as P
from loader.service import transport
from loader.service.transport import pipe_frames
from loader.service.transport.inproc import FakeChannel
from loader.service.transport.links import MAX_MESSAGE_BYTES, WorkerLinks, pack_frames, unpack_frames
from loader.service.transport.pipe_frames import FIRST_BUFFER_MAX_BYTES, FrameReader, FrameWriter
from loader.service.transport.pipes import PipeChannel
from tests.helpers import wait_until
from workers.control import ControlLink


def _chunk(*, stream=1, worker="w1", record=0, count):
    return P.Chunk(stream=stream, file=0, lease=1, worker=worker, record=record, count=count)


def _welcome(config=None):
    return P.Welcome(worker="w1", config=config or {}, data="pipe://data")


def _lease(lease):
    return P.Lease(lease=lease, stream=1, epoch=0, file=0, path="/data/f0.npy")


def test_frames_round_trip_without_pickle():
    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    chunk = _chunk(stream=1, count=3)
    frames = P.encode(chunk, {"x": array, "empty": np.zeros((3, 0)), "o": [b"a", [1, 2], None]})
    blob = pack_frames(frames)
    assert b"pickle" not in blob and isinstance(blob, bytes)
    message, columns = P.decode(unpack_frames(blob))
    assert message == chunk and np.array_equal(columns["x"], array) and columns["empty"].shape == (3, 0)
    assert list(columns["o"]) == [b"a", [1, 2], None]
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
        control.send(P.encode(P.Hello(worker="w1")))
        for i in range(200):  # fits the pipe unread
            assert data.try_send(P.encode(_chunk(record=i, count=10), {"x": np.full(10, i)}), timeout_s=5)
        assert links.control in poller.wait(5)
        peer, frames = links.control.recv(0)
        assert P.decode(frames)[0].worker == "w1"
        assert links.control.send(peer, P.encode(_welcome()))
        assert isinstance(P.decode(control.recv(5))[0], P.Welcome)
        got = []
        while len(got) < 200:
            frames = links.data.recv(0) if links.data in poller.wait(5) else None
            if frames is not None:
                chunk, columns = P.decode(frames)
                assert columns["x"][0] == chunk.record
                got.append(chunk.record)
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
            if frames is not None and isinstance(P.decode(frames)[0], P.Heartbeat):
                beats += 1
                daemon_side.send(P.encode(P.Heartbeat()))
        assert beats >= 4 and link.lost is None
        daemon_side.send(P.encode(_lease(1)))
        assert link.recv(2) == _lease(1)  # heartbeat answers are not passed on
        assert wait_until(lambda: link.lost is not None, timeout_s=3)  # now the "daemon" stays silent
        assert "silent" in link.lost
    finally:
        link.close()
        daemon_side.close()


# -- the daemon's end never waits for the rest of a message -------------------
def _send_bytes_output(blob: bytes) -> bytes:
    """The bytes ``Connection.send_bytes`` writes for ``blob``: the framing the daemon's end parses."""
    with tempfile.TemporaryFile() as fh:
        conn = multiprocessing.connection.Connection(os.dup(fh.fileno()), readable=False)
        conn.send_bytes(blob)
        conn.close()
        fh.seek(0)
        return fh.read()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class _PipeLinks:
    """A "pipe" ``WorkerLinks`` (``.links``) whose worker ends, made by ``open()``, close with it."""

    def __init__(self) -> None:
        self.links = WorkerLinks("pipe")
        self._channels: list[PipeChannel] = []

    def open(self) -> tuple[bytes, PipeChannel, PipeChannel]:
        """(peer, control, data): the worker's channels of a fresh link."""
        end = self.links.new_link()
        control, data = end.open_channels()
        self._channels += [data, control]
        return end.endpoint.split("://")[1].encode(), control, data

    def close(self) -> None:
        for channel in self._channels:
            channel.close()
        self.links.close()


@pytest.fixture
def pipe_links():
    made = _PipeLinks()
    yield made
    made.close()


def test_reader_reassembles_send_bytes_messages_from_any_pieces():
    blobs = [b"", b"x", bytes(range(256)) * 64, os.urandom(16385), os.urandom(300_000)]
    stream = b"".join(_send_bytes_output(b) for b in blobs)
    stream += struct.pack("!iQ", -1, 5) + b"long!"  # the > 2 GiB form, as a reader must take it
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    reader, got = FrameReader(r, max_bytes=1 << 20), []
    rng, offset = np.random.default_rng(1), 0
    try:
        while offset < len(stream):
            piece = int(rng.integers(1, 40_000))
            try:
                offset += os.write(w, stream[offset : offset + piece])
            except BlockingIOError:
                pass
            while (message := reader.read()) is not None:
                got.append(bytes(message))
                assert message.readonly
        assert reader.pending_bytes == 0
        assert got == [*blobs, b"long!"]
    finally:
        os.close(r)
        os.close(w)


def test_reader_buffer_grows_as_bytes_arrive(monkeypatch):
    monkeypatch.setattr(pipe_frames, "FIRST_BUFFER_MAX_BYTES", 1000)
    blob = os.urandom(50_000)
    r, w = os.pipe()
    os.set_blocking(r, False)
    try:
        reader = FrameReader(r, max_bytes=1 << 20)
        framed = _send_bytes_output(blob)
        for start in range(0, len(framed), 7_000):
            assert reader.read() is None
            _write_all(w, framed[start : start + 7_000])
        assert bytes(reader.read()) == blob
    finally:
        os.close(r)
        os.close(w)


def test_writer_writes_send_bytes_framing_keeping_the_rest_of_a_message():
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    writer, blob = FrameWriter(w), os.urandom(3 << 20)  # more than any pipe holds
    try:
        assert writer.send(blob) and writer.pending  # taken in part; the rest waits in the writer
        assert not writer.send(b"next")  # never interleaved with an unfinished message
        raw = bytearray()
        deadline = time.monotonic() + 10
        while (writer.pending or not raw) and time.monotonic() < deadline:
            with contextlib.suppress(BlockingIOError):
                raw += os.read(r, 1 << 20)
            writer.flush()
        assert writer.send(b"next") and not writer.pending
        raw += os.read(r, 1 << 20)
        assert bytes(raw) == _send_bytes_output(blob) + _send_bytes_output(b"next")
        with contextlib.suppress(BlockingIOError):
            while True:
                os.write(w, bytes(1 << 16))  # fill the pipe: a send that writes nothing says False
        assert not writer.send(b"no room") and not writer.pending
    finally:
        os.close(r)
        os.close(w)


@pytest.mark.parametrize("split", [2, 4, 5000])
def test_half_a_message_is_held_without_waiting_for_the_rest(split, pipe_links):
    links = pipe_links.links
    peer, _, data = pipe_links.open()
    frames = P.encode(_chunk(record=1, count=4000), {"x": np.arange(4000)})
    framed = _send_bytes_output(pack_frames(frames))
    _write_all(data.fileno_obj(), framed[:split])
    start = time.monotonic()
    assert links.data.recv(0.2) is None
    assert time.monotonic() - start < 2  # waited for its timeout, not for the writer
    assert links.data.pending_bytes(peer) == split
    _write_all(data.fileno_obj(), framed[split:])
    chunk, columns = P.decode(links.data.recv(5))
    assert chunk.record == 1 and np.array_equal(columns["x"], np.arange(4000))
    assert links.data.pending_bytes(peer) == 0


def test_a_link_stalled_mid_message_holds_up_no_other(pipe_links):
    links = pipe_links.links
    stalled, _, data_a = pipe_links.open()
    _, _, data_b = pipe_links.open()
    framed = _send_bytes_output(pack_frames(P.encode(_chunk(worker="a", count=10_000), {"x": np.zeros(10_000)})))
    _write_all(data_a.fileno_obj(), framed[: len(framed) // 2])
    for i in range(50):
        assert data_b.try_send(P.encode(_chunk(worker="b", record=i, count=0)), timeout_s=5)
    got = [P.decode(links.data.recv(5))[0] for _ in range(50)]
    assert [c.record for c in got] == list(range(50)) and {c.worker for c in got} == {"b"}
    assert links.data.recv(0.1) is None and links.data.pending_bytes(stalled) == len(framed) // 2
    _write_all(data_a.fileno_obj(), framed[len(framed) // 2 :])
    assert P.decode(links.data.recv(5))[0].worker == "a"


def test_end_of_file_mid_message_drops_the_link_and_its_part(pipe_links):
    links = pipe_links.links
    peer, control, data = pipe_links.open()
    framed = _send_bytes_output(pack_frames([b"h", bytes(10_000)]))
    _write_all(data.fileno_obj(), framed[:6000])
    assert links.data.recv(0.1) is None and links.data.pending_bytes(peer) == 6000
    data.close()  # the worker died mid-message
    control.close()
    assert links.data.recv(1) is None
    assert not links.data.owns(peer) and links.data.poll_keys() == [] and links.data.pending_bytes(peer) == 0


def test_a_dropped_link_never_delivers_the_rest_of_its_message(pipe_links):
    links = pipe_links.links
    peer, _, data = pipe_links.open()
    framed = _send_bytes_output(pack_frames([b"h", bytes(10_000)]))
    _write_all(data.fileno_obj(), framed[:6000])
    assert links.data.recv(0.1) is None and links.data.pending_bytes(peer) == 6000
    links.data.drop(peer)  # as the daemon gives up on a worker
    with pytest.raises(BrokenPipeError):
        _write_all(data.fileno_obj(), framed[6000:])  # the worker finishes it: nobody reads it
    assert links.data.recv(0.1) is None and not links.data.owns(peer)


@pytest.mark.parametrize(
    "header",
    [
        struct.pack("!iQ", -1, 1 << 62),
        struct.pack("!iQ", -1, MAX_MESSAGE_BYTES + 1),
        struct.pack("!i", -7),
    ],
    ids=["absurd", "over-limit", "negative"],
)
def test_garbled_length_drops_the_link_with_a_log_line(header, caplog, pipe_links):
    caplog.set_level(logging.WARNING, logger="loader.daemon")
    links = pipe_links.links
    peer, _, data = pipe_links.open()
    _write_all(data.fileno_obj(), header + b"rest of the garbage")
    tracemalloc.start()
    try:
        assert links.data.recv(1) is None
        assert tracemalloc.get_traced_memory()[1] < 1 << 20  # nothing the length asked for
    finally:
        tracemalloc.stop()
    assert not links.data.owns(peer) and links.data.poll_keys() == []
    assert "garbled or over the limit" in caplog.text


def test_a_long_length_under_the_limit_allocates_only_as_bytes_arrive(pipe_links):
    links = pipe_links.links
    peer, _, data = pipe_links.open()
    _write_all(data.fileno_obj(), struct.pack("!iQ", -1, 3 << 30) + bytes(1000))  # says 3 GiB, sends 1000 B
    tracemalloc.start()
    try:
        assert links.data.recv(0.1) is None
        assert tracemalloc.get_traced_memory()[1] <= FIRST_BUFFER_MAX_BYTES + (1 << 20)
    finally:
        tracemalloc.stop()
    assert links.data.pending_bytes(peer) == 12 + 1000


def test_control_message_bigger_than_the_socket_buffer_arrives_whole(pipe_links):
    links = pipe_links.links
    peer, control, data = pipe_links.open()
    big = P.encode(_welcome(config={"pad": "x" * (4 << 20)}))
    received: list[Any] = []
    assert links.control.send(peer, big)  # the worker is not reading: taken in part, without waiting
    assert not links.control.send(peer, P.encode(_lease(1)))  # not before the rest of the first
    reader = threading.Thread(target=lambda: received.append(control.recv(10)), daemon=True)
    reader.start()
    deadline = time.monotonic() + 10
    while reader.is_alive() and time.monotonic() < deadline:
        links.control.poll_keys()  # the daemon's loop asks for these every turn: the rest goes out
        reader.join(0.01)
    assert len(P.decode(received[0])[0].config["pad"]) == 4 << 20
    assert links.control.send(peer, P.encode(_lease(2)))
    assert P.decode(control.recv(5))[0] == _lease(2)
