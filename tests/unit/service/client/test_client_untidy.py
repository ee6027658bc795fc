"""The client refuses what the daemon could not honour, and never waits past its own deadline."""

from __future__ import annotations

import threading

import pytest

from loader.config.sections import MAX_PREFETCH
from loader.errors import ServiceUnavailableError
from loader.service import protocol as P
from loader.service.client.client import Client
from loader.service.transport import FakeChannel
from tests.helpers import wait_until
from tests.unit.service.client.test_client import FakeDaemon


class FullQueue(FakeChannel):
    """A client end whose daemon vanished after the welcome: every send waits for room that never comes."""

    full: threading.Event
    asked: list[tuple[str, float | None]]

    def _wait(self, frames, timeout_s):
        if not self.full.is_set():
            return True
        self.asked.append((type(P.decode(frames)[0]).__name__, timeout_s))
        threading.Event().wait(timeout_s or 0.0)
        return False

    def send(self, frames, timeout_s=None):
        if self._wait(frames, timeout_s):
            return super().send(frames, timeout_s)
        raise ServiceUnavailableError("full")

    def try_send(self, frames, timeout_s):
        return super().try_send(frames, timeout_s) if self._wait(frames, timeout_s) else False


def _received(channel, kind):
    frames = channel.recv(0.05)
    return frames is not None and isinstance(P.decode(frames)[0], kind)


def test_a_daemon_that_reads_nothing_is_reported_without_waiting_past_timeout():
    near, far = FakeChannel.pair()
    near.__class__ = FullQueue  # the same queues, with the waiting behaviour above
    near.full, near.asked = threading.Event(), []
    FakeDaemon(far, silent_after_hello=True)
    client = Client("fake://daemon", channel=near, prefetch=2, timeout_s=1.0)
    batches = client.epoch()
    asked = threading.Event()

    def vanish_once_asked() -> None:
        if wait_until(lambda: _received(far, P.Epoch)):  # the request goes out at the first batch
            asked.set()
            near.full.set()  # from here on the daemon is gone and its queue is full

    threading.Thread(target=vanish_once_asked, daemon=True).start()
    with client, pytest.raises(ServiceUnavailableError):
        for _ in batches:
            pass
    assert asked.is_set(), "the request went out before the daemon vanished"
    assert near.asked, "the client kept pinging"
    pings = [timeout for kind, timeout in near.asked if kind == "Ping"]
    # A ping never waits for room (it used to wait timeout_s, doubling the time to notice)...
    assert all(timeout == 0.0 for timeout in pings)
    # ...and nothing waits longer than the time left before the daemon counts as silent.
    assert all(timeout is not None and timeout <= client.timeout_s for _, timeout in near.asked)


@pytest.mark.parametrize("epoch", [-1, -(2**70), 1.5, "3", True, 2**60, 2**64])
def test_epoch_numbers_that_are_not_are_refused_at_once(epoch):
    near, far = FakeChannel.pair()
    FakeDaemon(far)
    with Client("fake://daemon", channel=near, prefetch=2, timeout_s=1.0) as client:
        with pytest.raises(ValueError, match=r"epoch must be an integer in \[0, 2\*\*60\)"):
            client.epoch(epoch)
        assert len(list(client.epoch())) == 5  # still usable, from epoch 0


@pytest.mark.parametrize("prefetch", [0, MAX_PREFETCH + 1, 10**6, 2.5, "Auto", "4"])
def test_prefetch_the_daemon_could_not_honour_is_refused(prefetch):
    with pytest.raises(ValueError, match=f'prefetch must be "auto" or an integer in \\[1, {MAX_PREFETCH}\\]'):
        Client("fake://daemon", channel=FakeChannel.pair()[0], prefetch=prefetch, timeout_s=1.0)


def test_a_client_of_a_config_that_reaches_nobody_says_where_the_address_came_from(tmp_path):
    from tests.helpers import free_port

    config = tmp_path / "train.toml"
    config.write_text(f'[source]\nfiles = ["*.npy"]\n[service]\nbind = "tcp://127.0.0.1:{free_port()}"\n')
    with pytest.raises(ServiceUnavailableError, match=r"is service.bind of .*train.toml \(from .*train.toml\)"):
        Client(str(config), timeout_s=0.3)


def test_the_no_answer_hint_fits_a_peer_with_keys_and_one_without(monkeypatch):
    # A peer with keys was told to set the keys it had set; its refusal is in the daemon's log.
    from loader.service.client.ask import no_answer_hint

    monkeypatch.delenv("LOADER_PEER_KEY", raising=False)
    assert "set LOADER_PEER_KEY and LOADER_DAEMON_PUBLIC_KEY" in no_answer_hint()
    monkeypatch.setenv("LOADER_PEER_KEY", "keys/peers/client.key_secret")
    keyed = no_answer_hint()
    assert "This side has CURVE keys" in keyed and "logs every key it refuses" in keyed
    assert "set LOADER_PEER_KEY" not in keyed and no_answer_hint(False) != keyed
