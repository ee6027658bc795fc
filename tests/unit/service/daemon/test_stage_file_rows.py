"""The stage with file rows: bound to the leased file, checked against its header, sent or copied out."""

from __future__ import annotations

import os

import numpy as np
import pytest

from loader.service import protocol as P
from loader.service.daemon.coordinator import Coordinator
from loader.service.shm import refs as R
from loader.service.shm.arena import ArenaError
from loader.service.shm.file_rows import FILE_ROWS, RowFiles, is_file_id, source_of
from loader.service.shm.pool import ArenaPool
from tests.unit.service.daemon.test_stage_refs import ROW, _done, _rows, _setup


@pytest.fixture
def pool(tmp_path):
    with ArenaPool(64 * ROW * 4, directory=str(tmp_path)) as p:  # 64 blocks of 64 KiB
        yield p


@pytest.fixture
def npy(tmp_path):
    path = str(tmp_path / "f.npz")
    np.savez(path, x=_rows(list(range(10))))  # member "x": 64 KiB float32 rows, the id first
    return path


def _file_chunk(stream, first, count, *, rows=None, spec=("<f4", [ROW]), name="x"):
    chunk = P.Chunk(
        stream=stream.stream_id, file=0, lease=1, worker="w1", record=first, count=count, refs={name: {0: list(spec)}}
    )
    refs = np.zeros((count, R.REF_WIDTH), np.int64)
    refs[:, 0] = FILE_ROWS
    refs[:, 1] = np.arange(first, first + count) if rows is None else rows
    return chunk, {name: refs}


def _take(stage, stream, arena, npy, first, count, **kwargs):
    chunk, columns = _file_chunk(stream, first, count, **kwargs)
    stage.refs.check_owned(chunk.refs, columns, arena.arena_id, chunk, npy)
    stage.on_chunk(chunk, columns)


def _client_ids(batch, columns):
    """What a client on this host reads: the rows straight from the file."""
    values = columns["x"]
    if batch.refs is not None:
        readers = RowFiles()
        files = batch.files or {}
        values = R.gather(
            values, R.parse_specs(batch.refs["x"]), lambda i: readers.open(files[source_of(i)]), free=False
        )
        readers.close()
    return values[:, 0].astype(int).tolist()


@pytest.mark.parametrize("shm", [True, False], ids=["same host", "another host"])
def test_file_rows_go_as_references_or_are_copied_by_the_stage(pool, npy, shm):
    rec, stage, session, stream, arena = _setup(pool, shm=shm, shuffle=4)
    _take(stage, stream, arena, npy, 0, 6)
    _take(stage, stream, arena, npy, 6, 4)
    stage.on_done(_done(stream, 0, 10))
    stage.pump(session)
    batches = rec.batches()
    assert all((b.files is not None) == shm for b, _ in batches)
    if shm:
        assert all(is_file_id(i) for _, c in batches for i in c["x"][:, 0].tolist())
    assert sorted(i for b in batches for i in _client_ids(*b)) == list(range(10))
    assert arena.used_blocks() == 0  # file rows never take arena blocks
    stage.on_epoch_request(session, True)  # releasing file rows frees nothing and breaks nothing


@pytest.mark.parametrize(
    "kwargs, why",
    [
        ({"rows": [0, 1, 5]}, "other than its chunk's records"),
        ({"spec": ("<f8", [ROW])}, "claims rows of"),
        ({"spec": ("<f4", [ROW, 1])}, "claims rows of"),
        ({"rows": [FILE_ROWS, FILE_ROWS, FILE_ROWS]}, "other than"),
        ({"name": "nothere"}, "no readable array"),
    ],
)
def test_file_rows_that_are_not_the_chunks_records_of_the_leased_file_are_refused(pool, npy, kwargs, why):
    rec, stage, session, stream, arena = _setup(pool)
    chunk, columns = _file_chunk(stream, 0, 3, **kwargs)
    with pytest.raises(ArenaError, match=why):
        stage.refs.check_owned(chunk.refs, columns, arena.arena_id, chunk, npy)


