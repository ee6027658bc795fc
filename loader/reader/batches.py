"""Batches of the service as paddle batch readers: lists of sample tuples, ready for ``DataFeeder.feed``.

``Client.reader()`` and ``Loader.reader()`` wrap their epochs with :func:`batch_reader`. A
stacked batch (``{field: array}``, fields in the config's order) becomes one tuple per
sample in that order; a ``batch_format = "list"`` batch keeps its tuples (dict samples give
their values, single values become 1-tuples).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any


def as_samples(batch: Any) -> list[tuple[Any, ...]]:
    """One batch of the service as a list of sample tuples in field order."""
    if isinstance(batch, dict):
        columns = list(batch.values())
        count = len(columns[0]) if columns else 0
        return [tuple(column[i] for column in columns) for i in range(count)]
    samples = []
    for sample in batch:
        if isinstance(sample, dict):
            samples.append(tuple(sample.values()))
        elif isinstance(sample, tuple):
            samples.append(sample)
        else:
            samples.append((sample,))
    return samples


def batch_reader(epoch: Callable[[], Iterable[Any]]) -> Callable[[], Iterator[list[tuple[Any, ...]]]]:
    """A paddle batch reader: each call iterates ``epoch()`` and yields its batches as lists of samples."""

    def reader() -> Iterator[list[tuple[Any, ...]]]:
        for batch in epoch():
            yield as_samples(batch)

    return reader


__all__ = ["as_samples", "batch_reader"]
