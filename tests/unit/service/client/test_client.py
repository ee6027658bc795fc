"""Client logic against an in-process fake daemon (no sockets): credits, END, errors, silence."""

from __future__ import annotations

import socket
import threading
import time

import msgpack
import numpy as np
import pytest

from loader.errors import ProtocolVersionError, ServiceUnavailableError, WorkerError
from loader.service import protocol as P
from loader.service.client.batches import to_batch
from loader.service.client.client import Client, query_status
from loader.service.transport import FakeChannel
from tests.helpers import wait_until


class FakeDaemon:
    """Answers hello, then serves ``batches`` batches per epoch honouring credits."""

    def __init__(
        self,
        channel,
        batches=5,
        fail=False,
        silent_after_hello=False,
        welcome=None,
        pack=1,
        bad_parts=False,
        mute=False,
    ):
        self.channel, self.batches, self.fail, self.silent = channel, batches, fail, silent_after_hello
        self.mute = mute  # answers pings, never an epoch
        self.clock_ahead_s = 0.0  # this fake's clock less the process's, as its pongs give it
        self.pack, self.bad_parts = pack, bad_parts  # batches per message (``Batch.parts``) when the client asks
        self.asked_pack = None
        self.welcome = welcome or {}
        self.hello = None
        self.pings: list[P.Ping] = []
        self.byes = 0
        self.max_outstanding = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        try:
            self._serve()
        except ServiceUnavailableError:
            pass  # the client closed its end (a test ended before the epoch did): this fake's end too

    def _serve(self):
        credits, sent, gen, epoch, outstanding = 0, 0, None, 0, 0
        while not self.stop.is_set():
            frames = self.channel.recv(0.02)
            if frames is not None:
                message, _ = P.decode(frames)
                if isinstance(message, P.ClientHello):
                    self.hello = message, msgpack.unpackb(frames[0])
                    welcome = {
                        "session": 1,
                        "batch_size": 2,
                        "batch_format": "stacked",
                        "files": 1,
                        "ping_s": 0.5,
                        **self.welcome,
                    }
                    self.channel.send(P.encode(P.ClientWelcome(**welcome)))
                    if self.silent:
                        return
                elif isinstance(message, P.Epoch) and not self.mute:
                    credits, sent, gen, epoch, outstanding = message.credit, 0, message.gen, message.epoch, 0
                    self.asked_pack = message.pack
                elif isinstance(message, P.Credit) and message.gen == gen:
                    credits += message.n
                    outstanding -= message.n
                elif isinstance(message, P.Bye):
                    self.byes += 1
                elif isinstance(message, P.Ping):
                    self.pings.append(message)
                    # A client that pinged and then said goodbye and closed its end: its BYE is still queued
                    # here, after the ping, and must be counted (a failed pong ended this fake before it).
                    try:
                        self.channel.send(P.encode(P.Pong(clock=time.monotonic() + self.clock_ahead_s)))
                    except ServiceUnavailableError:
                        pass
            if gen is None:
                continue
            if self.fail and sent == 2:
                err = WorkerError("Boom", "bad", file="/d/f.npy", record=3).to_dict()
                self.channel.send(P.encode(P.Error(gen=gen, error=err)))
                gen = None
                continue
            while credits > 0 and sent < self.batches:
                n = min(self.pack, self.batches - sent, self.asked_pack or 1)
                # Batch i holds rows [i, epoch]; it ends at global position 2 * (i + 1) of window 0.
                parts = [[2, 2 * (i + 1), 0, 0, 0] for i in range(sent, sent + n)]
                if self.bad_parts:
                    parts[0][0] = 3
                rows = np.array([v for i in range(sent, sent + n) for v in (i, epoch)])
                batch = P.Batch(gen=gen, epoch=epoch, count=2 * n, parts=parts if n > 1 else None)
                self.channel.send(P.encode(batch, {"x": rows}))
                credits -= 1
                sent += n
                outstanding += 1
                self.max_outstanding = max(self.max_outstanding, outstanding)
            if sent == self.batches:
                self.channel.send(P.encode(P.End(gen=gen, epoch=epoch)))
                gen = None


