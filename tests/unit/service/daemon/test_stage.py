"""Stage logic without sockets: exactly-once under re-sends and interleaving, credits, END, errors."""

from __future__ import annotations

import collections
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from loader.service import protocol as P
from loader.service.daemon.stage import Stage
from loader.service.daemon.streams import StreamFailed


class Recorder:
    def __init__(self):
        self.messages = []

    def __call__(self, peer, frames):
        self.messages.append((peer, *P.decode(frames)))
        return True

    def kinds(self):
        return [type(m[1]) for m in self.messages]


def _stage(send, batch_size=4, shuffle=0, drop_last=False):
    return Stage(
        batch_size=batch_size, drop_last=drop_last, shuffle_buffer=shuffle, seed=3, samples_per_message=8, send=send
    )


def _chunk(stream, f, first, values):
    chunk = P.Chunk(stream=stream.stream_id, file=f, lease=1, worker="w1", record=first, count=len(values))
    return chunk, {"x": np.asarray(values)}


def _done(stream, f, sent):
    return P.FileDone(stream=stream.stream_id, file=f, lease=1, worker="w1", sent=sent)


def _open(stage, files, credits=100):
    session = stage.open_session(b"peer", 0, 1, prefetch=credits)
    stream = stage.new_stream(
        settings=stage.settings, epoch=0, world_size=1, order=list(files), job="job", prefetch=session.prefetch
    )
    stage.attach(session, stream, gen=1, credits=credits)
    return session, stream


def test_batches_flow_with_credits_and_end_follows():
    rec = Recorder()
    stage = _stage(rec)
    session, stream = _open(stage, [0], credits=2)
    stage.on_chunk(*_chunk(stream, 0, 0, list(range(10))))
    stage.on_done(_done(stream, 0, 10))
    stage.pump(session)
    assert rec.kinds() == [P.Batch, P.Batch], "no more than the credits"
    session.credits += 5
    stage.pump(session)
    assert rec.kinds() == [P.Batch, P.Batch, P.Batch, P.End]
    assert [m[2]["x"].tolist() for m in rec.messages[:3]] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert rec.messages[-1][1].samples == 10


def test_epoch_ends_only_when_every_file_is_done():
    # A worker sends a file's chunks, then its FILE_DONE, on one connection: the done marker closes the file.
    rec = Recorder()
    stage = _stage(rec)
    session, stream = _open(stage, [0, 1])
    stage.on_chunk(*_chunk(stream, 0, 0, [1, 2]))
    stage.on_chunk(*_chunk(stream, 1, 0, [7]))
    stage.pump(session)
    assert rec.kinds() == []
    stage.on_chunk(*_chunk(stream, 0, 2, [3]))
    stage.on_done(_done(stream, 0, 3))
    stage.pump(session)
    assert P.End not in rec.kinds(), "file 1 is not done yet"
    stage.on_done(_done(stream, 1, 1))
    stage.pump(session)
    assert rec.kinds() == [P.Batch, P.End]
    assert rec.messages[0][2]["x"].tolist() == [1, 2, 3, 7], "files in the epoch's order"


def test_chunks_of_unknown_or_failed_streams_are_dropped():
    rec = Recorder()
    stage = _stage(rec)
    session, stream = _open(stage, [0])
    stage.on_chunk(P.Chunk(stream=999, file=0, lease=1, worker="w1", record=0, count=1), {"x": np.zeros(1)})
    stage.on_file_error(P.FileError(stream=stream.stream_id, file=0, lease=1, worker="w1", error={"type": "Boom"}))
    assert stage.events[-1] == StreamFailed(stream, {"type": "Boom"})
    stage.on_chunk(*_chunk(stream, 0, 0, [1, 2]))
    assert stream.rows_buffered == 0


def test_may_lease_stops_when_buffer_is_full():
    stage = _stage(Recorder())
    session, stream = _open(stage, [0], credits=0)
    assert stage.may_lease(stream.stream_id, 0)
    stage.on_chunk(*_chunk(stream, 0, 0, [0, 1]))
    record = 2
    while stream.rows_buffered < stage.buffer_limit_rows(stream):  # the bound holds one chunk (2 rows) more
        assert stage.may_lease(stream.stream_id, 0)
        stage.on_chunk(*_chunk(stream, 0, record, [record, record + 1]))
        record += 2
    assert not stage.may_lease(stream.stream_id, 0)
    assert not stage.may_lease(12345, 0)


