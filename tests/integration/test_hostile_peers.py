"""Hostile peers against a live daemon: each attack is refused or bounded, and a legitimate client still
reads exact epochs afterwards (docs/security.md). One test per attack the tracker lists."""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import msgpack
import numpy as np
import pytest

from loader import Client
from loader.errors import WorkerError
from loader.service import protocol as P
from loader.service import transport
from loader.service.client.client import query_status
from tests.helpers import wait_until
from tests.integration.conftest import collect_ids, collect_ids_meanwhile, make_config, running_daemon, write_id_files

pytestmark = pytest.mark.integration

FILES = [300, 250, 400, 120, 350, 200]
HOSTILE = {
    "service": {"max_workers": 4, "max_clients": 6, "max_message_mib": 1},
    # Fake workers that hold leases and send nothing are replaced after this long. A fake heartbeats once
    # before it forges: the heartbeat timeout leaves a loaded machine time to read its chunks as its own.
    "workers": {"progress_timeout_s": 3.0, "heartbeat_timeout_s": 6.0},
}


FORGER_JOIN_TIMEOUT_S = 30.0


def _config(tmp_path: Any, **overrides: Any) -> Any:
    sections = {name: dict(values) for name, values in HOSTILE.items()}
    for name, values in overrides.items():
        sections.setdefault(name, {}).update(values)
    return make_config(tmp_path, pipeline={"batch_size": 20, "shuffle_buffer": 50}, **sections)


def _ready(daemon: Any, workers: int = 2) -> None:
    assert wait_until(
        lambda: sum(w["connected"] for w in query_status(daemon.endpoint)["workers"]) >= workers, timeout_s=30
    )


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    data = tmp_path_factory.mktemp("hostile-data")
    ids = write_id_files(data, len(FILES), FILES)
    with running_daemon(_config(data)) as daemon:
        _ready(daemon)
        yield daemon, ids


def exact_epochs(daemon: Any, ids: list[int], epochs: int = 1) -> None:
    with Client(daemon.endpoint, timeout_s=30) as client:
        for _ in range(epochs):
            assert collections.Counter(collect_ids(client.epoch())) == collections.Counter(ids)


def rejected(daemon: Any) -> int:
    return int(query_status(daemon.endpoint)["rejected_messages"])


@contextlib.contextmanager
def raw_peer(endpoint: str) -> Iterator[Any]:
    peer = transport.dealer(endpoint)
    try:
        yield peer
    finally:
        peer.close()


def ask(peer: Any, frames: list[Any], timeout_s: float = 5.0) -> P.Message | None:
    peer.send(frames)
    got = peer.recv(timeout_s)
    return P.decode(got)[0] if got is not None else None


def raw(**head: Any) -> list[bytes]:
    return [msgpack.packb(head, use_bin_type=True)]


def live_worker_ids(daemon: Any) -> list[str]:
    return [w["id"] for w in query_status(daemon.endpoint)["workers"] if w["connected"]]


# -- 11: no single message stops the daemon ---------------------------------------------------------------------
def test_bad_messages_on_both_endpoints_are_dropped_counted_and_the_daemon_serves_on(hostile):
    daemon, ids = hostile
    before = rejected(daemon)
    with raw_peer(daemon.endpoint) as peer:
        # A world size of millions froze the loop for seconds at each epoch's end and took GiBs (a padding block per rank).
        hellos = (
            P.ClientHello(rank=3, world_size=2),
            P.ClientHello(prefetch=10**9),
            P.ClientHello(world_size=4_000_000),
        )
        for hello in hellos:
            answer = ask(peer, P.encode(hello))
            assert isinstance(answer, P.Error) and answer.message, answer
        assert isinstance(ask(peer, P.encode(P.ClientHello(prefetch=2))), P.ClientWelcome)
        peer.send(raw(k="epoch", g=1))  # epoch missing
        peer.send(raw(k="epoch", e=-1, g=1))  # negative epoch
        peer.send(P.encode(P.Credit(n=2**61, gen=1)))  # a credit no client can have in flight
        answer = ask(peer, P.encode(P.Epoch(epoch=0, gen=1, credit=10**9)))
        assert isinstance(answer, P.Error), answer
        # Positions the daemon would count on from past what the wire carries (it then sent batches no client reads).
        for epoch, position, anchor in ((2**61, 0, None), (0, 2**62 - 1, [2**62 - 2, 0, 0]), (0, 1, [0, 2**60, 0])):
            answer = ask(peer, P.encode(P.Epoch(epoch=epoch, gen=2, credit=2, position=position, anchor=anchor)))
            assert isinstance(answer, P.Error) and "2**60" in answer.message, answer
        peer.send(P.encode(P.Bye()))
    push = transport.push(daemon.data_endpoint)
    try:
        push.send([b"\x93not msgpack"])
        push.send(P.encode(P.Hello(worker="x")))  # a control message on the data endpoint
        push.send(P.encode(P.FileDone(stream=1, file=0, lease=1, worker="nobody", sent=0)))
        # Open until they arrived: a socket closed at once (linger 0) drops what it has not sent.
        assert wait_until(lambda: rejected(daemon) == before + 13, timeout_s=10), rejected(daemon) - before
    finally:
        push.close()
    exact_epochs(daemon, ids)


