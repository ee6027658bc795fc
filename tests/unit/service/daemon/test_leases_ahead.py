"""Leases ahead: a worker holds files queued behind the one it reads; slow files give theirs back.

What must hold whatever the timing: a worker is granted a lease ahead only while its files are quick,
a queued lease it has not started goes back to its queue once the file before it has run
``AHEAD_HOLD_S``, a death re-queues every lease and is charged only to the file being read, a lease put
back goes to its place in the epoch's order (so a queued head file is leased first), files larger than
the reorder window never livelock, and completing a file never scans the whole queue.
"""

from __future__ import annotations

import time
from collections import deque

import numpy as np

from loader.service.daemon.ahead import AHEAD_HOLD_S
from loader.service.daemon.coordinator import Coordinator
from loader.service.daemon.sequencer import Sequencer


def _coordinator(n=10, ahead=2, **kw):
    return Coordinator([f"/d/f{i}" for i in range(n)], heartbeat_timeout_s=1.0, leases_ahead=ahead, **kw)


def _grant(coord, worker, now=None):
    """Leases granted to ``worker`` now, as the pool's dispatch would."""
    now = time.monotonic() if now is None else now
    got = []
    while coord.wants_lease(worker, now):
        job = coord.next_job(worker)
        if job is None:
            break
        got.append(job)
    return got


def test_a_worker_holds_at_most_one_plus_leases_ahead():
    for ahead in (0, 1, 3):
        coord = _coordinator(ahead=ahead)
        coord.enqueue(1, 0, list(range(10)))
        w = coord.hello("w", b"p", 1)
        w.asked = 10  # more than it may hold: the rest waits
        assert [j.file_index for j in _grant(coord, w)] == list(range(1 + ahead))
        assert list(w.leases) == sorted(w.leases), "held in the order granted"


def test_nothing_is_granted_unasked():
    coord = _coordinator()
    coord.enqueue(1, 0, [0, 1])
    w = coord.hello("w", b"p", 1)
    assert _grant(coord, w) == []
    w.asked = 1
    assert len(_grant(coord, w)) == 1 and w.asked == 0


def test_no_lease_ahead_behind_a_slow_file_or_after_one():
    coord = _coordinator()
    coord.enqueue(1, 0, list(range(10)))
    w = coord.hello("w", b"p", 1)
    w.asked = 1
    first = _grant(coord, w)[0]
    w.asked = 1
    late = w.reading_since + AHEAD_HOLD_S
    assert _grant(coord, w, now=late) == [], "its current file runs long: no file waits behind it"
    w.reading_since -= 1.0  # the file took a second
    coord.job_finished(1, first.file_index)
    assert w.last_file_s >= 1.0
    w.asked = 2
    assert len(_grant(coord, w)) == 1, "after a slow file: one file at a time until a quick one"


def test_a_queued_lease_goes_back_first_when_the_file_before_it_runs_long():
    coord = _coordinator()
    coord.enqueue(1, 0, list(range(6)))
    w, other = coord.hello("w", b"p", 1), coord.hello("o", b"q", 2)
    w.asked = 3
    reading, queued_1, queued_2 = _grant(coord, w)
    coord.progressed("w", reading.lease_id)
    assert coord.take_back(time.monotonic()) == [], "not yet: the file before them may be quick"
    assert coord.take_back_due_in(time.monotonic()) <= AHEAD_HOLD_S
    late = w.reading_since + AHEAD_HOLD_S + 0.001
    assert coord.take_back_due_in(late) == 0.0
    cancelled = coord.take_back(late)
    assert cancelled == [("w", queued_1.lease_id), ("w", queued_2.lease_id)]
    assert list(w.leases) == [reading.lease_id]
    assert coord.taken_back == 2 and coord.take_back_due_in(late) == float("inf")
    other.asked = 2
    again = _grant(coord, other)
    assert [j.file_index for j in again] == [queued_1.file_index, queued_2.file_index], "first, in order"
    assert {j.lease_id for j in again}.isdisjoint({queued_1.lease_id, queued_2.lease_id}), "new leases"
    assert coord.was_owned("w", queued_1.lease_id, queued_1.token), "its late data is not a forgery"


