"""A worker's chunks of big mapped rows: they grow to the arena's chunk bound when the rows go by reference,
and go in parts no larger than the message bound when the arena cannot take them."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import workers.columns as columns
from loader.config import LoaderConfig
from loader.service import protocol as P
from loader.service.shm import refs as R
from loader.service.shm.pool import ArenaPool
from tests.unit.workers.file_jobs import run_file_job
from workers.arena_writer import ArenaWriter
from workers.columns import MAX_CHUNK_BYTES
from workers.file_job import FileJob, inline_parts

HERE = "tests.unit.workers.test_arena_chunks"
MIB = 1024 * 1024
ROW_FLOATS = 25_600  # 100 KiB of float32: a row that travels by reference
RECORDS = 200


def huge_at_7(sample: Any) -> Any:
    """Small rows, but record 7's is 2 MiB."""
    (value,) = sample
    return (np.zeros(512 * 1024 if value == 7 else 4, np.float32),)


def widen(sample: Any) -> Any:
    """A record's value as a 100 KiB row, with its label."""
    (value,) = sample
    return (np.full(ROW_FLOATS, float(value), np.float32), np.int64(value))


def widen_but_fail_at_50(sample: Any) -> Any:
    (value,) = sample
    if value == 150:  # record 50
        raise ValueError("record 50 is bad")
    return widen(sample)


@pytest.fixture(autouse=True)
def no_chunk_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(columns, "MAX_CHUNK_DELAY_S", 3600.0)  # only sizes end chunks, however slow the run


@pytest.fixture
def data_file(tmp_path: Any) -> str:
    path = str(tmp_path / "values.npy")
    np.save(path, np.arange(RECORDS, dtype=np.int64) * 3)
    return path


def run_job(path: str, writer: ArenaWriter) -> tuple[list[tuple[P.Message, dict[str, Any], int]], P.Message]:
    """One lease of ``path`` mapped by ``widen``: ([(chunk, columns, inline bytes)], the closing message)."""
    config = LoaderConfig.from_dict(
        {
            "source": {"files": [path]},
            "pipeline": {"batch_size": 4, "mappers": [f"{HERE}:widen"]},
            "workers": {"shm_arena_mib": 32},
        }
    )
    sent = run_file_job(P.Lease(lease=1, stream=1, epoch=0, file=0, path=path), config, writer)
    out = []
    for frames in sent[:-1]:
        message, cols = P.decode(frames)
        out.append((message, cols, sum(len(memoryview(f)) for f in frames[1:])))
    return out, P.decode(sent[-1])[0]


def rows_of(chunks: list[tuple[P.Message, dict[str, Any], int]], pool: ArenaPool) -> list[tuple[int, float, int]]:
    """(record, the row's value, the label) of every row sent, in order."""
    rows = []
    for message, cols, _ in chunks:
        assert isinstance(message, P.Chunk)
        (name, data), (_, labels) = cols.items()  # the row (named as the reader's field), then the label
        if message.refs and name in message.refs:
            (spec,) = message.refs[name].values()
            data = R.gather(np.asarray(data), {0: (spec[0], tuple(spec[1]))}, pool.get)
        data = np.asarray(data)
        assert (data == data[:, :1]).all(), "every row holds one value"
        rows.extend((message.record + i, float(data[i, 0]), int(label)) for i, label in enumerate(np.asarray(labels)))
    return rows


def test_rows_by_reference_fill_a_chunk_to_a_quarter_of_the_arena(data_file: str, tmp_path: Any) -> None:
    with ArenaPool(32 * MIB, directory=str(tmp_path)) as pool:
        writer = ArenaWriter(pool.create())
        chunks, done = run_job(data_file, writer)
        assert isinstance(done, P.FileDone) and done.sent == RECORDS
        sizes = [message.count for message, _, _ in chunks]
        assert max(sizes) == 8 * MIB // (ROW_FLOATS * 4) + 1, "a chunk holds 8 MiB of rows (a quarter of 32)"
        assert all(inline < 64 * 1024 for _, _, inline in chunks), "only references travel"
        assert rows_of(chunks, pool) == [(r, 3.0 * r, 3 * r) for r in range(RECORDS)]