def test_hellos_of_another_version_are_logged_once_a_minute_per_peer_not_once_each(hostile, caplog):
    """A refused hello is a bad message like any other: counted each time, logged at most once per peer per
    minute (each refusal was logged as an ERROR line, so one peer could fill the daemon's log)."""
    daemon, ids = hostile
    before = rejected(daemon)
    other = P.PROTOCOL_VERSION + 1
    hellos = 10
    with caplog.at_level(logging.INFO, logger="loader"), raw_peer(daemon.endpoint) as peer:
        for _ in range(hellos):
            for hello in (P.Hello(worker="old", pid=1, version=other), P.ClientHello(version=other)):
                answer = ask(peer, P.encode(hello))
                assert isinstance(answer, P.Error) and answer.refused == "version", answer
        assert wait_until(lambda: rejected(daemon) == before + 2 * hellos, timeout_s=10), rejected(daemon) - before
    lines = [r.getMessage() for r in caplog.records if f"speaks loader protocol {other}" in r.getMessage()]
    assert len(lines) == 1, lines
    exact_epochs(daemon, ids)


def test_text_a_peer_chooses_cannot_forge_log_lines(hostile, caplog):
    """A worker's name and a peer's package version reach the daemon's log: a newline in them wrote a
    line of the peer's choosing (a forged ERROR), an escape sequence reached the operator's terminal."""
    daemon, ids = hostile
    forged = "x\n2026-01-01 00:00:00,000 ERROR loader.daemon: forged\x1b[2J"
    other = P.PROTOCOL_VERSION + 1
    hellos = (
        P.Hello(worker=forged, pid=1),
        P.Hello(worker=forged, pid=1, version=other, package=forged),
        P.ClientHello(version=other, package=forged),
    )
    with caplog.at_level(logging.INFO, logger="loader"):
        for hello in hellos:
            with raw_peer(daemon.endpoint) as peer:  # a peer each: refusals are logged once a minute per peer
                answer = ask(peer, P.encode(hello))
                assert isinstance(answer, P.Welcome if hello.version == P.PROTOCOL_VERSION else P.Error), answer
                if isinstance(answer, P.Welcome):
                    assert answer.worker.isprintable() and answer.worker.startswith("x?2026"), answer.worker
                    peer.send(P.encode(P.Bye()))
                    assert wait_until(lambda name=answer.worker: name not in live_worker_ids(daemon), timeout_s=5)

        def forged_lines() -> list[str]:
            return [r.getMessage() for r in caplog.records if "forged" in r.getMessage()]

        # The daemon logs a refusal after sending it: the last one may still be on its way (a loaded CI saw 3).
        wait_until(lambda: len(forged_lines()) >= 4, timeout_s=5)
    lines = forged_lines()
    assert len(lines) >= 4, lines  # joined, left, and the two refusals
    assert all(line.isprintable() for line in lines), lines
    exact_epochs(daemon, ids)


