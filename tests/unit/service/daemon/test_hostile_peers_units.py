"""Hostile peers, unit by unit: refusals counted and logged once a minute, lease ownership, arena
reference ownership, reclaimed rows, handler guard, message size cap."""

from __future__ import annotations

import collections
import logging
import time
import types
from typing import Any

import msgpack
import numpy as np
import pytest

from loader.service import protocol as P
from loader.service import transport
from loader.service.daemon.coordinator import Coordinator
from loader.service.daemon.rejects import LOG_EVERY_S, MAX_LINES_PER_KIND, Rejects
from loader.service.daemon.stage import Stage
from loader.service.shm import refs as R
from loader.service.shm.arena import FREE, USED, ArenaError
from loader.service.shm.pool import ArenaPool

ROW = 16 * 1024  # float32: 64 KiB rows, one block each
SPEC = {"data": {0: ["<f4", [ROW]]}}


# -- refusals --------------------------------------------------------------------------------------------------
def test_refusals_are_all_counted_but_logged_once_per_peer_per_minute(caplog, monkeypatch):
    rejects = Rejects()
    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    with caplog.at_level(logging.WARNING, logger="loader.daemon"):
        for _ in range(50):
            rejects.reject("peer a", "garbage")
        rejects.reject("peer b", "garbage")
        clock[0] += LOG_EVERY_S + 1
        rejects.reject("peer a", "garbage again")
    assert rejects.count == 52
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3
    assert [line.split(":")[0] for line in lines] == [
        "dropping a message from peer a",
        "dropping a message from peer b",
        "dropping a message from peer a",
    ]


def test_a_peer_under_a_new_identity_for_every_message_cannot_flood_the_log(caplog, monkeypatch):
    # The limit was per zmq identity, which a peer makes anew by reconnecting: 9,436 warnings in 10 s.
    rejects = Rejects()
    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    with caplog.at_level(logging.WARNING, logger="loader.daemon"):
        for i in range(5 * MAX_LINES_PER_KIND):
            rejects.reject(f"peer {i}", "garbage")
        assert len(caplog.records) == MAX_LINES_PER_KIND + 1  # and one saying the rest are held back, at once
        assert caplog.records[-1].getMessage().startswith(f"more than {MAX_LINES_PER_KIND} 'rejected' lines")
        clock[0] += LOG_EVERY_S + 1
        rejects.reject("peer new", "garbage")
    assert rejects.count == 5 * MAX_LINES_PER_KIND + 1  # every one counted
    said = [r.getMessage() for r in caplog.records[MAX_LINES_PER_KIND + 1 :]]
    assert said[0].startswith(f"{4 * MAX_LINES_PER_KIND} more 'rejected' line(s) were not logged in the last 61 s")
    assert said[1].startswith("dropping a message from peer new")


# -- leases ------------------------------------------------------------------------------------------------------
def test_data_is_owned_only_by_the_lease_holder_with_its_token():
    coordinator = Coordinator(["a", "b"], heartbeat_timeout_s=5.0)
    coordinator.enqueue(7, 0, [0, 1])
    holder, other = coordinator.add_worker("w1"), coordinator.add_worker("w2")
    job = coordinator.next_job(holder)
    assert job is not None and len(job.token) >= 32
    assert coordinator.owns("w1", job.lease_id, job.token, 7, job.file_index)
    assert not coordinator.owns("w2", job.lease_id, job.token, 7, job.file_index)  # another worker
    assert not coordinator.owns("w1", job.lease_id, "0" * len(job.token), 7, job.file_index)  # a guessed token
    assert not coordinator.owns("w1", job.lease_id, "", 7, job.file_index)  # none
    assert not coordinator.owns("w1", job.lease_id, job.token, 8, job.file_index)  # another stream
    assert not coordinator.owns("w1", job.lease_id, job.token, 7, 1 - job.file_index)  # another file
    old_token = job.token
    coordinator.remove_worker(holder)  # the lease goes back to the queue: the old token is dead
    regrant = coordinator.next_job(other)
    assert regrant is not None and regrant.lease_id == job.lease_id and regrant.token != old_token
    assert not coordinator.owns("w2", job.lease_id, old_token, 7, job.file_index)
    # w1's late data for the lease it lost is told apart from a forgery (dropped quietly, not counted)
    assert coordinator.was_owned("w1", job.lease_id, old_token)
    assert not coordinator.was_owned("w1", job.lease_id, regrant.token)
    assert not coordinator.was_owned("w2", job.lease_id, old_token)


