"""One question to a daemon and its answer, outside a client's receiver thread: the handshake's
request, and ``query_status`` (``loader status``, ``Loader``'s readiness checks).

Also why a daemon may not have answered (``no_answer_hint``): the usual causes of silence look
alike from this side, so the error names them.
"""

from __future__ import annotations

import os
import time
from typing import Any

from loader.errors import MalformedMessageError, ServiceUnavailableError
from loader.service import protocol as P
from loader.service import transport
from loader.service.transport import Channel
from loader.service.transport.auth import ENV_PEER_KEY, CurveClient

ANSWER_POLL_S = 0.1  # one wait for the answer, between looks at the deadline


# The three usual causes of silence, which look alike from here: no daemon, another address, and a daemon with
# authentication, which answers no peer without keys (docs/security.md).
NO_ANSWER_HINT = (
    " (is `loader serve` running at that address? A daemon with CURVE keys answers only peers that have theirs: "
    "set LOADER_PEER_KEY and LOADER_DAEMON_PUBLIC_KEY, see docs/security.md)"
)
# ... and for a peer that has keys: the same silence, the other way round.
KEYED_NO_ANSWER_HINT = (
    " (is `loader serve` running at that address? This side has CURVE keys: a daemon that does not list its "
    "public key in service.authorized_keys, or that has no keys itself, gives it no answer; a daemon with keys "
    "logs every key it refuses, see docs/security.md)"
)


def no_answer_hint(has_keys: bool | None = None) -> str:
    """Why a daemon may not have answered, for a peer with CURVE keys or without (None: LOADER_PEER_KEY says)."""
    if has_keys is None:
        has_keys = bool(os.environ.get(ENV_PEER_KEY))
    return KEYED_NO_ANSWER_HINT if has_keys else NO_ANSWER_HINT


def query_status(address: str, timeout_s: float = 5.0, curve: CurveClient | None = None) -> dict[str, Any]:
    """The daemon's ``status()`` dict; ``ServiceUnavailableError`` when it does not answer.

    ``curve``: this peer's keys for a daemon with CURVE on (default: from the environment).
    """
    channel = transport.dealer(address, curve=curve)
    try:
        answer = request(channel, P.encode(P.Status()), (P.Status,), timeout_s, address)
    finally:
        channel.close()
    if not isinstance(answer, P.Status):
        hint = no_answer_hint(True if curve is not None else None)
        raise ServiceUnavailableError(f"no loader daemon answered at {address} within {timeout_s:g}s{hint}")
    return dict(answer.status or {})


def request(
    channel: Channel, frames: list[Any], answers: tuple[type[P.Message], ...], timeout_s: float, address: str
) -> P.Message | None:
    """Send ``frames`` and wait for a message of one of the ``answers`` types (others are skipped);
    the message, or None when none came within ``timeout_s``."""
    channel.send(frames, timeout_s=timeout_s)
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        got = channel.recv(min(ANSWER_POLL_S, left))
        if got is not None:
            try:
                message, _ = P.decode(got)
            except MalformedMessageError as exc:
                raise ServiceUnavailableError(
                    f"{address} answered with something that is not a loader daemon's message ({exc})"
                ) from None
            if isinstance(message, answers):
                return message


__all__ = ["query_status", "request", "no_answer_hint", "NO_ANSWER_HINT", "KEYED_NO_ANSWER_HINT"]
