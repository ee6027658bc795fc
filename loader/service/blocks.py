"""Columnar sample blocks: ``dict field -> array`` whose arrays share a leading axis of n samples.

Workers build them, the stage shuffles and batches them, the client receives
them. Object arrays hold ragged values. Nothing here loops over samples in
Python: blocks are concatenated, permuted with ``np.take`` and sliced.
"""

from __future__ import annotations

import itertools

import numpy as np

Block = dict[str, np.ndarray]


def block_rows(block: Block) -> int:
    for values in block.values():
        return int(values.shape[0])
    return 0


def concat(blocks: list[Block]) -> Block:
    if len(blocks) == 1:
        return blocks[0]
    names = list(blocks[0])
    return {name: _concat_column([b[name] for b in blocks]) for name in names}


def _concat_column(parts: list[np.ndarray]) -> np.ndarray:
    joined = _adjacent_view(parts)
    if joined is not None:
        return joined
    if any(p.dtype.hasobject for p in parts) and not all(p.dtype.hasobject for p in parts):
        # One block stacked, another ragged: fall back to object rows for all.
        parts = [p if p.dtype.hasobject else _as_object_rows(p) for p in parts]
    return np.concatenate(parts, axis=0)


def _adjacent_view(parts: list[np.ndarray]) -> np.ndarray | None:
    """One view over ``parts`` when they are consecutive slices of one buffer (steps cut from one chunk,
    which the stage then packs into one message): no copy. None when they are not."""
    first = parts[0]
    if first.dtype.hasobject or not first.flags.c_contiguous or first.ndim == 0:
        return None
    root = _root(first)
    address = first.__array_interface__["data"][0] + first.nbytes
    for part in parts[1:]:
        if (
            part.dtype != first.dtype
            or part.shape[1:] != first.shape[1:]
            or not part.flags.c_contiguous
            or part.__array_interface__["data"][0] != address
            or _root(part) is not root
        ):
            return None
        address += part.nbytes
    rows = sum(int(p.shape[0]) for p in parts)
    # Every byte of the view lies in ``root``'s buffer (the parts are adjacent slices of it).
    return np.lib.stride_tricks.as_strided(first, shape=(rows, *first.shape[1:]), writeable=first.flags.writeable)


def _root(array: np.ndarray) -> object:
    """The object that owns an array's memory (the end of its chain of bases)."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array.base if array.base is not None else array


def _as_object_rows(array: np.ndarray) -> np.ndarray:
    out = np.empty(array.shape[0], dtype=object)
    for i in range(array.shape[0]):
        out[i] = array[i]
    return out


def take(block: Block, rows: np.ndarray) -> Block:
    return {name: np.take(values, rows, axis=0) for name, values in block.items()}


def select(block: Block, keep: np.ndarray) -> Block:
    """Rows where the boolean mask ``keep`` is true."""
    return {name: values[keep] for name, values in block.items()}


def rows_slice(block: Block, start: int, stop: int) -> Block:
    return {name: values[start:stop] for name, values in block.items()}


def block_nbytes(block: Block) -> int:
    return sum(int(v.nbytes) for v in block.values())


ROW_BYTES_SAMPLES = 8  # values of an object column looked at to estimate its rows' size
ROW_BYTES_DEPTH = 4  # levels of nested lists, tuples and dicts looked into; deeper ones count 8 bytes an item


def row_nbytes_estimate(block: Block) -> int:
    """About the bytes one row of ``block`` holds: exact for fixed-size columns; for an object column (ragged
    values), the mean size of a few values spread over it (``block_nbytes`` counts only its pointers)."""
    rows = block_rows(block)
    if rows == 0:
        return 0
    total = 0
    for values in block.values():
        if not values.dtype.hasobject:
            total += int(values.nbytes) // rows
            continue
        picks = np.linspace(0, rows - 1, num=min(rows, ROW_BYTES_SAMPLES)).astype(np.int64)
        sizes = [_value_nbytes(values[int(i)]) for i in picks]
        total += 8 + sum(sizes) // len(sizes)
    return total


def _value_nbytes(value: object, depth: int = 0) -> int:
    if isinstance(value, (bytes, bytearray, str)):
        return len(value)
    if isinstance(value, (list, tuple, dict)):
        # Items of a dict too (a LoDTensor converted from RecordIO is {"data": array, ...}: 8 bytes undercounted
        # it). Only ROW_BYTES_DEPTH levels down: a worker's list nested hundreds deep (msgpack takes 511) raised
        # RecursionError here, after the chunk's references were adopted, and each level looked at costs up to
        # ROW_BYTES_SAMPLES times the one above.
        if not value or depth >= ROW_BYTES_DEPTH:
            return 8 * max(1, len(value))
        items = value.values() if isinstance(value, dict) else value
        head = list(itertools.islice(items, ROW_BYTES_SAMPLES))  # a long list is as its first items
        return len(value) * (8 + sum(_value_nbytes(v, depth + 1) for v in head) // len(head))
    return int(getattr(value, "nbytes", 8))


__all__ = ["Block", "concat", "take", "select", "block_rows", "rows_slice", "block_nbytes", "row_nbytes_estimate"]