def test_rows_past_the_files_end_no_path_mixed_ids_and_the_off_switch_are_refused(pool, npy):
    rec, stage, session, stream, arena = _setup(pool)
    chunk, columns = _file_chunk(stream, 8, 4)  # the file has 10 rows
    with pytest.raises(ArenaError, match="names row 11"):
        stage.refs.check_owned(chunk.refs, columns, arena.arena_id, chunk, npy)
    chunk, columns = _file_chunk(stream, 0, 2)
    with pytest.raises(ArenaError, match="no file is leased"):
        stage.refs.check_owned(chunk.refs, columns, arena.arena_id, chunk, None)
    with pytest.raises(ArenaError, match="no arena"):
        stage.refs.check_owned(chunk.refs, columns, None, chunk, npy)
    mixed = columns["x"].copy()
    mixed[1, 0] = arena.arena_id
    with pytest.raises(ArenaError, match="mixes"):
        stage.refs.check_owned(chunk.refs, {"x": mixed}, arena.arena_id, chunk, npy)
    stage.refs.allow_files = False
    with pytest.raises(ArenaError, match="file_rows"):
        stage.refs.check_owned(chunk.refs, columns, arena.arena_id, chunk, npy)


def test_a_chunk_naming_a_source_it_was_not_bound_to_is_dropped(pool, npy):
    rec, stage, session, stream, arena = _setup(pool)
    chunk, columns = _file_chunk(stream, 0, 2)
    columns["x"][:, 0] = FILE_ROWS - 7  # a stage-side id, never bound by check_owned
    stage.on_chunk(chunk, columns)  # adopt refuses it: dropped, logged
    assert stream.arrived.get(0, 0) == 0


def test_a_file_replaced_while_its_lease_is_read_has_its_later_rows_refused(pool, npy):
    # The worker maps the file it opened; replacing the path (an atomic rename, as rsync does) leaves its
    # mapping on the old file, so the columns it sends inline (a label) still come from the old file.
    # Rows bound by path to the new file would then pair new data with old labels, silently.
    rec, stage, session, stream, arena = _setup(pool)
    seen: dict = {}  # what the lease's first file rows were bound to (the coordinator's Job keeps it)
    chunk, columns = _file_chunk(stream, 0, 3)
    stage.refs.check_owned(chunk.refs, columns, arena.arena_id, chunk, npy, seen)
    replacement = npy + ".new.npz"
    np.savez(replacement, x=_rows([100 + i for i in range(10)]))
    os.replace(replacement, npy)
    chunk, columns = _file_chunk(stream, 3, 3)
    with pytest.raises(ArenaError, match="changed while its lease was read"):
        stage.refs.check_owned(chunk.refs, columns, arena.arena_id, chunk, npy, seen)
    chunk, columns = _file_chunk(stream, 3, 3)  # a new lease of the file binds to the file as it is now
    stage.refs.check_owned(chunk.refs, columns, arena.arena_id, chunk, npy, {})


def test_a_file_replaced_between_its_grant_and_its_first_rows_is_refused(pool, npy):
    # The coordinator pins the leased file at the grant (the worker opens it after that): rows bound to a
    # path replaced before the first chunk arrived are not the rows the worker read either.
    rec, stage, session, stream, arena = _setup(pool)
    coordinator = Coordinator([npy], heartbeat_timeout_s=5.0, pin_files=True)
    coordinator.enqueue(stream.stream_id, 0, [0])
    job = coordinator.next_job(coordinator.add_worker("w1"))
    assert job is not None and set(job.file_identities) == {npy}
    replacement = npy + ".new.npz"
    np.savez(replacement, x=_rows([100 + i for i in range(10)]))
    os.replace(replacement, npy)
    chunk, columns = _file_chunk(stream, 0, 3)
    with pytest.raises(ArenaError, match="changed while its lease was read"):
        stage.refs.check_owned(chunk.refs, columns, arena.arena_id, chunk, npy, job.file_identities)
