"""A stream's byte bound (``service.stream_buffer_mib``): what it may hold besides its reorder window is
bounded in bytes as well as rows, and a job that could only go on by holding more fails in one line."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from loader.config import LoaderConfig
from loader.errors import ConfigError
from loader.service import protocol as P
from loader.service.blocks import row_nbytes_estimate
from loader.service.daemon.stage import ROW_BYTES_MIN_ROWS, Stage
from loader.service.daemon.streams import StreamFailed
from tests.unit.service.daemon.test_stage import Recorder

ROW = 1024  # bytes a row: 128 float64


def _stage(budget_bytes: int, batch_size: int = 4, shuffle: int = 0) -> tuple[Stage, Recorder]:
    rec = Recorder()
    stage = Stage(
        batch_size=batch_size,
        drop_last=False,
        shuffle_buffer=shuffle,
        seed=3,
        samples_per_message=64,
        send=rec,
        stream_buffer_bytes=budget_bytes,
    )
    return stage, rec


def _open(stage: Stage, world_size: int, prefetch: int = 16):
    session = stage.open_session(b"peer", 0, world_size, prefetch=prefetch)
    stream = stage.new_stream(
        settings=stage.settings, epoch=0, world_size=world_size, order=[0], job="job", prefetch=session.prefetch
    )
    stage.attach(session, stream, gen=1, credits=prefetch)
    return session, stream


def _chunk(stream, first: int, rows: int):
    chunk = P.Chunk(stream=stream.stream_id, file=0, lease=1, worker="w1", record=first, count=rows)
    return chunk, {"x": np.zeros((rows, ROW // 8))}


def test_prefetch_is_cut_to_the_byte_bound_but_never_below_one_step():
    stage, _ = _stage(budget_bytes=64 * ROW)
    _, stream = _open(stage, world_size=2, prefetch=16)
    rows_only = stage.buffer_limit_rows(stream)
    assert rows_only == 2 * 4 * (16 + 2)  # rows alone until the first chunk says how big a row is
    stage.on_chunk(*_chunk(stream, 0, 8))
    assert stream.row_bytes == ROW
    assert stage.buffer_limit_rows(stream) == 64  # 64 KiB of 1 KiB rows, not 2 x 4 x 18 + 8 = 152
    assert not stage.events

    tight, _ = _stage(budget_bytes=13 * ROW)  # one step (8 rows) and a chunk (4), with a row to spare
    _, narrow = _open(tight, world_size=2, prefetch=16)
    tight.on_chunk(*_chunk(narrow, 0, 4))
    assert tight.buffer_limit_rows(narrow) == 13
    assert tight.rows_needed(narrow) == 2 * 4 + 4
    assert not tight.events
    tighter, _ = _stage(budget_bytes=11 * ROW)
    _, failing = _open(tighter, world_size=2, prefetch=16)
    tighter.on_chunk(*_chunk(failing, 0, 4))
    assert [type(e) for e in tighter.events] == [StreamFailed], "12 rows needed, 11 allowed"


def test_a_step_beyond_the_byte_bound_fails_the_epoch_in_one_line():
    stage, _ = _stage(budget_bytes=1024 * ROW, batch_size=8)
    _, stream = _open(stage, world_size=4096)  # a step of 32,768 rows: 32 MiB against 1 MiB
    for first in range(0, ROW_BYTES_MIN_ROWS, 8):  # rows enough to know their size (a quarter MiB: not before)
        assert not stage.events, "failed before it knew its rows' size"
        stage.on_chunk(*_chunk(stream, first, 8))
    failed = [e for e in stage.events if isinstance(e, StreamFailed)]
    assert len(failed) == 1 and failed[0].stream is stream
    message = failed[0].error["message"]
    assert failed[0].error["type"] == "StreamBufferError"
    assert "world_size 4096 x batch_size 8" in message and "service.stream_buffer_mib" in message
    assert "\n" not in message
    assert stream.rows_buffered == ROW_BYTES_MIN_ROWS - 8, "the chunk that showed it is not kept"
    stage.on_chunk(*_chunk(stream, ROW_BYTES_MIN_ROWS, 8))
    assert stream.rows_buffered == ROW_BYTES_MIN_ROWS - 8 and len(stage.events) == 1, "it takes nothing more"


def test_the_shuffle_window_counts_towards_what_a_stream_needs():
    stage, _ = _stage(budget_bytes=3000 * ROW, shuffle=2000)  # one buffer's rows fit, not the two it needs
    _, stream = _open(stage, world_size=1)
    for first in range(0, ROW_BYTES_MIN_ROWS, 8):
        stage.on_chunk(*_chunk(stream, first, 8))
    failed = [e for e in stage.events if isinstance(e, StreamFailed)]
    assert failed and "2 x shuffle_buffer 2000" in failed[0].error["message"]


def test_within_the_bound_every_record_arrives_once():
    stage, rec = _stage(budget_bytes=24 * ROW)
    session, stream = _open(stage, world_size=1, prefetch=64)
    sent = 0
    while sent < 100:
        if stage.may_lease(stream.stream_id, 0):
            n = min(8, 100 - sent)
            chunk, columns = _chunk(stream, sent, n)
            columns["x"][:, 0] = np.arange(sent, sent + n)
            stage.on_chunk(chunk, columns)
            sent += n
        assert stream.rows_buffered <= 2 * stage.buffer_limit_rows(stream)
        session.credits = 64
        stage.pump(session)
    stage.on_done(P.FileDone(stream=stream.stream_id, file=0, lease=1, worker="w1", sent=100))
    stage.pump(session)
    rows = [m[2]["x"][:, 0] for m in rec.messages if isinstance(m[1], P.Batch)]
    assert np.concatenate(rows).tolist() == list(range(100))
    assert isinstance(rec.messages[-1][1], P.End)


def test_object_rows_are_counted_by_what_they_hold():
    ragged = P.object_array([np.zeros(1000, np.uint8), np.zeros(3000, np.uint8)])
    assert 2000 <= row_nbytes_estimate({"x": ragged}) <= 2100
    texts = P.object_array([b"a" * 500, b"b" * 1500])
    assert 1000 <= row_nbytes_estimate({"t": texts, "y": np.zeros(2)}) <= 1100
    assert row_nbytes_estimate({"x": np.zeros((3, 10), np.float32)}) == 40


def test_the_setting_is_checked():
    config = LoaderConfig.from_dict({"source": {"files": ["x.npy"]}, "service": {"stream_buffer_mib": 16}})
    assert config.service.stream_buffer_mib == 16
    try:
        LoaderConfig.from_dict({"source": {"files": ["x.npy"]}, "service": {"stream_buffer_mib": 0}})
    except ConfigError as exc:
        assert "stream_buffer_mib" in str(exc)
    else:
        raise AssertionError("stream_buffer_mib = 0 was taken")


@settings(max_examples=80, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 40), min_size=1, max_size=4),
    chunk=st.integers(1, 9),
    world_size=st.integers(1, 3),
    batch_size=st.integers(1, 5),
    shuffle=st.sampled_from([0, 3, 17]),
    prefetch=st.integers(1, 8),
    spare_rows=st.integers(-3, 40),
)
def test_any_byte_bound_either_reads_every_record_or_fails_at_once(
    sizes, chunk, world_size, batch_size, shuffle, prefetch, spare_rows
):
    """Whatever the bound, within a few rows of what a step needs or far above it: the epoch ends with every
    record sent (the ranks' shares together, a short tail padded by repeats) and the stream never held more
    than twice its bound, or it fails with StreamBufferError when a step with its shuffle window cannot fit
    (once it has taken rows enough to know their size).
    Never a stall: the bound never goes below what the stream needs to cut a step."""
    rows_needed = 2 * shuffle + world_size * batch_size + min(chunk, max(sizes))  # the largest chunk sent
    stage, rec = _stage(budget_bytes=max(1, rows_needed + spare_rows) * ROW, batch_size=batch_size, shuffle=shuffle)
    sessions = [stage.open_session(bytes([r]), r, world_size, prefetch=prefetch) for r in range(world_size)]
    stream = stage.new_stream(
        settings=stage.settings,
        epoch=0,
        world_size=world_size,
        order=list(range(len(sizes))),
        job="job",
        prefetch=prefetch,
    )
    for session in sessions:
        stage.attach(session, stream, gen=1, credits=prefetch)
    offsets = np.cumsum([0, *sizes])
    pending = [(f, first) for f, size in enumerate(sizes) for first in range(0, size, chunk)]
    done_sent = set()
    idle = 0
    while idle < 3:
        progressed = False
        if pending and stage.accepting() and not stream.failed:
            f, first = pending[0]
            if first > 0 or stage.may_lease(stream.stream_id, f):  # a file once begun is the worker's to finish
                n = min(chunk, sizes[f] - first)
                header = P.Chunk(stream=stream.stream_id, file=f, lease=1, worker="w1", record=first, count=n)
                columns = {"x": np.zeros((n, ROW // 8))}
                columns["x"][:, 0] = np.arange(offsets[f] + first, offsets[f] + first + n)
                stage.on_chunk(header, columns)
                pending.pop(0)
                progressed = True
                assert stream.rows_buffered - stream.sequencer.held_rows <= 2 * stage.buffer_limit_rows(stream) + n
        for f, size in enumerate(sizes):  # FILE_DONE once its chunks are all sent
            if f not in done_sent and not any(p[0] == f for p in pending):
                stage.on_done(P.FileDone(stream=stream.stream_id, file=f, lease=1, worker="w1", sent=size))
                done_sent.add(f)
                progressed = True
        before = len(rec.messages)
        for session in sessions:
            session.credits = prefetch  # each rank takes what came
            stage.pump(session)
        progressed = progressed or len(rec.messages) > before
        idle = 0 if progressed else idle + 1
    failed = [e for e in stage.events if isinstance(e, StreamFailed)]
    over = rows_needed * ROW > stage.stream_buffer_bytes
    if failed:
        assert over and failed[0].error["type"] == "StreamBufferError", failed[0].error["message"]
        return
    # Over the bound, a stream fails once it knows its rows' size: from ROW_BYTES_MIN_ROWS rows, or a quarter
    # of the bound in bytes; an epoch smaller than that is read whole (it holds no more than that).
    known = sum(sizes) >= ROW_BYTES_MIN_ROWS or sum(sizes) * ROW > stage.stream_buffer_bytes // 4
    assert not (over and known), "a stream whose step cannot fit did not fail"
    ends = [m for m in rec.messages if isinstance(m[1], P.End)]
    assert len(ends) == world_size, "every rank's epoch ended"
    got = [int(v) for m in rec.messages if isinstance(m[1], P.Batch) for v in m[2]["x"][:, 0]]
    assert set(got) == set(range(int(offsets[-1])))
    assert len(got) - int(offsets[-1]) < world_size, "no more than the tail's repeats"


def test_deeply_nested_object_rows_are_estimated_not_a_recursion_error():
    """A worker's list nested 500 deep (msgpack packs up to 511) raised RecursionError in the estimate, after
    the chunk's references were adopted; a dict's items (a converted LoDTensor) counted 8 bytes."""
    deep: list = []
    for _ in range(500):
        deep = [deep]
    assert row_nbytes_estimate({"x": P.object_array([deep, deep])}) < 1000
    stage, _ = _stage(budget_bytes=1 << 30)
    _, stream = _open(stage, world_size=1)
    chunk = P.Chunk(stream=stream.stream_id, file=0, lease=1, worker="w1", record=0, count=2)
    stage.on_chunk(chunk, {"x": P.object_array([deep, deep])})
    assert stream.rows_buffered == 2 and not stage.events
    lod = {"data": np.zeros(4096, np.float32), "recursive_sequence_lengths": [[2, 2]]}
    assert row_nbytes_estimate({"t": P.object_array([lod, lod])}) >= 16384


def test_one_big_sample_among_small_ones_does_not_fail_the_epoch():
    """Ragged rows travel inline, and a big one comes in a chunk of its own: taken as every row's size (the
    largest chunk's mean), one 2 MiB sample among 1 KiB ones failed an epoch that needs about 3 MiB, claiming
    it needed 4 GiB. The mean row decides; rows that are all big still fail it."""

    def ragged(stream, first, sizes):
        chunk = P.Chunk(stream=stream.stream_id, file=0, lease=1, worker="w1", record=first, count=len(sizes))
        return chunk, {"x": P.object_array([np.zeros(n, np.uint8) for n in sizes])}

    for big_at in (5, 0):  # among the first chunks, or the very first
        stage, _ = _stage(budget_bytes=64 * 2**20, batch_size=32, shuffle=1000)
        _, stream = _open(stage, world_size=8, prefetch=2)  # needs 2 x 1000 + 256 + 64 rows
        first = 0
        for k in range(40):
            sizes = [2 * 2**20] if k == big_at else [1024] * 64
            stage.on_chunk(*ragged(stream, first, sizes))
            first += len(sizes)
        assert not stage.events, stage.events[0].error["message"]
        assert stream.row_bytes < 4096

    stage, _ = _stage(budget_bytes=64 * 2**20, batch_size=32, shuffle=1000)
    _, stream = _open(stage, world_size=8, prefetch=2)
    for first in range(0, 20 * 16, 16):  # every row 64 KiB: 2,320 of them are 145 MiB
        stage.on_chunk(*ragged(stream, first, [64 * 1024] * 16))
    failed = [e for e in stage.events if isinstance(e, StreamFailed)]
    assert failed and "service.stream_buffer_mib = 64" in failed[0].error["message"]
