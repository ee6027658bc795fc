"""Fuzzing what a worker that holds a lease sends: the stage's handlers behind the lease check.

``test_hostile_fuzz.py`` fuzzes every message kind from every role, but none of its data messages carries a
real lease token, so the stage's chunk, FILE_DONE and FILE_ERROR handlers never see hostile contents. Here
the daemon has no workers of its own: a raw peer says hello, takes leases (their tokens) and is the only
worker, while two victim clients read epochs throughout (one that fails with a ``WorkerError`` is followed
by the next: a lease holder is trusted for what its samples hold, so it may fail an epoch). Each hypothesis
example sends genuine rows, whole files, or chunks, FILE_DONEs and FILE_ERRORs carrying the real (worker,
lease, token, stream, file) and anything else hostile: records, counts, sample kinds, columns (dtypes,
shapes, object rows, an index column of any values), references into the worker's own arena that lie
about their rows, sent and skipped counts, error dicts.

Nothing of it may stop the daemon's loop, and on the daemon's own thread, after every turn, ``Watch``
checks that the buffers stay within their bounds, that every file can still be leased from where it
stands, that the blocks the stage marks held are exactly those its rows lie in, and that every message
the daemon sends decodes. Afterwards a real worker joins the same daemon and a fresh client reads exact
epochs.

``LOADER_LEASE_FUZZ_EXAMPLES`` sets the examples per mode (default 1000: about 4,000 data messages per
mode, of them about 2,900 chunks, 700 FILE_DONEs and 320 FILE_ERRORs; about 14 s for both modes). Each mode
checks that every kind of action was taken and every kind of data message sent.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from loader import Client
from loader.errors import WorkerError
from loader.service import protocol as P
from loader.service import transport
from loader.service.client.client import query_status
from loader.service.daemon.stage_refs import SPECS_KEPT
from loader.service.shm import refs as R
from tests.integration.conftest import collect_ids, make_config, running_daemon, write_id_files
from workers.arena_writer import ArenaWriter
from workers.main import run_worker

pytestmark = [pytest.mark.integration, pytest.mark.slow]

EXAMPLE_COUNT = int(os.environ.get("LOADER_LEASE_FUZZ_EXAMPLES", "1000"))
FILES = [120, 90, 200, 60, 150]
SAMPLES_PER_MESSAGE = 32
MAX_HELD = 3  # leases the fake worker asks for at once
ROW_FLOATS = 16 * 1024  # float32 rows of 64 KiB: one arena block each, large enough to travel as references
HUGE = 2**62 - 1  # the largest count the protocol allows
DTYPES = ["<i8", "<i4", ">i8", "<f8", "<f2", "|u1", "|b1", "<U3", "|S2", "|V4", "<c16", "<M8[s]", "<i4,<f4"]
NAMES = ["data", "x", P.INDEX_COLUMN, "", "ü" * 3]


def _values(dtype: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    raw = np.random.default_rng(seed).integers(0, 256, size=int(np.prod(shape)) * np.dtype(dtype).itemsize)
    return np.frombuffer(raw.astype(np.uint8).tobytes(), dtype=dtype).reshape(shape)


object_items = st.one_of(
    st.none(),
    st.integers(-(2**63), 2**63 - 1),
    st.text(max_size=4),
    st.binary(max_size=4),
    st.lists(st.integers(0, 9), max_size=3),
    st.lists(st.lists(st.integers(0, 9), max_size=3), max_size=3),  # ragged: numpy makes no array of it
    st.tuples(st.none(), st.floats()),
    st.dictionaries(st.text(max_size=2), st.integers(0, 9), max_size=2),
    st.builds(lambda n, dtype: np.zeros(n, dtype=dtype), st.integers(0, 4), st.sampled_from(DTYPES)),
    st.builds(lambda dtype: np.zeros((), dtype=dtype)[()], st.sampled_from(DTYPES)),  # numpy scalars
)


@st.composite
def columns(draw: Any, rows: int) -> dict[str, np.ndarray]:
    """Up to three columns of ``rows`` rows: any fixed dtype and row shape (zero-sized ones claiming huge
    dimensions included), or object rows of any codec-able values."""
    out: dict[str, np.ndarray] = {}
    for name in draw(st.lists(st.sampled_from(NAMES), max_size=3, unique=True)):
        if draw(st.integers(0, 4)) == 0:
            out[name] = P.object_array(draw(st.lists(object_items, min_size=rows, max_size=rows)))
            continue
        row = draw(st.sampled_from([(), (), (2,), (0,), (3, 2), (0, 2**40), (1, 1, 1, 1)]))
        shape = (rows, *row)
        if np.prod(shape) * 16 > 2**20:
            row, shape = (0,), (rows, 0)
        out[name] = _values(draw(st.sampled_from(DTYPES)), shape, draw(st.integers(0, 2**32)))
    return out


@st.composite
def index_column(draw: Any, first: int, rows: int) -> np.ndarray:
    """Record indexes for ``rows`` rows from ``first``: increasing with gaps (what a worker that skipped
    records sends), or decreasing, repeated, negative, beyond the protocol's range, of another dtype or shape."""
    kind = draw(st.sampled_from(["gaps", "gaps", "down", "repeat", "negative", "huge", "float", "2d", "before"]))
    steps = np.asarray(draw(st.lists(st.integers(1, 3), min_size=rows, max_size=rows)), dtype=np.int64)
    gaps = first + np.cumsum(steps) - steps[0] if rows else np.zeros(0, np.int64)
    if kind == "gaps":
        return gaps
    if kind == "down":
        return gaps[::-1].copy()
    if kind == "repeat":
        return np.full(rows, first, dtype=np.int64)
    if kind == "negative":
        return gaps - first - 5
    if kind == "huge":
        return np.arange(HUGE - rows + 3, HUGE + 3, dtype=np.int64)[:rows]
    if kind == "float":
        return gaps.astype(np.float64) + 0.5
    if kind == "2d":
        return np.stack([gaps, gaps], axis=1)
    return gaps - 1 if rows else gaps  # starting before the chunk's own record


