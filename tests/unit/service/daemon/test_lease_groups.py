"""``order.lease_groups``: which files share a lease (``source.files_per_lease``)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from loader.service.order import GROUP_BYTES, lease_groups

SMALL = 1 << 20


def flat(groups: list[list[int]]) -> list[int]:
    return [i for group in groups for i in group]


def test_one_file_per_lease_by_default() -> None:
    assert lease_groups([10, 20, 30], 1, SMALL, seed=0, shuffle=False) == [[0], [1], [2]]


def test_unshuffled_groups_are_runs_of_neighbours_in_list_order() -> None:
    groups = lease_groups([100] * 10, 4, SMALL, seed=0, shuffle=False)
    assert groups == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_large_and_unknown_files_go_alone_and_split_the_runs() -> None:
    sizes: list[int | None] = [5, 5, SMALL, 5, None, 5, 5, 5]
    assert lease_groups(sizes, 8, SMALL, seed=0, shuffle=False) == [[0, 1], [2], [3], [4], [5, 6, 7]]


def test_a_group_holds_at_most_group_bytes() -> None:
    size = GROUP_BYTES // 3 + 1  # three would be over
    assert lease_groups([size] * 5, 64, GROUP_BYTES, seed=0, shuffle=False) == [[0, 1], [2, 3], [4]]


@pytest.mark.parametrize("seed", [0, 1, 12345])
def test_shuffled_groups_hold_every_file_once_mixed_and_depend_on_the_seed_alone(seed: int) -> None:
    sizes: list[int | None] = [100] * 200 + [SMALL * 2] * 3
    groups = lease_groups(sizes, 16, SMALL, seed=seed, shuffle=True)
    assert sorted(flat(groups)) == list(range(203))
    assert [g for g in groups if len(g) == 1 and sizes[g[0]] == SMALL * 2] == [[200], [201], [202]]
    assert all(len(g) <= 16 for g in groups)
    assert groups == lease_groups(sizes, 16, SMALL, seed=seed, shuffle=True), "a function of the seed"
    assert groups != lease_groups(sizes, 16, SMALL, seed=seed + 1, shuffle=True)
    # A sorted list of class folders (20 classes of 10 files) is mixed: no group of one class.
    classes = [{i // 10 for i in g} for g in groups if len(g) == 16]
    assert all(len(c) > 1 for c in classes)


def test_a_daemon_groups_its_files_and_hints_when_many_small_files_go_one_per_lease(tmp_path: Any, caplog: Any) -> None:
    from loader.config import LoaderConfig
    from loader.service.daemon.datasets import HINT_FILES, DatasetTable

    for i in range(HINT_FILES):
        (tmp_path / f"img-{i:04d}.bin").write_bytes(b"x" * 100)
    (tmp_path / "img-zbig.bin").write_bytes(b"x" * SMALL)

    def table(**source: Any) -> DatasetTable:
        files = {"files": [str(tmp_path / "*.bin")], "reader": "tests.helpers:range_file_reader", **source}
        return DatasetTable(LoaderConfig.from_dict({"source": files, "pipeline": {"seed": 1}}))

    caplog.set_level(logging.INFO, logger="loader.daemon")
    single = table()
    assert len(single.files) == HINT_FILES + 1
    assert "source.files_per_lease = 64 would read" in caplog.text
    assert f"{HINT_FILES + 1} files of about 100 bytes, one lease each" in caplog.text
    caplog.clear()
    grouped = table(files_per_lease=64)
    assert "files_per_lease" not in caplog.text
    leases = grouped.default.leases
    assert [len(group) for group in leases] == [64] * (HINT_FILES // 64) + [1]
    assert [path for group in leases for path in group] == single.files, "unshuffled: list order"
    assert grouped.files == [group[0] for group in leases]
    fields = grouped.default.lease_fields(1)
    assert fields["file_key"] == 1 and fields["more"] == leases[1][1:]
    assert "more" not in grouped.default.lease_fields(len(leases) - 1)


def test_the_grouping_is_in_the_checkpoint_fingerprint_only_when_files_share_leases() -> None:
    from loader.config import LoaderConfig
    from loader.service.order import fingerprint

    config = LoaderConfig.from_dict({"source": {"files": ["x"]}})
    files = ["a", "b", "c"]
    alone = fingerprint(config, files, 1)
    assert fingerprint(config, files, 1, [[0], [1], [2]]) == alone, "checkpoints of one file per lease still match"
    paired = fingerprint(config, files, 1, [[0, 1], [2]])
    assert "lease_groups" in paired and paired != fingerprint(config, files, 1, [[0], [1, 2]])


def test_a_state_of_another_files_per_lease_says_the_setting_may_be_why() -> None:
    # The groups' difference is all the state can show when only source.files_per_lease changed (the source
    # digest names no key): its reason must not blame the files alone.
    from loader.config import LoaderConfig
    from loader.service.order import differences, fingerprint

    files = ["a", "b", "c", "d"]
    three = LoaderConfig.from_dict({"source": {"files": ["x"], "files_per_lease": 3}})
    two = LoaderConfig.from_dict({"source": {"files": ["x"], "files_per_lease": 2}})
    saved, now = fingerprint(three, files, 1, [[0, 1, 2], [3]]), fingerprint(two, files, 1, [[0, 1], [2, 3]])
    [groups] = [why for why in differences(saved, now) if why.startswith("lease_groups")]
    assert "source.files_per_lease" in groups and "a file changed" in groups, groups


def test_the_files_sizes_are_in_the_fingerprint_and_a_state_saved_without_them_still_matches() -> None:
    from loader.config import LoaderConfig
    from loader.service.order import differences, fingerprint

    config = LoaderConfig.from_dict({"source": {"files": ["x"]}})
    files = ["/data/a.npy", "/data/b.npy"]
    saved = fingerprint(config, files, 1, sizes=[128, 256])
    assert differences(saved, fingerprint(config, ["/moved/a.npy", "/moved/b.npy"], 1, sizes=[128, 256])) == []
    (changed,) = differences(saved, fingerprint(config, files, 1, sizes=[128, 264]))
    assert changed.startswith("file_sizes (") and "other files" in changed
    older = {key: value for key, value in saved.items() if key != "file_sizes"}
    assert differences(older, fingerprint(config, files, 1, sizes=[128, 264])) == [], "states from before sizes"
