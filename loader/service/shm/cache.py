"""A reader's side of the daemon's arenas: ``ArenaCache`` maps them on first use and unmaps idle ones."""

from __future__ import annotations

import os
import time
from typing import Any

from loader.service.shm.arena import PROBE_ID, Arena, ArenaError, arena_path

CLIENT_ARENA_IDLE_S = 30.0  # a reader unmaps an arena it has not used for this long (retired ones pin memory)


class ArenaCache:
    """A reader's mappings of one daemon's arenas, opened on first use and dropped when idle."""

    def __init__(self, info: dict[str, Any]) -> None:
        self.directory, self.prefix = str(info["dir"]), str(info["prefix"])
        if os.sep in self.prefix or self.prefix in ("", ".", ".."):
            # The daemon's welcome names it; a name, never a path that leaves ``dir`` ("../x").
            raise ValueError(f"arena prefix {self.prefix[:80]!r} is not a file name")
        self.token = bytes.fromhex(str(info["token"]))
        self._arenas: dict[int, Arena] = {}
        self._used: dict[int, float] = {}
        self._next_evict = 0.0

    def probe(self) -> bool:
        """True when this process maps the daemon's files (same host, same ``/dev/shm``)."""
        try:
            Arena.open(arena_path(self.directory, self.prefix, PROBE_ID), PROBE_ID, self.token).close()
        except (ArenaError, OSError, ValueError):
            return False
        return True

    def get(self, arena_id: int) -> Arena:
        """The mapping of ``arena_id``; ``ArenaError`` when it cannot be opened."""
        arena = self._arenas.get(arena_id)
        if arena is None:
            arena = Arena.open(arena_path(self.directory, self.prefix, arena_id), arena_id, self.token)
            self._arenas[arena_id] = arena
        self._used[arena_id] = time.monotonic()
        return arena

    def evict_idle(self, now: float | None = None) -> None:
        """Unmap arenas unused for ``CLIENT_ARENA_IDLE_S`` (a retired arena's memory goes with the last map)."""
        now = time.monotonic() if now is None else now
        if now < self._next_evict:
            return
        self._next_evict = now + 1.0
        for arena_id, used in list(self._used.items()):
            if now - used >= CLIENT_ARENA_IDLE_S:
                self._arenas.pop(arena_id).close()
                del self._used[arena_id]

    def close(self) -> None:
        for arena in self._arenas.values():
            arena.close()
        self._arenas.clear()
        self._used.clear()


__all__ = ["ArenaCache", "CLIENT_ARENA_IDLE_S"]
