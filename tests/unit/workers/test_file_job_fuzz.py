"""A worker's ``FileJob`` over tiny arenas, seeded at random: every record once, in order, every row right.

Big mapped rows go into the arena as each sample is added, and a chunk is cut where the arena fills
(``ChunkBuilder.add`` refusing the sample). These runs mix what makes that path branch: arenas with room for
one to four rows, a "daemon" that frees the sent rows at random, lease groups whose files have rows of
different sizes, ragged rows, records whose mapper fails under ``on_error = "skip"`` or ``"raise"``, a lease
starting past its first record, chunks the transport refuses, and a cancel at a random check. After each:
the records sent are increasing and unrepeated, each row holds its record's value (checked as sent: the
arena's blocks are reused after), ``FILE_DONE`` adds up, and the arena's used blocks are exactly the sent
rows not yet freed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

import workers.columns as columns
from loader.config import LoaderConfig
from loader.errors import UnsendableSampleError
from loader.service import protocol as P
from loader.service.shm import refs as R
from loader.service.shm.arena import Arena
from loader.service.shm.pool import ArenaPool
from workers.arena_writer import ArenaWriter
from workers.file_job import FileJob

HERE = "tests.unit.workers.test_file_job_fuzz"
MIB = 1024 * 1024
SEEDS = 150


@dataclass
class Plan:
    """One run's data: what ``widen`` makes of each record."""

    bad: set[int] = field(default_factory=set)  # records whose mapper raises
    firsts: list[int] = field(default_factory=list)  # the first record of each file of the group
    sizes: list[int] = field(default_factory=list)  # each file's big row, in bytes
    ragged: bool = False  # a shorter row every 13th record (list batches take them)

    def row_bytes(self, record: int) -> int:
        size = self.sizes[sum(1 for first in self.firsts if first <= record) - 1]
        return size - 4000 if self.ragged and record % 13 == 0 else size


PLAN = Plan()


def widen(sample: Any) -> Any:
    """Record ``r`` -> (a big uint8 row of ``r % 251``, a 68 KiB float32 row of ``r``, ``r``)."""
    (value,) = sample
    record = int(value)
    if record in PLAN.bad:
        raise ValueError(f"record {record} is bad")
    return (
        np.full(PLAN.row_bytes(record), record % 251, np.uint8),
        np.full(17_000, record, np.float32),
        np.int64(record),
    )


class Cancelled(Exception):
    pass


def _records(message: P.Chunk, cols: dict[str, Any]) -> list[int]:
    index = cols.get(P.INDEX_COLUMN)
    if index is not None:
        return [int(r) for r in np.asarray(index)]
    return list(range(message.record, message.record + message.count))


def _check_row(name: str, row: Any, record: int) -> None:
    row = np.asarray(row)
    if name == "0":
        assert row.size == PLAN.row_bytes(record) and (row == record % 251).all(), (name, record)
    else:
        assert (row == record).all(), (name, record)


@pytest.fixture(autouse=True)
def no_chunk_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(columns, "MAX_CHUNK_DELAY_S", 3600.0)


