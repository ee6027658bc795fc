"""The stage with untidy input: chunks that do not fit, files that fail for good, a stage that is full."""

from __future__ import annotations

import numpy as np
import pytest

from loader.config.sections import MAX_PREFETCH
from loader.service import protocol as P
from loader.service.daemon.stage import Stage
from loader.service.daemon.streams import FileCut, StreamFailed
from loader.service.transport.sockets import HIGH_WATER_MARK
from tests.unit.service.daemon.test_stage import Recorder, _done, _open

FILES = ["/data/a.npy", "/data/b.npy"]


def _stage(send, **kwargs):
    options = {"batch_size": 4, "drop_last": False, "shuffle_buffer": 0, "seed": 3, "samples_per_message": 8}
    return Stage(**{**options, **kwargs}, send=send, files=FILES)


def _chunk(stream, f, first, array, worker="w1"):
    chunk = P.Chunk(stream=stream.stream_id, file=f, lease=1, worker=worker, record=first, count=len(array))
    return chunk, {"x": array}


@pytest.mark.parametrize("shuffle", [0, 6])
def test_rows_of_another_width_fail_the_file_naming_it_and_the_record(shuffle):
    stage = _stage(Recorder(), shuffle_buffer=shuffle)
    _, stream = _open(stage, [0, 1])
    stage.on_chunk(*_chunk(stream, 0, 0, np.zeros((5, 4), np.float32)))
    stage.on_chunk(*_chunk(stream, 1, 7, np.zeros((5, 3), np.float32)))
    failed = [e for e in stage.events if isinstance(e, StreamFailed)]
    assert len(failed) == 1
    error = failed[0].error
    assert error["file"] == "/data/b.npy" and error["record"] == 7 and error["worker"] == "w1"
    assert "(3,)" in error["message"] and "(4,)" in error["message"] and "batch_format" in error["message"]
    assert stream.rows_buffered == 5  # nothing of the misfit joined a buffer


def test_a_dtype_that_differs_fails_too_and_other_fields_name_both():
    stage = _stage(Recorder())
    _, stream = _open(stage, [0, 1])
    stage.on_chunk(*_chunk(stream, 0, 0, np.zeros(4, np.float32)))
    stage.on_chunk(*_chunk(stream, 1, 0, np.zeros(4, np.int64)))
    assert "int64" in stage.events[-1].error["message"]
    # Only the dtype differs: list batches are not the fix (they took it), one dtype is.
    assert "write the files with one dtype, or cast it in a mapper" in stage.events[-1].error["message"]
    assert "batch_format" not in stage.events[-1].error["message"]
    stage2 = _stage(Recorder())
    _, other = _open(stage2, [0, 1])
    stage2.on_chunk(*_chunk(other, 0, 0, np.zeros(4)))
    chunk = P.Chunk(stream=other.stream_id, file=1, lease=1, worker="w", record=0, count=4)
    stage2.on_chunk(chunk, {"y": np.zeros(4)})
    assert "fields ['y']" in stage2.events[-1].error["message"]


def test_a_dtype_of_another_byte_order_says_which_order_each_side_has():
    # A big-endian >i8 file among <i8 ones read "dtype int64, but the batch has dtype int64".
    stage = _stage(Recorder())
    _, stream = _open(stage, [0, 1])
    stage.on_chunk(*_chunk(stream, 0, 0, np.zeros(4, "<i8")))
    stage.on_chunk(*_chunk(stream, 1, 0, np.zeros(4, ">i8")))
    message = stage.events[-1].error["message"]
    assert "dtype int64 (big-endian, >i8), but the batch has rows of shape () and dtype int64 (little-endian, <i8)" in (
        message
    )


