"""Every channel, router and pipe link has the shape of its protocol in ``transport.channel``.

The client, the worker and the daemon's loop are typed against the protocols, but the classes are
passed to them through process arguments and tests, where no type checker looks: this compares each
method's parameters with the protocol's, so a channel that drifts from ``Channel`` fails here.
"""

from __future__ import annotations

import inspect

import pytest

from loader.service.transport import Channel, ChannelOpener, FakeChannel, Router, RouterLike, ZmqChannel
from loader.service.transport.links import LinkRouter, SplitRouter, WorkerEnd
from loader.service.transport.pipes import PipeChannel, QueuedChannel

IMPLEMENTATIONS = [
    (Channel, ZmqChannel),
    (Channel, FakeChannel),
    (Channel, PipeChannel),
    (Channel, QueuedChannel),
    (RouterLike, Router),
    (RouterLike, LinkRouter),
    (RouterLike, SplitRouter),
    (ChannelOpener, WorkerEnd),
]


def _methods(protocol: type) -> list[str]:
    return [name for name, value in vars(protocol).items() if callable(value) and not name.startswith("_")]


def _parameters(function: object) -> list[tuple[str, object, object]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]  # type: ignore[arg-type]


@pytest.mark.parametrize(("protocol", "cls"), IMPLEMENTATIONS, ids=lambda c: c.__name__)
def test_each_method_takes_the_protocols_parameters(protocol, cls):
    for name in _methods(protocol):
        assert callable(getattr(cls, name, None)), f"{cls.__name__} has no {name}()"
        assert _parameters(getattr(cls, name)) == _parameters(getattr(protocol, name)), f"{cls.__name__}.{name}"


def test_a_drifted_channel_is_seen():
    class Drifted(FakeChannel):
        def recv(self, timeout: float) -> list | None:  # type: ignore[override]
            return None

    with pytest.raises(AssertionError, match="Drifted.recv"):
        test_each_method_takes_the_protocols_parameters(Channel, Drifted)


def test_a_pipe_links_worker_end_is_an_opener_and_an_address_is_not():
    assert issubclass(WorkerEnd, ChannelOpener)
    assert not isinstance("tcp://127.0.0.1:5555", ChannelOpener)
