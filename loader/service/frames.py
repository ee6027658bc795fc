"""Columns as raw buffer frames: one C-order array per field, described by ``[name, dtype, shape]``.

Arrays are received with ``np.frombuffer`` (no copy). A column whose values do
not stack into one fixed-dtype array (ragged shapes, mixed types) travels as
dtype ``"|O"`` with its frame holding ``loader.runtime.codec.pack(values)``;
nothing is ever unpickled.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from loader.errors import MalformedMessageError
from loader.runtime import codec

OBJECT_DTYPE = "|O"
# A frame may describe at most this many dimensions (numpy's own limit is 64).
MAX_DIMENSIONS = 32

Frame = Any  # bytes, memoryview, numpy array or zmq.Frame: anything with the buffer protocol
Columns = dict[str, np.ndarray]


def buffer_of(frame: Frame) -> memoryview:
    """The bytes of a received frame, without copying."""
    # zmq.Frame exposes its memory as .buffer; everything else supports the buffer protocol.
    buf = getattr(frame, "buffer", None)
    return buf if buf is not None else memoryview(frame)


def column_frames(columns: Mapping[str, Any]) -> tuple[list[list[Any]], list[Frame]]:
    """(descriptions, frames) of ``columns``, one frame per column in order."""
    described: list[list[Any]] = []
    frames: list[Frame] = []
    for name, values in columns.items():
        dtype, shape, frame = _column_frame(values)
        described.append([name, dtype, shape])
        frames.append(frame)
    return described, frames


def _column_frame(values: Any) -> tuple[str, list[int], Frame]:
    if isinstance(values, np.ndarray) and not values.dtype.hasobject:
        array = np.ascontiguousarray(values)
        # A zero-size or 0-d array still needs a valid buffer; reshape(-1) keeps it cheap.
        return array.dtype.str, list(array.shape), array.reshape(-1).view(np.uint8) if array.size else b""
    items = list(values)
    return OBJECT_DTYPE, [len(items)], codec.pack(items)


def read_columns(described: Any, frames: Sequence[Frame]) -> Columns:
    """The arrays of ``frames`` as ``described`` says; ``MalformedMessageError`` when they disagree."""
    if not isinstance(described, list) or len(described) != len(frames):
        count = len(described) if isinstance(described, list) else "no"
        raise MalformedMessageError(f"message describes {count} arrays but has {len(frames)}")
    columns: Columns = {}
    for item, frame in zip(described, frames):
        if not (
            isinstance(item, list)
            and len(item) == 3
            and isinstance(item[0], str)
            and isinstance(item[1], str)
            and isinstance(item[2], list)
            and len(item[2]) <= MAX_DIMENSIONS
            and all(type(n) is int and n >= 0 for n in item[2])
        ):
            raise MalformedMessageError(f"malformed column description {str(item)[:80]!r}")
        name, dtype_str, shape = item
        if name in columns:
            raise MalformedMessageError(f"column {name!r} appears twice")
        columns[name] = _column_array(dtype_str, shape, frame)
    return columns


def _column_array(dtype_str: str, shape: list[int], frame: Frame) -> np.ndarray:
    if dtype_str == OBJECT_DTYPE:
        try:
            items = codec.unpack(buffer_of(frame))
        except ValueError as exc:
            raise MalformedMessageError(f"malformed object column: {exc}") from exc
        if not isinstance(items, list):
            raise MalformedMessageError("an object column is not a list")
        return object_array(items)
    try:
        dtype = np.dtype(dtype_str)
    except Exception as exc:  # numpy raises TypeError, ValueError, even SyntaxError for odd strings
        raise MalformedMessageError(f"unknown dtype {dtype_str[:40]!r}") from exc
    if dtype.hasobject or dtype.itemsize == 0:
        raise MalformedMessageError(f"an array frame claims dtype {dtype_str[:40]!r}")
    buf = buffer_of(frame)
    count = 1
    for n in shape:
        count *= n
    if count * dtype.itemsize != buf.nbytes:
        raise MalformedMessageError(f"array frame has {buf.nbytes} bytes, expected {count * dtype.itemsize}")
    try:
        if count == 0:
            return np.zeros(shape, dtype=dtype)
        return np.frombuffer(buf, dtype=dtype).reshape(shape)
    except ValueError as exc:  # a shape numpy refuses (a dimension past its limits)
        raise MalformedMessageError(f"array frame of shape {str(shape)[:60]}: {exc}") from exc


def object_array(items: Sequence[Any]) -> np.ndarray:
    """A 1-d object array holding ``items`` as they are (never broadcasting nested arrays)."""
    out = np.empty(len(items), dtype=object)
    for i, item in enumerate(items):
        out[i] = item
    return out


__all__ = ["OBJECT_DTYPE", "Frame", "Columns", "buffer_of", "column_frames", "read_columns", "object_array"]
