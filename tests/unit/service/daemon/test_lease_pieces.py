"""``order.lease_pieces`` and the daemon's lease list with ``source.records_per_lease``: which records of
which file each lease reads, what its Lease says, the checkpoint fingerprint, the start-up hint, the config."""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np
import pytest

from loader.config import LoaderConfig
from loader.errors import ConfigError
from loader.service.daemon.datasets import DatasetTable
from loader.service.order import differences, fingerprint, lease_pieces


def test_files_are_cut_into_consecutive_pieces_the_last_one_shorter() -> None:
    assert lease_pieces([250, 100, None, 0, 101], 100) == [
        (0, (0, 100)),
        (0, (100, 100)),
        (0, (200, 50)),
        (1, None),  # no more records than a lease: read whole
        (2, None),  # count unknown: read whole
        (3, None),  # empty
        (4, (0, 100)),
        (4, (100, 1)),
    ]


def table(tmp_path: Any, sizes: list[int], **source: Any) -> DatasetTable:
    for i, size in enumerate(sizes):
        np.save(tmp_path / f"f{i}.npy", np.arange(size))
    section = {"files": [str(tmp_path / "*.npy")], "records_per_lease": 100, **source}
    return DatasetTable(LoaderConfig.from_dict({"source": section, "pipeline": {"seed": 1}}))


def test_a_daemon_leases_pieces_and_says_which_in_each_lease(tmp_path: Any) -> None:
    pieces = table(tmp_path, [250, 30])
    dataset = pieces.default
    f0, f1 = str(tmp_path / "f0.npy"), str(tmp_path / "f1.npy")
    assert pieces.files == [f0, f0, f0, f1] and dataset.leases == [[f0], [f0], [f0], [f1]]
    assert dataset.pieces == [(0, 100), (100, 100), (200, 50), None]
    found = os.stat(f0)
    assert dataset.lease_fields(1) == {
        "dataset": "default",
        "seed": 1,
        "file_key": 1,
        "piece": [100, 100],
        "seen": [found.st_size],  # what a worker checks the file against
    }
    assert "piece" not in dataset.lease_fields(3)
    assert [pieces.file_record(i, 7) for i in range(4)] == [7, 107, 207, 7]
    assert pieces.lease_note(2) == "; the lease was records 200 to 249 of f0.npy (source.records_per_lease)"
    assert pieces.lease_note(3) == ""
    assert dataset.describe()["leases"] == 4 and dataset.describe()["files"] == 2


def test_without_the_setting_nothing_changes(tmp_path: Any) -> None:
    whole = table(tmp_path, [250, 30], records_per_lease=0)
    assert whole.default.pieces == [] and whole.default.leases == [[p] for p in whole.default.files]
    assert "piece" not in whole.default.lease_fields(0) and whole.file_record(0, 7) == 7


def test_the_fingerprint_holds_the_setting_and_the_pieces(tmp_path: Any) -> None:
    config = LoaderConfig.from_dict({"source": {"files": ["x"]}})
    files = ["a", "b"]
    whole = fingerprint(config, files, 1, [[0], [1]])
    assert fingerprint(config, files, 1, [[0], [1]], pieces=[(0, None), (1, None)]) == whole, "leased whole: as before"
    cut = fingerprint(config, files, 1, [[0], [0], [1]], pieces=[(0, (0, 10)), (0, (10, 5)), (1, None)])
    other = fingerprint(config, files, 1, [[0], [0], [1]], pieces=[(0, (0, 10)), (0, (10, 6)), (1, None)])
    assert "lease_pieces" in cut and cut["lease_pieces"] != other["lease_pieces"]
    [why] = differences(cut, other)
    assert why.startswith("lease_pieces") and "a file's record count changed" in why
    # The setting itself, named on its own; its default leaves checkpoints from before it matching.
    set_config = LoaderConfig.from_dict({"source": {"files": ["x"], "records_per_lease": 10}})
    assert fingerprint(set_config, files, 1)["records_per_lease"] == 10
    assert fingerprint(set_config, files, 1)["source"] == whole["source"]
    assert "records_per_lease" not in whole


