"""A received batch as the training loop sees it: a dict of stacked arrays, or a list of samples.

Per-sample objects are built only for ``batch_format = "list"``, which asks for them.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def to_batch(columns: dict[str, np.ndarray], sample_kind: str, batch_format: str) -> Any:
    """A received batch as the user sees it: stacked dict, or a list of samples."""
    if batch_format == "list":
        names = list(columns)
        n = len(next(iter(columns.values()))) if columns else 0
        if sample_kind == "dict":
            return [{name: columns[name][i] for name in names} for i in range(n)]
        if sample_kind == "value" and len(names) == 1:
            return list(columns[names[0]])
        return [tuple(columns[name][i] for name in names) for i in range(n)]
    return {name: _stack_objects(values) for name, values in columns.items()}


def _stack_objects(values: np.ndarray) -> Any:
    if not values.dtype.hasobject:
        return values
    if any(isinstance(v, (bytes, bytearray)) for v in values):
        # As they are: a numpy "S" array pads each to the longest and drops trailing NUL bytes when read.
        return list(values)
    try:
        return np.stack([np.asarray(v) for v in values])
    except (ValueError, TypeError):
        return list(values)  # ragged: a list of per-sample values


__all__ = ["to_batch"]
