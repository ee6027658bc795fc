"""Coordinator: leases, the stage's gate, re-queues and re-lease on worker death; the seeded file order."""

from __future__ import annotations

import time

from loader.service.daemon.coordinator import SCAN_JOBS, Coordinator
from loader.service.order import file_order


def _coordinator(n=10, **kw):
    return Coordinator([f"/d/f{i}" for i in range(n)], heartbeat_timeout_s=1.0, **kw)


def test_file_order_is_seeded_per_epoch_golden():
    assert file_order(6, 5, 0, True) == GOLDEN_EPOCH0
    assert file_order(6, 5, 0, True) != file_order(6, 5, 1, True)
    assert file_order(6, 5, 3, False) == list(range(6))


GOLDEN_EPOCH0 = [1, 4, 2, 3, 5, 0]  # np.random.default_rng((5, 0)).permutation(6)


def test_leases_round_robin_and_requeue_on_death():
    coord = _coordinator(4)
    coord.enqueue(1, 0, [0, 1])
    coord.enqueue(2, 0, [2, 3])
    w1 = coord.hello("w1", b"p1", 11)
    w2 = coord.hello("w2", b"p2", 12)
    a, b = coord.next_job(w1), coord.next_job(w2)
    assert {a.stream_id, b.stream_id} == {1, 2}, "streams share workers fairly"
    orphans = coord.remove_worker(w1)
    assert [j.file_index for j in orphans] == [a.file_index]
    again = coord.next_job(w2)
    assert again.file_index == a.file_index, "an orphaned file goes to the front of its queue"
    assert coord.re_leases == 1


def test_job_finished_and_cancel():
    coord = _coordinator(3)
    coord.enqueue(1, 0, [0, 1, 2])
    w = coord.hello("w", b"p", 1)
    job = coord.next_job(w)
    coord.job_finished(1, job.file_index)
    assert w.files_done == 1 and not w.leases
    coord.next_job(w)
    assert coord.cancel_stream(1) and coord.queued() == 0 and coord.leased() == 0


def test_may_lease_gates_leasing_per_file_and_skips_to_the_first_allowed():
    allowed = set()
    coord = _coordinator(3, may_lease=lambda sid, file_index: file_index in allowed)
    coord.enqueue(1, 0, [0, 1, 2])
    w = coord.hello("w", b"p", 1)
    assert coord.next_job(w) is None
    allowed.add(1)
    job = coord.next_job(w)
    assert job is not None and job.file_index == 1
    assert coord.queued(1) == 2, "the files it passed over stay queued in order"


def test_the_gate_looks_at_a_bounded_number_of_queued_jobs():
    seen = []
    coord = _coordinator(SCAN_JOBS + 10, may_lease=lambda sid, file_index: seen.append(file_index) or False)
    coord.enqueue(1, 0, list(range(SCAN_JOBS + 10)))
    assert coord.next_job(coord.hello("w", b"p", 1)) is None
    assert len(seen) == SCAN_JOBS


def test_lease_starts_where_the_stage_asks():
    coord = _coordinator(2, lease_start=lambda sid, file_index: 40 + file_index)
    coord.enqueue(1, 0, [1, 0])
    job = coord.next_job(coord.hello("w", b"p", 1))
    assert (job.file_index, job.start) == (1, 41)


def test_requeue_cancels_the_lease_and_queues_the_file_first():
    coord = _coordinator(3)
    coord.enqueue(1, 0, [0, 1, 2])
    w = coord.hello("w", b"p", 1)
    job = coord.next_job(w)
    cancelled = coord.requeue(1, job.file_index)
    assert cancelled == [("w", job.lease_id)] and not w.leases
    again = coord.next_job(w)
    assert again.file_index == job.file_index and again.lease_id != job.lease_id
    assert coord.was_owned("w", job.lease_id, job.token), "late data of the cut lease is not a forgery"


def test_silent_worker_is_found_dead():
    coord = _coordinator(1)
    w = coord.hello("w", b"p", 1)
    assert coord.find_dead() == []
    dead = coord.find_dead(now=time.monotonic() + 5)
    assert dead and dead[0][0] is w and "heartbeat" in dead[0][1]


def test_a_worker_holding_a_lease_without_progress_is_hung():
    coord = _coordinator(1, progress_timeout_s=2.0)
    coord.enqueue(1, 0, [0])
    w = coord.hello("w", b"p", 1)
    coord.next_job(w)
    w.last_seen = time.monotonic() + 10  # heartbeats keep coming
    dead = coord.find_dead(now=time.monotonic() + 5)
    assert dead and "no progress" in dead[0][1]


def test_busy_seconds_count_each_worker_from_its_first_lease_to_its_last_whatever_falls_between_snapshots():
    # loader_worker_busy_seconds was sampled at each metrics snapshot (every 0.5 s): a file read between two
    # snapshots counted nothing, and a daemon whose epochs were that short reported its workers never busy.
    coord = _coordinator(4)
    coord.enqueue(1, 0, [0, 1, 2, 3])
    w1, w2 = coord.hello("w1", b"p1", 11), coord.hello("w2", b"p2", 12)
    began = time.monotonic()
    assert coord.busy_seconds(began) == 0.0
    first = coord.next_job(w1)
    time.sleep(0.05)
    assert coord.busy_seconds(time.monotonic()) >= 0.05  # a lease going on counts as it goes
    coord.job_finished(1, first.file_index)
    held = coord.busy_seconds(time.monotonic())
    time.sleep(0.05)
    assert coord.busy_seconds(time.monotonic()) == held  # idle since: nothing more
    coord.next_job(w2)
    time.sleep(0.05)
    coord.remove_worker(w2)  # died holding it: counted until then
    ended = time.monotonic()
    total = coord.busy_seconds(ended)
    assert 0.1 <= total <= ended - began
    assert coord.busy_seconds(ended + 10) == total
