"""What the daemon publishes for its metrics endpoint: an immutable snapshot every ``PUBLISH_INTERVAL_S``.

The daemon is one thread without locks, and a scrape arrives on another
thread (``metrics.MetricsServer``). So the HTTP side never reads daemon state:
``Snapshotter.take`` runs on the daemon's thread, copies every number into a
fresh ``Snapshot`` (plain ints, floats and tuples), and the daemon swaps it in
with one reference assignment (atomic in Python). A scrape reads whichever
snapshot is current: at most ``metrics.PUBLISH_INTERVAL_S`` plus one housekeeping tick old.

``METRICS`` is the one list of what is exported; ``docs/operations.md`` shows
it as a table and a test holds the two together.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from loader.service.daemon.rate import RecentRate

DATASET = "default"  # the dataset label of a daemon's [source]/[pipeline]; [datasets.NAME] are labelled NAME

# (name, type, labels, help). Counters are exported with the ``_total`` suffix Prometheus adds.
METRICS: tuple[tuple[str, str, tuple[str, ...], str], ...] = (
    ("loader_ready", "gauge", (), "1 when the daemon is ready: a worker is connected and the file list is read"),
    ("loader_uptime_seconds", "gauge", (), "seconds since the daemon started"),
    ("loader_batches_sent", "counter", ("dataset",), "batches sent to clients"),
    ("loader_samples_sent", "counter", ("dataset",), "samples sent to clients"),
    ("loader_bytes_sent", "counter", ("dataset",), "bytes of batch messages sent to clients (headers and columns)"),
    ("loader_samples_received", "counter", ("dataset",), "samples received from workers (after de-duplication)"),
    ("loader_bytes_received", "counter", ("dataset",), "bytes of data messages received from workers"),
    ("loader_samples_per_second", "gauge", ("dataset",), "samples received per second over the last ~10 s"),
    ("loader_epoch", "gauge", ("dataset", "session", "rank"), "the epoch a client is reading"),
    ("loader_epoch_files", "gauge", ("dataset", "session", "rank"), "files in a client's share of its epoch"),
    ("loader_epoch_files_done", "gauge", ("dataset", "session", "rank"), "files of that share read completely"),
    ("loader_epoch_samples_sent", "gauge", ("dataset", "session", "rank"), "samples of that epoch sent so far"),
    (
        "loader_client_wait_seconds",
        "counter",
        ("session", "rank"),
        "seconds the client's training loop waited for its next batch (reported with its credits)",
    ),
    ("loader_client_credits", "gauge", ("session", "rank"), "batches the daemon may still send a client now"),
    ("loader_clients", "gauge", (), "clients attached"),
    ("loader_workers", "gauge", ("state",), "workers: alive (processes or connections), connected, busy (leasing)"),
    (
        "loader_workers_desired",
        "gauge",
        (),
        "workers the autoscaler wants (workers.min..max): for an external autoscaler",
    ),
    ("loader_worker_utilisation", "gauge", (), "busy workers / alive workers, now"),
    (
        "loader_worker_busy_seconds",
        "counter",
        (),
        "worker-seconds spent holding a lease (rate / workers = utilisation)",
    ),
    ("loader_worker_restarts", "counter", (), "workers replaced after they died or hung"),
    ("loader_leases_active", "gauge", (), "files leased to workers now"),
    ("loader_files_queued", "gauge", (), "files waiting for a worker"),
    ("loader_leases", "counter", (), "file leases granted"),
    ("loader_re_leases", "counter", (), "leases handed back to the queue because their worker died"),
    ("loader_records_skipped", "counter", (), "bad records skipped (pipeline.on_error = 'skip')"),
    (
        "loader_records_rejected",
        "counter",
        (),
        "records rejected by the daemon's checks (they do not fit their batch; under skip also counted as skipped)",
    ),
    ("loader_duplicates_dropped", "counter", (), "samples dropped as duplicates (a file re-read after a death)"),
    ("loader_messages_rejected", "counter", (), "malformed or misplaced messages dropped"),
    ("loader_stage_buffered_samples", "gauge", (), "samples held in the stage's shuffle buffers and batchers"),
    (
        "loader_stage_buffered_bytes",
        "gauge",
        (),
        "about the bytes of those samples, as service.stream_buffer_mib counts them (a row in shared memory: 24)",
    ),
    ("loader_shm_arenas", "gauge", (), "shared-memory arenas open"),
    ("loader_shm_bytes", "gauge", (), "bytes of shared memory mapped by those arenas"),
    ("loader_shm_used_bytes", "gauge", (), "bytes of those arenas holding rows not yet read by their client"),
)

Sample = tuple[str, tuple[tuple[str, str], ...], float]  # (name, labels, value)


@dataclass(frozen=True)
class Snapshot:
    """Every exported sample, when it was taken, and readiness."""

    taken_at: float  # time.monotonic() on the daemon's thread
    ready: bool
    samples: tuple[Sample, ...]


class Snapshotter:
    """Lives on the daemon's thread: takes snapshots, and keeps each dataset's recent rate."""

    def __init__(self) -> None:
        self._rates: dict[str, RecentRate] = {}  # dataset -> its samples received per second

    def take(self, daemon: Any, now: float | None = None) -> Snapshot:
        now = time.monotonic() if now is None else now
        status = daemon.status()
        records = list(daemon.coordinator.workers.values())
        alive = [r for r in records if r.alive]
        busy = sum(1 for r in alive if r.leases)
        connected = sum(1 for r in alive if r.peer is not None)
        ready = connected > 0 and status["files"]["total"] > 0
        arenas = daemon.arenas
        shm_arenas = len(arenas.arenas) if arenas is not None else 0
        out: list[Sample] = []

        def add(name: str, value: float, **labels: Any) -> None:
            out.append((name, tuple((k, str(v)) for k, v in labels.items()), float(value)))

        add("loader_ready", 1 if ready else 0)
        add("loader_uptime_seconds", status["uptime_s"])
        # Every dataset the daemon serves, read yet or not, so a dashboard sees each from the start.
        names = dict.fromkeys([*daemon.datasets.by_name, *daemon.stage.traffic])
        for name in names:
            traffic = daemon.stage.traffic_of(name)
            rate = self._rates.setdefault(name, RecentRate())
            rate.record(now, traffic.samples_in)
            ds = {"dataset": name}
            add("loader_batches_sent", traffic.batches_sent, **ds)
            add("loader_samples_sent", traffic.samples_sent, **ds)
            add("loader_bytes_sent", traffic.bytes_sent, **ds)
            add("loader_samples_received", traffic.samples_in, **ds)
            add("loader_bytes_received", traffic.bytes_in, **ds)
            add("loader_samples_per_second", round(rate.per_second(now, traffic.samples_in), 1), **ds)
        for session in daemon.stage.sessions.values():
            who = {"session": session.session_id, "rank": session.rank}
            add("loader_client_wait_seconds", session.wait_s, **who)
            add("loader_client_credits", session.credits, **who)
            epoch = session.epoch_progress()  # after its END: the epoch the client may still be reading
            if epoch is not None:
                mine = {"dataset": session.dataset}
                add("loader_epoch", epoch[0], **mine, **who)
                add("loader_epoch_files", epoch[1], **mine, **who)
                add("loader_epoch_files_done", epoch[2], **mine, **who)
                add("loader_epoch_samples_sent", epoch[3], **mine, **who)
        add("loader_clients", len(daemon.stage.sessions))
        add("loader_workers", len(alive), state="alive")
        add("loader_workers", connected, state="connected")
        add("loader_workers", busy, state="busy")
        add("loader_workers_desired", daemon.autoscaler.desired)
        add("loader_worker_utilisation", busy / len(alive) if alive else 0.0)
        add("loader_worker_busy_seconds", daemon.coordinator.busy_seconds(now))
        add("loader_worker_restarts", status["worker_restarts"])
        add("loader_leases_active", status["files"]["leased"])
        add("loader_files_queued", status["files"]["queued"])
        add("loader_leases", daemon.coordinator.leases_granted)
        add("loader_re_leases", daemon.coordinator.re_leases)
        add("loader_records_skipped", status["skipped_records"])
        add("loader_records_rejected", status["rejected_records"])
        add("loader_duplicates_dropped", status["duplicates_dropped"])
        add("loader_messages_rejected", status["rejected_messages"])
        add("loader_stage_buffered_samples", status["buffered_samples"])
        add("loader_stage_buffered_bytes", status["buffered_bytes"])
        add("loader_shm_arenas", shm_arenas)
        add("loader_shm_bytes", shm_arenas * (arenas.arena_bytes if arenas is not None else 0))
        # One count over each arena's state bytes (a few thousand): cheap at the snapshot's pace.
        used = sum(a.used_blocks() * a.block_bytes for a in arenas.arenas.values()) if arenas is not None else 0
        add("loader_shm_used_bytes", used)
        return Snapshot(taken_at=now, ready=ready, samples=tuple(out))


__all__ = ["METRICS", "DATASET", "Snapshot", "Snapshotter"]