def test_rows_the_full_arena_cannot_take_go_in_parts_within_the_message_bound(data_file: str, tmp_path: Any) -> None:
    with ArenaPool(32 * MIB, directory=str(tmp_path)) as pool:
        arena = pool.create()
        writer = ArenaWriter(arena)
        assert arena.alloc(arena.n_blocks, 1) is not None  # full: every row must travel inline
        chunks, done = run_job(data_file, writer)
        assert isinstance(done, P.FileDone) and done.sent == RECORDS
        row_bytes = ROW_FLOATS * 4 + 8
        assert all(inline <= MAX_CHUNK_BYTES + row_bytes for _, _, inline in chunks)
        assert len(chunks) > RECORDS * row_bytes // (8 * MIB), "the 8 MiB chunks were sent in parts"
        assert rows_of(chunks, pool) == [(r, 3.0 * r, 3 * r) for r in range(RECORDS)]


def test_a_nearly_full_arena_cuts_the_chunk_where_it_fills_and_every_row_arrives_once(
    data_file: str, tmp_path: Any
) -> None:
    """Room for 20 rows: the first chunk goes by reference with those 20 (not inline whole, as it went when a
    chunk was all or nothing), the rest inline while nobody frees the rows; every record once, in order."""
    with ArenaPool(32 * MIB, directory=str(tmp_path)) as pool:
        arena = pool.create()
        writer = ArenaWriter(arena)
        per_row = arena.blocks_for(ROW_FLOATS * 4)
        assert arena.alloc(arena.n_blocks - 20 * per_row, 1) is not None
        chunks, done = run_job(data_file, writer)
        assert isinstance(done, P.FileDone) and done.sent == RECORDS
        first, cols, inline = chunks[0]
        assert first.count == 20 and first.refs and inline < 64 * 1024, "cut where the arena filled, by reference"
        assert all(not message.refs for message, _, _ in chunks[1:]), "then inline: nothing freed meanwhile"
        assert rows_of(chunks, pool) == [(r, 3.0 * r, 3 * r) for r in range(RECORDS)]


def test_rows_placed_for_a_chunk_the_file_never_sends_go_back_to_the_arena(data_file: str, tmp_path: Any) -> None:
    """Each big row goes into the arena as its sample is mapped; a file that fails before its chunk is cut must
    give those blocks back, or every failed file would shrink the worker's arena for good."""
    config = LoaderConfig.from_dict(
        {
            "source": {"files": [data_file]},
            "pipeline": {"batch_size": 4, "mappers": [f"{HERE}:widen_but_fail_at_50"]},
            "workers": {"shm_arena_mib": 32},
        }
    )
    with ArenaPool(32 * MIB, directory=str(tmp_path)) as pool:
        writer = ArenaWriter(pool.create())
        sent = run_file_job(P.Lease(lease=1, stream=1, epoch=0, file=0, path=data_file), config, writer)
        messages = [P.decode(frames)[0] for frames in sent]
        assert [type(m) for m in messages] == [P.FileError], "the chunk (80 rows a chunk) was never sent"
        assert "record 50 is bad" in str(messages[0].error)
        assert writer.arena.used_blocks() == 0, "the 50 rows placed for it went back"


def test_rows_of_a_chunk_cut_short_by_a_re_welcome_are_not_freed_in_the_new_arena(
    data_file: str, tmp_path: Any
) -> None:
    """A restarted daemon numbers its arenas afresh: the worker's new arena may have the old one's id. Rows
    written to the old arena for a chunk whose sending was cut short must not be freed by id in the new
    one, where those blocks hold other rows."""
    config = LoaderConfig.from_dict(
        {
            "source": {"files": [data_file]},
            "pipeline": {"batch_size": 4, "mappers": [f"{HERE}:widen"]},
            "workers": {"shm_arena_mib": 32},
        }
    )
    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    with (
        ArenaPool(32 * MIB, directory=str(tmp_path / "old")) as old_pool,
        ArenaPool(32 * MIB, directory=str(tmp_path / "new")) as new_pool,
    ):
        old, new = ArenaWriter(old_pool.create()), ArenaWriter(new_pool.create())
        assert old.arena.arena_id == new.arena.arena_id, "two daemons number their arenas alike"
        assert new.arena.alloc(new.arena.n_blocks, 1) is not None  # the new session's rows fill it
        current = [old]

        class Stopped(Exception):
            pass

        def send(frames: list[Any]) -> None:
            current[0] = new  # the re-WELCOME arrived while the stage was busy; then the worker is told to stop
            raise Stopped

        job = FileJob(
            P.Lease(lease=1, stream=1, epoch=0, file=0, path=data_file),
            config=config,
            worker_id="w",
            mappers=lambda: config.pipeline.resolve_mappers("mappers"),
            batch_mappers=lambda: [],
            arena=lambda: current[0],
            send_data=send,
            check=lambda: None,
        )
        with pytest.raises(Stopped):
            job.run()
        assert new.arena.used_blocks() == new.arena.n_blocks, "blocks of the new arena were freed by id"


