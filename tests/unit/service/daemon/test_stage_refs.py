"""The stage with reference columns: rows move as references, every dropped row is freed, data stays identical."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from loader.service import protocol as P
from loader.service.daemon.stage import Stage
from loader.service.shm import refs as R
from loader.service.shm.pool import ArenaPool

ROW = 16 * 1024  # float32 values: 64 KiB rows, one block each


class Recorder:
    def __init__(self):
        self.messages = []

    def __call__(self, peer, frames):
        self.messages.append(P.decode(frames))
        return True

    def batches(self):
        return [m for m in self.messages if isinstance(m[0], P.Batch)]


@pytest.fixture
def pool(tmp_path):
    with ArenaPool(64 * ROW * 4, directory=str(tmp_path)) as p:  # 64 blocks
        yield p


def _setup(pool, *, shm=True, batch_size=4, shuffle=0, drop_last=False, files=(0,)):
    rec = Recorder()
    stage = Stage(
        batch_size=batch_size,
        drop_last=drop_last,
        shuffle_buffer=shuffle,
        seed=3,
        samples_per_message=8,
        send=rec,
        arenas=pool,
    )
    session = stage.open_session(b"peer", 0, 1, prefetch=100)
    stage.on_epoch_request(session, shm)
    stream = stage.new_stream(
        settings=stage.settings, epoch=0, world_size=1, order=list(files), job="job", prefetch=session.prefetch
    )
    stage.attach(session, stream, gen=1, credits=100)
    return rec, stage, session, stream, pool.create()


def _rows(ids):
    values = np.zeros((len(ids), ROW), np.float32)
    values[:, 0] = ids
    return values


def _chunk(stream, arena, f, first, ids, *, inline=False):
    chunk = P.Chunk(stream=stream.stream_id, file=f, lease=1, worker="w1", record=first, count=len(ids))
    values = _rows(ids)
    refs = None if inline else R.write_column(arena, values)
    if refs is None:
        return chunk, {"x": values}
    return dataclasses.replace(chunk, refs={"x": {0: ["<f4", [ROW]]}}), {"x": refs}


def _ids(pool, batch, columns):
    """The ids of a received batch, resolving references like a client (without freeing)."""
    values = columns["x"]
    if batch.refs is not None:
        values = R.gather(values, R.parse_specs(batch.refs["x"]), pool.get, free=False)
    return values[:, 0].astype(int).tolist()


def _done(stream, f, sent):
    return P.FileDone(stream=stream.stream_id, file=f, lease=1, worker="w1", sent=sent)


def test_references_flow_and_are_freed_when_the_consumer_takes_the_batch(pool):
    rec, stage, session, stream, arena = _setup(pool)
    stage.on_chunk(*_chunk(stream, arena, 0, 0, list(range(10))))
    stage.on_done(_done(stream, 0, 10))
    stage.pump(session)
    batches = rec.batches()
    assert [b.refs is not None for b, _ in batches] == [True, True, True]
    assert [_ids(pool, *b) for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert arena.used_blocks() == 10  # sent, not yet taken
    stage.on_credit(session, 1, 2)
    assert arena.used_blocks() == 2
    stage.on_credit(session, 99, 1)  # another request's credit frees nothing
    assert arena.used_blocks() == 2
    stage.on_epoch_request(session, True)  # a new epoch: the client copied all it will read
    assert arena.used_blocks() == 0


def test_client_without_arenas_gets_identical_inline_data(pool):
    rec, stage, session, stream, arena = _setup(pool, shm=False, shuffle=5)
    stage.on_chunk(*_chunk(stream, arena, 0, 0, list(range(12))))
    stage.on_done(_done(stream, 0, 12))
    stage.pump(session)
    assert all(b.refs is None for b, _ in rec.batches())
    got = [i for h, c in rec.batches() for i in _ids(pool, h, c)]
    assert sorted(got) == list(range(12))
    assert arena.used_blocks() == 0  # copied out and freed by the stage


def test_duplicates_and_chunks_nobody_wants_are_freed(pool):
    rec, stage, session, stream, arena = _setup(pool, batch_size=100)
    stage.on_chunk(*_chunk(stream, arena, 0, 0, [0, 1, 2, 3]))
    stage.on_chunk(*_chunk(stream, arena, 0, 2, [2, 3, 4]))  # a replacement worker re-reads records 2..3
    assert stage.dropped_duplicates == 2 and arena.used_blocks() == 5
    stage.on_chunk(*_chunk(stream, arena, 0, 0, [0, 1]))  # all duplicates
    chunk, cols = _chunk(stream, arena, 0, 0, [7, 8])
    stage.on_chunk(dataclasses.replace(chunk, stream=999), cols)  # a cancelled stream
    assert arena.used_blocks() == 5
    stage.drop_stream(stream)
    assert arena.used_blocks() == 0


def test_drop_last_and_leaving_clients_free_their_rows(pool):
    rec, stage, session, stream, arena = _setup(pool, drop_last=True, shuffle=3)
    stage.on_chunk(*_chunk(stream, arena, 0, 0, list(range(10))))
    stage.on_done(_done(stream, 0, 10))
    stage.pump(session)
    assert len(rec.batches()) == 2 and isinstance(rec.messages[-1][0], P.End)
    assert arena.used_blocks() == 8  # the 2 rows of the short last batch are freed already
    stage.close_session(session)  # the client left before taking its batches
    assert arena.used_blocks() == 0


def test_mixed_inline_and_reference_chunks_keep_one_form_per_stream(pool):
    rec, stage, session, stream, arena = _setup(pool, files=(0, 1))
    stage.on_chunk(*_chunk(stream, arena, 0, 0, [0, 1, 2]))
    stage.on_chunk(*_chunk(stream, arena, 0, 3, [3], inline=True))  # the worker's arena was full
    stage.on_chunk(*_chunk(stream, arena, 1, 0, [10, 11, 12, 13]))
    stage.on_done(_done(stream, 0, 4))
    stage.on_done(_done(stream, 1, 4))
    stage.pump(session)
    batches = rec.batches()
    assert [b.refs is not None for b, _ in batches] == [False, True]  # the batch holding local rows is copied out
    assert [_ids(pool, *b) for b in batches] == [[0, 1, 2, 3], [10, 11, 12, 13]]
    assert stage.refs.local == {}
    stage.on_credit(session, 1, 2)
    assert arena.used_blocks() == 0

    rec, stage, session, stream, arena = _setup(pool)
    stage.on_chunk(*_chunk(stream, arena, 0, 0, [0, 1], inline=True))  # the stream starts inline
    stage.on_chunk(*_chunk(stream, arena, 0, 2, [2, 3]))
    assert stream.ref_columns == frozenset() and arena.used_blocks() == 0  # copied out at once
    stage.on_done(_done(stream, 0, 4))
    stage.pump(session)
    assert [_ids(pool, *b) for b in rec.batches()] == [[0, 1, 2, 3]]


def test_retired_arena_is_held_while_the_stage_has_its_rows(pool):
    rec, stage, session, stream, arena = _setup(pool, batch_size=4)
    stage.on_chunk(*_chunk(stream, arena, 0, 0, [0, 1]))
    pool.retire(arena.arena_id, now=0.0)
    assert stage.arenas_held() == {arena.arena_id}
    assert pool.collect(stage.arenas_held(), now=1e9) == []
    stage.drop_stream(stream)
    assert pool.collect(stage.arenas_held(), now=10.0) == [arena.arena_id]


def test_malformed_reference_columns_are_dropped(pool):
    rec, stage, session, stream, arena = _setup(pool)
    chunk = P.Chunk(
        stream=stream.stream_id, file=0, lease=1, worker="w1", record=0, count=2, refs={"x": {0: ["<f4", [ROW]]}}
    )
    stage.on_chunk(chunk, {"x": np.zeros((2, 2), np.int64)})
    good = np.array([[arena.arena_id, 0, 0], [arena.arena_id, 1, 0]], dtype=np.int64)
    stage.on_chunk(dataclasses.replace(chunk, refs={"x": {0: ["|O", [1]]}}), {"x": good})
    stage.on_chunk(chunk, {"x": np.array([[77, 0, 0], [77, 1, 0]], dtype=np.int64)})  # an arena we never made
    assert stream.rows_buffered == 0


def test_reference_spec_of_a_dtype_numpy_does_not_know_is_dropped(pool):
    # Such a chunk decodes (``Chunk.refs`` holds a dtype string, unchecked by the protocol): the stage must
    # drop it like any other malformed reference column, not raise into the daemon's loop.
    rec, stage, session, stream, arena = _setup(pool)
    good = np.array([[arena.arena_id, 0, 0], [arena.arena_id, 1, 0]], dtype=np.int64)
    chunk = P.Chunk(
        stream=stream.stream_id,
        file=0,
        lease=1,
        worker="w1",
        record=0,
        count=2,
        refs={"x": {0: ["not-a-dtype", [ROW]]}},
    )
    assert P.decode(P.encode(chunk, {"x": good}))[0] == chunk
    stage.on_chunk(chunk, {"x": good})
    assert stream.rows_buffered == 0


@pytest.mark.parametrize("first_inline", [False, True])
def test_reference_rows_of_another_width_fail_the_file_like_inline_rows(pool, first_inline):
    from loader.service.daemon.streams import StreamFailed

    rec, stage, session, stream, arena = _setup(pool, files=(0, 1))
    stage.files = ["/data/a.npy", "/data/b.npy"]
    stage.on_chunk(*_chunk(stream, arena, 0, 0, [0, 1], inline=first_inline))
    wide = np.zeros((2, ROW + 8), np.float32)  # the same column, rows 8 values wider, through the arena
    chunk = P.Chunk(stream=stream.stream_id, file=1, lease=1, worker="w1", record=5, count=2)
    refs = R.write_column(arena, wide)
    stage.on_chunk(dataclasses.replace(chunk, refs={"x": {0: ["<f4", [ROW + 8]]}}), {"x": refs})
    failed = [e for e in stage.events if isinstance(e, StreamFailed)]
    assert len(failed) == 1
    error = failed[0].error
    assert error["file"] == "/data/b.npy" and error["record"] == 5
    assert f"({ROW + 8},)" in error["message"] and f"({ROW},)" in error["message"]
    assert stream.rows_buffered == 2