record_choice = st.sampled_from(["next", "next", "zero", "ahead", "behind", "huge"])
count_choice = st.sampled_from(["rows", "rows", "rows", "rows", "more", "fewer", "huge"])


@st.composite
def chunk_actions(draw: Any) -> tuple[Any, ...]:
    rows = draw(st.sampled_from([0, 1, 2, 5, SAMPLES_PER_MESSAGE, SAMPLES_PER_MESSAGE + 1, 10**6]))
    if rows >= 10**6:  # many rows of nothing: zero-width columns are free on the wire
        cols: dict[str, np.ndarray] = {"data": np.zeros((rows, 0), np.int64)}
    else:
        genuine = draw(st.booleans())  # the file's own values (the stream's layout), or anything
        cols = {"data": None} if genuine else draw(columns(rows))  # type: ignore[dict-item]
    index = draw(st.booleans()) and rows < 10**6
    kind = draw(st.sampled_from(["tuple", "tuple", "dict", "value", "ragged?", ""]))
    return (
        "chunk",
        rows,
        cols,
        index,
        draw(index_column(0, min(rows, 64))) if index else None,
        kind,
        draw(record_choice),
        draw(count_choice),
    )


@st.composite
def ref_actions(draw: Any) -> tuple[Any, ...]:
    rows = draw(st.integers(1, 3))
    lie = draw(
        st.sampled_from(
            ["none", "none", "dtype", "shape", "short", "spec", "arena", "block", "twice", "index", "absent", "width"]
            + ["replay"]
        )
    )
    return ("refs", rows, lie, draw(st.sampled_from(["tuple", "dict"])), draw(st.integers(1, ROW_FLOATS)))