def test_inline_parts_split_only_what_travels_inline() -> None:
    big = np.zeros((80, ROW_FLOATS), np.float32)  # 8 MiB
    refs = np.zeros((80, R.REF_WIDTH), np.int64)
    assert inline_parts({"x": refs, "y": np.zeros(80)}, {"x": ("<f4", (ROW_FLOATS,))}, 80) == [slice(None)]
    parts = inline_parts({"x": big, "y": np.zeros(80)}, {}, 80)
    assert [(p.start, p.stop) for p in parts] == [(0, 40), (40, 80)], "40 rows of 100 KiB fit 4 MiB"
    ragged = np.empty(5, dtype=object)
    ragged[:] = [np.zeros(4), np.zeros(4), np.zeros(1_000_000), np.zeros(4), np.zeros(4)]
    assert [(p.start, p.stop) for p in inline_parts({"x": ragged}, {}, 5)] == [(0, 2), (2, 3), (3, 5)]
    assert inline_parts({"x": big[:1]}, {}, 1) == [slice(None)], "one row goes whole, whatever its size"
    due = np.zeros((MAX_CHUNK_BYTES // 10_000 + 1, 2_500), np.float32)  # a chunk due just past the bound
    assert inline_parts({"x": due}, {}, len(due)) == [slice(None)], "never split for the row it went past"


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_a_sample_over_the_daemons_message_bound_fails_with_one_clear_line(tmp_path: Any, on_error: str) -> None:
    path = str(tmp_path / "values.npy")
    np.save(path, np.arange(10, dtype=np.int64))
    config = LoaderConfig.from_dict(
        {
            "source": {"files": [path]},
            # Rows of two shapes: list batches take them; the message bound is what refuses record 7.
            "pipeline": {
                "batch_size": 2,
                "mappers": [f"{HERE}:huge_at_7"],
                "on_error": on_error,
                "batch_format": "list",
            },
            "workers": {"shm_arena_mib": 0},
            "service": {"max_message_mib": 1},
        }
    )
    sent = [
        P.decode(frames)[0] for frames in run_file_job(P.Lease(lease=1, stream=1, epoch=0, file=0, path=path), config)
    ]
    chunks, last = sent[:-1], sent[-1]
    sent_records = [c.record + i for c in chunks for i in range(c.count)]
    assert sent_records == [r for r in range(10) if r != 7 and (on_error == "skip" or r < 7)]
    if on_error == "raise":
        assert isinstance(last, P.FileError)
        error = last.error
        assert error["type"] == "MessageTooLargeError" and error["record"] == 7
        assert "the sample takes a message of 2.0 MiB, over service.max_message_mib = 1" in error["message"]
    else:
        assert isinstance(last, P.FileDone) and (last.sent, last.skipped) == (9, 1)


def test_chunks_stay_within_a_small_message_bound(data_file: str) -> None:
    """With ``service.max_message_mib = 1`` and no arena, 100 KiB rows go in chunks of at most half a MiB."""
    config = LoaderConfig.from_dict(
        {
            "source": {"files": [data_file]},
            "pipeline": {"batch_size": 4, "mappers": [f"{HERE}:widen"]},
            "workers": {"shm_arena_mib": 0},
            "service": {"max_message_mib": 1},
        }
    )
    sent = run_file_job(P.Lease(lease=1, stream=1, epoch=0, file=0, path=data_file), config)
    decoded = [P.decode(frames) for frames in sent]
    assert isinstance(decoded[-1][0], P.FileDone) and decoded[-1][0].sent == RECORDS
    assert all(sum(memoryview(f).nbytes for f in frames) <= MIB for frames in sent)
    rows = [(m.record + i, float(next(iter(c.values()))[i][0])) for m, c in decoded[:-1] for i in range(m.count)]
    assert rows == [(r, 3.0 * r) for r in range(RECORDS)]