def test_under_skip_misfits_are_counted_and_the_rest_is_batched():
    rec = Recorder()
    stage = _stage(rec, on_error="skip")
    session, stream = _open(stage, [0, 1])
    stage.on_chunk(*_chunk(stream, 0, 0, np.zeros((4, 2))))
    stage.on_chunk(*_chunk(stream, 1, 0, np.zeros((3, 5))))
    stage.on_done(_done(stream, 0, 4))
    stage.on_done(_done(stream, 1, 3))
    stage.pump(session)
    assert not [e for e in stage.events if isinstance(e, StreamFailed)]
    assert stage.skipped_records == 3
    assert [m[1].count for m in rec.messages if isinstance(m[1], P.Batch)] == [4]


def test_list_batches_take_ragged_rows_as_objects():
    rec = Recorder()
    stage = _stage(rec, batch_format="list", shuffle_buffer=3)
    session, stream = _open(stage, [0])
    for i, width in enumerate([1, 2, 3, 1, 2]):
        stage.on_chunk(*_chunk(stream, 0, i, np.full((1, width), i)))
    stage.on_done(_done(stream, 0, 5))
    stage.pump(session)
    rows = [row for m in rec.messages if isinstance(m[1], P.Batch) for row in m[2]["x"]]
    assert sorted(int(np.asarray(r)[0]) for r in rows) == [0, 1, 2, 3, 4]


def test_a_file_that_failed_for_good_under_skip_keeps_what_arrived():
    stage = _stage(Recorder(), on_error="skip")
    _, stream = _open(stage, [0])
    stage.on_chunk(*_chunk(stream, 0, 0, np.arange(3)))
    stage.fail_file(stream.stream_id, 0, {"type": "WorkerDiedError", "message": "died"})
    assert stream.input_done and not stream.failed
    assert stage.skipped_records == 1 and stream.rows_buffered == 3


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_a_file_failed_by_a_peer_is_settled_even_if_logging_its_error_raises(monkeypatch, on_error):
    # The error is a peer's: a line of it that could not be made (a list in "file" raised in WorkerError) left
    # the file neither failed nor done, the handler guard dropped the message, and the epoch waited to its timeout.
    import loader.service.daemon.stage as stage_module

    def unprintable(info):
        raise TypeError("an error dict that makes no line")

    monkeypatch.setattr(stage_module.WorkerError, "from_dict", unprintable)
    stage = _stage(Recorder(), on_error=on_error)
    _, stream = _open(stage, [0])
    with pytest.raises(TypeError):
        stage.fail_file(stream.stream_id, 0, {"type": "X", "file": ["a"]})
    assert stream.failed if on_error == "raise" else stream.input_done


@pytest.mark.parametrize("shuffle", [0, 4])
def test_a_chunk_that_raises_once_its_rows_count_as_arrived_fails_the_stream(shuffle):
    # Two structured dtypes of one size share ``dtype.str`` (``|V8``), so the second passed the batch's fit, and
    # np.concatenate refused it in the shuffle's round or the cutter's step after the sequencer had taken its rows:
    # the handler guard dropped the chunk, the FILE_DONE found all 6 records arrived, and the epoch ended with 2.
    rec = Recorder()
    stage = _stage(rec, shuffle_buffer=shuffle)
    session, stream = _open(stage, [0])
    stage.on_chunk(*_chunk(stream, 0, 0, np.zeros(2, "i4,i4")))
    stage.on_chunk(*_chunk(stream, 0, 2, np.zeros(2, "V8")))  # numpy's DTypePromotionError, logged, not raised
    stage.on_chunk(*_chunk(stream, 0, 4, np.zeros(2, "i4,i4")))
    stage.on_done(_done(stream, 0, 6))
    stage.pump(session)
    failed = [e for e in stage.events if isinstance(e, StreamFailed)]
    assert len(failed) == 1 and "taking rows of /data/a.npy failed" in failed[0].error["message"]
    assert P.End not in rec.kinds()