def test_the_rows_a_rank_leaves_behind_stop_counting_against_the_buffer():
    # A 2-rank job whose rank 1 left mid-epoch: its share of the steps cut was freed but still counted as
    # buffered, so the stream stayed "full", no file was leased and rank 0 waited until the stall timeout.
    rec = Recorder()
    stage = _stage(rec)
    ranks = [stage.open_session(f"peer{r}".encode(), r, 2, prefetch=1) for r in range(2)]
    stream = stage.new_stream(settings=stage.settings, epoch=0, world_size=2, order=[0, 1], job="job", prefetch=1)
    for session in ranks:
        stage.attach(session, stream, gen=1, credits=0)
    record = 0
    while stage.may_lease(stream.stream_id, 0):  # fill the buffer while neither rank takes a batch
        stage.on_chunk(*_chunk(stream, 0, record, list(range(record, record + 8))))
        record += 8
    assert stream.step_rows > 0 and not stage.may_lease(stream.stream_id, 1)
    rank_0_rows = sum(len(step.slices[0]["x"]) for step in stream.steps if step.slices[0] is not None)
    stage.close_session(ranks[1])  # rank 1 leaves
    assert stream.step_rows == rank_0_rows, "only what rank 0 has still to take is buffered"
    ranks[0].credits += 10**6
    while stream.steps:  # rank 0 reads what it has
        stage.pump(ranks[0])
    assert stream.step_rows == 0 and stage.may_lease(stream.stream_id, 1), "room for the next file again"


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 30), min_size=1, max_size=5),
    chunk=st.integers(1, 9),
    shuffle=st.sampled_from([0, 5, 40]),
    resend=st.lists(st.tuples(st.integers(0, 4), st.integers(0, 30)), max_size=4),
    seed=st.integers(0, 2**16),
)
def test_every_record_exactly_once_whatever_the_arrival(sizes, chunk, shuffle, resend, seed):
    """Chunks from several files interleave in any order, and files are partly re-sent (a dead
    worker's replacement starts the file again): every record is delivered exactly once."""
    rec = Recorder()
    stage = _stage(rec, batch_size=3, shuffle=shuffle)
    session, stream = _open(stage, list(range(len(sizes))), credits=10**6)
    offsets = np.cumsum([0] + sizes)
    messages = []
    for f, size in enumerate(sizes):
        for first in range(0, size, chunk):
            values = list(range(offsets[f] + first, offsets[f] + min(first + chunk, size)))
            messages.append(_chunk(stream, f, first, values))
        messages.append((_done(stream, f, size), None))
    for f, upto in resend:
        if f < len(sizes):
            upto = min(upto, sizes[f])
            if upto:
                messages.append(_chunk(stream, f, 0, list(range(offsets[f], offsets[f] + upto))))
    rng = np.random.default_rng(seed)
    # Keep each file's own messages in order (one worker's stream), interleave files at random.
    order = rng.permutation(len(messages))
    per_file = collections.defaultdict(list)
    for msg in messages:
        per_file[msg[0].file].append(msg)
    streams = {f: iter(msgs) for f, msgs in per_file.items()}
    picks = [messages[i][0].file for i in order]
    for f in picks:
        message, cols = next(streams[f])
        if isinstance(message, P.Chunk):
            stage.on_chunk(message, cols)
        else:
            stage.on_done(message)
        stage.pump(session)
    stage.pump(session)
    assert rec.kinds()[-1] is P.End
    got = [v for m in rec.messages if isinstance(m[1], P.Batch) for v in m[2]["x"].tolist()]
    assert sorted(got) == list(range(int(offsets[-1])))
    lengths = [len(m[2]["x"]) for m in rec.messages if isinstance(m[1], P.Batch)]
    assert all(n == 3 for n in lengths[:-1])


def _starving_stream(world_size: int, attached: set[int]) -> Any:
    """What ``Stage._starving`` and ``missing_ranks`` look at of a stream of a job starving since now, its steps cut."""
    import time
    import types

    return types.SimpleNamespace(
        starved_since=time.monotonic(),
        input_done=False,
        steps=[object()],
        world_size=world_size,
        attached_ever=attached,
        ranks_noted=False,
        ranks_looked_at=0.0,
        epoch=0,
        position=0,
        job=f"default/j/{world_size}",
    )


