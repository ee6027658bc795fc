"""loader.service.transport.sockets: the house settings of a bound socket."""

from __future__ import annotations


def test_a_connection_that_never_finishes_the_handshake_is_dropped() -> None:
    # The 30 s default let a flood of half-open connections hold the daemon's file descriptors.
    import socket

    from loader.service.transport import sockets

    channel = sockets.pull("tcp://127.0.0.1:*")
    try:
        host, port = channel.endpoint.removeprefix("tcp://").rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as raw:
            raw.settimeout(sockets.HANDSHAKE_TIMEOUT_MS / 1000 + 10)
            raw.sendall(b"\xff")  # a start of a greeting, never finished
            while raw.recv(4096):  # the daemon's greeting, then the close
                pass
    finally:
        channel.close()


def _short_dir() -> str:
    import tempfile

    return tempfile.mkdtemp(prefix="ipc-", dir="/tmp")  # a socket path has at most 107 bytes


def test_a_second_bind_on_a_live_ipc_path_is_refused_and_the_first_keeps_it() -> None:
    # zmq unlinks and rebinds the socket file: a second daemon silently took the path from the first.
    import shutil

    import pytest

    from loader.errors import TransportError
    from loader.service.transport import sockets

    directory = _short_dir()
    endpoint = f"ipc://{directory}/d.sock"
    first = sockets.Router(endpoint)
    try:
        with pytest.raises(TransportError, match="address already in use"):
            sockets.Router(endpoint)
        with sockets.dealer(endpoint) as peer:  # the first still gets what is sent to the path
            peer.send([b"hello"], timeout_s=5.0)
            got = first.recv(timeout_s=5.0)
            assert got is not None and bytes(got[1][0].buffer) == b"hello"
    finally:
        first.close()
        shutil.rmtree(directory, ignore_errors=True)


def test_a_stale_ipc_socket_file_is_replaced() -> None:
    # A daemon killed with SIGKILL leaves its socket file: nothing answers there, so a new one may bind.
    import os
    import shutil
    import socket

    from loader.service.transport import sockets

    directory = _short_dir()
    path = f"{directory}/d.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(path)
    stale.close()  # the file stays; nothing listens
    assert os.path.exists(path)
    try:
        router = sockets.Router(f"ipc://{path}")
        router.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def test_a_refused_curve_key_is_logged_once_a_minute_and_an_empty_key_directory_is_refused(tmp_path, caplog):
    import logging

    import pytest

    from loader.errors import ConfigError
    from loader.service.transport import sockets

    admitted, stranger = sockets.curve_keypair()[0], sockets.curve_keypair()[0]
    allowed = sockets._Allowed(frozenset({admitted}))
    caplog.set_level(logging.WARNING, logger="loader.daemon")
    assert allowed.callback("*", admitted) and not caplog.records  # an admitted peer: nothing said
    assert not allowed.callback("*", stranger) and not allowed.callback("*", stranger)
    refusals = [r for r in caplog.records if "refused a peer with CURVE public key" in r.getMessage()]
    assert len(refusals) == 1 and stranger.decode() in refusals[0].getMessage()  # once, not per attempt
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="holds no public key"):
        sockets.load_public_keys(str(tmp_path / "empty"))


def test_the_peer_watch_gives_up_on_refused_handshakes_but_not_on_a_daemon_too_slow_to_finish_them() -> None:
    # Events as zmq's monitor gives them (fed in, read at the times given). A daemon starved of CPU drops a
    # handshake it did not finish within its 5 s: the client took three such drops for "not a loader daemon",
    # gave up at 15 s of a 40 s timeout, and the fourth handshake would have passed.
    import zmq

    from loader.service.transport import sockets

    def watch() -> sockets.PeerWatch:
        sock = sockets._context().socket(zmq.DEALER)
        peer = sockets.PeerWatch(sock, connecting=True)
        peer.close()  # no monitor: only the events fed below
        sock.close(0)
        return peer

    def broken_off(peer: sockets.PeerWatch, starts: tuple[float, ...], after_s: float) -> None:
        """Handshakes broken off ``after_s`` after each connection, zmq dialling again each time."""
        for start in starts:
            peer._on_event(zmq.EVENT_CONNECTED, 0, start)
            peer._on_event(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, 0, start + after_s)
            peer._on_event(zmq.EVENT_DISCONNECTED, 0, start + after_s)
            peer._on_event(zmq.EVENT_CONNECT_RETRIED, 100, start + after_s)

    slow = watch()
    broken_off(slow, (0.0, 5.5, 11.0), 5.0)
    assert slow.handshake_broken(16.0) == sockets.HANDSHAKE_SLOW
    assert not slow.handshake_hopeless(16.0, 2.0) and not slow.handshake_hopeless(60.0, 2.0)
    slow._on_event(zmq.EVENT_CONNECTED, 0, 16.5)
    slow._on_event(zmq.EVENT_HANDSHAKE_SUCCEEDED, 0, 16.6)
    assert slow.handshake_broken(17.0) is None

    web = watch()  # another program: it breaks each handshake off at once, and zmq dials again
    broken_off(web, (0.0, 0.2, 0.4), 0.01)
    assert web.handshake_broken(0.5) == sockets.HANDSHAKE_BROKEN
    assert not web.handshake_hopeless(1.0, 2.0) and web.handshake_hopeless(2.5, 2.0)

    refused = watch()  # a key the daemon does not list: zmq does not dial again
    refused._on_event(zmq.EVENT_CONNECTED, 0, 0.0)
    refused._on_event(zmq.EVENT_HANDSHAKE_FAILED_AUTH, 400, 0.01)
    refused._on_event(zmq.EVENT_DISCONNECTED, 0, 0.01)
    assert refused.handshake_broken(0.1) == sockets.HANDSHAKE_AUTH
    assert refused.handshake_hopeless(2.1, 2.0)

    gap = watch()  # just dropped, the redial not said yet: not taken for "zmq will not dial again"
    gap._on_event(zmq.EVENT_CONNECTED, 0, 0.0)
    gap._on_event(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, 0, 0.01)
    gap._on_event(zmq.EVENT_CONNECTED, 0, 2.0)
    gap._on_event(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, 0, 2.01)
    gap._on_event(zmq.EVENT_DISCONNECTED, 0, 2.01)
    assert not gap.handshake_hopeless(2.1, 2.0)
    assert gap.handshake_hopeless(2.6, 2.0)  # and none came