# -- arena references ------------------------------------------------------------------------------------------
@pytest.fixture
def stage_and_arenas(tmp_path):
    with ArenaPool(16 * ROW * 4, directory=str(tmp_path)) as pool:  # 16 blocks each
        stage = Stage(
            batch_size=4, drop_last=False, shuffle_buffer=0, seed=1, samples_per_message=8, send=lambda p, f: True
        )
        stage.refs.arenas = pool
        yield stage.refs, pool.create(), pool.create()


def _written(arena, n=2):
    return R.write_column(arena, np.ones((n, ROW), np.float32))


def _check(keeper, refs, own):
    keeper.check_owned(SPEC, {"data": refs}, own)


@pytest.mark.parametrize(
    "forge",
    [
        lambda refs, own, other: np.array([[other.arena_id, 0, 0]]),  # another worker's arena
        lambda refs, own, other: np.array([[own.arena_id, -1, 0]]),  # a negative block wraps round
        lambda refs, own, other: np.array([[own.arena_id, 10**9, 0]]),  # far outside
        lambda refs, own, other: np.array([[own.arena_id, 9, 0]]),  # a free block
        lambda refs, own, other: np.array([[own.arena_id, int(refs[0, 1]), 7]]),  # an undescribed spec
        lambda refs, own, other: np.array([refs[0], refs[0]]),  # two rows in one block
    ],
)
def test_references_outside_what_the_sender_holds_are_refused(stage_and_arenas, forge):
    keeper, own, other = stage_and_arenas
    _written(other)
    refs = _written(own)
    with pytest.raises(ArenaError):
        _check(keeper, forge(refs, own, other).astype(np.int64), own.arena_id)
    _check(keeper, refs, own.arena_id)  # the genuine ones still pass


def test_a_reference_to_rows_the_stage_holds_is_refused_until_they_are_freed(stage_and_arenas):
    keeper, own, _ = stage_and_arenas
    refs = _written(own)
    _check(keeper, refs, own.arena_id)
    columns = {"data": refs.copy()}
    assert keeper.adopt(SPEC, columns) == frozenset({"data"})
    with pytest.raises(ArenaError, match="already handed over"):
        _check(keeper, refs.copy(), own.arena_id)  # a replay would free the rows the stage buffers
    keeper.release(columns["data"])
    assert (own.states[refs[:, 1]] == FREE).all()
    again = _written(own)  # the writer reuses the blocks: its new rows are its to send
    assert (again[:, 1] == refs[:, 1]).all()
    _check(keeper, again, own.arena_id)


def test_references_from_a_worker_without_an_arena_are_refused(stage_and_arenas):
    keeper, own, _ = stage_and_arenas
    with pytest.raises(ArenaError, match="no arena"):
        _check(keeper, _written(own), None)


# -- reclaim ----------------------------------------------------------------------------------------------------
def test_rows_sent_to_a_client_dropped_while_it_may_still_read_them_stay_kept_as_long(stage_and_arenas):
    # A client stopped (SIGSTOP, a debugger) past the heartbeat timeout is dropped; its rows were freed at once,
    # given to another client's rows, and the stopped client, woken, copied those into its batches as its own.
    keeper, own, _ = stage_and_arenas
    session = types.SimpleNamespace(shm=True, outstanding=collections.deque())
    refs = _written(own)
    _check(keeper, refs, own.arena_id)
    keeper.outbound(session, {"data": keeper.specs.adopt(refs, SPEC["data"])}, frozenset({"data"}), 1)
    sent_at = session.outstanding[0][2]
    keeper.set_aside(session)
    assert not session.outstanding
    keeper.collect_specs([], [])  # the specs the rows set aside name are what frees them: kept
    keeper.reclaim([], sent_at + keeper.keep_s - 1.0)
    assert (own.states[refs[:, 1]] == USED).all() and keeper.held([], []) == {own.arena_id}
    keeper.reclaim([], sent_at + keeper.keep_s + 1.0)
    assert (own.states[refs[:, 1]] == FREE).all() and keeper.held([], []) == set()
    # Set aside in the order sessions drop, not the order their batches were sent: each freed in its time.
    early, late = (types.SimpleNamespace(shm=True, outstanding=collections.deque()) for _ in range(2))
    sent = {}
    for session, at in ((early, 100.0), (late, 130.0)):
        sent[id(session)] = rows = _written(own)
        _check(keeper, rows, own.arena_id)
        keeper.outbound(session, {"data": keeper.specs.adopt(rows, SPEC["data"])}, frozenset({"data"}), 1)
        session.outstanding[0] = (1, session.outstanding[0][1], at)
    keeper.set_aside(late)
    keeper.set_aside(early)
    keeper.reclaim([], 100.0 + keeper.keep_s + 1.0)
    assert (own.states[sent[id(early)][:, 1]] == FREE).all() and (own.states[sent[id(late)][:, 1]] == USED).all()


