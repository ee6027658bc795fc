"""Recursive globs: every real file once, no symlink loop walked, glob's own matching rules otherwise."""

from __future__ import annotations

import glob
import os

from loader.config.globbing import glob_files


def _tree(root):
    for rel in ["a.npy", "sub/b.npy", "sub/deep/c.npy", ".hidden/d.npy", "sub/e.txt"]:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")


def test_without_links_it_matches_what_glob_matches(tmp_path):
    _tree(tmp_path)
    for pattern in ["**/*.npy", "*/**/*.npy", "**", "sub/**/c.npy", "**/sub/*.npy", "*.npy"]:
        full = str(tmp_path / pattern)
        expected = sorted(p for p in glob.glob(full, recursive=True) if os.path.isfile(p))
        assert glob_files(full) == expected, pattern


def test_a_symlink_loop_is_not_walked_and_aliases_count_once(tmp_path):
    _tree(tmp_path)
    os.symlink(tmp_path, tmp_path / "sub" / "up")  # a loop back to the root
    os.symlink(tmp_path / "a.npy", tmp_path / "sub" / "alias.npy")
    found = glob_files(str(tmp_path / "**" / "*.npy"))
    assert found == sorted(str(tmp_path / p) for p in ["a.npy", "sub/b.npy", "sub/deep/c.npy"])
    assert len(glob.glob(str(tmp_path / "**" / "*.npy"), recursive=True)) > 3 * len(found)  # what glob does


def test_matches_that_are_not_regular_files_are_left_out_with_one_warning_naming_them(tmp_path, caplog):
    # A shard linked to an unmounted filesystem made the dataset smaller without a word.
    (tmp_path / "a.npy").write_bytes(b"")
    os.symlink("/nonexistent/shard.npy", tmp_path / "b.npy")
    os.symlink(tmp_path / "c.npy", tmp_path / "c.npy")  # a link to itself
    os.mkfifo(tmp_path / "d.npy")
    (tmp_path / "e.npy").mkdir()
    os.symlink("/dev/zero", tmp_path / "f.npy")
    with caplog.at_level("WARNING", logger="loader.config"):
        assert glob_files(str(tmp_path / "*.npy")) == [str(tmp_path / "a.npy")]
    (record,) = caplog.records
    pattern = str(tmp_path / "*.npy")
    assert record.getMessage().startswith(
        f"source.files pattern {pattern!r}: left out 4 matches that are not regular files: "
        f"{tmp_path / 'b.npy'} (a symlink to a missing file), {tmp_path / 'c.npy'} (a symlink loop), "
        f"{tmp_path / 'd.npy'} (a FIFO) and 1 more"
    )
    caplog.clear()
    with caplog.at_level("WARNING", logger="loader.config"):
        glob_files(str(tmp_path / "**" / "e.npy"))
        glob_files(str(tmp_path / "f.npy"))
    assert [r.getMessage().split(": left out ")[1] for r in caplog.records] == [
        f"1 match that is not a regular file: {tmp_path / 'f.npy'} (a character device) "
        "(a shard linked to an unmounted filesystem makes the dataset smaller)",
    ]


def test_a_pattern_expanded_again_warns_again_only_when_what_it_leaves_out_changed(tmp_path, caplog):
    # `loader serve` expands each pattern when it checks the config and again when it builds the file table:
    # the same "left out" line was logged twice at every start.
    (tmp_path / "a.npy").write_bytes(b"")
    os.symlink("/nonexistent/shard.npy", tmp_path / "b.npy")
    pattern = str(tmp_path / "*.npy")
    with caplog.at_level("WARNING", logger="loader.config"):
        for _ in range(3):
            assert glob_files(pattern) == [str(tmp_path / "a.npy")]
        assert len(caplog.records) == 1
        os.symlink("/nonexistent/other.npy", tmp_path / "c.npy")
        glob_files(pattern)
        glob_files(pattern)
        assert len(caplog.records) == 2 and "left out 2 matches" in caplog.records[1].getMessage()
        os.remove(tmp_path / "b.npy")
        os.remove(tmp_path / "c.npy")
        glob_files(pattern)  # mended
        os.symlink("/nonexistent/shard.npy", tmp_path / "b.npy")
        os.symlink("/nonexistent/other.npy", tmp_path / "c.npy")
        glob_files(pattern)  # broken again as just before it was mended: said again
    assert len(caplog.records) == 3 and caplog.records[2].getMessage() == caplog.records[1].getMessage()


def test_directories_a_pattern_matches_are_left_out_without_a_warning(tmp_path, caplog):
    # `data/*` over a tree of folders, `**/*`, a final `**`: an ImageNet-like tree gave a thousand false names.
    _tree(tmp_path)
    with caplog.at_level("WARNING", logger="loader.config"):
        assert len(glob_files(str(tmp_path / "**"))) == 4  # the directories it walks are not files gone missing
        glob_files(str(tmp_path / "*"))
        glob_files(str(tmp_path / "**" / "*"))
    assert caplog.records == []