def test_a_peer_saying_hello_and_goodbye_in_a_loop_gets_a_log_line_a_minute(tmp_path, caplog):
    """Attaching, detaching, joining and leaving are routine INFO lines, written for each message: one peer
    saying hello in a loop wrote two lines a message (4,000 lines, 400 KB, a second). A daemon of its own:
    each worker hello retires an arena, and retired arenas count against the cap for a while."""
    ids = write_id_files(tmp_path, len(FILES), FILES)
    rounds = 30
    with running_daemon(_config(tmp_path)) as daemon, caplog.at_level(logging.INFO, logger="loader"):
        _ready(daemon)
        with raw_peer(daemon.endpoint) as peer:
            for _ in range(rounds):
                assert isinstance(ask(peer, P.encode(P.ClientHello(prefetch=1))), P.ClientWelcome)
            assert isinstance(ask(peer, P.encode(P.Status())), P.Status)
            peer.send(P.encode(P.Bye()))
        with raw_peer(daemon.endpoint) as peer:
            for _ in range(rounds):
                welcome = ask(peer, P.encode(P.Hello(pid=1)))
                assert isinstance(welcome, P.Welcome), welcome
                peer.send(P.encode(P.Bye()))  # its record goes; the next hello is a new worker on this connection
            assert wait_until(lambda: welcome.worker not in live_worker_ids(daemon), timeout_s=5)
        said = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
        clients = [
            kind for line in said if line.startswith("client ") for kind in ("attached", "detached") if kind in line
        ]
        workers = [kind for line in said if "(pid 1)" in line for kind in ("joined", "left") if kind in line]
        lines = collections.Counter(clients + workers)
        assert lines == {"attached": 1, "detached": 1, "joined": 1, "left": 1}, lines
        exact_epochs(daemon, ids)


@pytest.mark.slow
def test_a_flood_of_epoch_requests_over_many_leases_stops_no_worker_and_fails_no_epoch(tmp_path):
    """An EPOCH costs the loop O(leases) (a stream and a queued lease of each): 0.3 s for 20,000. The loop
    took 64 control messages a turn whatever they cost, so one client asking for epoch after epoch of a
    large dataset held worker data unread for seconds: honest workers were stopped as hung and another
    client's epoch failed. Control messages now stop for the turn once they took ``CONTROL_DRAIN_BUDGET_S``,
    and a client's EPOCHs wait for its pace (``desk.EPOCH_PACING``): with the budget alone, one EPOCH a turn still
    took most of the loop, and under a loaded CI with coverage the honest epoch took 40 s and failed as stalled."""
    ids = write_id_files(tmp_path, len(FILES), FILES)
    big = tmp_path / "big"
    big.mkdir()
    np.save(big / "big.npy", np.arange(20_000, dtype=np.int64))
    datasets = {"big": {"source": {"files": [str(big / "big.npy")], "records_per_lease": 1}}}
    # Heartbeats wait their turn behind the flood's EPOCHs (0.3 s each, more on a loaded machine): 8 s of
    # silence, not the test config's 2, counts as hung. The old loop stalled 19 s a turn (64 EPOCHs).
    config = _config(tmp_path, datasets=datasets, workers={"heartbeat_timeout_s": 8.0})
    with running_daemon(config) as daemon:
        _ready(daemon)
        restarts = query_status(daemon.endpoint)["worker_restarts"]
        stop, sent, failures = threading.Event(), [0], []

        def flood() -> None:
            try:
                with raw_peer(daemon.endpoint) as peer:
                    assert isinstance(ask(peer, P.encode(P.ClientHello(dataset="big"))), P.ClientWelcome)
                    while not stop.is_set():
                        request = P.Epoch(epoch=sent[0], gen=sent[0] + 1, credit=1, ahead=False)
                        sent[0] += peer.try_send(P.encode(request), timeout_s=0.1)
                        while peer.recv(0) is not None:
                            pass
            except BaseException as exc:  # reaches the assertion below
                failures.append(exc)

        flooder = threading.Thread(target=flood, name="epoch-flood", daemon=True)
        flooder.start()
        try:
            assert wait_until(lambda: sent[0] >= 100, timeout_s=10)
            exact_epochs(daemon, ids)
        finally:
            stop.set()
            flooder.join(FORGER_JOIN_TIMEOUT_S)
        assert not flooder.is_alive() and not failures, failures
        assert query_status(daemon.endpoint)["worker_restarts"] == restarts


