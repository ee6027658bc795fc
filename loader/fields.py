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
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from loader.errors import DataError, ShapeMismatchError
from loader.lod_tensor import LoDTensor

_SUPPORTED_KINDS = "biufc"  # bool, signed, unsigned, float, complex

# The latest Field made under each name, so that a feed_list of names resolves without a program,
# as fluid resolved names in its default main program. Fields are tiny and names few.
_DECLARED: dict[str, Field] = {}
_DECLARED_LOCK = threading.Lock()


@dataclasses.dataclass(frozen=True)
class Field:
    """One input of a ``DataFeeder``: name, shape (``-1`` for the batch), dtype, lod_level."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    lod_level: int = 0
    # Paddle 3's feeder (PIR mode): every value of the batch is flattened to its scalars, and the
    # lot reshaped to ``shape`` (one free dimension); no LoD, no per-sample check.
    flatten: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Field name must be a non-empty string, got {self.name!r}")
        try:
            shape = tuple(-1 if d is None else int(d) for d in self.shape)
        except (TypeError, ValueError):
            raise ValueError(f"Field {self.name!r}: shape must be a sequence of ints, got {self.shape!r}") from None
        if str(self.dtype).lower() in _BFLOAT16_NAMES:
            # Paddle's VarType.BF16 / paddle.bfloat16: numpy has no such dtype to stack a batch in.
            raise ValueError(
                f"Field {self.name!r}: dtype bfloat16 has no numpy form to feed: declare the field float32 and cast "
                "on the device (tensor.to(torch.bfloat16), paddle.cast(x, 'bfloat16'))"
            )
        try:
            dtype = np.dtype(self.dtype)
        except TypeError:
            raise ValueError(f"Field {self.name!r}: unknown dtype {self.dtype!r}") from None
        if dtype.kind not in _SUPPORTED_KINDS:
            raise ValueError(f"Field {self.name!r}: dtype {dtype} is not numeric (bool, int, uint, float, complex)")
        if not isinstance(self.lod_level, int) or self.lod_level < 0:
            raise ValueError(f"Field {self.name!r}: lod_level must be an int >= 0, got {self.lod_level!r}")
        if self.flatten and self.lod_level:
            raise ValueError(f"Field {self.name!r}: flatten=True feeds no LoD, so lod_level must be 0")
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "dtype", dtype.name)
        with _DECLARED_LOCK:
            _DECLARED[self.name] = self

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
        if self.field.flatten:
            return self._flat(column)
        if self.field.lod_level == 0:
            return self._stack(column, None)
        leaves, lengths = self._flatten(column)
        return LoDTensor(self._stack(leaves, lengths), lengths)

    def _flat(self, column: Sequence[Any]) -> np.ndarray:
        """Paddle 3: all scalars of the column, reshaped to the declared shape when its rank differs."""
        leaves: list[Any] = []
        stack: list[Any] = [column]
        while stack:  # depth-first, left to right, without recursion limits
            item = stack.pop()
            if isinstance(item, (list, tuple)):
                stack.extend(reversed(item))
            elif isinstance(item, np.ndarray):
                leaves.extend(item.ravel().tolist())
            else:
                leaves.append(item)
        try:
            array = np.asarray(leaves, dtype=self.dtype)
        except (TypeError, ValueError, OverflowError) as exc:
            raise DataError(f"field {self.field.name!r}: values cannot be converted to {self.dtype}: {exc}") from None
        if self._became_nan(array) and any(leaf is None for leaf in leaves):
            raise DataError(f"field {self.field.name!r}: a value is None, which {self.dtype} would hold as NaN")
        shape = self.field.shape
        if sum(d < 0 for d in shape) > 1 or array.ndim == len(shape):
            return array  # as Paddle: several free dimensions mean no reshape
        try:
            return array.reshape(shape)
        except ValueError:
            raise ShapeMismatchError(
                f"field {self.field.name!r}: {array.size} values in the batch cannot be reshaped to {list(shape)}"
            ) from None

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
        if isinstance(items, np.ndarray) and items.dtype != object:
            array = items
        else:
            try:
                array = np.asarray(items, dtype=self.dtype)
            except (ValueError, TypeError, OverflowError):  # 256 for uint8, 2**63 for int64: OverflowError
                return self._stack_one_by_one(items, lengths)
            self._refuse_none_in_nan_rows(items, array, lengths)
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
            except (ValueError, TypeError, OverflowError) as exc:
                raise DataError(
                    f"field {self.field.name!r}: {self._where(i, lengths)} cannot be converted to "
                    f"{self.dtype} with shape {self.element}: {exc}"
                ) from None
            self._refuse_none_in_nan_rows([item], row.reshape(1, -1), lengths, first=i)
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

    def _became_nan(self, array: np.ndarray) -> bool:
        """Whether a float or complex ``array`` holds a NaN: numpy turns None into NaN there without a word."""
        return self.dtype.kind in "fc" and bool(np.isnan(array).any())

    def _refuse_none_in_nan_rows(
        self, items: Sequence[Any], array: np.ndarray, lengths: list[list[int]] | None, first: int = 0
    ) -> None:
        """``DataError`` naming the first of ``items`` that is or holds a None, which numpy made a NaN of row
        ``i`` of the float or complex ``array`` without a word. Arrays of numbers hold no None, so a column of
        them is not looked at; otherwise only the items whose rows hold a NaN are walked (a NaN of the data's
        own, common in missing values, cost a walk of every value of the batch)."""
        if self.dtype.kind not in "fc" or array.ndim == 0 or not len(array):
            return
        if all(type(item) is np.ndarray and item.dtype != object for item in items):
            return
        for row in np.flatnonzero(np.isnan(array.reshape(len(array), -1)).any(axis=1)).tolist():
            item = items[row]
            if _holds_none(item):
                what = "is None" if item is None else "holds a None"
                raise DataError(
                    f"field {self.field.name!r}: {self._where(first + row, lengths)} {what}, which {self.dtype} "
                    f"would hold as NaN; expected shape {_describe(self.element)}"
                )

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


def _holds_none(value: Any) -> bool:
    """Whether ``value`` is None or a list, tuple or object array with a None anywhere inside."""
    pending = [value]
    while pending:  # without recursion: nesting is the user's
        item = pending.pop()
        if item is None:
            return True
        if isinstance(item, (list, tuple)):
            pending.extend(item)
        elif isinstance(item, np.ndarray) and item.dtype == object:
            pending.extend(item.ravel().tolist())
    return False


# Fluid's VarType names (``VarType.FP32``, ``paddle.float32``) -> numpy dtype names.
_BFLOAT16_NAMES = ("bf16", "bfloat16")  # dtype_name's spelling of Paddle's VarType.BF16 and paddle.bfloat16

_FLUID_DTYPES = {
    "bool": "bool",
    "int8": "int8",
    "int16": "int16",
    "int32": "int32",
    "int64": "int64",
    "uint8": "uint8",
    "fp16": "float16",
    "fp32": "float32",
    "fp64": "float64",
    "float16": "float16",
    "float32": "float32",
    "float64": "float64",
    "complex64": "complex64",
    "complex128": "complex128",
}


def dtype_name(value: Any) -> str:
    """A numpy dtype name for a numpy dtype, a string, or a fluid/paddle dtype (``VarType.FP32``, ``paddle.int64``)."""
    if isinstance(value, str):
        text = value
    elif isinstance(value, (np.dtype, type)):
        return np.dtype(value).name
    else:
        text = str(getattr(value, "name", value))
    key = text.rsplit(".", 1)[-1].lower()  # "VarType.FP32" -> "fp32", "paddle.int64" -> "int64"
    return _FLUID_DTYPES.get(key, text)


def declared_field(name: str) -> Field:
    """The latest ``Field`` made with ``name`` in this process; ``ValueError`` when there is none."""
    with _DECLARED_LOCK:
        found = _DECLARED.get(name)
        known = sorted(_DECLARED)
    if found is None:
        raise ValueError(f"feed_list names {name!r}, but no Field of that name was declared (declared: {known})")
    return found


def program_field(program: Any, name: str) -> Field:
    """The ``Field`` of variable ``name`` in ``program``: anything whose ``global_block().var(name)``
    gives an object with name, shape, dtype and lod_level (a fluid ``Program``), a mapping of
    names to Fields or variables, or a sequence of them."""
    if hasattr(program, "global_block"):
        try:
            var = program.global_block().var(name)
        except Exception as exc:  # a program's own lookup error, translated once here
            raise ValueError(f"feed_list names {name!r}, which the program does not have ({exc})") from exc
        return as_field(var)
    if isinstance(program, dict):
        entries = list(program.values())
    else:
        entries = list(program)
    fields = {f.name: f for f in map(as_field, entries)}
    if name not in fields:
        raise ValueError(f"feed_list names {name!r}, which the program does not have (it has {sorted(fields)})")
    return fields[name]


def as_field(entry: Any) -> Field:
    """A ``Field`` for a ``Field`` or any variable-like object with ``name`` and ``shape``
    (and optionally ``dtype`` and ``lod_level``), such as a fluid ``Variable``."""
    if isinstance(entry, Field):
        return entry
    if hasattr(entry, "name") and hasattr(entry, "shape"):
        dtype = dtype_name(getattr(entry, "dtype", "float32"))
        if not hasattr(entry, "lod_level"):
            # Paddle 3's values (PIR) have no LoD: its feeder flattened each batch and reshaped it.
            return Field(str(entry.name), tuple(entry.shape), dtype, 0, flatten=True)
        lod_level = entry.lod_level
        return Field(str(entry.name), tuple(entry.shape), dtype, int(lod_level() if callable(lod_level) else lod_level))
    raise TypeError(
        f"feed_list should contain loader.Field objects, variables (name, shape, dtype, lod_level) or names, "
        f"got {type(entry).__name__}"
    )


__all__ = ["Field", "FieldConverter", "as_field", "declared_field", "dtype_name", "program_field"]
