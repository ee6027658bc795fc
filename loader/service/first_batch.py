"""The first batch of a dataset as the training loop gets it, after every mapper (``loader check``).

A file's fields say what the readers give; mappers and batch mappers may add, drop,
crop or cast fields. ``loader check`` shows both: the files' fields from a survey,
and the first batch of epoch 0 read through an in-process ``Loader`` with one
worker on the CPU, so a mapper that fails on real data fails here, with the file and
record of its error, before a training job is launched.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from loader.config import LoaderConfig

# The daemon thread's log is noise in check's output (a client attached, a worker joined) or a copy of the error
# its client raises, which check prints as its one line.
_QUIET = ("loader.daemon", "loader.stage", "loader.coordinator", "loader.metrics")


@contextmanager
def first_batch_reader(config: LoaderConfig) -> Iterator[Callable[[str], Any]]:
    """A function of a dataset's name that gives its first batch of epoch 0 (None when the epoch is
    empty), from one in-process ``Loader`` with one worker, closed on leaving ``with``."""
    from loader.service.local import Loader

    # One local worker, no metrics port (a daemon of this config may be serving on it), batches on the CPU.
    changes = {"workers.count": 1, "workers.launcher": "local", "service.metrics": "", "client.device": "cpu"}
    config = config.override(changes, origin="loader check")
    levels = {name: logging.getLogger(name).level for name in _QUIET}
    for name in _QUIET:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    try:
        with Loader(config) as loader:

            def first_batch(name: str) -> Any:
                batches = loader.client(dataset=name, prefetch=1, rank=0, world_size=1).epoch(0)
                try:
                    return next(batches, None)
                finally:
                    batches.close()

            yield first_batch
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


def describe_batch(batch: Any) -> tuple[int, list[dict[str, str]]]:
    """The number of samples of ``batch`` and a row (field, shape, dtype) per field.

    A stacked batch (a dict of arrays) shows each array's shape, batch axis first; a batch
    of the "list" format shows the fields of its first sample."""
    if isinstance(batch, dict):
        values = list(batch.values())
        count = len(values[0]) if values else 0
        return count, [_row(name, value) for name, value in batch.items()]
    samples = list(batch)
    if not samples:
        return 0, []
    first = samples[0]
    if isinstance(first, dict):
        items = list(first.items())
    elif isinstance(first, tuple):
        items = [(str(i), value) for i, value in enumerate(first)]
    else:
        items = [("0", first)]
    return len(samples), [_row(name, value, per_sample=True) for name, value in items]


def _row(name: str, value: Any, per_sample: bool = False) -> dict[str, str]:
    if isinstance(value, list):  # a ragged field of a stacked batch: one value per sample
        return {"field": name, "shape": f"{len(value)} values of varying shape", "dtype": _dtypes(value)}
    array = np.asarray(value)
    shape = str(tuple(array.shape)) + (" per sample" if per_sample else "")
    return {"field": name, "shape": shape, "dtype": str(array.dtype)}


def _dtypes(values: list[Any]) -> str:
    found = dict.fromkeys(str(np.asarray(value).dtype) for value in values)
    return ", ".join(found)


__all__ = ["first_batch_reader", "describe_batch"]