# -- 12: data is accepted only from the worker holding the lease, with its token --------------------------------
def _forgery(kind: str, stream: int, file: int, lease: int, worker: str) -> list[Any]:
    tag = {"stream": stream, "file": file, "lease": lease, "worker": worker}
    if kind == "chunk":
        values = np.arange(10**9, 10**9 + 512, dtype=np.int64)
        return P.encode(P.Chunk(**tag, record=0, count=512), {"data": values})
    if kind == "done_empty":
        return P.encode(P.FileDone(**tag, sent=0))
    if kind == "done_huge":
        return P.encode(P.FileDone(**tag, sent=10**9))
    return P.encode(P.FileError(**tag, error={"type": "Forged", "message": "attacker's words"}))


@pytest.mark.parametrize("kind", ["chunk", "done_empty", "done_huge", "error"])
def test_forged_data_messages_change_nothing(hostile, kind):
    daemon, ids = hostile
    workers = live_worker_ids(daemon)
    with Client(daemon.endpoint, timeout_s=30, prefetch=1) as client:
        batches = client.epoch()
        first = [next(batches)]  # the epoch's stream is open: one credit, files still being read
        status = query_status(daemon.endpoint)
        before = status["rejected_messages"]
        push = transport.push(daemon.data_endpoint)
        sent, failures = [0], []

        def forge() -> None:
            # Every stream id the daemon can have made so far, every file, the leases nearby, each real worker.
            try:
                for stream in range(1, 4 * len(status["clients"]) + 40):
                    for file in range(len(FILES)):
                        for worker in workers:
                            push.send(_forgery(kind, stream, file, stream * len(FILES) + file, worker))
                            sent[0] += 1
            except BaseException as exc:  # reaches the assertion below
                failures.append(exc)

        # Forged while the client reads on: a daemon whose stage is full reads no data (workers wait), so
        # the forgeries are read, and refused, as the epoch's genuine data flows.
        forger = threading.Thread(target=forge, name="forger", daemon=True)
        forger.start()
        try:
            got = collect_ids(first) + collect_ids(batches)
            forger.join(FORGER_JOIN_TIMEOUT_S)
            assert not forger.is_alive() and not failures, failures
            # Every forgery arrived and was refused (the socket stays open until then: linger is 0).
            assert wait_until(lambda: rejected(daemon) >= before + sent[0], timeout_s=20)
        finally:
            forger.join(FORGER_JOIN_TIMEOUT_S)
            push.close()
    assert collections.Counter(got) == collections.Counter(ids)
    exact_epochs(daemon, ids)


def test_columns_of_a_message_nobody_may_send_are_never_decoded(hostile, monkeypatch):
    """An object column costs many times its bytes to decode: a 64 MiB frame of small integers took the
    daemon 1.1 GiB and over 8 s, and its own workers, hearing nothing, left. Such a frame came from anyone
    who reached the data endpoint, decoded before the daemon asked whether the sender held the lease; and
    on the control endpoint, where no message with columns belongs."""
    daemon, ids = hostile
    decoded: list[int] = []
    real = P.read_columns
    monkeypatch.setattr(
        P, "read_columns", lambda described, frames: decoded.append(len(frames)) or real(described, frames)
    )
    rows = 100_000  # a frame of 100,000 one-byte integers: 100,000 Python objects, and an object array of them
    values = P.object_array([0] * rows)
    tag = {"stream": 1, "file": 0, "lease": 1, "worker": live_worker_ids(daemon)[0], "token": "0" * 32}
    before = rejected(daemon)
    push = transport.push(daemon.data_endpoint)
    try:
        push.send(P.encode(P.Chunk(**tag, count=rows), {"data": values}))
        with raw_peer(daemon.endpoint) as peer:
            peer.send(P.encode(P.Batch(epoch=0, count=rows), {"data": values}))
            assert wait_until(lambda: rejected(daemon) == before + 2, timeout_s=10), rejected(daemon) - before
    finally:
        push.close()
    assert decoded == []
    monkeypatch.undo()
    exact_epochs(daemon, ids)


