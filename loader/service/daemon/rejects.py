"""Messages the daemon refuses: counted, and logged at most once per peer per minute.

Whatever a peer sends, the daemon goes on: a message that fails decoding, names
what its sender does not hold, or makes a handler raise is dropped here. The
count is ``status()["rejected_messages"]``; the log says why, but a peer that
sends garbage in a loop gets one line per ``LOG_EVERY_S``, so it cannot fill
the disk or drown the log.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Hashable

from loader.service.protocol import printable

log = logging.getLogger("loader.daemon")

LOG_EVERY_S = 60.0
MAX_REMEMBERED_PEERS = 1024  # peers whose last log line is remembered (a flood of peers forgets the oldest)


class PeerLines:
    """Routine log lines a peer can make the daemon write at will (a client attaching and detaching, a worker
    joining and saying goodbye, a refused message): each kind at most once per peer per ``LOG_EVERY_S`` at its
    level, the rest at DEBUG. A peer saying hello in a loop wrote two INFO lines a message, 400 KB of log a second."""

    def __init__(self) -> None:
        self._logged_at: dict[tuple[Hashable, str], float] = {}

    def level(self, peer: Hashable | None, kind: str, level: int = logging.INFO) -> int:
        """``level`` for this peer's line of this ``kind`` now, or DEBUG when it had one lately."""
        if peer is None:
            return level
        now = time.monotonic()
        key = (peer, kind)
        last = self._logged_at.get(key)
        if last is not None and now - last < LOG_EVERY_S:
            return logging.DEBUG
        if last is None and len(self._logged_at) >= MAX_REMEMBERED_PEERS:
            del self._logged_at[next(iter(self._logged_at))]  # a flood of peers forgets the oldest
        self._logged_at[key] = now
        return level


class Rejects:
    """The daemon's count of refused messages and its rate-limited log of them."""

    def __init__(self) -> None:
        self.count = 0
        self._lines = PeerLines()

    def reject(self, peer: str, why: str) -> None:
        """Count a refused message from ``peer`` and log ``why`` unless this peer was logged recently."""
        self.count += 1
        if self._lines.level(peer, "rejected", logging.WARNING) != logging.WARNING:
            return
        # ``why`` may quote what the peer wrote: one line whatever it holds.
        log.warning(
            "dropping a message from %s: %s (further ones within %.0fs are not logged)",
            peer,
            printable(why),
            LOG_EVERY_S,
        )


__all__ = ["Rejects", "PeerLines", "LOG_EVERY_S"]