counts = st.one_of(st.sampled_from(["exact", "exact", "more", "fewer", "zero"]), st.integers(0, HUGE))
error_dicts = st.one_of(
    st.dictionaries(
        st.sampled_from(["type", "message", "traceback", "worker", "file", "record", "x"]),
        st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1), st.text(max_size=8), st.lists(st.booleans())),
        max_size=6,
    ),
    st.just({"type": "Big", "message": "m" * 20_000}),
    st.just({}),
)
genuine = st.tuples(st.just("genuine"), st.integers(1, SAMPLES_PER_MESSAGE))
finish = st.just(("finish",))
done = st.tuples(st.just("done"), counts, st.one_of(st.just(0), st.integers(0, HUGE)))
# Genuine rows and whole files often enough that some epochs end (and their last steps are cut) among
# the hostile messages; hostile chunks as often, since most of them keep the epoch going.
actions = st.one_of(
    genuine,
    genuine,
    finish,
    chunk_actions(),
    chunk_actions(),
    ref_actions(),
    done,
    done,
    st.tuples(st.just("error"), error_dicts),
)


@dataclass
class Held:
    """A lease the fake worker holds: its message, the file's values, the next genuine record, counts sent."""

    lease: P.Lease
    values: np.ndarray
    next: int
    sent: int = 0  # the count of every chunk sent on this lease (what a FILE_DONE says was sent)