def test_a_data_message_header_over_its_cap_is_never_unpacked(hostile, monkeypatch):
    """A data message's header is unpacked before anything else is checked, and the data endpoint takes
    messages of up to ``service.max_message_mib`` (256 MiB by default): 64 MiB of small msgpack integers in
    a header cost the daemon 0.6 GiB. Honest headers take a few KiB."""
    from loader.service.daemon import loop

    daemon, ids = hostile
    cap = 64 * 1024  # the fixture's data messages stop at 1 MiB
    monkeypatch.setattr(loop, "MAX_DATA_HEAD_BYTES", cap)
    unpacked: list[int] = []  # sizes of the headers unpacked over the cap
    real = P.decode_head

    def spy(frames: Any) -> Any:
        if len(P.buffer_of(frames[0])) > cap:
            unpacked.append(len(P.buffer_of(frames[0])))
        return real(frames)

    monkeypatch.setattr(P, "decode_head", spy)
    tag = {"k": "chunk", "s": 1, "f": 0, "l": 1, "w": live_worker_ids(daemon)[0], "t": "0" * 32, "n": 0}
    before = rejected(daemon)
    push = transport.push(daemon.data_endpoint)
    try:
        push.send([msgpack.packb({**tag, "pad": [0] * 100_000}, use_bin_type=True)])
        assert wait_until(lambda: rejected(daemon) == before + 1, timeout_s=10), rejected(daemon) - before
    finally:
        push.close()
    assert unpacked == []
    monkeypatch.undo()
    exact_epochs(daemon, ids)


# -- 14: a HELLO cannot take over a live worker -----------------------------------------------------------------
def test_hello_with_a_live_workers_id_gets_its_own_record_and_its_bye_ends_only_that(hostile):
    daemon, ids = hostile
    before = query_status(daemon.endpoint)
    victim = live_worker_ids(daemon)[0]
    with raw_peer(daemon.endpoint) as peer:
        welcome = ask(peer, P.encode(P.Hello(worker=victim, pid=1)))
        assert isinstance(welcome, P.Welcome) and welcome.worker != victim
        peer.send(P.encode(P.Bye()))
    with raw_peer(daemon.endpoint) as peer:
        refused = ask(peer, P.encode(P.Hello(worker=f"{victim}#0123456789abcdef", pid=1)))
        assert isinstance(refused, P.Error) and refused.refused == "worker"
    assert wait_until(lambda: welcome.worker not in live_worker_ids(daemon), timeout_s=5)
    after = query_status(daemon.endpoint)
    assert victim in live_worker_ids(daemon)
    assert after["worker_restarts"] == before["worker_restarts"]
    exact_epochs(daemon, ids)


# -- 16: the daemon does not buffer oversized messages ----------------------------------------------------------
def test_a_control_message_over_the_size_cap_is_not_received(hostile):
    daemon, ids = hostile
    padded = [msgpack.packb({"k": "status", "pad": b"x" * (2 * 1024 * 1024)}, use_bin_type=True)]
    with raw_peer(daemon.endpoint) as peer:
        assert ask(peer, padded, timeout_s=2.0) is None  # zmq disconnected the sender unread
    with raw_peer(daemon.endpoint) as peer:
        assert isinstance(ask(peer, P.encode(P.Status())), P.Status)
    exact_epochs(daemon, ids)


# -- 13 and 17: a worker that holds a lease can neither forge references nor stall the epoch --------------------
class FakeWorker:
    """A raw peer speaking the worker protocol: hello, one lease, then whatever the test sends."""

    def __init__(self, endpoint: str) -> None:
        self.peer = transport.dealer(endpoint)
        welcome = ask(self.peer, P.encode(P.Hello(pid=1)))
        assert isinstance(welcome, P.Welcome), welcome
        self.welcome = welcome
        self.data = transport.push(transport.reachable_endpoint(welcome.data, endpoint))

    def ask_lease(self) -> None:
        """Ask before the epoch starts: the daemon leases to every waiting worker in turn."""
        self.peer.send(P.encode(P.LeaseRequest()))

    def heartbeat(self) -> None:
        """Say it is alive: the daemon drops a worker silent for ``heartbeat_timeout_s``, and then counts its
        chunks as a lost worker's stale data, not as refused ones."""
        self.peer.send(P.encode(P.Heartbeat()))

    def lease(self) -> P.Lease:
        for _ in range(100):
            got = self.peer.recv(0.2)
            message = P.decode(got)[0] if got is not None else None
            if isinstance(message, P.Lease):
                return message
            self.heartbeat()
        raise AssertionError("no lease came")

    def close(self) -> None:
        self.data.close()
        self.peer.close()


