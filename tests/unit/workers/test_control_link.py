"""The worker's control link: a daemon silent past the heartbeat timeout is reported, and the worker's goodbye
saying so still reaches it (a daemon that was only held up replaces the worker and logs why)."""

from __future__ import annotations

from loader.service import protocol as P
from loader.service.transport.inproc import FakeChannel
from tests.helpers import wait_until
from workers.control import ControlLink


def _heard(daemon: FakeChannel) -> list[P.Message]:
    """Every message the link sent to ``daemon``'s end, in order."""
    said = []
    while (frames := daemon.recv(0.1)) is not None:
        said.append(P.decode(frames)[0])
    return said


def test_a_goodbye_sent_after_the_daemon_went_silent_still_goes_out():
    near, daemon = FakeChannel.pair()
    link = ControlLink(near, interval_s=0.05, timeout_s=0.3)
    link.start()
    try:
        assert wait_until(lambda: link.lost is not None, timeout_s=5)
        assert link.lost.startswith("daemon silent for ")
        link.send(P.Bye(reason=link.lost))
    finally:
        link.close()
    said = _heard(daemon)
    assert said and all(isinstance(m, (P.Heartbeat, P.Bye)) for m in said)
    assert isinstance(said[-1], P.Bye) and said[-1].reason.startswith("daemon silent for "), said[-1]


def test_a_malformed_message_from_the_daemon_is_reported_and_the_goodbye_saying_so_goes_out():
    # A lease the worker cannot decode (a seed of 2**62, which the config used to accept) ended the link's thread:
    # the worker left with code 0, its goodbye never sent, and the daemon logged "exited without reporting an error".
    near, daemon = FakeChannel.pair()
    link = ControlLink(near, interval_s=0.05, timeout_s=30)
    link.start()
    try:
        daemon.send([b'{"k": "lease"}'])  # not msgpack of a lease
        assert wait_until(lambda: link.lost is not None, timeout_s=5)
        assert link.lost.startswith("a malformed message from the daemon: ")
        daemon.send(P.encode(P.Heartbeat()))  # the link still reads, and answers
        link.send(P.Bye(reason=link.lost))
    finally:
        link.close()
    said = _heard(daemon)
    assert isinstance(said[-1], P.Bye) and said[-1].reason.startswith("a malformed message from the daemon: ")