def test_the_stage_stops_accepting_when_full_unless_a_client_starves():
    stage = _stage(Recorder())
    session, stream = _open(stage, [0], credits=0)
    assert stage.accepting()
    # Chunks of 4 rows (the bound holds one chunk on top of the batches: see buffer_limit_rows).
    record = 0
    while stream.rows_buffered < 2 * stage.buffer_limit_rows(stream):
        stage.on_chunk(*_chunk(stream, 0, record, np.arange(record, record + 4)))
        record += 4
    assert not stage.accepting()  # over twice the lease bound and the client has taken nothing
    stage.on_credit(session, stream.gens[0], 1)
    stage.pump(session)  # one batch out: below the bound again
    assert stage.accepting()
    stage.on_chunk(*_chunk(stream, 0, record, np.arange(4)))
    assert not stage.accepting()
    # Another client waits with credits and nothing to receive: pausing would starve it behind this one.
    other = stage.open_session(b"other", 0, 1, prefetch=2)
    waiting = stage.new_stream(settings=stage.settings, epoch=0, world_size=1, order=[1], job="other", prefetch=2)
    stage.attach(other, waiting, gen=1, credits=2)
    assert stage.accepting()


def test_prefetch_stays_below_the_sockets_high_water_mark():
    # Batches in flight plus a few control messages must fit a peer's queue, or a busy client reads as dead.
    assert MAX_PREFETCH + 8 <= HIGH_WATER_MARK
    stage = _stage(Recorder())
    assert stage.open_session(b"p", 0, 1, prefetch=10**6).prefetch == MAX_PREFETCH


def test_a_file_done_whose_chunks_did_not_all_arrive_fails_the_file_instead_of_losing_records():
    stage = _stage(Recorder())
    _, stream = _open(stage, [0, 1])
    stage.lease_start(stream.stream_id, 0)
    stage.on_chunk(*_chunk(stream, 0, 0, np.arange(4)))
    # records 4..7 were sent in a chunk the daemon dropped (malformed, or refused on the way)
    stage.on_done(P.FileDone(stream=stream.stream_id, file=0, lease=1, worker="w1", sent=8))
    failed = [e for e in stage.events if isinstance(e, StreamFailed)]
    assert len(failed) == 1
    error = failed[0].error
    assert error["type"] == "LostDataError" and error["file"] == "/data/a.npy" and error["record"] == 4
    assert "sent 8 record(s)" in error["message"] and "4 arrived" in error["message"]


def test_errors_the_stage_finds_in_a_piece_of_a_file_name_the_record_in_the_file():
    # Lease 1 is records 1000.. of its file (source.records_per_lease): its records are numbered from 0.
    stage = _stage(Recorder(), file_record=lambda file_index, record: record + 1000 * file_index)
    _, stream = _open(stage, [0, 1])
    stage.on_chunk(*_chunk(stream, 0, 0, np.zeros((5, 4), np.float32)))
    stage.on_chunk(*_chunk(stream, 1, 7, np.zeros((5, 3), np.float32)))
    [misfit] = [e.error for e in stage.events if isinstance(e, StreamFailed)]
    assert (misfit["file"], misfit["record"]) == ("/data/b.npy", 1007)
    stage = _stage(Recorder(), file_record=lambda file_index, record: record + 1000 * file_index)
    _, stream = _open(stage, [1, 0])
    stage.lease_start(stream.stream_id, 1)
    stage.on_chunk(*_chunk(stream, 1, 0, np.arange(4)))
    stage.on_done(P.FileDone(stream=stream.stream_id, file=1, lease=1, worker="w1", sent=8))
    [lost] = [e.error for e in stage.events if isinstance(e, StreamFailed)]
    assert (lost["type"], lost["file"], lost["record"]) == ("LostDataError", "/data/b.npy", 1004)


def test_a_new_lease_counts_its_own_chunks():
    rec = Recorder()
    stage = _stage(rec)
    session, stream = _open(stage, [0])
    stage.lease_start(stream.stream_id, 0)
    stage.on_chunk(*_chunk(stream, 0, 0, np.arange(3)))  # the first lease's worker dies here
    assert stage.lease_start(stream.stream_id, 0) == 3, "the next lease starts after what was taken"
    stage.on_chunk(*_chunk(stream, 0, 3, np.arange(3, 5)))
    stage.on_done(P.FileDone(stream=stream.stream_id, file=0, lease=2, worker="w1", sent=2))
    stage.pump(session)
    assert not [e for e in stage.events if isinstance(e, StreamFailed)]
    assert [m[2]["x"].tolist() for m in rec.messages if isinstance(m[1], P.Batch)] == [[0, 1, 2, 3], [4]]