def _forged_chunks_are_refused(hostile: Any, forge: Callable[[FakeWorker, P.Lease, dict[str, Any]], int]) -> None:
    """A fake worker takes a lease while a client reads; ``forge`` sends chunks under it (returns how many),
    every one of them must be refused, and the client still gets every sample once, now and after."""
    daemon, ids = hostile
    before = rejected(daemon)
    fake = FakeWorker(daemon.endpoint)
    try:
        with Client(daemon.endpoint, timeout_s=30) as client:
            fake.ask_lease()
            # The epoch is asked for at its first batch, which the reading thread waits for: its first lease goes
            # to the fake, which asked first (and a stage left full would stop reading every worker's data).
            read = collect_ids_meanwhile(client.epoch())
            # Forged at once: a lease that sends nothing for progress_timeout_s is taken from its holder, and its
            # chunks then count as a lost worker's stale data, not as refused (waiting for a first batch before
            # forging took a loaded CI past it).
            lease = fake.lease()
            tag = {"stream": lease.stream, "file": lease.file, "lease": lease.lease, "worker": fake.welcome.worker}
            fake.heartbeat()
            sent = forge(fake, lease, tag)
            assert wait_until(lambda: fake.heartbeat() or rejected(daemon) >= before + sent, timeout_s=10)
            fake.peer.send(P.encode(P.Bye()))  # its lease goes to a real worker now, not after progress_timeout_s
            got = read()
        assert collections.Counter(got) == collections.Counter(ids)
    finally:
        fake.close()
    exact_epochs(daemon, ids)


@pytest.mark.slow
def test_forged_arena_references_from_a_lease_holder_are_refused(hostile):
    def forge(fake: FakeWorker, lease: P.Lease, tag: dict[str, Any]) -> int:
        own = (fake.welcome.shm or {}).get("arena")
        assert own is not None, "the daemon gives shared memory to its workers"
        spec = {"data": {0: ["<i8", [8192]]}}  # 64 KiB rows: one block each
        forged = [(own - 1, 0), (own, -1), (own, 10**9), (own, 0)]  # another's, wrapping, far, free
        for arena, block in forged:
            refs = np.array([[arena, block, 0]], dtype=np.int64)
            chunk = P.Chunk(**tag, token=lease.token, count=1, refs=spec)
            fake.data.send(P.encode(chunk, {"data": refs}))
        return len(forged)

    _forged_chunks_are_refused(hostile, forge)


@pytest.mark.slow
def test_forged_file_rows_from_a_lease_holder_are_refused(hostile):
    def forge(fake: FakeWorker, lease: P.Lease, tag: dict[str, Any]) -> int:
        assert (fake.welcome.shm or {}).get("arena") is not None
        ok_spec = {"data": {0: ["<i8", []]}}  # the id files hold int64 scalars
        forged = [
            (0, [[-2, 5, 0]], ok_spec, "data"),  # a row that is not the chunk's record
            (10**6, [[-2, 10**6, 0]], ok_spec, "data"),  # past the file's end
            (0, [[-2, 0, 0]], {"data": {0: ["<i8", [8192]]}}, "data"),  # a spec the header does not give
            (0, [[-2, 0, 0]], {"../../../etc/passwd": {0: ["<i8", []]}}, "../../../etc/passwd"),  # no such member
            (0, [[-2, 0, 0]], {"label": {0: ["<i8", []]}}, "label"),  # a companion that is not there
            (0, [[-3, 0, 0]], ok_spec, "data"),  # a stage-side file id: not the worker's to name
        ]
        for record, refs, spec, name in forged:
            chunk = P.Chunk(**tag, token=lease.token, record=record, count=1, refs=spec)
            fake.data.send(P.encode(chunk, {name: np.array(refs, dtype=np.int64)}))
        return len(forged)

    _forged_chunks_are_refused(hostile, forge)