def test_a_grown_file_changes_the_fingerprint(tmp_path: Any) -> None:
    before = table(tmp_path, [250]).default.fingerprint()
    assert table(tmp_path, [250]).default.fingerprint() == before
    assert table(tmp_path, [251]).default.fingerprint()["lease_pieces"] != before["lease_pieces"]


def test_few_counted_files_for_many_workers_get_a_hint(tmp_path: Any, caplog: Any) -> None:
    np.save(tmp_path / "big.npy", np.zeros((40_000, 64), dtype=np.float32))

    def load(**source: Any) -> DatasetTable:
        section = {"files": [str(tmp_path / "*.npy")], **source}
        return DatasetTable(LoaderConfig.from_dict({"source": section, "workers": {"count": 4}}))

    caplog.set_level(logging.INFO, logger="loader.daemon")
    load()
    hints = [r.getMessage() for r in caplog.records if "records_per_lease" in r.getMessage()]
    assert hints == [
        "dataset 'default': 1 file(s) for 4 workers, one lease each, so at most 1 read at once: "
        "source.records_per_lease = 2500 would cut them into pieces that every worker reads"
    ]
    caplog.clear()
    load(records_per_lease=2500)
    assert "records_per_lease" not in caplog.text
    np.save(tmp_path / "tiny.npy", np.zeros((10, 64), dtype=np.float32))
    (tmp_path / "big.npy").unlink()
    load()
    assert "records_per_lease" not in caplog.text, "too few records to be worth cutting"


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ({"records_per_lease": -1}, "source.records_per_lease must be >= 0, got -1"),
        ({"records_per_lease": 1.5}, "source.records_per_lease must be an integer, got 1.5"),
        ({"records_per_lease": True}, "source.records_per_lease must be an integer, got True"),
        ({"records_per_lease": 2**41}, "source.records_per_lease must be <= 1099511627776"),
        (
            {"records_per_lease": 10, "files_per_lease": 8},
            "source.records_per_lease and source.files_per_lease = 8 are exclusive: cut large files into "
            "leases of records, or join small files into leases, not both",
        ),
        (
            {"records_per_lease": 10, "reader": "tests.helpers:range_file_reader"},
            "source.records_per_lease has no effect with source.reader, whose files' records are not counted",
        ),
    ],
)
def test_the_setting_is_checked_in_one_line(source: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        LoaderConfig.from_dict({"source": {"files": ["x.npy"], **source}})
    assert message in str(info.value) and "\n" not in str(info.value)


def test_too_many_pieces_are_refused_naming_the_smallest_value_that_fits(tmp_path: Any, monkeypatch: Any) -> None:
    # 2 million pieces of one record took 1.2 GB and seconds of the daemon's loop: a cap, and the value to give.
    import loader.service.daemon.datasets as datasets

    monkeypatch.setattr(datasets, "MAX_PIECE_LEASES", 10)
    with pytest.raises(
        ConfigError, match=r"records_per_lease = 20 cuts its files into 15 leases, more than 10: give at least 30"
    ):
        table(tmp_path, [250, 30], records_per_lease=20)  # 13 pieces and 2
    assert len(table(tmp_path, [250, 30], records_per_lease=30).default.leases) == 10  # 9 and 1
    with pytest.raises(ConfigError, match="give at least 30"):
        table(tmp_path, [250, 30], records_per_lease=29)  # 9 and 2


def test_the_fingerprint_is_digested_once(tmp_path: Any, monkeypatch: Any) -> None:
    import loader.service.daemon.datasets as datasets

    dataset = table(tmp_path, [250, 30]).default
    first = dataset.fingerprint()
    monkeypatch.setattr(datasets, "fingerprint", lambda *a, **k: pytest.fail("digested again"))
    assert dataset.fingerprint() == first and dataset.fingerprint() is not dataset.fingerprint()


def test_a_setting_left_at_its_default_is_called_unset_in_a_refusal() -> None:
    config = LoaderConfig.from_dict({"source": {"files": ["x"]}})
    cut = LoaderConfig.from_dict({"source": {"files": ["x"], "records_per_lease": 10}})
    saved, now = fingerprint(config, ["a"], 1), fingerprint(cut, ["a"], 1)
    assert "records_per_lease (unset in the state, 10 now)" in differences(saved, now)