def test_a_rank_that_stops_reading_holds_its_job_back_within_the_bound():
    rec = Recorder()
    stage = _stage(rec)
    fast, slow = stage.open_session(b"fast", 0, 2, prefetch=2), stage.open_session(b"slow", 1, 2, prefetch=2)
    stream = stage.new_stream(settings=stage.settings, epoch=0, world_size=2, order=[0, 1], job="j", prefetch=2)
    stage.attach(fast, stream, gen=1, credits=10**6)
    stage.attach(slow, stream, gen=1, credits=0)  # never takes a batch
    limit = stage.buffer_limit_rows(stream)
    cuts = []
    for first in range(0, 50 * limit, 8):
        stage.on_chunk(*_chunk(stream, 0, first, np.arange(first, first + 8)))
        stage.pump(fast)
        cuts += [e for e in stage.events if isinstance(e, FileCut)]
        if cuts:
            break
        assert stage.accepting() or not stage._starved(fast), "the fast rank is held back, not starved"
    assert cuts and cuts[0].file_index == 0, "the overfull stream's file is cut, to be read again later"
    limit = stage.buffer_limit_rows(stream)  # with one chunk's rows in it now
    assert stream.rows_buffered <= 2 * limit + 8
    assert not stage.may_lease(stream.stream_id, 0)
    # another client starving elsewhere makes the daemon read on: this stream's chunks still take no room
    other = stage.open_session(b"other", 0, 1, prefetch=2)
    waiting = stage.new_stream(settings=stage.settings, epoch=0, world_size=1, order=[1], job="o", prefetch=2)
    stage.attach(other, waiting, gen=1, credits=2)
    assert stage.accepting()
    before = stream.rows_buffered
    stage.on_chunk(*_chunk(stream, 1, 0, np.arange(100)))
    assert stream.rows_buffered == before


def test_under_skip_a_lost_chunk_counts_the_records_it_held():
    rec = Recorder()
    stage = _stage(rec, on_error="skip")
    session, stream = _open(stage, [0])
    stage.lease_start(stream.stream_id, 0)
    stage.on_chunk(*_chunk(stream, 0, 0, np.arange(4)))
    stage.on_done(P.FileDone(stream=stream.stream_id, file=0, lease=1, worker="w1", sent=10, skipped=2))
    stage.pump(session)
    assert stage.skipped_records == 6 + 2, "six records lost on the way, two skipped by the worker"
    assert [m[1].count for m in rec.messages if isinstance(m[1], P.Batch)] == [4]


def test_a_client_found_gone_while_its_last_batches_are_sent_is_dropped_without_an_error():
    # As the desk does: a send that fails drops the session. pump then sent END to the dropped client and
    # deleted it from the stream's members a second time: a KeyError the loop logged as "could not be sent".
    sent = []

    def send(peer, frames):
        message, _ = P.decode(frames)
        if isinstance(message, P.Batch) and sent:
            stage.close_session(stage.sessions[peer])
            return False
        sent.append(message)
        return True

    stage = _stage(send)
    session, stream = _open(stage, [0])
    stage.on_chunk(*_chunk(stream, 0, 0, np.arange(8)))
    stage.on_done(_done(stream, 0, 8))
    stage.pump(session)  # two batches, then END: the second send finds the client gone
    assert [type(m) for m in sent] == [P.Batch]
    assert session.current is None and 0 not in stream.members