def _client(**fake_kw):
    near, far = FakeChannel.pair()
    daemon = FakeDaemon(far, **fake_kw)
    return Client("fake://daemon", channel=near, prefetch=2, timeout_s=1.0), daemon


def test_epochs_arrive_in_order_within_credit_window():
    client, daemon = _client(batches=6)
    with client:
        for epoch in range(2):
            got = [b["x"].tolist() for b in client.epoch()]
            assert got == [[i, epoch] for i in range(6)]
    assert daemon.max_outstanding <= 2
    daemon.stop.set()


def test_packed_messages_arrive_as_their_batches_and_cost_one_credit_each():
    client, daemon = _client(batches=11, pack=4)
    with client:
        for epoch in range(2):
            got, places = [], []
            for batch in client.epoch():
                got.append(batch["x"].tolist())
                places.append(client.state_dict()["position"])
            assert got == [[i, epoch] for i in range(11)]
            # The place after each batch is that batch's own, not its message's last.
            assert places == [2 * (i + 1) for i in range(11)]
    assert daemon.asked_pack == P.MAX_PACK
    assert daemon.max_outstanding <= 2  # messages in flight: the prefetch counts messages
    daemon.stop.set()


def test_a_packed_message_whose_parts_do_not_add_up_ends_the_client_with_one_line():
    from loader.errors import TransportError

    client, daemon = _client(batches=4, pack=2, bad_parts=True)
    with client, pytest.raises(TransportError, match="parts do not add up to its 4 rows"):
        list(client.epoch())
    daemon.stop.set()


def test_pings_carry_the_consumers_wait_so_the_wait_after_the_last_credit_is_counted():
    client, daemon = _client(batches=3)
    with client:
        list(client.epoch())  # the last wait (for END) comes after the last credit
        waited = client.stats()["wait_s"]
        assert wait_until(lambda: any(p.wait_s == round(waited, 6) for p in daemon.pings), timeout_s=5.0)
    daemon.stop.set()


def test_a_client_dropped_unclosed_is_collected_and_says_goodbye():
    # A notebook cell that makes a client and never closes it: its thread and daemon session must not live on
    # (the daemon refuses clients beyond service.max_clients).
    import gc
    import weakref

    before = {t.ident for t in threading.enumerate() if t.name == "loader-client"}
    client, daemon = _client(batches=3)
    assert len(list(client.epoch())) == 3
    ref = weakref.ref(client)
    del client
    assert wait_until(lambda: gc.collect() is not None and ref() is None, timeout_s=20.0), [
        type(r) for r in gc.get_referrers(ref())
    ]
    assert wait_until(lambda: daemon.byes == 1, timeout_s=20.0), daemon.byes
    threads = lambda: {t.ident for t in threading.enumerate() if t.name == "loader-client"}  # noqa: E731
    assert wait_until(lambda: threads() <= before, timeout_s=20.0), threads() - before
    daemon.stop.set()


def test_an_epochs_iterator_ended_by_a_later_epoch_call_says_so_and_takes_nothing_of_the_later_one():
    from loader.errors import ClosedError

    client, daemon = _client(batches=6)
    with client:
        old = client.epoch()
        assert next(old)["x"].tolist() == [0, 0]
        new = client.epoch()
        with pytest.raises(ClosedError, match="epoch 0's iterator was ended by a later epoch"):
            next(old)
        assert [b["x"].tolist() for b in new] == [[i, 1] for i in range(6)]
    daemon.stop.set()


