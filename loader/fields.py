"""``Field`` (one input of a ``DataFeeder``) and the conversion of a field's column of a batch.

A field's shape starts with the batch dimension (``-1``); the rest is the shape of
one sample (``lod_level == 0``) or of one sequence element (``lod_level > 0``).
``FieldConverter`` turns the values of one field across a mini-batch into one
array (or a ``LoDTensor``), checking every shape and naming the sample that does
not fit. See :mod:`loader.feeder` for the rules.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any, Sequence

import numpy as np

from loader.errors import DataError, ShapeMismatchError
from loader.lod_tensor import LoDTensor

_SUPPORTED_KINDS = "biufc"  # bool, signed, unsigned, float, complex


@dataclasses.dataclass(frozen=True)
class Field:
    """One input of a ``DataFeeder``: name, shape (``-1`` for the batch), dtype, lod_level."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    lod_level: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Field name must be a non-empty string, got {self.name!r}")
        try:
            shape = tuple(-1 if d is None else int(d) for d in self.shape)
        except (TypeError, ValueError):
            raise ValueError(f"Field {self.name!r}: shape must be a sequence of ints, got {self.shape!r}") from None
        try:
            dtype = np.dtype(self.dtype)
        except TypeError:
            raise ValueError(f"Field {self.name!r}: unknown dtype {self.dtype!r}") from None
        if dtype.kind not in _SUPPORTED_KINDS:
            raise ValueError(f"Field {self.name!r}: dtype {dtype} is not numeric (bool, int, uint, float, complex)")
        if not isinstance(self.lod_level, int) or self.lod_level < 0:
            raise ValueError(f"Field {self.name!r}: lod_level must be an int >= 0, got {self.lod_level!r}")
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "dtype", dtype.name)

    @property
    def sample_shape(self) -> tuple[int, ...]:
        """The shape of one sample (lod_level 0) or of one sequence element (lod_level > 0)."""
        if self.shape and self.shape[0] < 0:
            return self.shape[1:]
        return self.shape


def _matches(shape: tuple[int, ...], expected: tuple[int, ...]) -> bool:
    return len(shape) == len(expected) and all(e < 0 or e == d for d, e in zip(shape, expected))


def _reshape_target(shape: tuple[int, ...], expected: tuple[int, ...]) -> tuple[int, ...] | None:
    """The sample shape to reshape to, or None when ``shape`` cannot become ``expected``."""
    if _matches(shape, expected):
        return shape
    free = [i for i, e in enumerate(expected) if e < 0]
    size = math.prod(shape)
    known = math.prod(e for e in expected if e >= 0)
    if not free:
        return expected if size == known else None
    if len(free) == 1 and known and size % known == 0:
        return tuple(size // known if e < 0 else e for e in expected)
    return None


def _describe(shape: tuple[int, ...]) -> str:
    return f"{shape} ({math.prod(shape)} values)"


class FieldConverter:
    """Builds the array (or LoDTensor) of one field from that field's column of a batch."""

    def __init__(self, field: Field) -> None:
        self.field = field
        self.dtype = np.dtype(field.dtype)
        self.element = field.sample_shape

    def __call__(self, column: Sequence[Any]) -> Any:
        if self.field.lod_level == 0:
            return self._stack(column, None)
        leaves, lengths = self._flatten(column)
        return LoDTensor(self._stack(leaves, lengths), lengths)

    def _flatten(self, column: Sequence[Any]) -> tuple[Any, list[list[int]]]:
        items: Any = column
        lengths: list[list[int]] = []
        for level in range(self.field.lod_level):
            try:
                lengths.append([len(item) for item in items])
            except TypeError:
                bad = next(i for i, item in enumerate(items) if not hasattr(item, "__len__"))
                where = self._where(bad, lengths)
                raise ShapeMismatchError(
                    f"field {self.field.name!r} has lod_level {self.field.lod_level}: {where} should be a sequence "
                    f"nested {self.field.lod_level - level} more level(s), got {type(items[bad]).__name__}"
                ) from None
            last = level == self.field.lod_level - 1
            if last and items and all(isinstance(item, np.ndarray) and item.ndim >= 1 for item in items):
                try:
                    return np.concatenate(items), lengths
                except ValueError:
                    pass  # differing element shapes: the generic path names the culprit
            items = list(itertools.chain.from_iterable(items))
        return items, lengths

    def _stack(self, items: Any, lengths: list[list[int]] | None) -> np.ndarray:
        if isinstance(items, np.ndarray):
            array = items
        else:
            try:
                array = np.asarray(items, dtype=self.dtype)
            except (ValueError, TypeError):
                return self._stack_one_by_one(items, lengths)
        target = _reshape_target(array.shape[1:], self.element) if array.ndim >= 1 else None
        if target is None:
            if len(items) == 0:
                return np.zeros((0, *(max(d, 0) for d in self.element)), dtype=self.dtype)
            return self._stack_one_by_one(items, lengths)
        return array.astype(self.dtype, copy=False).reshape((len(array), *target))

    def _stack_one_by_one(self, items: Sequence[Any], lengths: list[list[int]] | None) -> np.ndarray:
        """Slow path: convert each item alone, so the error names the one that does not fit."""
        rows = []
        for i, item in enumerate(items):
            try:
                row = np.asarray(item, dtype=self.dtype)
            except (ValueError, TypeError) as exc:
                raise DataError(
                    f"field {self.field.name!r}: {self._where(i, lengths)} cannot be converted to "
                    f"{self.dtype} with shape {self.element}: {exc}"
                ) from None
            target = _reshape_target(row.shape, self.element)
            if target is None:
                raise ShapeMismatchError(
                    f"field {self.field.name!r}: expected shape {_describe(self.element)}, "
                    f"received shape {_describe(row.shape)} in {self._where(i, lengths)}"
                )
            rows.append(row.reshape(target))
        try:
            return np.stack(rows)
        except ValueError:
            # Every item fits on its own, but free (-1) dimensions differ between items.
            first = rows[0].shape
            bad = next(i for i, row in enumerate(rows) if row.shape != first)
            raise ShapeMismatchError(
                f"field {self.field.name!r}: expected shape {self.element} with the same free dimensions in "
                f"every sample, received {rows[bad].shape} in {self._where(bad, lengths)} after {first}"
            ) from None

    @staticmethod
    def _where(index: int, lengths: list[list[int]] | None) -> str:
        """'sample i', or for flattened sequence data 'element j of sample i'."""
        if not lengths:
            return f"sample {index}"
        owner = index
        for level in reversed(lengths):
            offsets = np.cumsum(level)
            owner = int(np.searchsorted(offsets, owner, side="right"))
        return f"element {index} of the flattened data (sample {owner})"


def as_field(entry: Any) -> Field:
    if isinstance(entry, Field):
        return entry
    if hasattr(entry, "name") and hasattr(entry, "shape"):
        return Field(
            entry.name, tuple(entry.shape), str(getattr(entry, "dtype", "float32")), int(getattr(entry, "lod_level", 0))
        )
    raise TypeError(f"feed_list should contain loader.Field objects, got {type(entry).__name__}")


__all__ = ["Field", "FieldConverter", "as_field"]
