"""Autoscaling the daemon's own workers between ``workers.min`` and ``workers.max``.

Each housekeeping tick the daemon calls ``Autoscaler.tick``. It grows the pool
by one worker when, for ``GROW_AFTER_S`` without a break, a client could take
a batch but none is ready (it has credits left after the stage pumped), every
connected worker holds a lease, and files wait in the queue: more workers would
help. It retires one idle worker when, for ``SHRINK_AFTER_S`` without a break,
some connected worker holds no lease. The two delays, the one-step-at-a-time
rule and the restart of each clock after a step are the hysteresis: a pool
does not flap between epochs. A worker still starting (launched, not yet
connected) stops growth until it is there.

Exactly-once holds while the pool changes, because growing only adds a worker
that asks for leases, and only a worker without a lease is retired (on the
daemon's one thread, so no lease can be granted to it in between): nothing it
read is lost or repeated. ``desired`` is what ``loader_workers_desired``
exports, for an external autoscaler (a Kubernetes HPA on an external metric,
KEDA) that scales hand-started workers by the same rule: with ``act=False``
(``workers.max`` = 0) the autoscaler only advises, counting every worker,
hand-started ones included, and starts or stops none.
"""

from __future__ import annotations

import logging
from typing import Any

from loader.service.daemon.workforce import RETIRED_IDLE

log = logging.getLogger("loader.daemon")

GROW_AFTER_S = 1.0
SHRINK_AFTER_S = 3.0
UNBOUNDED = 1 << 30


class Autoscaler:
    """Grows and shrinks one daemon's ``WorkerPool``; see the module docstring."""

    def __init__(self, daemon: Any, minimum: int, maximum: int, *, act: bool = True) -> None:
        self._daemon = daemon
        self.minimum, self.maximum, self.act = minimum, maximum or UNBOUNDED, act
        self.desired = daemon.config.workers.count
        self._starved_since: float | None = None
        self._idle_since: float | None = None

    def tick(self, now: float) -> None:
        """Look at the pool and the clients; grow or shrink by one when a condition has held long enough."""
        daemon = self._daemon
        own = [r for r in daemon.coordinator.workers.values() if r.alive and (r.process is not None or not self.act)]
        connected = [r for r in own if r.peer is not None]
        starting = len(own) - len(connected)
        busy = all(r.leases for r in connected)
        waiting = any(s.current is not None and s.credits > 0 for s in daemon.stage.sessions.values())
        starved = waiting and busy and not starting and daemon.coordinator.queued() > 0
        self._starved_since = (self._starved_since or now) if starved else None
        idle = [r for r in connected if not r.leases]
        self._idle_since = (self._idle_since or now) if idle and not starved else None
        if self._starved_since is not None and now - self._starved_since >= GROW_AFTER_S and len(own) < self.maximum:
            self.desired = len(own) + 1
            self._starved_since = None
            if self.act:
                log.info("autoscaling: clients wait and %d worker(s) are busy; starting one more", len(own))
                daemon.pool.try_launch(retry=False)  # asked again here if still starved
        elif self._idle_since is not None and now - self._idle_since >= SHRINK_AFTER_S and len(own) > self.minimum:
            self.desired = len(own) - 1
            self._idle_since = None
            if self.act:
                log.info("autoscaling: worker %s is idle; retiring it", idle[-1].worker_id)
                daemon.pool.gone(idle[-1], RETIRED_IDLE, replace=False)  # no lease: nothing to re-read
        elif self.act:
            self.desired = len(own)


__all__ = ["Autoscaler", "GROW_AFTER_S", "SHRINK_AFTER_S"]
