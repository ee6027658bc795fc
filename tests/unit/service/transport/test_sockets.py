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