def test_rows_of_a_client_that_returns_no_credit_are_reclaimed_after_the_limit(stage_and_arenas):
    keeper, own, _ = stage_and_arenas

    session = types.SimpleNamespace(shm=True, outstanding=collections.deque())
    refs = _written(own)
    _check(keeper, refs, own.arena_id)
    adopted = keeper.specs.adopt(refs, SPEC["data"])
    keeper.outbound(session, {"data": adopted}, frozenset({"data"}), 1)
    sent_at = session.outstanding[0][2]
    keeper.reclaim([session], sent_at + 10.0)
    assert (own.states[refs[:, 1]] == USED).all()  # not yet
    keeper.reclaim([session], sent_at + 61.0)
    assert (own.states[refs[:, 1]] == FREE).all()
    assert len(session.outstanding) == 1  # the entry stays, so a late credit still lines up
    keeper.credited(session, 1, 1)
    assert not session.outstanding


# -- the size cap -----------------------------------------------------------------------------------------------
def test_a_data_socket_drops_messages_over_its_cap():
    pull = transport.pull("tcp://127.0.0.1:*", max_message_bytes=64 * 1024)
    push = transport.push(pull.endpoint)
    try:
        push.send([b"x" * (256 * 1024)])
        assert pull.recv(1.0) is None
        push2 = transport.push(pull.endpoint)  # the big sender was cut off; others still get through
        try:
            push2.send([msgpack.packb({"k": "ping"})])
            got = pull.recv(5.0)
            assert got is not None and P.decode(got)[0] == P.Ping()
        finally:
            push2.close()
    finally:
        push.close()
        pull.close()


# -- the handler guard ------------------------------------------------------------------------------------------
def test_a_handler_that_raises_on_a_peers_message_is_counted_and_the_daemon_goes_on(tmp_path, monkeypatch):
    from loader.config import LoaderConfig
    from loader.service.daemon.loop import Daemon

    np.save(tmp_path / "f.npy", np.arange(3))
    config = LoaderConfig.from_dict(
        {"source": {"files": [str(tmp_path / "*.npy")]}, "service": {"bind": "tcp://127.0.0.1:*"}}
    )
    with Daemon(config, start_workers=False) as daemon:

        def boom(*args):
            raise KeyError("what a peer's message made a handler do")

        monkeypatch.setattr(daemon.clients, "hello", boom)
        monkeypatch.setattr(daemon.stage, "on_done", boom)
        daemon._on_control(b"peer", P.encode(P.ClientHello()))
        daemon.coordinator.may_lease = lambda stream_id, file_index: True
        job_holder = daemon.coordinator.add_worker("w")
        daemon.coordinator.enqueue(1, 0, [0])
        job = daemon.coordinator.next_job(job_holder)
        assert job is not None
        done = P.FileDone(stream=1, file=0, lease=job.lease_id, worker="w", token=job.token, sent=3)
        daemon._on_data(P.encode(done))
        assert daemon.status()["rejected_messages"] == 2
        daemon.step(0.0)  # still serving


