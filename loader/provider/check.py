"""Turning what ``process`` yields into a list of slot values, and checking it (``check=True``)."""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from loader.provider.types import DataType, InputType

_SEQUENCE_TYPES = (list, tuple, np.ndarray)


class InvalidSample(Exception):
    """A sample does not fit its input types; ``slot`` is None when the sample as a whole is wrong."""

    def __init__(self, slot: str | None, reason: str) -> None:
        super().__init__(reason)
        self.slot, self.reason = slot, reason


def normalize(raw: Any, names: Sequence[str], dict_mode: bool) -> list[Any]:
    """The sample as a list in slot order (the original's SingleSlot/InputOrder wrappers)."""
    if dict_mode:
        if isinstance(raw, Mapping):
            return [raw.get(name) for name in names]
        # The original passed a non-dict sample through as is: its values in slot order.
        if len(names) == 1:
            return [raw]  # one slot: the sample is its value (the original's SingleSlotWrapper)
        if not isinstance(raw, (list, tuple)):
            raise InvalidSample(None, f"expected a dict or a list of {len(names)} slots, got {type(raw).__name__}")
        if len(raw) != len(names):
            raise InvalidSample(None, f"has {len(raw)} slots, input_types has {len(names)} ({list(names)})")
        return list(raw)
    if isinstance(raw, Mapping):
        raise InvalidSample(None, "got a dict sample but input_types is a list; declare input_types as a dict")
    if len(names) == 1:
        # With one slot the yielded value *is* that slot's value (a dense vector is a list).
        return [raw]
    if not isinstance(raw, (list, tuple)):
        raise InvalidSample(None, f"expected a list or tuple of {len(names)} slots, got {type(raw).__name__}")
    if len(raw) != len(names):
        raise InvalidSample(None, f"has {len(raw)} slots, input_types has {len(names)} ({list(names)})")
    return list(raw)


def check_sample(sample: Sequence[Any], types: Sequence[InputType], names: Sequence[str]) -> None:
    """Raise ``InvalidSample`` naming the slot and the problem if ``sample`` does not fit ``types``."""
    for value, input_type, name in zip(sample, types, names):
        if value is None:
            raise InvalidSample(name, "is missing (None)")
        try:
            _check_nested(value, input_type, int(input_type.seq_type), "")
        except InvalidSample as exc:
            raise InvalidSample(name, exc.reason) from None


def _check_nested(value: Any, input_type: InputType, depth: int, path: str) -> None:
    if depth == 0:
        problem = _check_value(value, input_type)
        if problem:
            raise InvalidSample(None, f"{path + ': ' if path else ''}{problem}")
        return
    if not isinstance(value, _SEQUENCE_TYPES):
        what = "sub-sequence" if depth == 2 else "sequence"
        raise InvalidSample(None, f"{path + ': ' if path else ''}expected a {what} (list), got {type(value).__name__}")
    for i, item in enumerate(value):
        _check_nested(item, input_type, depth - 1, f"{path}[{i}]")


def _check_value(value: Any, input_type: InputType) -> str | None:
    kind, dim = input_type.type, input_type.dim
    if kind == DataType.Index:
        if isinstance(value, bool) or not isinstance(value, (numbers.Integral, np.integer)):
            return f"expected an int, got {type(value).__name__} {value!r}"
        return None if 0 <= int(value) < dim else f"integer {value} out of range [0, {dim})"
    if kind == DataType.Dense:
        return _check_dense(value, dim)
    if not isinstance(value, _SEQUENCE_TYPES):
        return f"expected a list of column ids, got {type(value).__name__}"
    if kind == DataType.SparseValue:
        if not all(isinstance(p, _SEQUENCE_TYPES) and len(p) == 2 for p in value):
            return "expected a list of (column id, value) pairs"
        ids = [p[0] for p in value]
        problem = _check_floats([p[1] for p in value], None)
        if problem:
            return problem
    else:
        ids = list(value)
    return _check_ids(ids, dim)


def _check_dense(value: Any, dim: int) -> str | None:
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "fiu":
            return f"expected a numeric array, got dtype {value.dtype}"
        if value.ndim > 1:
            # An N-d array (a (28, 28) image for dense_array(784)) is read flat, as the original did.
            if value.size != dim:
                return f"expected {dim} values, got an array of shape {value.shape} ({value.size} values)"
            value = value.reshape(-1)
    elif not isinstance(value, (list, tuple)):
        return f"expected a list of {dim} floats, got {type(value).__name__}"
    return _check_floats(value, dim)


def _check_floats(values: Any, dim: int | None) -> str | None:
    if not isinstance(values, np.ndarray) and not all(
        isinstance(v, (numbers.Real, np.number)) and not isinstance(v, bool) for v in values
    ):
        bad = next(v for v in values if isinstance(v, bool) or not isinstance(v, (numbers.Real, np.number)))
        return f"expected float values, got {type(bad).__name__} {bad!r}"
    array = np.asarray(values, dtype=np.float64)
    if dim is not None and array.shape != (dim,):
        return f"expected {dim} values, got shape {array.shape}"
    if not np.isfinite(array).all():
        return f"non-finite value at position {int(np.argmin(np.isfinite(array)))}"
    return None


def _check_ids(ids: list[Any], dim: int) -> str | None:
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, (numbers.Integral, np.integer)):
            return f"column id {i!r} is not an int"
    array = np.asarray(ids, dtype=np.int64)
    if array.size and (array.min() < 0 or array.max() >= dim):
        bad = int(array[(array < 0) | (array >= dim)][0])
        return f"column id {bad} out of range [0, {dim})"
    if len(np.unique(array)) != len(array):
        return "column ids are not unique"
    return None


__all__ = ["InvalidSample", "normalize", "check_sample"]