def test_a_daemon_sending_beyond_its_credit_ends_the_client_with_one_line():
    from loader.errors import TransportError

    near, far = FakeChannel.pair()
    client = None

    def flood():
        while True:  # a daemon that ignores credits: the client must not buffer what it sends
            frames = far.recv(1.0)
            if frames is None:
                return
            message, _ = P.decode(frames)
            if isinstance(message, P.ClientHello):
                far.send(P.encode(P.ClientWelcome(session=1, batch_size=1, batch_format="stacked", files=1, ping_s=1)))
            elif isinstance(message, P.Epoch):
                try:
                    for _ in range(50):
                        far.send(P.encode(P.Batch(gen=message.gen, epoch=0, count=1), {"x": np.zeros(1)}))
                except ServiceUnavailableError:
                    pass  # the client, ended, closed its end
                return

    threading.Thread(target=flood, daemon=True).start()
    client = Client("fake://daemon", channel=near, prefetch=2, timeout_s=2.0)
    waker = client._waker
    with (
        client,
        pytest.raises(TransportError, match=r"sent more batch messages than this client gave credit for \(\d+\)"),
    ):
        for _ in client.epoch():
            time.sleep(0.05)
    assert waker.closed  # closed by close() once its receiver had ended


def test_a_client_whose_receiver_died_and_is_dropped_unclosed_closes_its_waker():
    import gc

    near, far = FakeChannel.pair()
    FakeDaemon(far, silent_after_hello=True)
    client = Client("fake://daemon", channel=near, prefetch=2, timeout_s=0.3)  # a silent daemon: fatal soon
    waker, thread = client._waker, client._thread
    assert wait_until(lambda: not thread.is_alive(), timeout_s=10.0)
    del client
    gc.collect()
    assert waker.closed  # two pipe descriptors per client otherwise, never closed


def test_worker_error_is_raised_from_the_iterator():
    client, daemon = _client(fail=True)
    with client, pytest.raises(WorkerError, match="record 3"):
        list(client.epoch())
    daemon.stop.set()


def test_silent_daemon_raises_service_unavailable():
    client, daemon = _client(silent_after_hello=True)
    start = time.monotonic()
    with client, pytest.raises(ServiceUnavailableError, match="silent"):
        list(client.epoch())
    assert time.monotonic() - start < 3


def test_closed_client_refuses_new_epochs():
    from loader.errors import ClosedError

    client, daemon = _client()
    assert repr(client).startswith(f"<Client {client.address!r}, rank=0, world_size=1") and "closed" not in repr(client)
    client.close()
    client.close()
    assert repr(client).endswith(", closed>")
    with pytest.raises(ClosedError):
        client.epoch()
    daemon.stop.set()


def test_list_batch_format_rebuilds_samples():
    cols = {"a": np.array([1, 2]), "b": np.array([[0.5], [1.5]])}
    samples = to_batch(cols, "tuple", "list")
    assert len(samples) == 2 and samples[1][0] == 2 and samples[1][1].tolist() == [1.5]
    assert to_batch(cols, "dict", "list")[0]["a"] == 1
    ragged = to_batch({"s": P.object_array([np.zeros(1), np.zeros(3)])}, "tuple", "stacked")
    assert isinstance(ragged["s"], list)


def test_client_says_its_protocol_version_and_refuses_a_daemon_of_another():
    near, far = FakeChannel.pair()
    daemon = FakeDaemon(far, welcome={"version": P.PROTOCOL_VERSION + 1, "package": "9.9"})
    with pytest.raises(ProtocolVersionError) as info:
        Client("fake://daemon", channel=near, timeout_s=1.0)
    daemon.stop.set()
    hello, raw = daemon.hello
    assert hello.version == P.PROTOCOL_VERSION and raw["v"] == P.PROTOCOL_VERSION  # said on the wire
    message = str(info.value)
    assert message.startswith(
        f"the daemon at fake://daemon speaks loader protocol {P.PROTOCOL_VERSION + 1} (loader 9.9)"
    )
    assert f"this side speaks {P.PROTOCOL_VERSION}" in message and "\n" not in message


