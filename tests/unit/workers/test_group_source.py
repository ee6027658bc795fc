"""``GroupSource``: the files of one lease read as one file, record numbers running on."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from loader.config import LoaderConfig
from workers.sources import GroupSource


def lines_reader(path: str) -> Callable[[], Iterator[tuple[int]]]:
    """One sample per line of int; the word ``bad`` raises mid-file."""

    def read() -> Iterator[tuple[int]]:
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                if line.strip() == "bad":
                    raise ValueError(f"bad line in {path}")
                yield (int(line),)

    return read


def config(tmp_path: Any) -> LoaderConfig:
    return LoaderConfig.from_dict(
        {
            "source": {
                "files": [str(tmp_path / "*.txt")],
                "reader": "tests.unit.workers.test_group_source:lines_reader",
                "files_per_lease": 8,
            }
        }
    )


def write(tmp_path: Any, name: str, lines: list[str]) -> str:
    path = tmp_path / name
    path.write_text("".join(f"{line}\n" for line in lines))
    return str(path)


def read_all(group: GroupSource) -> tuple[list[int], list[tuple[int, str, int | None]]]:
    """(values read, [(group record, file, record in the file) of each failure]) reading past failures."""
    values: list[int] = []
    failures: list[tuple[int, str, int | None]] = []
    samples, record = group.samples(), 0
    while True:
        try:
            (value,) = next(samples)
        except StopIteration:
            return values, failures
        except Exception as exc:
            failures.append((record, *group.locate(record)))
            record += exc.records_skipped  # type: ignore[attr-defined]
            continue
        assert group.locate(record)[1] is not None
        values.append(int(value))
        record += 1


def test_files_are_read_in_order_with_records_numbered_on(tmp_path: Any) -> None:
    a = write(tmp_path, "a.txt", ["1", "2"])
    b = write(tmp_path, "b.txt", [])
    c = write(tmp_path, "c.txt", ["3", "4", "5"])
    group = GroupSource(config(tmp_path), [a, b, c])
    values, failures = read_all(group)
    assert (values, failures) == ([1, 2, 3, 4, 5], [])
    assert [group.locate(r) for r in (0, 1, 2, 4)] == [(a, 0), (a, 1), (c, 0), (c, 2)]
    group.close()


def test_a_failing_file_is_one_record_named_by_its_own_path_and_the_next_file_goes_on(tmp_path: Any) -> None:
    a = write(tmp_path, "a.txt", ["1", "2", "bad", "99"])
    missing = str(tmp_path / "gone.txt")
    c = write(tmp_path, "c.txt", ["3"])
    values, failures = read_all(GroupSource(config(tmp_path), [a, missing, c]))
    assert values == [1, 2, 3]
    # a's reader raised at its record 2 (its rest is lost: one record); gone.txt's at its first.
    assert failures == [(2, a, 2), (3, missing, 0)]


def npy_group(tmp_path: Any, a: np.ndarray, c: np.ndarray) -> GroupSource:
    """A group of a.npy, b.npy (not an .npy file) and c.npy."""
    np.save(tmp_path / "a.npy", a)
    (tmp_path / "b.npy").write_bytes(b"not an npy file")
    np.save(tmp_path / "c.npy", c)
    cfg = LoaderConfig.from_dict({"source": {"files": [str(tmp_path / "*.npy")], "files_per_lease": 4}})
    return GroupSource(cfg, [str(tmp_path / f"{name}.npy") for name in "abc"])


def test_a_file_that_cannot_be_opened_names_no_record(tmp_path: Any) -> None:
    group = npy_group(tmp_path, np.arange(3), np.arange(10, 12))
    paths = group.paths
    values, failures = read_all(group)
    assert values == [0, 1, 2, 10, 11]
    assert failures == [(3, paths[1], None)]


def test_fields_come_from_the_config_or_the_first_file_opened(tmp_path: Any) -> None:
    np.savez(tmp_path / "x.npz", image=np.zeros((2, 3)), label=np.arange(2))
    cfg = LoaderConfig.from_dict({"source": {"files": [str(tmp_path / "*.npz")], "files_per_lease": 4}})
    group = GroupSource(cfg, [str(tmp_path / "x.npz")])
    assert group.fields is None
    assert len(list(group.samples())) == 2
    assert group.fields == ["image", "label"]


def test_files_per_lease_is_checked(tmp_path: Any) -> None:
    from loader.errors import ConfigError

    for bad in (0, -1, 5000, "8", True):
        with pytest.raises(ConfigError, match="files_per_lease"):
            LoaderConfig.from_dict({"source": {"files": ["x"], "files_per_lease": bad}})


def test_a_block_ends_before_a_bad_file_which_is_one_record(tmp_path: Any) -> None:
    group = npy_group(tmp_path, np.arange(5), np.arange(10, 13))
    paths = group.paths
    assert group.can_read_blocks
    got, failures = [], []
    while True:
        try:
            block = group.read_block(4)
        except Exception as exc:
            failures.append((group.record - exc.records_skipped, *group.locate(group.record - 1)))  # type: ignore[attr-defined]
            continue
        if block is None:
            break
        got.append(next(iter(block.values())).tolist())
    assert got == [[0, 1, 2, 3], [4], [10, 11, 12]]
    assert failures == [(5, paths[1], None)]
    assert group.record == 9


def test_a_block_spans_files_of_the_same_columns_and_stops_at_one_of_others(tmp_path: Any) -> None:
    for name, values in (("a", np.arange(2)), ("b", np.arange(10, 13)), ("c", np.arange(20.0, 22.0))):
        np.save(tmp_path / f"{name}.npy", values)
    cfg = LoaderConfig.from_dict({"source": {"files": [str(tmp_path / "*.npy")], "files_per_lease": 4}})
    group = GroupSource(cfg, [str(tmp_path / f"{name}.npy") for name in "abc"])
    blocks = []
    while (block := group.read_block(8)) is not None:
        blocks.append(next(iter(block.values())).tolist())
    assert blocks == [[0, 1, 10, 11, 12], [20.0, 21.0]], "a and b in one block; c (float) in its own"
