"""The daemon's arenas: ``ArenaPool`` creates, retires and unlinks them (a reader maps them with ``cache.ArenaCache``).

The daemon makes one arena per worker hello (a replacement or a re-introduced
worker gets a fresh one, so every arena has had one writer at a time) and a
header-only probe file, all named ``<dir>/<prefix>-<id>``. Peers learn
``{"dir", "prefix", "token"}`` from their welcome: a client maps the probe
to learn whether it shares the daemon's host (``cache.ArenaCache.probe``), and a
worker maps the arena the welcome names.

A dead worker's arena is *retired*, not unlinked at once: references to it
may still sit in the stage, or be on their way to a client that has not
mapped it yet (unlinking removes the name that client needs). It is unlinked
once the stage holds none of its references (buffered, or sent to a client
whose credit for that batch has not come back: a client copies a batch before
it returns the credit) and it is at least ``RETIRED_MIN_AGE_S`` old, which
covers chunks of the dead writer still queued in the daemon's socket. Blocks
the dead writer allocated but never sent are garbage then, so their state
bytes are not waited for. ``close`` unlinks everything: nothing outlives the
daemon. Files of a daemon killed with SIGKILL are removed by its orphaned
workers (``stale_shm.sweep_after``), or, when they were killed too, by the next
daemon that starts (``stale_shm.sweep``).
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from typing import Any

from loader.service.shm import stale as stale_shm
from loader.service.shm.arena import PROBE_ID, Arena, arena_path, new_token, shm_directory

log = logging.getLogger("loader.daemon")

# Bytes of blocks per worker arena when none is given (the daemon passes workers.shm_arena_mib; 0 disables).
DEFAULT_ARENA_BYTES = 256 * 1024 * 1024
# A retired arena is kept at least this long: a re-introduced worker may write to it until its new WELCOME lands.
RETIRED_MIN_AGE_S = 5.0


class ArenaPool:
    """The daemon's arenas; see the module docstring. Context manager; ``close`` is idempotent."""

    def __init__(self, arena_bytes: int = DEFAULT_ARENA_BYTES, directory: str | None = None) -> None:
        self.arena_bytes = int(arena_bytes)
        self.directory = directory or shm_directory()
        self.prefix = stale_shm.owner_prefix()
        stale_shm.sweep(self.directory)  # before creating ours: files of daemons killed with SIGKILL
        self.token = new_token()
        self._ids = itertools.count(PROBE_ID + 1)
        self.arenas: dict[int, Arena] = {}
        self._retired: dict[int, float] = {}  # arena id -> when
        self._probe: Arena | None = Arena.create(
            self.directory, os.path.basename(arena_path(self.directory, self.prefix, PROBE_ID)), PROBE_ID, 0, self.token
        )

    def describe(self) -> dict[str, Any]:
        """What a peer needs to find and check arenas (goes into welcomes)."""
        return {"dir": self.directory, "prefix": self.prefix, "token": self.token.hex()}

    def create(self) -> Arena:
        """A fresh arena for one worker."""
        arena_id = next(self._ids)
        name = os.path.basename(arena_path(self.directory, self.prefix, arena_id))
        arena = Arena.create(self.directory, name, arena_id, self.arena_bytes, self.token)
        self.arenas[arena_id] = arena
        return arena

    def get(self, arena_id: int) -> Arena | None:
        return self.arenas.get(arena_id)

    def retire(self, arena_id: int | None, now: float | None = None) -> None:
        """Its writer is gone: unlink it later (``collect``)."""
        if arena_id in self.arenas and arena_id not in self._retired:
            self._retired[arena_id] = time.monotonic() if now is None else now

    @property
    def has_retired(self) -> bool:
        return bool(self._retired)

    def collect(self, held: set[int], now: float | None = None) -> list[int]:
        """Unlink and unmap retired arenas nobody can need any more; returns their ids."""
        now = time.monotonic() if now is None else now
        done = []
        for arena_id, since in list(self._retired.items()):
            arena = self.arenas[arena_id]
            if arena_id in held or now - since < RETIRED_MIN_AGE_S:
                continue
            arena.close()
            del self.arenas[arena_id], self._retired[arena_id]
            done.append(arena_id)
        return done

    def close(self) -> None:
        """Unlink every arena and the probe. Idempotent."""
        for arena in self.arenas.values():
            arena.close()
        self.arenas.clear()
        self._retired.clear()
        if self._probe is not None:
            self._probe.close()
            self._probe = None

    def __enter__(self) -> ArenaPool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def open_pool(arena_bytes: int = DEFAULT_ARENA_BYTES) -> ArenaPool | None:
    """The daemon's arenas, or None (fast path off: ``arena_bytes`` 0, or no usable shared-memory directory)."""
    if arena_bytes <= 0:
        return None
    try:
        return ArenaPool(arena_bytes)
    except OSError as exc:
        log.warning("shared-memory fast path off: %s", exc)
        return None


__all__ = ["ArenaPool", "open_pool", "DEFAULT_ARENA_BYTES", "RETIRED_MIN_AGE_S"]