def test_forged_data_under_many_claimed_worker_names_is_logged_once_a_minute_not_once_per_name(
    tmp_path, caplog, monkeypatch
):
    """The data endpoint cannot tell senders apart: a worker name in a message whose lease it does not hold is
    the sender's claim, not who it is. Each new name got a log line of its own, so one PUSH socket sending
    forgeries under a fresh name each wrote a WARNING per message (2,000 messages, 2,000 lines)."""
    from loader.config import LoaderConfig
    from loader.service.daemon.loop import Daemon

    np.save(tmp_path / "f.npy", np.arange(3))
    config = LoaderConfig.from_dict(
        {"source": {"files": [str(tmp_path / "*.npy")]}, "service": {"bind": "tcp://127.0.0.1:*"}}
    )
    clock = [1000.0]
    with Daemon(config, start_workers=False) as daemon, caplog.at_level(logging.WARNING, logger="loader.daemon"):
        monkeypatch.setattr(time, "monotonic", lambda: clock[0])
        for i in range(200):
            forged = P.FileDone(stream=1, file=0, lease=1, worker=f"w{i}\n", token="t" * 32, sent=0)
            daemon._on_data(P.encode(forged))
        clock[0] += LOG_EVERY_S + 1
        daemon._on_data(P.encode(P.FileDone(stream=1, file=0, lease=1, worker="w0", sent=0)))
        assert daemon.status()["rejected_messages"] == 201
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("dropping a message")]
    assert len(lines) == 2, lines[:5]
    assert "worker 'w0" in lines[0] and lines[0].isprintable(), lines[0]  # the claim is still shown, as a claim


# -- clients asking for epoch after epoch ----------------------------------------------------------------------
@pytest.fixture
def idle_daemon(tmp_path):
    """A daemon without workers, its messages handed to it directly (no loop thread)."""
    from loader.config import LoaderConfig
    from loader.service.daemon.loop import Daemon

    np.save(tmp_path / "f.npy", np.arange(3))
    config = LoaderConfig.from_dict(
        {"source": {"files": [str(tmp_path / "*.npy")]}, "service": {"bind": "tcp://127.0.0.1:*"}}
    )
    with Daemon(config, start_workers=False) as daemon:
        yield daemon


def _epoch(daemon: Any, peer: bytes, n: int, **fields: Any) -> None:
    daemon._on_control(peer, P.encode(P.Epoch(epoch=n, gen=n + 1, credit=1, ahead=False, **fields)))


def _reading(daemon: Any, peer: bytes) -> tuple[int, int] | None:
    session = daemon.stage.sessions[peer]
    stream = session.current
    return None if stream is None else (stream.epoch, stream.gens[session.rank])


def test_epochs_asked_faster_than_their_cost_wait_in_line_and_only_a_clients_newest_starts(idle_daemon):
    """Starting an epoch costs the loop O(files); one client asking for epoch after epoch of 20,000 leases took the
    whole loop (another client's epoch stalled for 30 s under a loaded CI). The next EPOCH of any client now starts
    no sooner than ``EPOCH_PACING`` times the cost of the last; those asked sooner wait in line, and a client's
    waiting request is replaced by its next (it gave the older up)."""
    daemon = idle_daemon
    clients = daemon.clients
    flooder, honest = b"flooder", b"honest"
    for peer in (flooder, honest):
        daemon._on_control(peer, P.encode(P.ClientHello()))
    before = time.monotonic()
    _epoch(daemon, flooder, 0)
    assert _reading(daemon, flooder) == (0, 1)
    assert clients._epoch_due > before, "the pace is set by what the epoch cost"
    clients._epoch_due = time.monotonic() + 60  # as after an epoch that cost 15 s
    _epoch(daemon, flooder, 1)
    _epoch(daemon, honest, 0)
    _epoch(daemon, flooder, 2)
    assert _reading(daemon, flooder) == (0, 1) and _reading(daemon, honest) is None, "asked too soon: they wait"
    assert daemon.stage.sessions[flooder].credits == 0, "the epoch it gave up is not read on meanwhile"
    waiting = {c["session"]: c["epoch_waiting"] for c in daemon.status()["clients"]}
    assert sorted(waiting.values()) == [0, 2], "`loader status` shows who waits, and for which epoch"
    assert clients.parked_due_in(time.monotonic()) > 50
    assert clients.start_parked_epochs() == [] and _reading(daemon, honest) is None, "not due yet"
    streams = len(daemon.stage.streams)
    clients._epoch_due = 0.0
    clients.start_parked_epochs()
    # In the order asked (the flooder's newest asked last), and one at a time: the first start sets the pace.
    assert _reading(daemon, honest) == (0, 1) and _reading(daemon, flooder) == (0, 1)
    clients._epoch_due = 0.0
    clients.start_parked_epochs()
    assert _reading(daemon, flooder) == (2, 3), "the newest request starts; epoch 1 was given up, never made"
    assert len(daemon.stage.streams) == streams + 1, "the honest client's stream came; the flooder's replaced"
    assert clients.parked_due_in(time.monotonic()) == float("inf")
    assert daemon.status()["rejected_messages"] == 0