def test_a_batch_naming_one_arena_row_many_times_ends_the_client_with_one_line_naming_the_daemon(tmp_path):
    from types import SimpleNamespace

    from loader.errors import TransportError
    from loader.service.shm import refs as R
    from loader.service.shm.pool import ArenaPool

    with ArenaPool(4 << 20, directory=str(tmp_path)) as pool:
        values = np.ones((2, 100_000), np.float32)
        refs = R.write_column(pool.create(), values)
        # The receiver's side of a client that maps the daemon's arenas (its ArenaCache gives arenas by id).
        receiver = SimpleNamespace(address="tcp://daemon:1", _arenas=pool, _gather_into=lambda n: np.empty(n, np.uint8))
        described = {"x": {0: [values.dtype.str, [100_000]]}}
        columns = {"x": refs[[0] * 1000]}  # 400 MB of copies of one 400 KB row
        with pytest.raises(TransportError, match=r"daemon at tcp://daemon:1 sent a bad batch: .*overlapping rows"):
            Client._gather(receiver, described, columns, {})  # type: ignore[arg-type]
        with pytest.raises(TransportError, match="reference column 'y' from tcp://daemon:1 is missing"):
            Client._gather(receiver, {"y": described["x"]}, {"x": refs}, {})  # type: ignore[arg-type]


def test_clients_closed_at_exit_share_one_wait_for_their_receivers(monkeypatch):
    # A process whose daemon died: each receiver is stuck (in a send waiting for room). The exit waits for
    # their goodbyes once, not THREAD_JOIN_TIMEOUT_S per client.
    from loader.service.client import client as client_module

    monkeypatch.setattr(client_module, "THREAD_JOIN_TIMEOUT_S", 0.5)
    made = [_client(batches=1) for _ in range(4)]
    for client, _ in made:
        client._receive_once = lambda state, poller: time.sleep(3.0)  # type: ignore[method-assign]
    time.sleep(2 * client_module.RECEIVER_POLL_S)  # every receiver in its stuck round
    waits: list[float] = []  # what each close() was given to wait: their sum is the exit's wait (no clock)
    for client, _ in made:
        client._close = lambda join_s, close=client._close: (waits.append(join_s), close(join_s))[1]  # type: ignore[method-assign]
    client_module._close_live_clients()
    assert len(waits) == 4 and sum(waits) <= 0.5  # one shared deadline; each its own would sum to 2 s
    assert all(client._closed for client, _ in made)
    for _, daemon in made:
        daemon.stop.set()


def test_an_address_of_the_wrong_kind_is_refused_in_one_line_naming_what_an_address_is(tmp_path):
    # Client(5555) failed with "argument of type 'int' is not iterable", Client(Path("train.toml")) with
    # "... 'PosixPath' is not iterable", and Client("http://...") with zmq's "Protocol not supported".
    from pathlib import Path

    from loader.errors import ConfigError
    from tests.helpers import free_port

    with pytest.raises(TypeError, match=r"a Client's address is tcp://HOST:PORT, .* not int 5555"):
        Client(5555)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"'http://127.0.0.1:1' is not a daemon address: give tcp://HOST:PORT"):
        Client("http://127.0.0.1:1")
    # A misspelled config path read only as a bad address.
    with pytest.raises(ConfigError, match=r"'configs/npy.tom' is not a daemon address.*is no file here either"):
        Client("configs/npy.tom")
    port = free_port()
    config = tmp_path / "train.toml"
    config.write_text(f'[source]\nfiles = ["*.npy"]\n[service]\nbind = "tcp://127.0.0.1:{port}"\n')
    with pytest.raises(ServiceUnavailableError, match=rf"127.0.0.1:{port} within .* is service.bind of"):
        Client(Path(config), timeout_s=0.2)  # a config file as a Path, read as its name is


