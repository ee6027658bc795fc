"""Packed BATCH messages (``Epoch.pack``): several small batches of one rank in one message, one credit."""

from __future__ import annotations

import numpy as np
import pytest

from loader.service import protocol as P
from loader.service.daemon import stage as stage_module
from loader.service.daemon.stage import Stage


class Recorder:
    def __init__(self):
        self.messages = []

    def __call__(self, peer, frames):
        self.messages.append(P.decode(frames))
        return True


def _run(pack, credits=100, values=None, shuffle=0, world_size=1, rows=50):
    """The BATCH messages a client with ``pack`` gets for one file of ``rows`` rows (batch 4)."""
    rec = Recorder()
    stage = Stage(batch_size=4, drop_last=False, shuffle_buffer=shuffle, seed=3, samples_per_message=64, send=rec)
    sessions = [stage.open_session(f"peer{r}".encode(), r, world_size, prefetch=4) for r in range(world_size)]
    stream = stage.new_stream(settings=stage.settings, epoch=0, world_size=world_size, order=[0], job="job", prefetch=4)
    for session in sessions:
        stage.on_epoch_request(session, False, pack)
        stage.attach(session, stream, gen=1, credits=credits)
    x = np.arange(rows) if values is None else values
    for first in range(0, rows, 16):
        chunk = P.Chunk(
            stream=stream.stream_id, file=0, lease=1, worker="w", record=first, count=len(x[first : first + 16])
        )
        stage.on_chunk(chunk, {"x": x[first : first + 16]})
    stage.on_done(P.FileDone(stream=stream.stream_id, file=0, lease=1, worker="w", sent=rows))
    for session in sessions:
        stage.pump(session)
    return [(m, c) for m, c in rec.messages if isinstance(m, P.Batch)], sessions


def _batches(messages):
    """Every batch, split out of its message as the client does: (rows, position, anchor)."""
    out = []
    for message, columns in messages:
        parts = message.parts or [[message.count, message.position, *(message.anchor or ())]]
        start = 0
        for count, position, *anchor in parts:
            out.append((columns["x"][start : start + count].tolist(), position, anchor))
            start += count
    return out


@pytest.mark.parametrize("shuffle", [0, 12])
def test_packed_messages_hold_the_same_batches_in_the_same_order(shuffle):
    single, _ = _run(pack=1, shuffle=shuffle)
    packed, _ = _run(pack=5, shuffle=shuffle)
    assert all(m.parts is None for m, _ in single) and len(single) == 13
    assert len(packed) < len(single) and max(len(m.parts or [0]) for m, _ in packed) == 5
    assert _batches(packed) == _batches(single)
    for message, columns in packed:  # the header's count, position and anchor are the whole message's
        assert message.count == len(columns["x"]) == sum(p[0] for p in message.parts or [[message.count]])
        if message.parts:
            assert [message.position, *message.anchor] == message.parts[-1][1:]


def test_each_packed_message_costs_one_credit():
    packed, sessions = _run(pack=4, credits=2)
    assert len(packed) == 2 and [len(m.parts) for m, _ in packed] == [4, 4]
    assert sessions[0].credits == 0 and sessions[0].batches_sent == 8


def test_ranks_get_their_own_batches_packed():
    single, _ = _run(pack=1, world_size=2, rows=64)
    packed, _ = _run(pack=3, world_size=2, rows=64)
    assert _batches(packed) == _batches(single)


def test_a_message_stays_within_the_byte_bound(monkeypatch):
    monkeypatch.setattr(stage_module, "PACK_BYTES", 3 * 4 * 8)  # three batches of four int64 rows
    packed, _ = _run(pack=P.MAX_PACK)
    assert max(len(m.parts or [0]) for m, _ in packed) == 3
    assert _batches(packed) == _batches(_run(pack=1)[0])


def test_ragged_batches_travel_one_per_message():
    values = np.empty(20, dtype=object)
    for i in range(20):
        values[i] = np.arange(i % 3 + 1)
    packed, _ = _run(pack=8, values=values, rows=20)
    assert len(packed) == 5 and all(m.parts is None for m, _ in packed)


class FrameRecorder(Recorder):
    def __call__(self, peer, frames):
        self.frames = [*getattr(self, "frames", []), list(frames)]
        return super().__call__(peer, frames)


def test_a_run_of_batches_from_one_chunk_goes_as_a_view_and_ends_at_the_chunk(monkeypatch):
    # Chunks of 16 rows hold 4 batches of 4. A message of up to 8 batches took the next chunk's batches too and
    # copied all of them; a run of adjacent batches this large now ends at its chunk and is sent as a view of it.
    monkeypatch.setattr(stage_module, "PACK_RUN_BYTES", 2 * 4 * 8)  # two batches of four int64 rows
    rows = 64
    x = np.arange(rows)
    rec = FrameRecorder()
    stage = Stage(batch_size=4, drop_last=False, shuffle_buffer=0, seed=3, samples_per_message=64, send=rec)
    session = stage.open_session(b"peer", 0, 1, prefetch=4)
    stream = stage.new_stream(settings=stage.settings, epoch=0, world_size=1, order=[0], job="job", prefetch=4)
    stage.on_epoch_request(session, False, 8)
    stage.attach(session, stream, gen=1, credits=100)
    chunks = [x[first : first + 16].copy() for first in range(0, rows, 16)]
    for first, values in zip(range(0, rows, 16), chunks):
        chunk = P.Chunk(stream=stream.stream_id, file=0, lease=1, worker="w", record=first, count=16)
        stage.on_chunk(chunk, {"x": values})
    stage.on_done(P.FileDone(stream=stream.stream_id, file=0, lease=1, worker="w", sent=rows))
    stage.pump(session)
    sent = [(m, c, f) for (m, c), f in zip(rec.messages, rec.frames) if isinstance(m, P.Batch)]
    assert [len(m.parts or [0]) for m, _, _ in sent] == [4, 4, 4, 4]
    assert [c["x"].tolist() for _, c, _ in sent] == [values.tolist() for values in chunks]
    for (_, _, frames), values in zip(sent, chunks):
        assert any(isinstance(f, np.ndarray) and np.shares_memory(f, values) for f in frames), "copied"
    assert _batches([(m, c) for m, c, _ in sent]) == _batches(_run(pack=1, rows=rows)[0])
