"""The worker's control channel, owned by a small thread so heartbeats flow while user code runs.

After the handshake the worker hands its control channel to a ``ControlLink``.
Its thread is the only one that touches the channel from then on: it sends
what the main loop queues (``send``), a heartbeat every
``heartbeat_interval_s``, and puts every message from the daemon except
heartbeat answers in an inbox (``recv``). A daemon silent for
``heartbeat_timeout_s`` (or a channel that fails) sets ``lost``; the main loop
checks it between samples and stops, and its goodbye (with that reason) is
still sent by the thread, which runs until ``close``.

Because heartbeats no longer depend on the main loop, a slow reader or mapper
keeps its worker alive however long one call takes; a worker that hangs is
found by the coordinator's per-lease progress timeout instead
(``coordinator.LEASE_PROGRESS_TIMEOUT_S``).
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

from loader.errors import MalformedMessageError, TransportError
from loader.service import protocol as P
from loader.service import transport
from loader.service.transport import Channel, ChannelOpener

LINK_JOIN_TIMEOUT_S = 2.0


def open_channels(connect: str | transport.Dial | ChannelOpener) -> tuple[Channel, Channel | None, str]:
    """(control channel, data channel or None, address) for a daemon address or a pipe link."""
    if isinstance(connect, ChannelOpener):
        control, data = connect.open_channels()
        return control, data, str(connect)
    # Over zmq the data endpoint is learnt from WELCOME; a Dial carries the address and the worker's CURVE keys.
    if isinstance(connect, transport.Dial):
        return transport.dealer(connect.address, curve=connect.curve), None, connect.address
    return transport.dealer(connect), None, str(connect)


class Whereabouts:
    """Where the worker's reading stands, ``(lease, record)`` or None: written by the main loop at every record,
    read by the link's thread into each heartbeat (``Heartbeat.at``), so a worker hung on a record is named with
    it. One tuple assigned, so the thread never sees a lease with another lease's record."""

    __slots__ = ("at",)

    def __init__(self) -> None:
        self.at: tuple[int, int] | None = None


class ControlLink:
    """Owns ``channel`` on a thread from ``start()`` to ``close()`` (which also closes the channel)."""

    def __init__(self, channel: Channel, interval_s: float, timeout_s: float) -> None:
        self._channel = channel
        self.interval_s, self.timeout_s = interval_s, timeout_s
        self._inbox: queue.Queue[P.Message] = queue.Queue()
        self._outbox: queue.Queue[list[Any]] = queue.Queue()
        self._waker = transport.Waker()
        self._stop = threading.Event()
        self.lost: str | None = None
        self.whereabouts = Whereabouts()
        self._last_sent = self._last_heard = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="loader-worker-control", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def send(self, message: P.Message) -> None:
        """Queue a message for the daemon; the link thread sends it at once."""
        self._outbox.put(P.encode(message))
        self._waker.wake()

    def recv(self, timeout_s: float) -> P.Message | None:
        """The next message from the daemon, or None after ``timeout_s``."""
        try:
            return self._inbox.get(timeout=timeout_s) if timeout_s > 0 else self._inbox.get_nowait()
        except queue.Empty:
            return None

    def close(self) -> None:
        """Send what is queued (a final BYE), stop the thread (bounded wait), close the channel."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._waker.wake()
        if self._thread.is_alive():
            self._thread.join(LINK_JOIN_TIMEOUT_S)
        if not self._thread.is_alive():
            self._channel.close()
            self._waker.close()

    # -- the thread ---------------------------------------------------------
    def _run(self) -> None:
        poller = transport.Poller()
        poller.register(self._channel)
        poller.register(self._waker)
        try:
            while True:
                self._waker.clear()
                self._flush()
                if self._stop.is_set():
                    return  # after the flush, so the main loop's last words go out
                now = time.monotonic()
                if now - self._last_sent >= self.interval_s:
                    at = self.whereabouts.at
                    self._send(P.encode(P.Heartbeat(at=list(at) if at is not None else None)))
                if self.lost is None and now - self._last_heard > self.timeout_s:
                    # Said, not acted on here: the main loop stops, and its goodbye saying why still goes out
                    # through this thread (a daemon that was only held up replaces the worker, and logs why).
                    self.lost = f"daemon silent for {now - self._last_heard:.1f}s"
                if self._channel in poller.wait(self.interval_s / 2):
                    self._drain()
        except TransportError as exc:
            self.lost = f"lost the daemon: {exc}"

    def _send(self, frames: list[Any]) -> None:
        self._channel.send(frames, timeout_s=self.interval_s)
        self._last_sent = time.monotonic()

    def _flush(self) -> None:
        while True:
            try:
                frames = self._outbox.get_nowait()
            except queue.Empty:
                return
            self._send(frames)

    def _drain(self) -> None:
        while True:
            frames = self._channel.recv(0)
            if frames is None:
                return
            self._last_heard = time.monotonic()
            try:
                message, _ = P.decode(frames)
            except MalformedMessageError as exc:
                # Said, not acted on here, as for a silent daemon: the thread runs on so the main loop's goodbye
                # carries this to the daemon's log (ending the thread lost it, and the worker left unexplained).
                if self.lost is None:
                    self.lost = f"{P.UNREADABLE_FROM_DAEMON}: {exc}"
                continue
            if not isinstance(message, P.Heartbeat):
                self._inbox.put(message)


__all__ = ["ControlLink", "Whereabouts", "open_channels"]