def test_a_queued_lease_whose_data_arrived_is_being_read_and_stays():
    coord = _coordinator()
    coord.enqueue(1, 0, list(range(4)))
    w = coord.hello("w", b"p", 1)
    w.asked = 2
    _, started = _grant(coord, w)
    coord.progressed("w", started.lease_id)
    late = w.reading_since + 10 * AHEAD_HOLD_S
    assert coord.take_back(late) == [] and len(w.leases) == 2
    assert coord.take_back_due_in(late) == float("inf"), "nothing to take back: no busy loop"


def test_the_next_queued_lease_starts_its_clock_when_the_one_before_ends():
    coord = _coordinator()
    coord.enqueue(1, 0, list(range(4)))
    w = coord.hello("w", b"p", 1)
    w.asked = 2
    first, second = _grant(coord, w)
    w.reading_since -= 5.0
    coord.job_finished(1, first.file_index)
    assert list(w.leases) == [second.lease_id]
    assert time.monotonic() - w.reading_since < 1.0, "the worker went on to the next file just now"


def test_death_requeues_every_lease_in_order_and_names_the_one_being_read_first():
    coord = _coordinator()
    coord.enqueue(1, 0, [4, 2, 7, 1, 0])
    w = coord.hello("w", b"p", 1)
    w.asked = 3
    held = [(j.lease_id, j.token) for j in _grant(coord, w)]
    orphans = coord.remove_worker(w)
    assert [j.file_index for j in orphans] == [4, 2, 7], "the first is the file it was reading"
    other = coord.hello("o", b"q", 2)
    other.asked = 3
    assert [j.file_index for j in _grant(coord, other)] == [4, 2, 7], "back at the front, in the epoch's order"
    assert all(coord.was_owned("w", lease_id, token) for lease_id, token in held), "their late data is no forgery"


def test_a_finished_file_leaves_its_requeued_job_and_nothing_else():
    coord = _coordinator(ahead=0)
    coord.enqueue(1, 0, [0, 1, 2, 3])
    w = coord.hello("w", b"p", 1)
    w.asked = 1
    job = _grant(coord, w)[0]
    coord.remove_worker(w)
    assert coord.queued(1) == 4
    coord.job_finished(1, job.file_index)  # the dead worker's data completed the file after all
    assert coord.queued(1) == 3
    coord.job_finished(1, 2)  # not re-queued: its queued job stays (only a lease's data completes a file)
    assert coord.queued(1) == 3


def test_finishing_files_does_not_scan_the_queue():
    """An epoch of n files must not cost n passes over the queue (it did: O(n^2) per epoch)."""
    coord = _coordinator(1000, ahead=16)
    coord.enqueue(1, 0, list(range(1000)))
    w = coord.hello("w", b"p", 1)
    w.asked = 17
    held = _grant(coord, w)
    passes = []

    class Spy(deque):
        def __iter__(self):
            passes.append(1)
            return super().__iter__()

    coord._queues[1] = Spy(coord._queues[1])
    for job in held:
        coord.job_finished(1, job.file_index)
    assert not w.leases and coord.queued(1) == 1000 - 17
    assert passes == [], "a file leased from the queue is not looked for in it"


def test_leases_taken_back_from_several_workers_go_back_in_the_epochs_order():
    """Each worker's queued leases used to go to the very front in turn, so the second worker's later files
    stood before the first's: the head file among them waited behind files it comes before."""
    coord = _coordinator(8)
    coord.enqueue(1, 0, list(range(8)))
    a, b = coord.hello("a", b"p", 1), coord.hello("b", b"q", 2)
    a.asked = b.asked = 3
    assert [j.file_index for j in _grant(coord, a) + _grant(coord, b)] == [0, 1, 2, 3, 4, 5]
    late = max(a.reading_since, b.reading_since) + AHEAD_HOLD_S + 0.001
    assert len(coord.take_back(late)) == 4
    assert [job.file_index for job in coord._queues[1]] == [1, 2, 4, 5, 6, 7]


