"""Coordinator: seeded file order, disjoint shares, leases, re-lease on worker death."""

from __future__ import annotations

import time

from loader.service.daemon.coordinator import Coordinator, file_order


def _coordinator(n=10, **kw):
    return Coordinator([f"/d/f{i}" for i in range(n)], seed=5, shuffle_files=True, heartbeat_timeout_s=1.0, **kw)


def test_file_order_is_seeded_per_epoch_golden():
    assert file_order(6, 5, 0, True) == GOLDEN_EPOCH0
    assert file_order(6, 5, 0, True) != file_order(6, 5, 1, True)
    assert file_order(6, 5, 3, False) == list(range(6))


GOLDEN_EPOCH0 = [1, 4, 2, 3, 5, 0]  # np.random.default_rng((5, 0)).permutation(6)


def test_shares_are_disjoint_and_cover_all_files():
    coord = _coordinator(11)
    for epoch in range(3):
        shares = [coord.share(epoch, r, 3) for r in range(3)]
        flat = [i for s in shares for i in s]
        assert sorted(flat) == list(range(11))


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


def test_job_finished_and_cancel():
    coord = _coordinator(3)
    coord.enqueue(1, 0, [0, 1, 2])
    w = coord.hello("w", b"p", 1)
    job = coord.next_job(w)
    coord.job_finished(1, job.file_index)
    assert w.files_done == 1 and not w.leases
    coord.next_job(w)
    assert coord.cancel_stream(1) and coord.queued() == 0 and coord.leased() == 0


def test_may_lease_gates_leasing():
    allowed = {"ok": False}
    coord = _coordinator(2, may_lease=lambda sid: allowed["ok"])
    coord.enqueue(1, 0, [0, 1])
    w = coord.hello("w", b"p", 1)
    assert coord.next_job(w) is None
    allowed["ok"] = True
    assert coord.next_job(w) is not None


def test_silent_worker_is_found_dead():
    coord = _coordinator(1)
    w = coord.hello("w", b"p", 1)
    assert coord.find_dead() == []
    dead = coord.find_dead(now=time.monotonic() + 5)
    assert dead and dead[0][0] is w and "heartbeat" in dead[0][1]
