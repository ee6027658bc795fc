"""Samples that would reach the training loop wrong, refused in the worker with the record that made them.

Without this, two mistakes came out as batches that looked fine to the loader: a mapper that
returns None (every batch a column of None, the other fields gone) and, with stacked batches, one
sample whose array has another shape or dtype among many that share one (the chunk's column became
objects, and those batches lists of arrays). Each is now a ``DataError`` that travels like any
failure of a record: a ``WorkerError`` naming the file, the record and the reason, or under
``on_error = "skip"`` a skipped record.

Only what one lease reads is compared: rows of another shape in another file are the daemon's to
refuse (``daemon/fit.py``), with that file's name.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from loader.errors import DataError, ShapeMismatchError
from workers.columns import sample_parts

RAGGED_HINT = "a stacked batch needs one shape and dtype per field; pipeline.batch_format = 'list' takes ragged fields"


class SampleCheck:
    """Checks each sample of a lease (or of one file of a lease group: ``restart`` at each file)."""

    def __init__(self, fields: Sequence[str] | None, stacked: bool) -> None:
        self.fields = list(fields) if fields else None
        self.stacked = stacked
        self._first: list[tuple[tuple[int, ...], np.dtype] | None] | None = None  # per field of the first sample

    def restart(self, fields: Sequence[str] | None) -> None:
        self.fields = list(fields) if fields else None
        self._first = None

    def __call__(self, sample: Any) -> None:
        """Raise ``DataError`` (``ShapeMismatchError`` for a shape) saying what is wrong with ``sample``."""
        if sample is None:
            raise DataError("the sample is None (does a mapper return nothing?)")
        _, names, values = sample_parts(sample, self.fields)
        if not self.stacked:
            return
        layouts = [_fixed_layout(value) for value in values]
        if self._first is None or len(self._first) != len(layouts):
            self._first = layouts
            return
        for name, want, got in zip(names, self._first, layouts):
            if want is not None and got is not None and want != got:
                raise ShapeMismatchError(
                    f"field {name!r} has shape {got[0]} and dtype {got[1]}, but the samples before it have "
                    f"{want[0]} and {want[1]} ({RAGGED_HINT})"
                )


def _fixed_layout(value: Any) -> tuple[tuple[int, ...], np.dtype] | None:
    """(shape, dtype) of a numpy array or scalar of a fixed dtype; None for anything else (objects, strings)."""
    if isinstance(value, np.ndarray):
        dtype = value.dtype
        return None if dtype.hasobject or dtype.kind in "USV" else (value.shape, dtype)
    if isinstance(value, np.generic) and not isinstance(value, (np.str_, np.bytes_, np.object_)):
        return (), value.dtype
    return None  # Python numbers too: a column of them takes the type they stack to, as numpy decides


__all__ = ["SampleCheck", "RAGGED_HINT"]
