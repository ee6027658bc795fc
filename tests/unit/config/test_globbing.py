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