def test_epochs_failing_in_a_burst_are_logged_once_a_second_with_a_count(caplog, monkeypatch):
    # One ERROR line each: a client asking for epochs that fail at once could fill the disk with the log.
    import loader.service.daemon.stage as stage_module

    clock = [100.0]
    monkeypatch.setattr(stage_module.time, "monotonic", lambda: clock[0])
    stage = _stage(Recorder())
    error = {"type": "ValueError", "message": "bad", "file": "/data/a.npy", "record": 0}
    with caplog.at_level("ERROR", logger="loader.stage"):
        for epoch in range(5):
            stream = stage.new_stream(
                settings=stage.settings, epoch=epoch, world_size=1, order=[0], job="j", prefetch=2
            )
            stage.fail_file(stream.stream_id, 0, error)
        clock[0] += 1.5
        stream = stage.new_stream(settings=stage.settings, epoch=5, world_size=1, order=[0], job="j", prefetch=2)
        stage.fail_file(stream.stream_id, 0, error)
    lines = [r.getMessage() for r in caplog.records if "failed:" in r.getMessage()]
    assert len(lines) == 2 and lines[0].startswith("epoch 0 of j failed: ValueError: bad")
    assert lines[1].startswith("epoch 5 ") and lines[1].endswith("(4 more epochs failed since the last line)")
    assert all(isinstance(e, StreamFailed) for e in stage.events) and len(stage.events) == 6  # all failed all the same


def test_a_fault_while_skipping_a_file_fails_that_epoch_not_the_daemon(monkeypatch, caplog):
    # A lost worker's file is skipped from the daemon's housekeeping, outside any message's guard: whatever
    # goes wrong there must end that stream with one error, and leave the loop (and other streams) running.
    stage = _stage(Recorder(), on_error="skip")
    _, stream = _open(stage, [0, 1])

    def broken(*args, **kwargs):
        raise RuntimeError("sequencer out of step")

    monkeypatch.setattr(stage, "_finish_file", broken)
    with caplog.at_level("ERROR", logger="loader.stage"):
        stage.fail_file(stream.stream_id, 1, {"type": "WorkerDiedError", "message": "died"})
    failed = [e for e in stage.events if isinstance(e, StreamFailed)]
    assert stream.failed and len(failed) == 1
    error = failed[0].error
    assert error["file"] == "/data/b.npy"
    assert error["message"] == "skipping the rest of /data/b.npy failed: RuntimeError: sequencer out of step"
    assert any("skipping the rest of file index 1 (epoch 0) failed" in r.getMessage() for r in caplog.records)


def test_a_fault_while_completing_a_file_fails_that_epoch_at_once(monkeypatch):
    # A FILE_DONE's handler is guarded per message, but dropping the message would leave the stream waiting
    # for a file that never completes (until the stall timeout): the epoch fails now, naming the file.
    stage = _stage(Recorder())
    _, stream = _open(stage, [0, 1])
    stage.on_chunk(*_chunk(stream, 0, 0, np.zeros((8, 2), np.float32)))

    def broken(*args, **kwargs):
        raise RuntimeError("sequencer out of step")

    monkeypatch.setattr(stage, "_finish_file", broken)
    stage.on_done(_done(stream, 0, 8))
    failed = [e for e in stage.events if isinstance(e, StreamFailed)]
    assert stream.failed and len(failed) == 1
    assert failed[0].error["message"] == "completing /data/a.npy failed: RuntimeError: sequencer out of step"


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_a_lease_holders_error_text_reaches_the_log_as_one_printable_line(on_error, caplog):
    # A FILE_ERROR's words are its sender's: its first line was logged as it came, terminal escapes and all.
    stage = _stage(Recorder(), on_error=on_error)
    _, stream = _open(stage, [0, 1])
    error = {"type": "Forged\x1b[2J", "message": "title\x1b]0;pwned\x07 then\ra second line"}
    with caplog.at_level("WARNING", logger="loader.stage"):
        stage.on_file_error(P.FileError(stream=stream.stream_id, file=0, lease=1, worker="w", error=error))
    lines = [r.getMessage() for r in caplog.records if "Forged" in r.getMessage()]
    assert len(lines) == 1 and lines[0].isprintable(), lines
    assert "Forged?[2J: title?]0;pwned? then" in lines[0] and "second line" not in lines[0]
