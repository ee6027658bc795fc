"""Counting an epoch's samples from file headers (``len()`` of an epoch), within a time budget."""

from __future__ import annotations

import itertools

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
