"""Transport: the channel protocol, ZeroMQ sockets (the one zmq import), worker pipe links and their framing."""

from loader.service.transport.auth import CurveClient, CurveServer, Dial
from loader.service.transport.channel import Channel, ChannelOpener, Frames, RouterLike
from loader.service.transport.inproc import FakeChannel, Waker
from loader.service.transport.sockets import (
    HANDSHAKE_AUTH,
    HANDSHAKE_BROKEN,
    HANDSHAKE_MECHANISM,
    HANDSHAKE_SLOW,
    AuthServer,
    PeerWatch,
    Poller,
    Router,
    ZmqChannel,
    data_endpoint_for,
    dealer,
    load_peer_watch,
    pull,
    push,
    reachable_endpoint,
)

__all__ = [
    "HANDSHAKE_AUTH",
    "HANDSHAKE_BROKEN",
    "HANDSHAKE_MECHANISM",
    "HANDSHAKE_SLOW",
    "AuthServer",
    "CurveClient",
    "CurveServer",
    "Dial",
    "Channel",
    "ChannelOpener",
    "Frames",
    "RouterLike",
    "FakeChannel",
    "Waker",
    "PeerWatch",
    "Poller",
    "Router",
    "ZmqChannel",
    "data_endpoint_for",
    "dealer",
    "load_peer_watch",
    "pull",
    "push",
    "reachable_endpoint",
]
