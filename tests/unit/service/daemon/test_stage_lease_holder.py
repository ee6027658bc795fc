"""What a worker that holds a lease may send, unit by unit. The stage trusts the contents of its samples,
but no chunk, FILE_DONE or FILE_ERROR of it may stop the daemon, outgrow a bound or spoil what the daemon
sends. Each case here was found by ``tests/integration/test_hostile_lease_fuzz.py``."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from loader.config import LoaderConfig
from loader.service import protocol as P
from loader.service.daemon.loop import Daemon
from loader.service.daemon.stage import Stage
from loader.service.daemon.stage_refs import SPECS_KEPT
from loader.service.shm import refs as R
from tests.unit.service.daemon.test_stage import Recorder
from tests.unit.service.daemon.test_stage_refs import ROW, _chunk, _done, _setup, pool  # noqa: F401 (a fixture)

SPM = 8  # samples_per_message


def _stage() -> Stage:
    return Stage(batch_size=4, drop_last=False, shuffle_buffer=0, seed=3, samples_per_message=SPM, send=Recorder())


def _header(record: int, count: int, refs: dict | None = None) -> P.Chunk:
    return P.Chunk(stream=1, file=0, lease=1, worker="w1", record=record, count=count, refs=refs)


IDX = P.INDEX_COLUMN
FINE = [
    (_header(5, 3), {"x": np.zeros(3)}),
    (_header(5, 3), {"x": np.zeros(3), IDX: np.array([5, 7, 20])}),  # records skipped inside the chunk
    (_header(5, 3), {"x": np.zeros(3), IDX: np.array([5, 7, 20], np.uint8)}),
    (_header(P.MAX_INT - 5, 3), {"x": np.zeros(3)}),
]
MALFORMED = [
    ("records; a worker sends 1 to 8", _header(0, 10**6), {"x": np.zeros((10**6, 0))}),  # rows of no bytes
    ("records; a worker sends 1 to 8", _header(0, 0), {"x": np.zeros(0)}),
    ("have no columns", _header(0, 3), {}),
    ("have no columns", _header(0, 3), {IDX: np.arange(3)}),
    ("not integers", _header(0, 3), {"x": np.zeros(3), IDX: np.arange(3) + 0.5}),
    ("not integers", _header(0, 3), {"x": np.zeros(3), IDX: np.zeros((3, 2), np.int64)}),
    ("not integers", _header(0, 1), {"x": np.zeros(1), IDX: P.object_array([0])}),
    ("does not rise strictly", _header(5, 3), {"x": np.zeros(3), IDX: np.array([7, 6, 5])}),
    ("does not rise strictly", _header(5, 3), {"x": np.zeros(3), IDX: np.array([5, 5, 6])}),
    ("does not rise strictly", _header(5, 3), {"x": np.zeros(3), IDX: np.array([4, 5, 6])}),  # before record
    ("does not rise strictly", _header(5, 3), {"x": np.zeros(3), IDX: np.array([-3, -2, -1])}),
    ("beyond what a lease", _header(0, 2), {"x": np.zeros(2), IDX: np.array([0, P.MAX_INT])}),
    ("beyond what a lease", _header(0, 2), {"x": np.zeros(2), IDX: np.array([0, 2**64 - 1], np.uint64)}),
    ("beyond what a lease", _header(P.MAX_INT - 2, 3), {"x": np.zeros(3)}),  # the next record would be
    ("is a reference column", _header(0, 1, {IDX: {0: ["<i8", [8192]]}}), {"x": np.zeros(1), IDX: np.zeros((1, 3))}),
    # "i4,i4" on the wire: |V8, as a plain V8 column is, so the batch's fit took both and the shuffle raised.
    ("has a structured dtype", _header(0, 2), {"x": np.zeros(2, "i4,i4")}),
]


@pytest.mark.parametrize(("chunk", "columns"), FINE)
def test_what_a_worker_sends_passes_the_chunk_check(chunk, columns):
    assert _stage().chunk_problem(chunk, columns) is None


@pytest.mark.parametrize(("why", "chunk", "columns"), MALFORMED)
def test_a_chunk_whose_columns_do_not_fit_its_header_is_named_in_one_line(why, chunk, columns):
    problem = _stage().chunk_problem(chunk, columns)
    assert problem is not None and why in problem and "\n" not in problem


@pytest.fixture
def daemon(tmp_path):
    np.save(tmp_path / "f.npy", np.arange(100))
    config = LoaderConfig.from_dict(
        {
            "source": {"files": [str(tmp_path / "*.npy")]},
            "service": {"bind": "tcp://127.0.0.1:*"},
            "workers": {"samples_per_message": SPM},
        }
    )
    with Daemon(config, start_workers=False) as daemon:
        yield daemon


def _lease(daemon):
    """A stream of the daemon's one file, and its lease held by worker "w": (stream, data message tag)."""
    stage = daemon.stage
    session = stage.open_session(b"peer", 0, 1, prefetch=4)
    stream = stage.new_stream(settings=stage.settings, epoch=0, world_size=1, order=[0], job="j", prefetch=4)
    stage.attach(session, stream, gen=1, credits=4)
    daemon.coordinator.enqueue(stream.stream_id, 0, [0])
    job = daemon.coordinator.next_job(daemon.coordinator.add_worker("w"))
    assert job is not None
    stage.lease_start(stream.stream_id, 0)
    return stream, {"stream": stream.stream_id, "file": 0, "lease": job.lease_id, "worker": "w", "token": job.token}


