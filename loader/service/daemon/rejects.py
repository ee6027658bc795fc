"""Messages the daemon refuses: counted, and logged at most once per peer per minute.

Whatever a peer sends, the daemon goes on: a message that fails decoding, names
what its sender does not hold, or makes a handler raise is dropped here. The
count is ``status()["rejected_messages"]``; the log says why, but a peer that
sends garbage in a loop gets one line per ``LOG_EVERY_S``, so it cannot fill
the disk or drown the log. A peer is a zmq identity, which a peer can make anew
for every message: so each kind of line is also held to ``MAX_LINES_PER_KIND``
a ``LOG_EVERY_S`` from all peers together, and the lines held back are counted
in one line after.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Hashable

from loader.service.protocol import printable

log = logging.getLogger("loader.daemon")

LOG_EVERY_S = 60.0
MAX_REMEMBERED_PEERS = 1024  # peers whose last log line is remembered (a flood of peers forgets the oldest)
# Lines of one kind a LOG_EVERY_S, all peers together: a job of a thousand ranks attaching at once is logged
# whole, a peer reconnecting under a new identity for every message (9,400 lines in 10 s) is not.
MAX_LINES_PER_KIND = 1000


class PeerLines:
    """Routine log lines a peer can make the daemon write at will (a client attaching and detaching, a worker
    joining and saying goodbye, a refused message): each kind at most once per peer per ``LOG_EVERY_S`` at its
    level, the rest at DEBUG. A peer saying hello in a loop wrote two INFO lines a message, 400 KB of log a second."""

    def __init__(self) -> None:
        self._logged_at: dict[tuple[Hashable, str], float] = {}
        self._windows: dict[str, list[float]] = {}  # kind -> [window start, lines logged, lines held back]

    def level(self, peer: Hashable | None, kind: str, level: int = logging.INFO) -> int:
        """``level`` for this peer's line of this ``kind`` now, or DEBUG when it had one lately, or when this
        kind had ``MAX_LINES_PER_KIND`` lines lately from all peers."""
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
        return level if self._within_kind(kind, level, now) else logging.DEBUG

    def _within_kind(self, kind: str, level: int, now: float) -> bool:
        window = self._windows.setdefault(kind, [now, 0, 0])
        if now - window[0] >= LOG_EVERY_S:
            if window[2]:
                log.log(
                    level,
                    "%d more '%s' line(s) were not logged in the last %.0f s (more than %d from all peers: many "
                    "peers, or one reconnecting under new identities)",
                    int(window[2]),
                    kind,
                    now - window[0],
                    MAX_LINES_PER_KIND,
                )
            window[:] = [now, 0, 0]
        if window[1] >= MAX_LINES_PER_KIND:
            if not window[2]:  # said when it starts, not only after (the next line of the kind may never come)
                log.log(
                    level,
                    "more than %d '%s' lines from all peers within %.0f s: the rest are logged at DEBUG and counted "
                    "until the %.0f s are over (many peers, or one reconnecting under new identities)",
                    MAX_LINES_PER_KIND,
                    kind,
                    LOG_EVERY_S,
                    LOG_EVERY_S,
                )
            window[2] += 1
            return False
        window[1] += 1
        return True


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


__all__ = ["Rejects", "PeerLines", "LOG_EVERY_S", "MAX_LINES_PER_KIND"]