def test_a_client_waiting_for_a_daemon_that_is_not_there_says_so_before_its_timeout(monkeypatch, caplog):
    """It said nothing for the whole timeout (30 s by default): a first hour's hang, to look at."""
    import logging
    import re

    from loader.service.client import ask
    from tests.helpers import free_port

    monkeypatch.setattr(ask, "STILL_WAITING_S", 0.2)
    caplog.set_level(logging.WARNING, logger="loader.client")
    port = free_port()
    # Nothing listens there (forgotten `loader serve`, a wrong port): said so, not the CURVE keys hint.
    with pytest.raises(ServiceUnavailableError, match="no loader daemon answered .*nothing listens there, its"):
        Client(f"tcp://127.0.0.1:{port}", timeout_s=1.0)
    (line,) = [r for r in caplog.records if r.name == "loader.client"]
    said = line.getMessage()
    assert re.match(
        rf"no answer yet from a loader daemon at tcp://127.0.0.1:{port} after \d+ s; waiting up to 1 s", said
    )
    assert "nothing listens there, its connections are refused (is `loader serve` running" in said
    caplog.clear()
    with socket.socket() as listening:  # something listens, and says nothing: not said to refuse
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        with pytest.raises(ServiceUnavailableError, match="is `loader serve` running at that address"):
            Client(f"tcp://127.0.0.1:{listening.getsockname()[1]}", timeout_s=1.0)
    assert "nothing listens there" not in caplog.text
    caplog.clear()
    with pytest.raises(ServiceUnavailableError):
        Client(f"tcp://127.0.0.1:{port}", timeout_s=0.15)  # shorter than the note's wait: only the error
    assert not [r for r in caplog.records if r.name == "loader.client"]


def _handshake_failed_soon(port: int) -> str:
    """What a client with a 20 s timeout says of a local port whose handshakes fail, well before its timeout."""
    started = time.monotonic()
    with pytest.raises(ServiceUnavailableError) as caught:
        Client(f"tcp://127.0.0.1:{port}", timeout_s=20.0)
    said = str(caught.value)
    assert said.startswith(f"no loader daemon answered at tcp://127.0.0.1:{port} (the handshake failed)")
    assert time.monotonic() - started < 10.0  # HANDSHAKE_GIVE_UP_S (2 s), or a probe after a slow drop
    return said


def test_a_client_pointed_at_something_that_is_not_a_daemons_client_address_says_so_without_waiting():
    """A daemon's metrics port or worker data socket, or another program: the client waited its whole timeout
    (a PULL socket held its send, then "did not accept a message in time"), then blamed CURVE keys."""
    import zmq

    context = zmq.Context()
    data_socket = context.socket(zmq.PULL)  # what a daemon's worker data socket is
    data_port = data_socket.bind_to_random_port("tcp://127.0.0.1")
    web = socket.socket()  # an HTTP server: it answers the zmq greeting with a status line and closes
    web.bind(("127.0.0.1", 0))
    web.listen()
    stop = threading.Event()

    def serve_web() -> None:
        web.settimeout(0.1)
        while not stop.is_set():
            try:
                connection, _ = web.accept()
            except OSError:
                continue
            with connection:
                connection.settimeout(1.0)
                try:
                    connection.recv(64)
                    connection.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
                except OSError:
                    pass

    server = threading.Thread(target=serve_web, daemon=True)
    server.start()
    try:
        for port in (data_port, web.getsockname()[1]):
            said = _handshake_failed_soon(port)
            assert "something listens there but broke off the handshake: it is not a loader daemon's address" in said
            assert "CURVE" not in said and "did not accept" not in said
            started = time.monotonic()
            with pytest.raises(ServiceUnavailableError) as caught:  # `loader status` asks the same way
                query_status(f"tcp://127.0.0.1:{port}", timeout_s=20.0)
            assert "(the handshake failed): something listens there but broke off" in str(caught.value)
            assert time.monotonic() - started < 10.0
    finally:
        stop.set()
        server.join(timeout=5)
        web.close()
        data_socket.close(0)
        context.term()


def test_a_client_pointed_at_an_http_server_that_times_it_out_says_so_without_waiting_its_timeout():
    # A daemon's metrics port waits for a request line that zmq's greeting never finishes, and drops it after
    # its own timeout: slow drops, which a daemon too busy to finish a handshake gives too. The client waited
    # its whole timeout, then guessed "a daemon too busy".
    import socketserver

    class Silent(socketserver.StreamRequestHandler):
        timeout = 1.5  # the metrics server's is 5 s: a slow drop either way

        def handle(self) -> None:
            try:
                line = self.rfile.readline()
            except OSError:
                return
            if line.startswith(b"GET "):
                self.wfile.write(b"HTTP/1.0 404 Not Found\r\n\r\n")

    class Server(socketserver.ThreadingMixIn, socketserver.TCPServer):
        daemon_threads = True

    with Server(("127.0.0.1", 0), Silent) as server:
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        thread.start()
        try:
            port = server.server_address[1]
            assert "an HTTP server answers there (a loader daemon's metrics port?" in _handshake_failed_soon(port)
            with pytest.raises(ServiceUnavailableError, match="an HTTP server answers there"):
                query_status(f"tcp://127.0.0.1:{port}", timeout_s=20.0)
        finally:
            server.shutdown()
            thread.join(timeout=5)