def test_a_refused_request_gives_up_the_one_waiting_and_a_client_that_leaves_takes_its_own(idle_daemon):
    daemon, clients, peer = idle_daemon, idle_daemon.clients, b"client"
    daemon._on_control(peer, P.encode(P.ClientHello()))
    clients._epoch_due = time.monotonic() + 60
    _epoch(daemon, peer, 3)
    _epoch(daemon, peer, 4, position=5)  # refused at once: a resume position without its anchor
    assert daemon.status()["rejected_messages"] == 1
    clients._epoch_due = 0.0
    clients.start_parked_epochs()
    assert _reading(daemon, peer) is None, "epoch 3 was given up when epoch 4 was asked for"
    clients._epoch_due = time.monotonic() + 60
    _epoch(daemon, peer, 5)
    daemon._on_control(peer, P.encode(P.Bye()))
    assert clients.parked_due_in(time.monotonic()) == float("inf"), "its request left with it"


def test_reconnecting_does_not_reset_the_pace(idle_daemon):
    """The pace is the daemon's, not a session's: a client saying goodbye and hello again (or a fresh identity
    each time) waits in the same line, and dropping its streams (O(files) too) paces the next epoch."""
    daemon, clients, peer = idle_daemon, idle_daemon.clients, b"client"
    daemon._on_control(peer, P.encode(P.ClientHello()))
    _epoch(daemon, peer, 0)
    clients._epoch_due = due = time.monotonic() + 60
    daemon._on_control(peer, P.encode(P.Bye()))
    daemon._on_control(peer, P.encode(P.ClientHello()))
    _epoch(daemon, peer, 1)
    assert _reading(daemon, peer) is None and clients._epoch_due >= due


def test_an_epoch_that_fails_to_start_fails_that_request_not_the_daemon(idle_daemon, monkeypatch):
    daemon, clients, peer = idle_daemon, idle_daemon.clients, b"client"
    daemon._on_control(peer, P.encode(P.ClientHello()))
    clients._epoch_due = time.monotonic() + 60
    _epoch(daemon, peer, 0)

    def boom(*args: Any) -> None:
        raise KeyError("what no check foresaw")

    monkeypatch.setattr(clients, "_stream_for", boom)
    told: list[Any] = []
    monkeypatch.setattr(clients._router, "send", lambda to, frames: told.append((to, P.decode(frames)[0])) or True)
    clients._epoch_due = 0.0
    daemon.step(0.0)  # starts the waiting request in the loop: it fails, and the loop goes on
    assert daemon.status()["rejected_messages"] == 1
    ((to, error),) = told  # the client is told, not left to its timeout
    assert to == peer and isinstance(error, P.Error) and error.gen == 1
    assert error.error["message"] == "EPOCH failed: KeyError: 'what no check foresaw'"
    daemon.step(0.0)


def test_an_epoch_credit_out_of_bounds_is_refused_to_that_request(idle_daemon, monkeypatch):
    # Refused without the request's gen, the ERROR was dropped by the client, which waited out its timeout.
    daemon, peer = idle_daemon, b"client"
    daemon._on_control(peer, P.encode(P.ClientHello()))
    told: list[Any] = []
    monkeypatch.setattr(daemon.clients._router, "send", lambda to, frames: told.append(P.decode(frames)[0]) or True)
    daemon._on_control(peer, P.encode(P.Epoch(epoch=0, gen=7, credit=5000)))
    ((error,),) = [told]
    assert (
        isinstance(error, P.Error) and error.gen == 7 and "an epoch credit of 5000 is outside 1..1024" in error.message
    )
    assert daemon.status()["rejected_messages"] == 1


