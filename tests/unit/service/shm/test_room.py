"""``ShmRoom``: big rows arriving inline while the arenas' filesystem is full are said once, with the fix."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import numpy as np
import pytest

from loader.service.shm.arena import RESERVE_STEP_BYTES
from loader.service.shm.room import CHECK_EVERY_S, ShmRoom

MIB = 1024 * 1024
IMAGES = np.zeros((8, 3, 224, 224), np.float32)  # 588 KiB rows


class Filesystem:
    """A statvfs whose free space the test sets; counts its calls."""

    def __init__(self, free: int, total: int = 64 * MIB) -> None:
        self.free, self.total, self.calls = free, total, 0

    def __call__(self, path: str) -> SimpleNamespace:
        self.calls += 1
        return SimpleNamespace(f_bavail=self.free // 4096, f_blocks=self.total // 4096, f_frsize=4096)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _room(fs: Filesystem, clock: Clock) -> ShmRoom:
    return ShmRoom("/dev/shm", 256, 2, clock=clock, statvfs=fs)


def test_big_inline_rows_on_a_full_filesystem_are_said_once_with_the_numbers_and_the_fix(caplog) -> None:
    fs, clock = Filesystem(free=1 * MIB), Clock()
    room = _room(fs, clock)
    with caplog.at_level(logging.WARNING, logger="loader.daemon"):
        for _ in range(5):
            room.note_chunk(None, {"image": IMAGES, "label": np.arange(8)})
            clock.now += 10
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1, lines
    line = lines[0]
    assert "/dev/shm has 1 MiB free of 64 MiB" in line and "588 KiB" in line
    assert "2 workers x workers.shm_arena_mib (256 MiB)" in line and "--shm-size" in line
    assert fs.calls == 1, "once said, it looks no more"


@pytest.mark.parametrize(
    ("refs", "columns"),
    [
        ({"image": {0: ["<f4", [3, 224, 224]]}}, {"image": np.zeros((8, 3), np.int64), "label": np.arange(8)}),
        (None, {"x": np.zeros((4096, 64), np.float32), "label": np.arange(4096)}),  # small rows: never by reference
        (None, {"ragged": np.array([np.zeros(200_000), np.zeros(3)], dtype=object)}),
        (None, {"empty": np.zeros((0, 3, 224, 224), np.float32)}),
    ],
    ids=["references", "small rows", "objects", "no rows"],
)
def test_chunks_that_do_not_carry_big_rows_inline_never_ask_the_filesystem(refs, columns, caplog) -> None:
    fs = Filesystem(free=0)
    room = _room(fs, Clock())
    with caplog.at_level(logging.WARNING, logger="loader.daemon"):
        room.note_chunk(refs, columns)
    assert fs.calls == 0 and not caplog.records


def test_an_arena_full_of_rows_in_use_with_room_on_the_filesystem_is_said_nothing_of(caplog) -> None:
    fs, clock = Filesystem(free=RESERVE_STEP_BYTES + IMAGES[0].nbytes, total=4096 * MIB), Clock()
    room = _room(fs, clock)
    with caplog.at_level(logging.WARNING, logger="loader.daemon"):
        room.note_chunk(None, {"image": IMAGES})
        room.note_chunk(None, {"image": IMAGES})  # within the second: not asked again
        assert fs.calls == 1
        clock.now += CHECK_EVERY_S
        fs.free = RESERVE_STEP_BYTES  # now a worker's next reserve step would not fit
        room.note_chunk(None, {"image": IMAGES})
    assert fs.calls == 2 and len(caplog.records) == 1


def test_a_filesystem_that_cannot_be_asked_is_said_nothing_of(caplog) -> None:
    def gone(path: str) -> SimpleNamespace:
        raise FileNotFoundError(path)

    room = ShmRoom("/gone", 256, 2, clock=Clock(), statvfs=gone)
    with caplog.at_level(logging.WARNING, logger="loader.daemon"):
        room.note_chunk(None, {"image": IMAGES})
    assert not caplog.records and not room.said