# -- 15: floods of hellos are capped ----------------------------------------------------------------------------
@pytest.mark.slow
def test_hello_floods_are_refused_at_the_caps(tmp_path):
    ids = write_id_files(tmp_path, len(FILES), FILES)
    with running_daemon(_config(tmp_path)) as daemon:
        _ready(daemon)
        peers = [transport.dealer(daemon.endpoint) for _ in range(20)]
        try:
            answers = [ask(peer, P.encode(P.Hello(pid=1))) for peer in peers]
            welcomed = [a for a in answers if isinstance(a, P.Welcome)]
            assert len(welcomed) == 4  # service.max_workers
            assert all(isinstance(a, P.Error) and "max_workers" in a.message for a in answers[4:])
            for peer in peers[:4]:  # re-hellos from admitted peers make no more arenas than the cap
                for _ in range(20):
                    ask(peer, P.encode(P.Hello(pid=1)))
            status = query_status(daemon.endpoint)
            assert status["shm_arenas"] <= 2 * (4 + 2)
            assert len(status["workers"]) == 6
            clients = [transport.dealer(daemon.endpoint) for _ in range(8)]
            try:
                answers = [ask(c, P.encode(P.ClientHello(prefetch=1))) for c in clients]
                assert sum(isinstance(a, P.ClientWelcome) for a in answers) == 6  # service.max_clients
                assert all(isinstance(a, P.Error) and a.refused == "capacity" for a in answers[6:])
            finally:
                for c in clients:
                    c.send(P.encode(P.Bye()))
                    c.close()
        finally:
            for peer in peers:
                peer.close()
        # The silent fakes are dropped after heartbeat_timeout_s; the real client is served throughout.
        exact_epochs(daemon, ids)


@pytest.mark.slow
def test_a_fake_worker_that_takes_leases_and_sends_nothing_stalls_nothing_past_the_progress_timeout(tmp_path):
    ids = write_id_files(tmp_path, len(FILES), FILES)
    with running_daemon(_config(tmp_path, workers={"count": 1})) as daemon:
        _ready(daemon, 1)
        fake = FakeWorker(daemon.endpoint)
        try:
            with Client(daemon.endpoint, timeout_s=30) as client:
                fake.ask_lease()
                batches = client.epoch()
                first = [next(batches)]
                fake.lease()  # held, never served; heartbeats keep the fake "alive"
                got = collect_ids(first) + collect_ids(batches)
            assert collections.Counter(got) == collections.Counter(ids)
            assert fake.welcome.worker not in live_worker_ids(daemon) or not any(
                w["leases"] for w in query_status(daemon.endpoint)["workers"] if w["id"] == fake.welcome.worker
            )
        finally:
            fake.close()


# -- 17: shared-memory rows of a client that never returns credits --------------------------------------------
@pytest.mark.slow
def test_arena_rows_of_clients_that_return_no_credit_are_reclaimed(tmp_path):
    from tests.integration.test_service_shm import write_large_files

    ids = write_large_files(tmp_path, 3, 24)
    config = make_config(
        tmp_path,
        pipeline={"batch_size": 4},
        workers={"samples_per_message": 4},
        service={"reclaim_after_s": 1.0},
    )

    def outstanding_rows() -> int:
        """Rows sent to clients by reference and not yet freed (read across threads: polled only)."""
        sessions = list(daemon.stage.sessions.values())
        return sum(len(refs) for s in sessions for entry in list(s.outstanding) for refs in entry[1])

    with running_daemon(config) as daemon:
        _ready(daemon)
        fakes = [transport.dealer(daemon.endpoint) for _ in range(3)]
        try:
            for fake in fakes:  # claim shared memory, take batches, never credit them
                assert isinstance(ask(fake, P.encode(P.ClientHello(prefetch=4))), P.ClientWelcome)
                fake.send(P.encode(P.Epoch(epoch=0, gen=1, credit=4, shm=True)))
            pinned = wait_until(lambda: outstanding_rows() >= 3 * 4 * 4, timeout_s=20)
            assert pinned, "the fakes were sent rows by reference"

            def reclaimed() -> bool:
                for fake in fakes:  # alive: pings keep their sessions
                    fake.send(P.encode(P.Ping()))
                    while fake.recv(0) is not None:
                        pass
                return outstanding_rows() == 0

            assert wait_until(reclaimed, timeout_s=20, interval_s=0.3)
            assert len(query_status(daemon.endpoint)["clients"]) == 3  # still attached, yet holding nothing
        finally:
            for fake in fakes:
                fake.close()
        with Client(daemon.endpoint, timeout_s=30) as client:
            got = [int(i) for batch in client.epoch() for i in batch["data"][:, 0]]
        assert collections.Counter(got) == collections.Counter(ids)