def test_the_daemon_refuses_a_lease_holders_malformed_chunk_before_the_stage_takes_any_of_it(daemon):
    stream, tag = _lease(daemon)
    # Before: a million rows of no bytes were buffered (the stream's bound is a few hundred), and an index
    # column's last value became the file's next record, one no Lease can carry.
    daemon._on_data(P.encode(P.Chunk(**tag, record=0, count=10**6), {"x": np.zeros((10**6, 0))}))
    daemon._on_data(P.encode(P.Chunk(**tag, record=0, count=2), {"x": np.zeros(2), IDX: np.array([0, P.MAX_INT])}))
    assert daemon.rejected_messages == 2
    assert stream.rows_buffered == 0 and stream.arrived == {0: 0}
    assert stream.sequencer.files[0].next_record == 0
    daemon._on_data(P.encode(P.Chunk(**tag, record=0, count=2), {"x": np.zeros(2)}))  # the genuine one
    assert daemon.rejected_messages == 2 and stream.arrived == {0: 2}


def test_skipped_records_a_worker_claims_saturate_so_that_status_still_encodes(daemon):
    stream, tag = _lease(daemon)
    daemon._on_data(P.encode(P.FileDone(**tag, sent=0, skipped=P.MAX_INT - 1)))
    other = daemon.stage.new_stream(
        settings=daemon.stage.settings, epoch=1, world_size=1, order=[0], job="k", prefetch=4
    )
    daemon.stage.on_done(P.FileDone(stream=other.stream_id, file=0, lease=9, worker="w", sent=0, skipped=P.MAX_INT - 1))
    assert daemon.stage.skipped_records == P.MAX_INT  # before: past 2**64 after four, and msgpack refused status()
    P.decode(P.encode(P.Status(status=daemon.status())))


def test_a_batch_that_cannot_be_sent_fails_its_epoch_and_the_loop_goes_on(daemon, monkeypatch, caplog):
    stream, _ = _lease(daemon)

    def unsendable(*args):
        raise TypeError("rows no batch can carry")

    monkeypatch.setattr(daemon.stage, "pump", unsendable)
    with caplog.at_level(logging.ERROR, logger="loader.daemon"):
        for _ in range(3):
            daemon.step(0.0)  # before: the TypeError left serve() and the daemon stopped
    assert stream.failed and stream.stream_id not in daemon.stage.streams  # dropped, its rows freed
    assert len([r for r in caplog.records if "could not be sent" in r.getMessage()]) == 1


def test_object_rows_sent_inline_for_a_reference_column_reach_the_client_as_sent(pool):  # noqa: F811
    rec, stage, session, stream, arena = _setup(pool, shm=False, batch_size=3)
    stage.on_chunk(*_chunk(stream, arena, 0, 0, [0]))  # the stream's column "x" is one of references
    rows = [{"a": 1}, None, [1, None]]  # rows of any codec-able values: kept as local rows
    chunk = P.Chunk(stream=stream.stream_id, file=0, lease=1, worker="w1", record=1, count=len(rows))
    stage.on_chunk(chunk, {"x": P.object_array(rows)})
    stage.on_done(_done(stream, 0, 4))
    stage.pump(session)  # before: np.asarray made {"a": 1} a 0-d object array, which the codec refuses
    batches = rec.batches()
    assert [b.count for b, _ in batches] == [3, 1]
    first, second = batches[0][1]["x"], batches[1][1]["x"]
    assert first[0][0] == 0 and first[1] == {"a": 1} and first[2] is None
    assert second[0] == [1, None]
    assert stage.refs.local == {}


def test_ragged_nested_rows_sent_inline_for_a_reference_column_are_batched_not_raised(pool):  # noqa: F811
    rec, stage, session, stream, arena = _setup(pool, shm=False, batch_size=2)
    stage.on_chunk(*_chunk(stream, arena, 0, 0, [0]))
    chunk = P.Chunk(stream=stream.stream_id, file=0, lease=1, worker="w1", record=1, count=1)
    stage.on_chunk(chunk, {"x": P.object_array([[[1], [1, 2]]])})  # numpy makes no array of this row
    stage.on_done(_done(stream, 0, 2))
    stage.pump(session)
    ((batch, columns),) = rec.batches()
    assert batch.count == 2 and columns["x"][1] == [[1], [1, 2]]
    assert stage.refs.local == {}


def test_row_specs_no_row_names_are_forgotten_so_new_shapes_cannot_grow_the_table(pool):  # noqa: F811
    rec, stage, session, stream, arena = _setup(pool, shm=False, batch_size=2)
    stage.on_chunk(*_chunk(stream, arena, 0, 0, [7]))  # buffered: its spec must survive
    for n in range(1, 3 * SPECS_KEPT):  # a lease holder claiming another row shape with each chunk
        refs = R.write_column(arena, np.zeros((1, ROW), np.float32))
        assert refs is not None
        chunk = P.Chunk(stream=999, file=0, lease=1, worker="w1", count=1, refs={"x": {0: ["<f4", [n]]}})
        stage.on_chunk(chunk, {"x": refs})  # no such stream: adopted, then freed
        stage.collect_specs()  # the daemon's housekeeping
    assert len(stage.refs.specs.specs) <= SPECS_KEPT + 1  # before: one more for every shape, for good
    stage.on_done(_done(stream, 0, 1))
    stage.pump(session)
    ((batch, columns),) = rec.batches()
    assert columns["x"][0][0] == 7 and columns["x"].shape == (1, ROW)
