"""The shapes every transport has: a point-to-point ``Channel`` and the daemon's ``RouterLike``.

ZeroMQ sockets (``sockets``), the in-process fake (``inproc``) and the worker
pipe links (``pipes``, ``links``) all satisfy these, so the client, the worker
and the daemon loop are written once against them; a worker's pipe link is a
``ChannelOpener``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

Frames = list[Any]


class Channel(Protocol):
    """One peer-to-peer message stream (a DEALER, PUSH or PULL socket, a pipe, a fake)."""

    def send(self, frames: Sequence[Any], timeout_s: float | None = None) -> None:
        """Send one message, waiting at most ``timeout_s``; a full peer raises ``ServiceUnavailableError``."""
        ...

    def try_send(self, frames: Sequence[Any], timeout_s: float) -> bool:
        """Send if accepted within ``timeout_s``; False otherwise (the caller retries)."""
        ...

    def recv(self, timeout_s: float) -> list[Any] | None:
        """One message, or None when nothing arrived within ``timeout_s``."""
        ...

    def fileno_obj(self) -> Any:
        """What a ``Poller`` registers to wait for this channel."""
        ...

    def close(self) -> None:
        """Release the channel; idempotent."""
        ...


@runtime_checkable
class ChannelOpener(Protocol):
    """What a worker is given in place of an address: the worker's end of a pipe link (``links.WorkerEnd``)."""

    def open_channels(self) -> tuple[Channel, Channel]:
        """(control, data) channels, opened in the worker's own process."""
        ...


class RouterLike(Protocol):
    """The daemon's well-known endpoint: many peers, each addressed by its identity."""

    endpoint: str

    def send(self, peer: bytes, frames: Sequence[Any]) -> bool:
        """Send to ``peer`` without blocking; False when the peer is gone or full."""
        ...

    def recv(self, timeout_s: float) -> tuple[bytes, list[Any]] | None:
        """One message and the identity of its sender, or None after ``timeout_s``."""
        ...

    def close(self) -> None:
        """Release the endpoint; idempotent."""
        ...


__all__ = ["Channel", "ChannelOpener", "RouterLike", "Frames"]
