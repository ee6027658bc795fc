"""A rate over the last few seconds, for ``loader status``.

A lifetime average (samples since start / uptime) says little about a daemon
that idled between clients; this keeps (time, count) readings taken by the
daemon loop and reports the rate across the window they span.
"""

from __future__ import annotations

from collections import deque

RATE_WINDOW_S = 10.0
RATE_READING_INTERVAL_S = 0.5


class RecentRate:
    """Counts per second over the last ``window_s`` seconds of readings."""

    def __init__(self, window_s: float = RATE_WINDOW_S, interval_s: float = RATE_READING_INTERVAL_S) -> None:
        self.window_s, self.interval_s = window_s, interval_s
        self._readings: deque[tuple[float, int]] = deque()

    def record(self, now: float, count: int) -> None:
        """Note the running total ``count`` at ``now`` (cheap; call as often as you like)."""
        if self._readings and now - self._readings[-1][0] < self.interval_s:
            return
        self._readings.append((now, count))
        while len(self._readings) > 2 and now - self._readings[1][0] >= self.window_s:
            self._readings.popleft()

    def per_second(self, now: float, count: int) -> float:
        """The rate from the oldest kept reading to (``now``, ``count``); 0.0 before any reading."""
        if not self._readings:
            return 0.0
        then, first = self._readings[0]
        span = now - then
        return (count - first) / span if span > 0 else 0.0


__all__ = ["RecentRate", "RATE_WINDOW_S"]
