"""Counting an epoch's samples from file headers (``len()`` of an epoch), within a time budget."""

from __future__ import annotations

import itertools
import os
import threading

from loader.config import SourceConfig
from loader.examples import datagen
from loader.io import survey


def test_counts_come_from_the_headers(tmp_path):
    files = datagen.generate(str(tmp_path), format="npz", files=3, samples=7)
    assert survey.count_samples(SourceConfig(files=tuple(files)), files) == [7, 7, 7]


def test_a_count_that_overruns_its_budget_is_given_up(tmp_path, monkeypatch):
    files = datagen.generate(str(tmp_path), format="npz", files=3, samples=7)
    clock = itertools.count(0.0, 0.4)  # every look at the clock: 0.4 s later
    monkeypatch.setattr(survey, "monotonic", lambda: next(clock))
    assert survey.count_samples(SourceConfig(files=tuple(files)), files, budget_s=1.0) is None
    clock = itertools.count(0.0, 0.1)
    assert survey.count_samples(SourceConfig(files=tuple(files)), files, budget_s=1.0) == [7, 7, 7]


def test_recordio_cannot_be_counted_from_headers(tmp_path):
    files = datagen.generate(str(tmp_path), format="recordio", files=1, samples=3)
    assert survey.count_samples(SourceConfig(files=tuple(files)), files) is None


def test_a_fifo_in_a_files_place_is_not_opened(tmp_path):
    # The daemon counts at a client's hello, on its loop thread: a data file replaced by a FIFO since the
    # file list was expanded would block that open until a writer came, and the daemon with it.
    files = datagen.generate(str(tmp_path), format="npz", files=2, samples=7)
    os.unlink(files[1])
    os.mkfifo(files[1])
    counted: list[object] = []
    thread = threading.Thread(
        target=lambda: counted.append(survey.count_samples(SourceConfig(files=tuple(files)), files)), daemon=True
    )
    thread.start()
    thread.join(5.0)
    assert not thread.is_alive(), "counting opened a FIFO and waited for a writer"
    assert counted == [None]


def refuses_to_be_called(path, **options):
    """A user's format factory: the daemon must not run it in its loop (one that called sys.exit() on a bad
    file ended the daemon, one that slept on it froze every client's hello)."""
    raise SystemExit(f"a user's factory ran in the daemon's loop for {path}")


def test_a_users_format_factory_is_not_run_to_count(tmp_path):
    (tmp_path / "a.csv").write_text("1,2\n")
    source = SourceConfig(files=(str(tmp_path / "a.csv"),), formats={"csv": f"{__name__}:refuses_to_be_called"})
    assert survey.count_samples(source, [str(tmp_path / "a.csv")]) is None
    # Even under a built-in suffix, when the user's format is named for it:
    files = datagen.generate(str(tmp_path), format="npz", files=1, samples=7)
    named = SourceConfig(files=tuple(files), format="mine", formats={"mine": f"{__name__}:refuses_to_be_called"})
    assert survey.count_samples(named, files) is None
    assert survey.count_samples(SourceConfig(files=tuple(files)), files) == [7]