@pytest.mark.parametrize("seed", range(SEEDS))
def test_a_file_job_over_a_tiny_arena_sends_every_record_once_and_right(seed: int, tmp_path: Any) -> None:
    rng = random.Random(seed)
    lengths = [rng.randint(1, 50) for _ in range(rng.choice([1, 1, 2, 3]))]
    PLAN.firsts = [int(x) for x in np.cumsum([0, *lengths[:-1]])]
    batch_format = rng.choice(["list", "stacked"])
    PLAN.ragged = batch_format == "list"
    PLAN.sizes = [rng.choice([70_000, 90_000, 140_000]) for _ in lengths]
    if not PLAN.ragged:
        PLAN.sizes = [PLAN.sizes[0]] * len(lengths)  # stacked batches need one row size
    total = sum(lengths)
    PLAN.bad = set(rng.sample(range(total), min(total, rng.randint(0, 3))))
    paths = []
    for i, n in enumerate(lengths):
        paths.append(str(tmp_path / f"v{i}.npy"))
        np.save(paths[-1], np.arange(PLAN.firsts[i], PLAN.firsts[i] + n, dtype=np.int64))
    on_error = rng.choice(["skip", "skip", "raise"])
    start = rng.choice([0, 0, rng.randint(0, total - 1)])
    config = LoaderConfig.from_dict(
        {
            "source": {"files": paths},
            "pipeline": {
                "batch_size": 4,
                "mappers": [f"{HERE}:widen"],
                "on_error": on_error,
                "batch_format": batch_format,
            },
            "workers": {"samples_per_message": rng.choice([3, 8, 64])},
        }
    )
    cancel_at = rng.randint(1, 200) if rng.random() < 0.2 else None
    refuse = set(rng.sample(range(1, 30), rng.randint(1, 2))) if rng.random() < 0.3 else set()
    free_chance = rng.choice([0.0, 0.3, 1.0])
    with ArenaPool(int(rng.choice([0.25, 0.5, 1, 2]) * MIB), directory=str(tmp_path)) as pool:
        created = pool.create()
        writer = ArenaWriter(Arena.open(created.path, created.arena_id, pool.token))  # as a worker maps it
        sent: list[tuple[P.Message, dict[str, Any]]] = []
        held: list[tuple[np.ndarray, R.Spec]] = []  # sent rows the "daemon" has not freed
        refused: set[int] = set()
        calls = {"check": 0, "send": 0}

        def check() -> None:
            calls["check"] += 1
            if calls["check"] == cancel_at:
                raise Cancelled

        def send(frames: list[Any]) -> None:
            calls["send"] += 1
            message, cols = P.decode([bytes(frame) for frame in frames])
            if isinstance(message, P.Chunk) and calls["send"] in refuse:
                refused.update(_records(message, cols))
                raise UnsendableSampleError("refused by the test's transport")
            sent.append((message, cols))
            if isinstance(message, P.Chunk):
                records = _records(message, cols)
                for name, values in cols.items():
                    if name == P.INDEX_COLUMN:
                        continue
                    if message.refs and name in message.refs:
                        ((dtype, shape),) = message.refs[name].values()
                        spec: R.Spec = (dtype, tuple(shape))
                        refs = np.array(values, copy=True)
                        values = R.gather(refs, {0: spec}, pool.get, free=False)
                        held.append((refs, spec))
                    for k, record in enumerate(records):
                        _check_row(name, values[k], record)
            while held and rng.random() < free_chance:
                refs, spec = held.pop(rng.randrange(len(held)))
                R.free_refs(refs, {0: spec}, pool.get)

        lease = P.Lease(lease=1, stream=1, epoch=0, file=0, path=paths[0], more=paths[1:] or None, start=start)
        job = FileJob(
            lease,
            config=config,
            worker_id="w",
            mappers=lambda: config.pipeline.resolve_mappers("mappers"),
            batch_mappers=lambda: [],
            arena=lambda: writer,
            send_data=send,
            check=check,
        )
        cancelled = False
        try:
            job.run()
        except Cancelled:
            cancelled = True

        seen = [r for message, cols in sent if isinstance(message, P.Chunk) for r in _records(message, cols)]
        assert seen == sorted(set(seen)), "records out of order or repeated"
        done = next((m for m, _ in sent if isinstance(m, P.FileDone)), None)
        failed = next((m for m, _ in sent if isinstance(m, P.FileError)), None)
        wanted = list(range(start, total))
        if not cancelled and on_error == "skip":
            assert seen == [r for r in wanted if r not in PLAN.bad and r not in refused], "a record was lost"
            assert done is not None and done.sent == len(seen) and done.sent + done.skipped == len(wanted)
        elif not cancelled and not refused:
            first_bad = min((r for r in wanted if r in PLAN.bad), default=None)
            if first_bad is None:
                assert seen == wanted and done is not None and done.sent == len(seen)
            else:
                assert failed is not None and seen == [r for r in wanted if r < first_bad][: len(seen)]
        in_use = sum(len(refs) * writer.arena.blocks_for(R.row_nbytes(spec)) for refs, spec in held)
        assert writer.arena.used_blocks() == in_use, "arena blocks leaked, or freed under sent rows"
