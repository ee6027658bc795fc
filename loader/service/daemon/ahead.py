"""Leases ahead: when a worker may hold a file queued behind the one it reads, and when it must give it back.

A worker asks for its next lease when it starts one (``workers.leases_ahead``
queued at most), so small files follow each other without a round trip to the
coordinator. A queued lease is also a file that could wait behind a slow one,
which the sequencer's head file must not do for longer than it would without
leases ahead. That is bounded by time, ``AHEAD_HOLD_S``, not by file sizes,
which a reader does not always know before reading:

* ``may_queue``: a worker is granted a lease ahead only while its files are
  quick: its last one took less than ``AHEAD_GRANT_S`` (a quarter of
  ``AHEAD_HOLD_S``) and its current one began less than that ago. Slower files
  go one at a time (a round trip is then a few percent of a file). The gap
  between the two bounds is hysteresis: with one bound, files that take about
  that long were granted leases ahead and had them taken back in turn (the
  small-samples benchmark's files of ~25 ms: 49 take-backs and 556 chunks of
  started leases dropped in 10 epochs, 10% slower than one lease at a time).
* ``waiting_behind_slow``: once a worker's current file has run ``AHEAD_HOLD_S``,
  the leases queued behind it that it has not started (no data of theirs
  arrived) go back to their queues for any worker, each at its place in the
  epoch's order (``Coordinator.take_back``, each loop turn; ``due_in`` wakes the
  loop for it).

So a file waits behind another at most ``AHEAD_HOLD_S`` plus a loop turn, then
goes to the next worker that asks, as it would have without leases ahead; the
head file first, whatever else was put back with it.
"""

from __future__ import annotations

from collections.abc import Iterable

from loader.service.daemon.records import Job, WorkerRecord

# A lease queued behind the file its worker reads goes back to the queue once that file has taken this long;
# and a worker whose files take this long gets no lease ahead: for such files a round trip is cheap anyway.
AHEAD_HOLD_S = 0.02
# A worker is granted leases ahead only while its files take less than this: well under AHEAD_HOLD_S, so a
# lease granted ahead is taken back only when a file turns out several times slower than the one before.
AHEAD_GRANT_S = AHEAD_HOLD_S / 4


def may_queue(worker: WorkerRecord, leases_ahead: int, now: float) -> bool:
    """Whether ``worker``, which holds a lease, may be granted one more to read after it."""
    return (
        len(worker.leases) <= leases_ahead
        and worker.last_file_s < AHEAD_GRANT_S
        and now - worker.reading_since < AHEAD_GRANT_S
    )


def waiting_behind_slow(worker: WorkerRecord, now: float) -> list[Job]:
    """The leases ``worker`` has not started, queued behind a file it has read for ``AHEAD_HOLD_S``, in the
    order granted. One whose data arrived is being read (the one before it is done): it stays."""
    if len(worker.leases) < 2 or now - worker.reading_since < AHEAD_HOLD_S:
        return []
    return [job for job in list(worker.leases.values())[1:] if not job.heard]


def due_in(workers: Iterable[WorkerRecord], now: float) -> float:
    """Seconds until ``waiting_behind_slow`` may find a lease for some worker (inf when none waits)."""
    due = [
        w.reading_since + AHEAD_HOLD_S - now
        for w in workers
        if len(w.leases) > 1 and not all(job.heard for job in list(w.leases.values())[1:])
    ]
    return max(0.0, min(due)) if due else float("inf")


__all__ = ["AHEAD_GRANT_S", "AHEAD_HOLD_S", "due_in", "may_queue", "waiting_behind_slow"]