def test_a_file_put_back_goes_to_its_place_behind_a_queued_head():
    coord = _coordinator(6, ahead=0)
    coord.enqueue(1, 0, [5, 3, 1, 0, 4, 2])  # the epoch's order
    a, b = coord.hello("a", b"p", 1), coord.hello("b", b"q", 2)
    a.asked = b.asked = 1
    reading, later = _grant(coord, a)[0], _grant(coord, b)[0]
    coord.remove_worker(a)  # the head goes back
    coord.requeue(1, later.file_index)  # then the stage cuts the file after it
    assert [job.file_index for job in coord._queues[1]] == [reading.file_index, later.file_index, 1, 0, 4, 2]


def _read_with_cuts(ahead: int, files: int, rows: int, chunk: int, window: int, max_turns: int) -> list[int] | None:
    """Two workers read ``files`` files of ``rows`` records through a coordinator and a stream's sequencer
    wired as the daemon wires them (``Stage.may_lease``, ``Stage.lease_start``): per turn, leases granted
    (leases ahead only in the first turn, then queued ones taken back: the files run long), and each
    worker sends one ``chunk`` of the file it reads; a chunk beyond the reorder window cuts its file and
    queues it again. Records numbered across files (``file * rows + record``; the order is the files'
    own) in the order they came out, or None if the epoch did not complete in ``max_turns`` turns."""
    seq = Sequencer(list(range(files)), 0, 0, reorder_rows=window)
    coord = _coordinator(
        files, ahead=ahead, may_lease=lambda s, f: seq.may_read(f), lease_start=lambda s, f: seq.lease_start(f)
    )
    coord.enqueue(1, 0, list(range(files)))
    workers = [coord.hello("a", b"p", 1), coord.hello("b", b"q", 2)]
    at: dict[int, int] = {}  # lease id -> the next record its worker reads
    out: list[int] = []
    for turn in range(max_turns):
        if seq.complete:
            return out
        now = time.monotonic() + (0.0 if turn == 0 else 10 * AHEAD_HOLD_S)
        coord.take_back(now)
        for worker in sorted(workers, key=lambda w: bool(w.leases)):  # idle workers first, as dispatch
            worker.asked = 1 + ahead - len(worker.leases)
            while coord.wants_lease(worker, now) and (job := coord.next_job(worker)) is not None:
                at[job.lease_id] = job.start
        for worker in workers:
            if not worker.leases:
                continue
            job = next(iter(worker.leases.values()))
            first = at[job.lease_id]
            records = np.arange(first, min(first + chunk, rows))
            if len(records) == 0:  # the lease read its file: FILE_DONE
                out += [f * rows + int(r) for _, f, records in seq.finish(job.file_index) for r in records]
                coord.job_finished(1, job.file_index)
                continue
            coord.progressed(worker.worker_id, job.lease_id)
            tagged, _, cut = seq.add(job.file_index, {"r": records}, records)
            out += [f * rows + int(r) for _, f, records in tagged for r in records]
            at[job.lease_id] = int(records[-1]) + 1
            if cut is not None:
                coord.requeue(1, cut.file_index)
    return out if seq.complete else None


def test_files_larger_than_the_reorder_window_complete_with_leases_ahead():
    """The livelock of leases ahead: taken back, the head file stood in the queue behind later files, and
    those, cut as the window filled, were leased again at once (room for one row), cut again, queued first
    again, in turn for both workers, while the head waited for good."""
    files, rows = 6, 40
    got = _read_with_cuts(ahead=2, files=files, rows=rows, chunk=8, window=20, max_turns=500)
    assert got is not None, "the epoch stalled"
    assert got == list(range(files * rows)), "every record once, in the epoch's order"