def test_a_job_of_a_huge_world_size_fails_its_epoch_at_the_byte_bound_not_at_the_stall_timeout(tmp_path):
    """A client saying world_size 65,536 would have the daemon buffer its input for ranks that never come (a
    step of 1.3 M rows here): the epoch fails once the first chunk shows what a step would take, naming the
    setting, and the daemon serves honest jobs on."""
    ids = write_id_files(tmp_path, len(FILES), FILES)
    with running_daemon(_config(tmp_path, service={"stream_buffer_mib": 1})) as daemon:
        _ready(daemon)
        started = time.monotonic()
        with Client(daemon.endpoint, rank=0, world_size=P.MAX_WORLD_SIZE, timeout_s=30) as client:
            with pytest.raises(WorkerError, match=r"world_size 65536 x batch_size 20.*service\.stream_buffer_mib = 1"):
                collect_ids(client.epoch())
        assert time.monotonic() - started < 20, "failed by the byte bound, not by a timeout"
        exact_epochs(daemon, ids)


# -- a chunk that fails once its rows are counted ----------------------------------------------------------------
def test_chunks_of_a_structured_dtype_fail_the_epoch_naming_the_file_they_do_not_end_it_short(tmp_path):
    """The lease holder sends 6 records: a chunk of 2 of a structured dtype, one of 2 of a plain ``V8`` (the same
    ``dtype.str``, so the batch's fit took it) and one more of the first. The second raised in the stage only after
    its records counted as arrived and the shuffle had emptied its round: the guard dropped it, the FILE_DONE found
    all 6 arrived, and the client's epoch ended, without an error, with 2 samples. The stage now refuses the
    structured chunks before they count (``chunk_problem``), so the epoch fails at the FILE_DONE's count, naming
    the file; a failure after the count fails the stream (``test_stage_untidy``)."""
    write_id_files(tmp_path, 1, [6])
    config = make_config(
        tmp_path,
        pipeline={"batch_size": 4, "shuffle_buffer": 4},
        service=HOSTILE["service"],
        workers=HOSTILE["workers"],
    )
    with running_daemon(config, start_workers=False) as daemon:  # the fake is the only worker
        fake = FakeWorker(daemon.endpoint)
        try:
            with Client(daemon.endpoint, timeout_s=20) as client:
                fake.ask_lease()
                read = collect_ids_meanwhile(client.epoch(), timeout_s=30)
                lease = fake.lease()
                tag = {"stream": lease.stream, "file": lease.file, "lease": lease.lease, "token": lease.token}
                for record, dtype in ((0, "i4,i4"), (2, "V8"), (4, "i4,i4")):
                    chunk = P.Chunk(**tag, worker=fake.welcome.worker, record=record, count=2)
                    frames = P.encode(chunk, {"data": np.zeros(2, "V8")})
                    head = msgpack.unpackb(frames[0])
                    head["cols"][0][1] = dtype  # numpy reads "i4,i4" as a structured dtype; encode sends dtype.str
                    fake.data.send([msgpack.packb(head, use_bin_type=True), *frames[1:]])
                fake.data.send(P.encode(P.FileDone(**tag, worker=fake.welcome.worker, sent=6)))
                with pytest.raises(
                    WorkerError, match=r"^LostDataError: the worker sent 6 record\(s\) .* but 2 arrived"
                ):
                    read()
        finally:
            fake.close()
