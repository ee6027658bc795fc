"""Does a chunk fit its stream's batches? The stage asks before a row joins a buffer.

A stream's rows are concatenated (shuffle buffer, batcher), so every chunk of one
stream must have the same fields and, per fixed-dtype field, the same dtype and
row shape as the stream's first chunk. A file whose rows are another width, or a
dtype another file does not have, would otherwise fail inside ``np.concatenate``
deep in the daemon's loop, naming no file.

``Layout`` remembers the first chunk's columns; ``misfit`` explains, in one line,
why a later chunk does not fit (None when it does). With ``batch_format = "list"``
ragged fields are fine: ``as_objects`` turns such a column into object rows, and
the layout remembers the field as ragged from then on.
"""

from __future__ import annotations

import numpy as np

from loader.service.blocks import Block

RAGGED = "ragged"  # a field whose rows are per-sample objects (object dtype)

ColumnLayout = tuple[str, tuple[int, ...]] | str  # (dtype, row shape) or RAGGED
Layout = dict[str, ColumnLayout]

RAGGED_HINT = "ragged fields need pipeline.batch_format = 'list'"
DTYPE_HINT = "a stacked batch needs one dtype per field: write the files with one dtype, or cast it in a mapper"


def describe(block: Block, known: Layout | None = None) -> Layout:
    """Each field's (dtype, row shape), or RAGGED for object columns; ``known`` gives the layout of
    columns whose arrays do not show it (reference columns: ``of_rows``)."""
    known = known or {}
    return {name: known[name] if name in known else _column(values) for name, values in block.items()}


def of_rows(rows: set[tuple[str, tuple[int, ...]] | None]) -> ColumnLayout:
    """A column's layout from its rows' (dtype, shape) pairs (None: an object row): one pair, or RAGGED."""
    if len(rows) != 1:
        return RAGGED
    (row,) = rows
    if row is None:
        return RAGGED
    dtype, shape = row
    return np.dtype(dtype).str, tuple(int(n) for n in shape)


def _column(values: np.ndarray) -> ColumnLayout:
    if values.dtype.hasobject:
        return RAGGED
    return values.dtype.str, tuple(int(n) for n in values.shape[1:])


def _show(column: ColumnLayout, other: ColumnLayout) -> str:
    """``column`` in words; its byte order too where only that differs from ``other``'s dtype (a
    big-endian ``>i8`` file among ``<i8`` ones read "dtype int64, but the batch has dtype int64")."""
    if isinstance(column, str):
        return "ragged rows"
    dtype, shape = column
    return f"rows of shape {shape} and dtype {_dtype_text(np.dtype(dtype), other)}"


_BYTE_ORDERS = {">": "big-endian", "<": "little-endian"}


def _dtype_text(dtype: np.dtype, other: ColumnLayout) -> str:
    if isinstance(other, str) or dtype.str == other[0] or np.dtype(other[0]).name != dtype.name:
        return dtype.name
    return f"{dtype.name} ({_BYTE_ORDERS.get(dtype.str[0], 'no byte order')}, {dtype.str})"


def field_misfit(layout: Layout, block: Block, first: str = "") -> str | None:
    """Why ``block``'s fields differ from the layout's (None when they are the same names); ``first`` is the
    file whose rows made the layout. Files of other fields cannot share batches: said so, and which differ
    (a ``.npy`` without its ``.label.npy`` companion beside files with one read as "the batch has 'label'",
    naming neither the missing companion nor the other file)."""
    if list(block) == list(layout):
        return None
    missing = [name for name in layout if name not in block]
    extra = [name for name in block if name not in layout]
    differ = [f"{', '.join(map(repr, missing))} missing"] if missing else []
    differ += [f"{', '.join(map(repr, extra))} more"] if extra else []
    from_file = f" (as in {first})" if first else ""
    return (
        f"a sample has fields {list(block)}, but the batch has fields {list(layout)}{from_file}: "
        f"{'; '.join(differ) or 'another order'}; files of other fields cannot share a batch (a .npy's fields "
        "include its companions, such as NAME.label.npy beside NAME.npy: `loader check` lists the files that differ)"
    )


def shape_misfits(layout: Layout, block: Block, known: Layout | None = None) -> dict[str, str]:
    """Field -> why its fixed rows do not stack with the layout's fixed rows (object rows always fit)."""
    out: dict[str, str] = {}
    known = known or {}
    for name, values in block.items():
        want, got = layout[name], known[name] if name in known else _column(values)
        if want == got or RAGGED in (want, got):
            continue
        out[name] = f"field {name!r} has {_show(got, want)}, but the batch has {_show(want, got)}"
    return out


def misfit_hint(layout: Layout, block: Block, misfits: dict[str, str], known: Layout | None = None) -> str:
    """What to do about ``shape_misfits``: one dtype when only dtypes differ, else list batches."""
    known = known or {}
    for name in misfits:
        want, got = layout[name], known[name] if name in known else _column(block[name])
        if isinstance(want, str) or isinstance(got, str) or want[1] != got[1]:
            return RAGGED_HINT  # shapes differ (or a side is ragged): only list batches take both
    return DTYPE_HINT


def as_objects(values: np.ndarray) -> np.ndarray:
    """One object row per sample (a ragged field's column)."""
    out = np.empty(values.shape[0], dtype=object)
    for i in range(values.shape[0]):
        out[i] = values[i]
    return out


__all__ = [
    "Layout",
    "RAGGED",
    "RAGGED_HINT",
    "DTYPE_HINT",
    "misfit_hint",
    "describe",
    "of_rows",
    "field_misfit",
    "shape_misfits",
    "as_objects",
]
