"""A data file written while a worker reads it: the lease fails naming the file (or, under ``on_error = "skip"``,
its rest is skipped), and no row read after the write is sent.

Before, a worker compared the file's size with the daemon's only as the lease began: a file appended to mid-read
served the new lines in that epoch (a half-written last line parsed as a sample), one cut short served rows of
zeros, and one rewritten in place served old rows beside new ones; none said a word.

The write is made by the job's own ``check`` callback, which a ``FileJob`` calls before each read: so it lands
after the same record on every run.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from loader.config import LoaderConfig
from loader.recordio import Writer
from loader.service import protocol as P
from tests.unit.workers.file_jobs import run_file_job
from workers.file_pin import FilePin

HERE = "tests.unit.workers.test_file_changed_while_read"
ROWS = 100
# The check call (a read) before which the file is written: a read is a record of mapped samples, a block of
# rows without mappers (one row, then the rest: rows this small go in one block).
WRITE_AT = {True: 40, False: 2}


def parse(line: str) -> tuple[np.int64]:
    return (np.int64(int(line)),)


def plus_zero(sample: Any) -> Any:
    return sample


def _text(path: Path) -> dict[str, Any]:
    path.write_text("".join(f"{i}\n" for i in range(ROWS)))
    return {"format": "text", "format_options": {"parser": f"{HERE}:parse"}}


def _npy(path: Path) -> dict[str, Any]:
    np.save(path, np.arange(ROWS, dtype=np.int64))
    return {}


def _recordio(path: Path) -> dict[str, Any]:
    with Writer(str(path), max_num_records=8) as writer:
        for i in range(ROWS):
            writer.write({"id": np.int64(i)})
    return {"format": "recordio"}


def _append_text(path: Path) -> None:
    with open(path, "a") as file:
        file.write("".join(f"{ROWS + i}\n" for i in range(50)) + "10")  # the last line half-written


def _rewrite_npy_bigger(path: Path) -> None:
    np.save(path, np.arange(1000, 1000 + 2 * ROWS, dtype=np.int64))  # in place: the same inode


def _cut_text(path: Path) -> None:
    with open(path, "r+") as file:
        file.truncate(os.path.getsize(path) // 3)


def _append_recordio(path: Path) -> None:
    extra = path.with_suffix(".more")
    with Writer(str(extra), max_num_records=8) as writer:
        for i in range(50):
            writer.write({"id": np.int64(ROWS + i)})
    with open(path, "ab") as file:
        file.write(extra.read_bytes())


Case = tuple[str, Callable[[Path], dict[str, Any]], Callable[[Path], None]]  # file name, make it, write it
CASES: dict[str, Case] = {
    "text appended to, its last line half-written": ("rows.txt", _text, _append_text),
    "text cut short": ("rows.txt", _text, _cut_text),
    ".npy rewritten in place, bigger": ("rows.npy", _npy, _rewrite_npy_bigger),
    "RecordIO appended to": ("rows.recordio", _recordio, _append_recordio),
}


def _run(
    tmp_path: Path, case: str | Case, *, on_error: str, mapped: bool, group: bool = False
) -> tuple[list[int], P.Message]:
    """One lease read while the file is written: (every record value sent, the closing message)."""
    name, make, write = CASES[case] if isinstance(case, str) else case
    path = tmp_path / name
    source = make(path)
    paths = [str(path)]
    if group:  # a lease of two files, the written one second
        first = tmp_path / f"first{path.suffix}"
        make(first)
        paths = [str(first), str(path)]
    config = LoaderConfig.from_dict(
        {
            "source": {"files": paths, **source, **({"files_per_lease": 2} if group else {})},
            "pipeline": {
                "batch_size": 4,
                "on_error": on_error,
                "mappers": [f"{HERE}:plus_zero"] if mapped else [],
            },
            "workers": {"samples_per_message": 16, "shm_arena_mib": 0},
        }
    )
    sizes = [os.path.getsize(p) for p in paths]  # what the daemon found at start-up
    lease = P.Lease(lease=1, stream=1, epoch=0, file=0, path=paths[0], more=paths[1:], seen=sizes)
    reads = [0]

    def check() -> None:
        reads[0] += 1
        if reads[0] == WRITE_AT[mapped] + (ROWS if group and mapped else 0):
            write(path)

    sent = run_file_job(lease, config, check=check, copied=True)
    assert reads[0] >= WRITE_AT[mapped], "the file was written before the read ended"
    messages = [P.decode(frames) for frames in sent]
    values = [int(v) for _, columns in messages[:-1] for v in np.asarray(next(iter(columns.values())))]
    return values, messages[-1][0]


@pytest.mark.parametrize("mapped", [False, True], ids=["blocks", "mapped samples"])
@pytest.mark.parametrize("case", list(CASES))
def test_a_file_written_while_read_fails_naming_it_and_no_row_after_the_write_is_sent(tmp_path, case, mapped):
    values, end = _run(tmp_path, case, on_error="raise", mapped=mapped)
    assert isinstance(end, P.FileError), end
    assert end.error["type"] == "FileChangedError"
    assert "changed while it was read" in end.error["message"] and end.error["file"].endswith(CASES[case][0])
    assert values == list(range(len(values))) and len(values) < ROWS  # the file's first rows only, in order


@pytest.mark.parametrize("case", [".npy rewritten in place, bigger", "text appended to, its last line half-written"])
def test_under_skip_the_rest_of_a_file_written_while_read_is_skipped_and_the_count_is_what_was_sent(
    tmp_path, case, caplog
):
    values, end = _run(tmp_path, case, on_error="skip", mapped=True)
    assert isinstance(end, P.FileDone), end
    assert end.sent == len(values) and end.skipped == 1
    assert values == list(range(len(values))) and len(values) < ROWS
    assert "skipping the rest of" in caplog.text and "changed while it was read" in caplog.text


@pytest.mark.parametrize("mapped", [False, True], ids=["blocks", "mapped samples"])
def test_a_file_of_a_group_written_before_it_opened_is_refused_by_its_start_up_size(tmp_path, mapped):
    # The group's sizes were checked as its lease began; its second file changed while the first was read and
    # was then read whole, appended rows and all.
    values, end = _run(tmp_path, "RecordIO appended to", on_error="raise", mapped=mapped, group=True)
    assert isinstance(end, P.FileError), end
    assert end.error["type"] == "FileChangedError" and end.error["file"].endswith("rows.recordio")
    assert "changed since the daemon started" in end.error["message"] or "while it was read" in end.error["message"]
    assert max(values) < ROWS  # no appended record


def test_a_pin_sees_writes_in_place_but_not_a_file_moved_over_it_or_removed(tmp_path):
    path = tmp_path / "data.bin"
    path.write_bytes(b"x" * 100)
    pin = FilePin(str(path))
    assert pin.changed() is None
    other = tmp_path / "new.bin"
    other.write_bytes(b"y" * 300)
    os.replace(other, path)  # the reader's open file is the old one, whole
    assert pin.changed() is None
    path.unlink()
    assert pin.changed() is None

    path.write_bytes(b"x" * 100)
    pin = FilePin(str(path))
    stat = os.stat(path)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # the same size, written again
    assert "written in place" in (pin.changed() or "")
    with open(path, "ab") as file:
        file.write(b"z")
    assert "is 101 bytes, not 100" in (pin.changed() or "")


@pytest.mark.parametrize("mapped", [False, True], ids=["blocks", "mapped samples"])
def test_a_companion_written_while_read_fails_the_lease_naming_it(tmp_path, mapped):
    # part.label.npy is the field "label" of part.npy's samples: rewritten mid-read, labels of the new file were
    # paired with rows of the old one, without a word.
    def write(path: Path) -> None:
        np.save(tmp_path / "rows.label.npy", np.arange(5000, 5000 + 2 * ROWS, dtype=np.int64))

    values, end = _run(tmp_path, ("rows.npy", _npy_with_labels, write), on_error="raise", mapped=mapped)
    assert isinstance(end, P.FileError), end
    assert end.error["type"] == "FileChangedError" and end.error["file"].endswith("rows.label.npy")
    assert values == list(range(len(values))) and len(values) < ROWS


def _npy_with_labels(path: Path) -> dict[str, Any]:
    np.save(path, np.arange(ROWS, dtype=np.int64))
    np.save(path.with_name("rows.label.npy"), np.arange(ROWS, dtype=np.int64))
    return {}
