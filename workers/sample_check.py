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

from loader.errors import DataError, ShapeMismatchError, UnsendableSampleError
from loader.runtime import codec
from workers.columns import in_order, sample_parts

RAGGED_HINT = "a stacked batch needs one shape and dtype per field; pipeline.batch_format = 'list' takes ragged fields"


class SampleCheck:
    """Checks each sample of a lease (or of one file of a lease group: ``restart`` at each file)."""

    def __init__(self, fields: Sequence[str] | None, stacked: bool) -> None:
        self.fields = list(fields) if fields else None
        self.stacked = stacked
        self._names: tuple[str, list[str]] | None = None  # (kind, field names) of the first sample
        self._first: list[Layout | None] | None = None  # per field of the first sample

    def restart(self, fields: Sequence[str] | None) -> None:
        self.fields = list(fields) if fields else None
        self._names = None
        self._first = None

    def __call__(self, sample: Any) -> tuple[str, list[str], list[Any]]:
        """Raise ``DataError`` (``ShapeMismatchError`` for a shape) saying what is wrong with ``sample``; else
        its ``sample_parts``, a dict's values in the file's field order (``ChunkBuilder.add`` takes them)."""
        if sample is None:
            raise DataError("the sample is None (does a mapper return nothing, or the reader yield None?)")
        kind, names, values = sample_parts(sample, self.fields)
        if not names:
            raise DataError("the sample has no fields (does a mapper return an empty tuple or dict?)")
        if self._names is None:
            self._names = (kind, names)
        elif self._names != (kind, names):
            reordered = in_order(kind, names, values, self._names[1]) if kind == self._names[0] else None
            if reordered is None:
                raise DataError(
                    f"the sample's fields are {_fields(kind, names)}, but the samples before it have "
                    f"{_fields(*self._names)}: every sample of a file needs the same fields"
                )
            names, values = self._names[1], reordered  # a dict's keys in another order: taken by key
        for name, value in zip(names, values):
            kind_of = type(value)
            if kind_of is np.ndarray:  # the usual value, checked here (a call to unsendable costs a microsecond)
                dtype = value.dtype
                if not dtype.hasobject and dtype.names is None and dtype.itemsize:
                    continue
            elif kind_of in _PLAIN_LEAVES:
                continue
            elif isinstance(value, np.generic):
                dtype = value.dtype
                if not dtype.hasobject and dtype.names is None and dtype.itemsize:
                    continue
            reason = unsendable(value)
            if reason is not None:
                raise UnsendableSampleError(f"field {name!r} {reason}")
        if self.stacked:
            self._check_layouts(names, values)
        return kind, names, values

    def _check_layouts(self, names: list[str], values: list[Any]) -> None:
        layouts = [_fixed_layout(value) for value in values]
        if self._first is None:
            self._first = layouts
            return
        for name, want, got in zip(names, self._first, layouts):
            if want is not None and got is not None and not _same_layout(want, got):
                raise ShapeMismatchError(
                    f"field {name!r} {_has(got)}, but the samples before it {_has(want, plural=True)} ({RAGGED_HINT})"
                )


Layout = tuple[tuple[int, ...], "np.dtype | None"]  # (shape, dtype); dtype None: a Python number, of shape ()

_PY_NUMBERS = (bool, int, float)
_LEAVES = (type(None), bool, float, str, bytes, bytearray)
_PLAIN_LEAVES = frozenset(_LEAVES)
_MAX_ITEMS_CHECKED = 100_000  # a sample holding more than this many Python objects is checked that far


def unsendable(value: Any) -> str | None:
    """Why ``value`` cannot travel in a message as it is (``loader.runtime.codec``), or None when it can.

    Checked here, per record, because a value the encoder refuses later fails a whole chunk, named by no record."""
    seen, stack = 0, [(value, 0)]
    while stack and seen < _MAX_ITEMS_CHECKED:
        item, depth = stack.pop()
        seen += 1
        if isinstance(item, np.ndarray) or isinstance(item, np.generic):
            reason = unsendable_dtype(item.dtype)
            if reason is not None:
                return reason
        elif isinstance(item, int) and not isinstance(item, bool):
            if not -(2**63) <= item < 2**64:
                return f"holds the integer {item}, which does not fit in 64 bits"
        elif isinstance(item, _LEAVES):
            continue
        elif isinstance(item, (list, tuple, dict)):
            if depth >= codec.MAX_TUPLE_NESTING:
                return f"nests lists, tuples or dicts deeper than {codec.MAX_TUPLE_NESTING}"
            items = list(item.keys()) + list(item.values()) if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in items)
        else:
            kind = f"{type(item).__module__}.{type(item).__qualname__}"
            if hasattr(item, "numpy") and hasattr(item, "device"):  # a torch (or alike) tensor: say the fix
                return f"holds a {kind}: return numpy arrays (tensor.numpy()); device='torch' makes tensors of them"
            return f"holds a {kind}, which cannot be sent ({codec.KEPT_TYPES})"
    return None


def unsendable_dtype(dtype: np.dtype) -> str | None:
    """Why values of ``dtype`` cannot travel as columns (the words after "field 'x' "), or None when they can."""
    if dtype.hasobject:
        return "is a numpy array of Python objects (dtype object): convert it to a fixed dtype"
    if dtype.names is not None:
        return f"has the structured dtype {dtype}: its field names would be lost; make each field a sample field"
    if dtype.itemsize == 0:
        # The daemon refuses such a frame as malformed: the epoch failed as "a chunk was lost on the way".
        if dtype.kind in "US":  # np.str_("") from a reader: an empty numpy string, not a file's dtype
            return f"is an empty numpy string (dtype {dtype.str}, no bytes): give str(value), or an array of a width"
        return f"has the zero-width dtype {dtype.str} (its values hold no bytes): write it with a dtype of one byte or more"
    return None


def _fixed_layout(value: Any) -> Layout | None:
    """(shape, dtype) of a numpy array or scalar of a fixed dtype, ((), None) for a Python number; None for
    anything else (objects, strings)."""
    if isinstance(value, np.ndarray):
        dtype = value.dtype
        return None if dtype.hasobject or dtype.kind in "USV" else (value.shape, dtype)
    if isinstance(value, np.generic) and not isinstance(value, (np.str_, np.bytes_, np.object_, np.void)):
        return (), value.dtype
    if type(value) in _PY_NUMBERS:
        return (), None  # a column of them takes the type they stack to, as numpy decides; its shape is ()
    return None


def _same_layout(want: Layout, got: Layout) -> bool:
    if want[1] is None or got[1] is None:  # a Python number: only the shape is its own
        return want[0] == got[0]
    return want == got


def _has(layout: Layout, plural: bool = False) -> str:
    shape, dtype = layout
    if dtype is None:
        return "are Python numbers" if plural else "is a Python number"
    return f"{'have' if plural else 'has'} shape {shape} and dtype {dtype}"


def _fields(kind: str, names: list[str]) -> str:
    return f"{names} (a {kind})"


__all__ = ["SampleCheck", "RAGGED_HINT", "unsendable", "unsendable_dtype"]
