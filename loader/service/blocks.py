"""Columnar sample blocks: ``dict field -> array`` whose arrays share a leading axis of n samples.

Workers build them, the stage shuffles and batches them, the client receives
them. Object arrays hold ragged values. Nothing here loops over samples in
Python: blocks are concatenated, permuted with ``np.take`` and sliced.
"""

from __future__ import annotations

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
    if any(p.dtype.hasobject for p in parts) and not all(p.dtype.hasobject for p in parts):
        # One block stacked, another ragged: fall back to object rows for all.
        parts = [p if p.dtype.hasobject else _as_object_rows(p) for p in parts]
    return np.concatenate(parts, axis=0)


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


__all__ = ["Block", "concat", "take", "select", "block_rows", "rows_slice", "block_nbytes"]