class LeaseHolder:
    """A raw peer that speaks the worker protocol: hello, leases (their tokens), heartbeats; then sends
    whatever the test asks on the data endpoint, tagged with a lease it holds."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.ctl = transport.dealer(endpoint)
        self.data: Any = None
        self.arena: ArenaWriter | None = None
        self.worker = ""
        self.leases: dict[int, Held] = {}
        self.last: Held | None = None  # a lease held before: messages for it are late
        self.sent = 0  # data messages sent
        self.kinds: collections.Counter[str] = collections.Counter()  # of them, per kind
        self.actions: collections.Counter[str] = collections.Counter()  # the actions taken, per kind
        self._beat = 0.0
        self._files: dict[str, np.ndarray] = {}
        self.hello()

    def hello(self) -> None:
        """(Re)introduce this worker; a fresh arena comes with each WELCOME."""
        self.ctl.send(P.encode(P.Hello(pid=os.getpid())))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            got = self.ctl.recv(0.5)
            message = P.decode(got)[0] if got is not None else None
            if isinstance(message, P.Welcome):
                if message.worker != self.worker:
                    self.leases.clear()  # a forgotten worker's leases went back to the queue
                self.worker = message.worker
                if self.data is None:
                    self.data = transport.push(transport.reachable_endpoint(message.data, self.endpoint))
                if self.arena is not None:
                    self.arena.close()
                self.arena = ArenaWriter.from_welcome(message.shm)
                return
            self._note(message)
        raise AssertionError("the daemon did not welcome the fake worker")

    def _note(self, message: P.Message | None) -> None:
        if isinstance(message, P.Lease):
            path = message.path
            if path not in self._files:
                self._files[path] = np.load(path)
            self.leases[message.lease] = Held(message, self._files[path], message.start)
        elif isinstance(message, P.Cancel):
            gone = self.leases.pop(message.lease, None)
            self.last = gone or self.last
        elif isinstance(message, P.Error) and message.unknown_session:
            self.hello()  # the daemon forgot this worker (it missed heartbeats): join again

    def poll(self, wait_s: float = 0.0) -> None:
        """Read the control channel; keep asking for leases and beating."""
        while (got := self.ctl.recv(wait_s)) is not None:
            wait_s = 0.0
            self._note(P.decode(got)[0])
        now = time.monotonic()
        if len(self.leases) < MAX_HELD:
            self.ctl.send(P.encode(P.LeaseRequest()))
        if now - self._beat > 0.3:
            self._beat = now
            self.ctl.send(P.encode(P.Heartbeat()))

    def pick(self, which: int) -> Held | None:
        for _ in range(4):
            if self.leases:
                held = list(self.leases.values())[which % len(self.leases)]
                self.last = held
                return held
            self.poll(0.025)
        return self.last  # no lease now (between epochs): a lease held before, its data is late

    def send(self, message: P.FileMessage, columns: dict[str, Any] | None = None) -> None:
        if not self.data.try_send(P.encode(message, columns or None), timeout_s=5.0):
            raise AssertionError("the daemon read no data for 5 s")
        self.sent += 1
        self.kinds[message.KIND] += 1

    def tag(self, held: Held) -> dict[str, Any]:
        """What every data message about the lease carries: the real (stream, file, lease, token), and its worker."""
        return {key: getattr(held.lease, key) for key in ("stream", "file", "lease", "token")} | {"worker": self.worker}

    def genuine(self, held: Held, rows: int) -> None:
        values = held.values[held.next : held.next + rows]
        if len(values):
            self.send(P.Chunk(**self.tag(held), record=held.next, count=len(values)), {"data": values})
            held.next += len(values)
            held.sent += len(values)

    def finish(self, held: Held) -> None:
        while held.next < len(held.values):
            self.genuine(held, SAMPLES_PER_MESSAGE)
        self.send(P.FileDone(**self.tag(held), sent=min(held.sent, HUGE)))
        self.leases.pop(held.lease.lease, None)

    def close(self) -> None:
        self.ctl.send(P.encode(P.Bye(reason="fuzzing over")))
        time.sleep(0.2)  # let the BYE leave before the socket closes (linger 0)
        if self.data is not None:
            self.data.close()
        if self.arena is not None:
            self.arena.close()
        self.ctl.close()


def _act(fake: LeaseHolder, which: int, action: tuple[Any, ...]) -> None:
    held = fake.pick(which)
    if held is None:
        return
    kind = action[0]
    fake.actions[kind] += 1
    if kind == "genuine":
        fake.genuine(held, action[1])
    elif kind == "finish":
        fake.finish(held)
    elif kind == "chunk":
        _hostile_chunk(fake, held, *action[1:])
    elif kind == "refs":
        _hostile_refs(fake, held, *action[1:])
    elif kind == "done":
        sent = {
            "exact": min(held.sent, HUGE),
            "more": min(held.sent + 1, HUGE),
            "fewer": max(0, min(held.sent, HUGE) - 1),
            "zero": 0,
        }.get(action[1], action[1])
        fake.send(P.FileDone(**fake.tag(held), sent=sent, skipped=action[2]))
        fake.leases.pop(held.lease.lease, None)  # as a worker would: what it sends for the lease now is late
    else:
        fake.send(P.FileError(**fake.tag(held), error=action[1]))
        fake.leases.pop(held.lease.lease, None)


def _hostile_chunk(
    fake: LeaseHolder,
    held: Held,
    rows: int,
    cols: dict[str, Any],
    with_index: bool,
    index: np.ndarray | None,
    sample_kind: str,
    record_choice: str,
    count_choice: str,
) -> None:
    record = {
        "next": held.next,
        "zero": 0,
        "ahead": held.next + 7,
        "behind": max(0, held.next - 3),
        "huge": HUGE - max(rows, 1),
    }[record_choice]
    if "data" in cols and cols["data"] is None:  # the file's own values, from ``record`` on (cycled to fill)
        cols = {"data": np.resize(held.values[record % len(held.values) :] if len(held.values) else [0], rows)}
    cols = dict(cols)
    if with_index and index is not None:
        rows_now = len(next(iter(cols.values()))) if cols else len(index)
        cols[P.INDEX_COLUMN] = np.resize(index, (rows_now, *index.shape[1:])) + (
            record if index.dtype.kind in "iu" else 0
        )
    n = len(next(iter(cols.values()))) if cols else rows
    count = {"rows": n, "more": n + 1, "fewer": max(0, n - 1), "huge": HUGE}[count_choice]
    fake.send(P.Chunk(**fake.tag(held), record=record, count=count, sample_kind=sample_kind), cols)
    held.sent += count


def _hostile_refs(fake: LeaseHolder, held: Held, rows: int, lie: str, sample_kind: str, short: int) -> None:
    """A chunk whose column lies in the worker's own arena, described truthfully or not."""
    if fake.arena is None:
        return
    values = np.full((rows, ROW_FLOATS), held.next, dtype=np.float32)
    refs = R.write_column(fake.arena.arena, values)
    if refs is None:  # the arena is full of blocks the daemon refused: a fresh one comes with a new WELCOME
        fake.hello()
        return
    spec: dict[int, list[Any]] = {0: ["<f4", [ROW_FLOATS]]}
    name = "data"
    if lie == "dtype":
        spec = {0: ["<f8", [ROW_FLOATS]]}
    elif lie == "shape":
        spec = {0: ["<f4", [ROW_FLOATS * 3]]}
    elif lie == "short":  # rows of another length within the blocks written: a new spec each time
        spec = {0: ["<f4", [short]]}
    elif lie == "spec":
        spec = {5: ["<f4", [ROW_FLOATS]]}
    elif lie == "arena":
        refs[:, 0] += 1
    elif lie == "block":
        refs[:, 1] -= 1
    elif lie == "twice":
        refs[-1] = refs[0]
    elif lie == "index":
        name = P.INDEX_COLUMN
    elif lie == "width":
        refs = refs[:, :2].copy()
    columns: dict[str, Any] = {name: refs}
    if name == P.INDEX_COLUMN:
        columns["data"] = held.values[held.next : held.next + rows]
        if len(columns["data"]) != rows:
            return
    described = {"absent" if lie == "absent" else name: spec}
    chunk = P.Chunk(**fake.tag(held), record=held.next, count=rows, sample_kind=sample_kind, refs=described)
    fake.send(chunk, columns)
    if lie == "replay":
        fake.send(chunk, columns)
    held.sent += rows


