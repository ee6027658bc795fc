"""The transport pieces that need no ``zmq``: the ``Waker`` self-pipe and the in-process ``FakeChannel``.

``transport`` re-exports both, so callers keep writing ``transport.Waker``.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Sequence
from typing import Any

from loader.errors import ServiceUnavailableError


class Waker:
    """A self-pipe: ``wake()`` from any thread makes a ``Poller`` waiting on it return."""

    def __init__(self) -> None:
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        os.set_blocking(self._write_fd, False)
        self.closed = False
        # A wake racing a close from another thread must not write to the closed descriptor's number, which
        # the process may have given to another file by then.
        self._lock = threading.Lock()

    def fileno(self) -> int:
        return self._read_fd

    def fileno_obj(self) -> Any:
        return self._read_fd

    def wake(self) -> None:
        with self._lock:
            if self.closed:
                return
            try:
                os.write(self._write_fd, b"\0")
            except (BlockingIOError, OSError):
                pass  # pipe full (already awake)

    def clear(self) -> None:
        with self._lock:
            if self.closed:
                return
            try:
                while os.read(self._read_fd, 4096):
                    pass
            except (BlockingIOError, OSError):
                pass

    def close(self) -> None:
        with self._lock:
            if not self.closed:
                self.closed = True
                os.close(self._read_fd)
                os.close(self._write_fd)


class FakeChannel:
    """In-process stand-in for a ``Channel``, for unit tests of client logic without sockets.

    ``FakeChannel.pair()`` returns two connected ends; frames are passed as they are.
    """

    def __init__(self, inbox: queue.Queue[list[Any]], outbox: queue.Queue[list[Any]]) -> None:
        self._inbox, self._outbox = inbox, outbox
        self._peer: FakeChannel  # set by pair()
        self.endpoint = "fake://"
        self.closed = False
        self._waker = Waker()
        self._lock = threading.Lock()

    @classmethod
    def pair(cls) -> tuple[FakeChannel, FakeChannel]:
        a: queue.Queue[list[Any]] = queue.Queue()
        b: queue.Queue[list[Any]] = queue.Queue()
        left, right = cls(a, b), cls(b, a)
        left._peer, right._peer = right, left
        return left, right

    def fileno_obj(self) -> Any:
        return self._waker.fileno()

    def send(self, frames: Sequence[Any], timeout_s: float | None = None) -> None:
        if self.closed or self._peer.closed:
            raise ServiceUnavailableError("fake peer closed")
        self._outbox.put([bytes(memoryview(f)) if not isinstance(f, bytes) else f for f in frames])
        self._peer._waker.wake()

    def try_send(self, frames: Sequence[Any], timeout_s: float) -> bool:
        self.send(frames)
        return True

    def recv(self, timeout_s: float) -> list[Any] | None:
        try:
            frames = self._inbox.get(timeout=max(0.0, timeout_s)) if timeout_s > 0 else self._inbox.get_nowait()
        except queue.Empty:
            return None
        # Clear first, then re-arm if more is queued, so a concurrent send is never missed.
        self._waker.clear()
        if not self._inbox.empty():
            self._waker.wake()
        return frames

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._waker.close()


__all__ = ["Waker", "FakeChannel"]