def test_which_ranks_a_starving_stream_waits_for_is_looked_at_once_and_shown_capped(monkeypatch):
    """A job of 65,536 ranks, 32 of them attached and starving: the look at which ranks it waited for (every rank,
    every session) ran each loop turn for each client (a turn took a second; workers took the daemon for gone),
    and each status row listed 65,504 ranks."""
    from loader.service.daemon import stage as stage_module

    stage = _stage(lambda peer, frames: True)
    stream = _starving_stream(65536, set(range(32)))
    looked: list[int] = []
    monkeypatch.setattr(stage, "_ranks_waited_for", lambda s: looked.append(1) or "rank(s) 32, ...")
    for _ in range(100):
        stage._starving(None, stream)  # type: ignore[arg-type]
    assert not looked, "before RANKS_NOTE_S nothing is looked at"
    stream.starved_since -= stage_module.RANKS_NOTE_S
    for _ in range(100):
        stage._starving(None, stream)  # type: ignore[arg-type]
    assert len(looked) == 1, "once at RANKS_NOTE_S, then once every RANKS_NOTE_S until said, and at the stall"
    assert stage.missing_ranks(stream, 8) == list(range(32, 40))  # type: ignore[arg-type]


def test_a_stream_waiting_for_a_rank_that_reads_another_request_of_the_epoch_says_so():
    """Ranks that asked for an epoch a different number of times (each iterated client.epoch() is a request):
    the stall's error said "never asked" of a rank that did ask, for another stream of the epoch."""
    import types

    stage = _stage(lambda peer, frames: True)
    waiting = _starving_stream(2, {0})
    assert "rank(s) 1 of world_size 2, which never asked for this epoch" in stage._ranks_waited_for(waiting)
    other = types.SimpleNamespace(epoch=0, position=0)
    stage.sessions[b"rank-1"] = types.SimpleNamespace(rank=1, job="default/j/2", current=other, finished=None)
    assert "rank(s) 1 of world_size 2, which read another request for epoch 0" in stage._ranks_waited_for(waiting)
    stage.sessions[b"rank-1"].current, stage.sessions[b"rank-1"].finished = None, (0, 4, 4, 600)  # read it to its end
    assert "which read another request for epoch 0" in stage._ranks_waited_for(waiting)


def _reading(stage: Any, peer: bytes, job: str, *, epoch: int, position: int = 0) -> Any:
    """A session of rank 1 of 2 in ``job``, reading a stream of ``epoch`` begun at ``position``; the stream."""
    session = stage.open_session(peer, 1, 2, prefetch=1)
    session.job = job
    stream = stage.new_stream(
        settings=stage.settings, epoch=epoch, world_size=2, order=[0], job=job, prefetch=1, position=position
    )
    stage.attach(session, stream, gen=1, credits=1)
    return stream


def test_a_stream_waiting_for_a_rank_that_read_its_epoch_from_another_place_says_so():
    """Ranks that loaded states of different steps read one epoch from two places, each stream waiting for the
    other's rank: said so, not "the ranks asked for it a different number of times"."""
    stage = _stage(lambda peer, frames: True)
    waiting = _starving_stream(2, {0})
    _reading(stage, b"rank-1", waiting.job, epoch=0, position=24)
    said = stage._ranks_waited_for(waiting)
    assert said.startswith(
        "rank(s) 1 of world_size 2, which read this epoch from another place (rank 1: begun at sample 24; this "
        "stream at sample 0): ranks that loaded states of different steps"
    ), said


def test_a_stream_waiting_for_a_rank_whose_client_left_says_it_left_and_when():
    """A 2-rank job whose rank 1 crashed in epoch 0: rank 0's next epoch waits for rank 1, and the stall said
    rank 1 "never asked", which sent users looking for a misconfigured world_size."""
    stage = _stage(lambda peer, frames: True)
    gone = stage.open_session(b"rank-1", 1, 2, prefetch=1)
    gone.job = "default/j/2"
    stage.close_session(gone)  # its client went silent, or said goodbye
    waiting = _starving_stream(2, {0})
    said = stage._ranks_waited_for(waiting)
    assert said.startswith("rank(s) 1 of world_size 2, whose client left (rank 1 at "), said
    assert "restarted as a whole" in said
    later = _reading(stage, b"rank-1-again", "default/j/2", epoch=1)  # the same job and rank read again
    # Back on another epoch than the one waiting for it, both begun at their start (no resume): said so.
    said = stage._ranks_waited_for(waiting)
    assert said.startswith(
        "rank(s) 1 of world_size 2, which still read another epoch (rank 1: epoch 1, begun at sample 0; this is "
        "epoch 0, begun at sample 0)"
    ), said
    assert "state" not in said  # no resume: no advice about states
    later.position = 300  # as if it had resumed there: then the advice about states
    said = stage._ranks_waited_for(waiting)
    assert "which read another epoch (rank 1: epoch 1, begun at sample 300;" in said, said
    assert "every rank loads the same state" in said
    for rank in range(2, 2 + 70_000):  # remembered ranks are bounded
        left = stage.open_session(f"r{rank}".encode(), rank, 100_000, prefetch=1)
        left.job = "default/big/100000"
        stage.close_session(left)
    assert len(stage.departed) <= 65_536