def test_an_epoch_that_waits_long_for_a_batch_says_so_once_before_it_fails(monkeypatch, caplog):
    """A daemon that answers but sends nothing (a rank of the job never started): the iterator waited
    progress_timeout_s (600 s) without a word."""
    import logging

    from loader.service.client import client as client_module
    from loader.service.client.client import EpochStalledError

    monkeypatch.setattr(client_module, "WAITING_NOTE_S", 0.2)
    caplog.set_level(logging.WARNING, logger="loader.client")
    for shuffle in (0, 4096):
        caplog.clear()
        near, far = FakeChannel.pair()
        daemon = FakeDaemon(far, mute=True, welcome={"fingerprint": {"shuffle_buffer": shuffle}})
        with Client("fake://daemon", channel=near, prefetch=2, timeout_s=5.0, progress_timeout_s=1.0) as client:
            with pytest.raises(EpochStalledError, match="sent nothing for this epoch"):
                list(client.epoch())
        daemon.stop.set()
        (note,) = [r.getMessage() for r in caplog.records if r.name == "loader.client"]
        assert note.startswith(
            "no batch from the loader daemon at fake://daemon for 0 s (request 1), though it answers"
        )
        assert "waiting up to 1 s in all: its log or `loader status` says what the epoch waits for" in note
        # A slow mapper and a large shuffle buffer: the first batch waits for a whole window, which it did not say.
        window = "its first shuffle window, 32768 samples or the whole epoch if smaller, to be read"
        assert (window in note) == (shuffle > 0)


def test_a_welcome_naming_another_config_is_a_warning_and_a_forged_one_nothing(tmp_path, caplog):
    import logging

    config = tmp_path / "train.toml"
    config.write_text('[source]\nfiles = ["*.npy"]\n')
    caplog.set_level(logging.WARNING, logger="loader.client")
    for serving, said in [("/srv/other.toml", True), ("/etc/x\0y", False), (str(config), False)]:
        caplog.clear()
        near, far = FakeChannel.pair()
        daemon = FakeDaemon(far, welcome={"config": serving})
        with Client(str(config), channel=near, timeout_s=5.0):  # a NUL raised ValueError here, its socket left open
            pass
        daemon.stop.set()
        lines = [r.getMessage() for r in caplog.records if r.name == "loader.client"]
        assert bool(lines) == said, (serving, lines)
        if said:
            assert lines == [
                f"the daemon at {config} serves /srv/other.toml, not {config}: another config's "
                "daemon listens at its address"
            ]


def test_a_welcome_read_late_is_corrected_by_the_pongs_that_follow():
    # The client sets its reading of the daemon's clock by the welcome: one read late (this process stopped during
    # its handshake) made every batch's `kept` deadline look later than it is, the unsafe way. Each pong reads it
    # again, and the largest reading stands (each is at most the true offset).
    near, far = FakeChannel.pair()
    daemon = FakeDaemon(far, welcome={"clock": time.monotonic() - 30.0})  # as if read 30 s after it was sent
    with Client("fake://daemon", channel=near, timeout_s=5.0) as client:
        assert client._clock_offset == pytest.approx(-30.0, abs=1.0)
        assert wait_until(lambda: client._clock_offset > -0.5, timeout_s=5.0)
        daemon.clock_ahead_s = -60.0  # a later, lower reading changes nothing
        time.sleep(1.2)
        assert client._clock_offset > -0.5
    daemon.stop.set()