class Victim(threading.Thread):
    """A client reading epochs until told to stop; an epoch that fails with a ``WorkerError`` is followed
    by the next (the lease holder may fail an epoch). Anything else it meets is the test's failure."""

    def __init__(self, endpoint: str, rank: int, world_size: int) -> None:
        super().__init__(name=f"victim-{rank}", daemon=True)
        self.endpoint, self.rank, self.world_size = endpoint, rank, world_size
        self.stop = threading.Event()
        self.ended = self.failed = self.batches = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            # One job of ``world_size`` ranks, or (world size 1) a job of its own.
            job = {"rank": self.rank % self.world_size, "world_size": self.world_size, "job": f"victim-{self.rank}"}
            if self.world_size > 1:
                job["job"] = "victims"
            with Client(self.endpoint, timeout_s=60, prefetch=4, **job) as client:
                while not self.stop.is_set():
                    try:
                        for _ in client.epoch():
                            self.batches += 1
                        self.ended += 1
                    except WorkerError:
                        self.failed += 1
        except BaseException as exc:  # reported by the test
            self.error = exc


def _ids(batches: Any) -> list[int]:
    """The ids of an epoch's batches: stacked (a dict of columns), or lists of (id,) samples."""
    out: list[int] = []
    for batch in batches:
        out.extend(int(sample[0]) for sample in batch) if isinstance(batch, list) else out.extend(collect_ids([batch]))
    return out


def _named_blocks(stage: Any) -> dict[int, set[int]]:
    """Per arena, the blocks the rows the stage keeps (buffered, or sent and not yet credited) lie in."""
    named: dict[int, set[int]] = collections.defaultdict(set)
    columns = [block[name] for block, names in stage._buffered_refs() for name in names if name in block]
    columns += [refs for session in stage.sessions.values() for _, sent, _ in session.outstanding for refs in sent]
    for refs in columns:
        for arena_id, start, spec_id in refs.tolist():
            arena = stage.refs.arena_of(arena_id) if arena_id != R.LOCAL_ARENA else None
            if arena is not None:
                run = arena.blocks_for(R.row_nbytes(stage.refs.specs.specs[spec_id]))
                named[arena_id].update(range(start, start + run))
    return named


