"""One batch of provider samples -> one array structure per slot (see the package docstring)."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from loader.errors import DataError
from loader.lod_tensor import LoDTensor
from loader.provider.types import DataType, InputType


@dataclasses.dataclass
class SparseBatch:
    """Rows of a sparse slot in CSR form: row ``r`` has ``indices[offsets[r]:offsets[r+1]]``.

    ``values`` are float32 (all ones for ``sparse_binary_vector``); ``dim`` is the
    number of columns.
    """

    indices: np.ndarray
    values: np.ndarray
    offsets: np.ndarray
    dim: int

    @property
    def rows(self) -> int:
        return len(self.offsets) - 1

    def row(self, r: int) -> tuple[np.ndarray, np.ndarray]:
        start, stop = self.offsets[r], self.offsets[r + 1]
        return self.indices[start:stop], self.values[start:stop]

    def to_dense(self) -> np.ndarray:
        out = np.zeros((self.rows, self.dim), dtype=np.float32)
        rows = np.repeat(np.arange(self.rows), np.diff(self.offsets))
        out[rows, self.indices] = self.values
        return out


def assemble(samples: Sequence[Sequence[Any]], types: Sequence[InputType], names: Sequence[str]) -> dict[str, Any]:
    """Build ``{slot name: array | SparseBatch | LoDTensor}`` from normalized samples."""
    columns = list(zip(*samples)) if samples else [() for _ in types]
    return {name: slot_column(list(col), t, name) for col, t, name in zip(columns, types, names)}


def slot_column(values: list[Any], input_type: InputType, name: str) -> Any:
    """One slot of a batch; sequences become a ``LoDTensor`` over the flattened values."""
    depth = int(input_type.seq_type)
    lengths: list[list[int]] = []
    items: Any = values
    try:
        for level in range(depth):
            lengths.append([len(v) for v in items])
            last = level == depth - 1
            if last and input_type.type == DataType.Dense and items and all(isinstance(v, np.ndarray) for v in items):
                items = np.concatenate(items)
            else:
                items = list(itertools.chain.from_iterable(items))
        data = _base_column(items, input_type)
    except (TypeError, ValueError, IndexError) as exc:
        raise DataError(f"slot {name!r} ({input_type!r}): cannot build a batch: {exc}") from None
    return LoDTensor(data, lengths) if depth else data


def _base_column(values: Any, input_type: InputType) -> Any:
    kind, dim = input_type.type, input_type.dim
    if kind == DataType.Dense:
        if len(values) == 0:
            return np.zeros((0, dim), dtype=np.float32)
        array = np.asarray(values, dtype=np.float32)
        if array.ndim > 2 and math.prod(array.shape[1:]) == dim:
            # N-d samples of dim values (dense_array(784) fed (28, 28) arrays): read flat, as the original did.
            array = array.reshape(len(array), dim)
        if array.ndim != 2 or array.shape[1] != dim:
            raise ValueError(f"dense vectors of {dim} values expected, got samples of shape {array.shape[1:]}")
        return array
    if kind == DataType.Index:
        array = np.asarray(values)
        if array.ndim != 1:
            raise ValueError(f"one int per sample expected, got samples of shape {array.shape[1:]}")
        if len(array) and array.dtype.kind not in "iub":
            # The original refused what is not an int ("Cannot cast int"); a cast to int64 made 1.7 a 1, "7" a 7.
            bad = next((v for v in values if not isinstance(v, (int, np.integer))), values[0])
            raise ValueError(f"ints expected, got {bad!r} ({type(bad).__name__})")
        return array.astype(np.int64, copy=False)
    counts = np.fromiter(map(len, values), dtype=np.int64, count=len(values))
    offsets = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    nnz = int(offsets[-1])
    if kind == DataType.SparseNonValue:
        ids: Sequence[Any] = list(itertools.chain.from_iterable(values))
        weights = np.ones(nnz, dtype=np.float32)
    else:
        pairs = list(itertools.chain.from_iterable(values))
        ids, vals = zip(*pairs) if pairs else ((), ())
        weights = np.asarray(vals, dtype=np.float32)
    return SparseBatch(_column_ids(ids, dim), weights, offsets, dim)


def _column_ids(ids: Sequence[Any], dim: int) -> np.ndarray:
    """Sparse column ids as int64, refusing what is not an int in ``[0, dim)``.

    Checked even without ``check=True``: a cast to int64 made 1.7 a 1 and "7" a 7, and an id outside
    the ``dim`` columns made a CSR batch that breaks whatever reads it (``to_dense`` included)."""
    array = np.asarray(ids) if len(ids) else np.zeros(0, dtype=np.int64)
    if array.ndim != 1 or array.dtype.kind not in "iu":
        bad = next((v for v in ids if isinstance(v, bool) or not isinstance(v, (int, np.integer))), ids[0])
        raise ValueError(f"column ids must be ints, got {bad!r} ({type(bad).__name__})")
    outside = (array < 0) | (array >= dim)
    if outside.any():
        raise ValueError(f"column id {int(array[outside][0])} out of range [0, {dim})")
    return array.astype(np.int64, copy=False)


__all__ = ["SparseBatch", "assemble", "slot_column"]