def test_rows_of_a_file_that_changed_under_its_lease_fail_that_file_by_name_at_once(idle_daemon, monkeypatch):
    """The stage refuses file rows of a file that changed under its lease (``bind_file_rows``). The chunk was
    dropped as a peer's bad message, and the epoch failed at the lease's FILE_DONE as LostDataError ("a chunk was
    lost on the way"), the cause only in the daemon's log. The worker holds the lease: the file fails now."""
    from loader.service.daemon.streams import StreamFailed
    from loader.service.shm.file_layout import FileChangedError

    daemon, peer = idle_daemon, b"client"
    daemon._on_control(peer, P.encode(P.ClientHello()))
    _epoch(daemon, peer, 0)
    stream = daemon.stage.sessions[peer].current
    worker = daemon.coordinator.add_worker("w1")
    job = daemon.coordinator.next_job(worker)
    assert job is not None and job.stream_id == stream.stream_id
    chunk = P.Chunk(stream=stream.stream_id, file=job.file_index, lease=job.lease_id, worker="w1", record=1, count=2)
    monkeypatch.setattr(daemon.stage, "chunk_problem", lambda chunk, columns: None)

    def changed(*args: Any) -> None:
        raise FileChangedError(f"{job.path} changed while its lease was read (size, mtime or inode)")

    monkeypatch.setattr(daemon.stage.refs, "check_owned", changed)
    assert daemon._on_file_message(chunk, {}) is None, "not the peer's fault: no refusal counted"
    (event,) = [e for e in daemon.stage.events if isinstance(e, StreamFailed)]
    error = event.error
    assert (error["type"], error["file"], error["record"], error["worker"]) == ("FileChangedError", job.path, 1, "w1")
    assert error["message"].endswith("changed while its lease was read (size, mtime or inode)")


def test_under_skip_a_file_that_changed_under_its_lease_skips_the_rest_counted_at_its_file_done(
    tmp_path, monkeypatch, caplog
):
    """Under ``skip`` the worker goes on sending the lease: failing the file at the first refused chunk ended the
    lease under it, so its later chunks and its FILE_DONE came late and only that chunk's records were counted."""
    from loader.config import LoaderConfig
    from loader.service.daemon.loop import Daemon
    from loader.service.shm.file_layout import FileChangedError

    np.save(tmp_path / "f.npy", np.arange(100))
    config = LoaderConfig.from_dict(
        {
            "source": {"files": [str(tmp_path / "*.npy")]},
            "pipeline": {"on_error": "skip", "batch_size": 4},
            "service": {"bind": "tcp://127.0.0.1:*"},
        }
    )
    with Daemon(config, start_workers=False) as daemon:
        peer = b"client"
        daemon._on_control(peer, P.encode(P.ClientHello()))
        _epoch(daemon, peer, 0)
        stream = daemon.stage.sessions[peer].current
        job = daemon.coordinator.next_job(daemon.coordinator.add_worker("w1"))
        assert job is not None
        tag = {"stream": stream.stream_id, "file": job.file_index, "lease": job.lease_id, "worker": "w1"}

        def chunk(record: int) -> list[Any]:
            return P.encode(
                P.Chunk(**tag, token=job.token, record=record, count=10), {"x": np.arange(record, record + 10)}
            )

        daemon._on_data(chunk(0))

        def changed(*args: Any) -> None:
            raise FileChangedError(f"{job.path} changed while its lease was read (size, mtime or inode)")

        monkeypatch.setattr(daemon.stage.refs, "check_owned", changed)
        for record in range(10, 100, 10):
            daemon._on_data(chunk(record))
            daemon.clients.handle_events()
        daemon._on_data(P.encode(P.FileDone(**tag, token=job.token, sent=100, skipped=3)))
        daemon.clients.handle_events()
        assert daemon.stage.skipped_records == 93, "the 90 records refused and the 3 the worker skipped"
        assert daemon.late_data == 0 and daemon.status()["rejected_messages"] == 0
        (line,) = [r.getMessage() for r in caplog.records if "skipping the rest of" in r.getMessage()]
        assert "FileChangedError" in line and "changed while its lease was read" in line, line
