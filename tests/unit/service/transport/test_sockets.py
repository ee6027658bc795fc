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