class Watch:
    """Checks, on the daemon's own thread after every turn of its loop, what must hold whatever a worker
    sent: the buffers within their bounds, every file's next record one the protocol can lease from; and
    that every message the daemon sends decodes. Violations are recorded (the daemon goes on)."""

    def __init__(self, daemon: Any, monkeypatch: Any) -> None:
        self.daemon = daemon
        self.violations: list[str] = []
        self._kinds: set[str] = set()
        self.turns = 0
        step = daemon.step

        def watched_step(timeout_s: float) -> None:
            step(timeout_s)
            self.turns += 1
            try:
                self.check()
            except Exception as exc:  # a check that cannot even run is a violation too
                self.note(f"checking failed: {type(exc).__name__}: {exc}")

        monkeypatch.setattr(daemon, "step", watched_step)
        send = transport.Router.send

        def checked_send(router: Any, peer: bytes, frames: Any) -> bool:
            try:
                P.decode([bytes(memoryview(f)) if not isinstance(f, bytes) else f for f in frames])
            except Exception as exc:
                self.note(f"the daemon sent an undecodable message: {type(exc).__name__}: {exc}")
            return send(router, peer, frames)

        monkeypatch.setattr(transport.Router, "send", checked_send)

    def note(self, violation: str) -> None:
        """Record a violation; one of each kind (the words before its first number) is enough."""
        kind = violation.split(" ", 3)[:3] if violation.startswith("stream") else violation[:40]
        if str(kind) not in self._kinds and len(self.violations) < 20:
            self._kinds.add(str(kind))
            self.violations.append(violation)

    def _check_held(self, stage: Any) -> None:
        """Blocks marked held by the stage are exactly those its rows lie in (none leaked, none unmarked)."""
        named = _named_blocks(stage)
        for arena_id, held in stage.refs._held.items():
            marked = set(np.flatnonzero(held).tolist())
            if marked != named.get(arena_id, set()):
                extra, missing = marked - named[arena_id], named[arena_id] - marked
                self.note(f"arena {arena_id}: {len(extra)} blocks held for no row, {len(missing)} rows' not held")

    def check(self) -> None:
        stage = self.daemon.stage
        for stream in stage.streams.values():
            outside = stream.rows_buffered - stream.sequencer.held_rows
            bound = 2 * stage.buffer_limit_rows(stream) + SAMPLES_PER_MESSAGE
            if outside > bound:
                self.note(f"stream {stream.stream_id} buffers {outside} rows, its bound is {bound}")
            window = stream.sequencer
            if (
                window.held_rows > window.reorder_rows + SAMPLES_PER_MESSAGE
                and window.held_bytes > window.reorder_bytes
            ):
                self.note(f"stream {stream.stream_id} holds {window.held_rows} rows for reordering")
            for file_index, state in window.files.items():
                if not 0 <= state.next_record < P.MAX_INT:
                    self.note(f"stream {stream.stream_id} would lease file {file_index} from {state.next_record}")
            if stream.step_rows < 0:
                self.note(f"stream {stream.stream_id} counts {stream.step_rows} step rows")
        if len(stage.refs.specs.specs) > 2 * SPECS_KEPT:
            self.note(f"the stage keeps {len(stage.refs.specs.specs)} row specs")
        if self.turns % 10 == 0:
            self._check_held(stage)
        if len(stage.refs.local) > stage.buffered_rows() + 64 * SAMPLES_PER_MESSAGE:
            self.note(f"the stage keeps {len(stage.refs.local)} local rows for {stage.buffered_rows()} buffered")


# Two victims: two jobs of one rank each (stacked batches, a misfit fails the epoch), or two ranks of one job
# (list batches, ragged rows taken, misfits skipped; steps cut for two ranks, the last one padded).
MODES = [("raise", "stacked", 1), ("skip", "list", 2)]


@pytest.mark.parametrize(("on_error", "batch_format", "world_size"), MODES)
def test_nothing_a_lease_holder_sends_stops_the_daemon_or_outgrows_its_buffers(
    tmp_path, monkeypatch, on_error, batch_format, world_size
):
    ids = write_id_files(tmp_path, len(FILES), FILES)
    config = make_config(
        tmp_path,
        pipeline={"batch_size": 16, "shuffle_buffer": 32, "on_error": on_error, "batch_format": batch_format},
        workers={"samples_per_message": SAMPLES_PER_MESSAGE, "shm_arena_mib": 8, "heartbeat_timeout_s": 10.0},
        service={"max_workers": 4, "max_clients": 4},
    )
    with running_daemon(config, start_workers=False) as daemon:
        daemon_thread = next(t for t in threading.enumerate() if t.name == "test-daemon")
        watch = Watch(daemon, monkeypatch)
        fake = LeaseHolder(daemon.endpoint)
        victims = [Victim(daemon.endpoint, rank, world_size) for rank in range(2)]
        for victim in victims:
            victim.start()
        started = time.monotonic()
        try:
            # No shrinking: the daemon's state is not replayed with an example, so a smaller one proves nothing.
            @settings(
                max_examples=EXAMPLE_COUNT,
                deadline=None,
                database=None,
                phases=[Phase.generate],
                suppress_health_check=list(HealthCheck),
            )
            @given(st.lists(st.tuples(st.integers(0, MAX_HELD - 1), actions), min_size=1, max_size=4))
            def fuzz(steps: list[tuple[int, tuple[Any, ...]]]) -> None:
                fake.poll()
                for which, action in steps:
                    _act(fake, which, action)
                assert daemon_thread.is_alive(), "the daemon's loop stopped"

            fuzz()
        finally:
            fake.close()
        fuzz_s = time.monotonic() - started
        assert daemon_thread.is_alive(), "the daemon's loop stopped"
        # Every kind of action was taken, and every kind of data message sent (each hundreds of times).
        assert set(fake.actions) == {"genuine", "finish", "chunk", "refs", "done", "error"}, fake.actions
        assert {"chunk", "done", "ferror"} <= set(fake.kinds), fake.kinds
        status = query_status(daemon.endpoint)
        assert 0 < status["rejected_messages"] <= fake.sent, status["rejected_messages"]
        assert status["late_data_dropped"] <= fake.sent
        for victim in victims:
            assert victim.error is None, victim.error
        assert sum(v.batches for v in victims) > 0 and sum(v.ended + v.failed for v in victims) > 0
        # A real worker joins the same daemon: the victims' epochs in flight end, then a fresh client
        # reads exact epochs.
        stop = threading.Event()
        worker = threading.Thread(target=run_worker, args=(daemon.endpoint,), kwargs={"stop_event": stop}, daemon=True)
        worker.start()
        try:
            for victim in victims:
                victim.stop.set()
            for victim in victims:
                victim.join(90)
                assert not victim.is_alive(), "a victim's last epoch did not end"
                assert victim.error is None, victim.error
            with Client(daemon.endpoint, timeout_s=30) as after:
                for _ in range(2):
                    assert collections.Counter(_ids(after.epoch())) == collections.Counter(ids)
            assert daemon_thread.is_alive()
            assert watch.turns > 0 and not watch.violations, watch.violations
        finally:
            stop.set()
            worker.join(10)
    ended, failed = sum(v.ended for v in victims), sum(v.failed for v in victims)
    print(
        f"{on_error}: {EXAMPLE_COUNT} examples, {dict(fake.actions)}, {fake.sent} data messages {dict(fake.kinds)} "
        f"in {fuzz_s:.1f}s; "
        f"victims: {ended} "
        f"epochs ended, {failed} failed; daemon: {status['rejected_messages']} rejected, "
        f"{status['late_data_dropped']} late, {status['skipped_records']} skipped"
    )
