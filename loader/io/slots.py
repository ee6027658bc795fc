"""Samples as instances (one numpy array per slot), and the declared-shape check.

Rule for declared shapes (as in ``open_files(shapes=[[-1, 784], [-1, 1]])``): the
first entry of a declared shape is the batch axis and is never checked against
one instance (write ``-1``).

* ``lod_level == 0``: an instance has the rest of the shape, ``shape[1:]``. An
  instance of the full rank whose first size is 1 (``(1, 784)``) is accepted too
  and delivered without that axis (``(784,)``), so batching stacks it; so is a
  scalar where the rest is all ones (a label for ``[-1, 1]`` is delivered as ``(1,)``).
* ``lod_level == 1``: an instance is a sequence of the full rank: its first size is
  the sequence length (any), the rest is checked.

Everywhere else ``-1`` matches any size; the rank and every fixed size must match,
and the dtype must be exactly the declared one (no silent casts).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from loader.errors import ShapeMismatchError

ShapesArg = Sequence[Sequence[int]] | None
DtypesArg = Sequence[Any] | None
LodArg = Sequence[int] | None


def default_slot_names(count: int) -> list[str]:
    return [f"slot{i}" for i in range(count)]


def as_instance(sample: Any) -> tuple[list[np.ndarray], list[str] | None]:
    """``(arrays, names)`` for one sample: a dict (names = its keys), a list/tuple, or one value."""
    if isinstance(sample, dict):
        return [np.asarray(v) for v in sample.values()], [str(k) for k in sample]
    if isinstance(sample, (list, tuple)):
        return [np.asarray(v) for v in sample], None
    return [np.asarray(sample)], None


class DictSlots:
    """Dict samples of one file, joined by key: the first sample's keys are the slots, in its order.

    Taking ``dict.values()`` in each dict's own order swapped two slots of one shape without a word
    when a writer's key order changed; a dict with a key missing or added is refused, naming where."""

    def __init__(self) -> None:
        self.keys: list[Any] | None = None

    def arrays(self, sample: dict[Any, Any], where: str) -> list[np.ndarray]:
        """The values of ``sample`` in slot order (``where``: "FILE: line N", for the error)."""
        if self.keys is None:
            names = [str(key) for key in sample]
            if len(set(names)) != len(names):
                # Fields are named by str(key): {1: a, "1": b} made two fields named "1", and a batch kept one.
                raise ShapeMismatchError(f"{where}: the keys {list(sample)} name fields alike as text ({names})")
            self.keys = list(sample)
        elif len(sample) != len(self.keys) or any(key not in sample for key in self.keys):
            missing = [k for k in self.keys if k not in sample]
            extra = [k for k in sample if k not in self.keys]
            raise ShapeMismatchError(
                f"{where}: a sample with the keys {list(sample)} among samples with {self.keys} "
                f"({'lacks ' + repr(missing) if missing else 'adds ' + repr(extra)})"
            )
        return [np.asarray(sample[key]) for key in self.keys]

    @property
    def names(self) -> list[str]:
        return [str(key) for key in self.keys or ()]


def _dtype(index: int, value: Any, dtypes: Sequence[Any]) -> np.dtype:
    """``dtypes[index]`` as a numpy dtype; ``TypeError`` naming the entry when it is none."""
    try:
        return np.dtype(value)
    except TypeError as exc:
        hint = ""
        if all(isinstance(d, int) and not isinstance(d, bool) for d in dtypes):
            # Paddle's open_files / open_recordio_file took (shapes, lod_levels, dtypes): its positional calls
            # land the lod_levels here.
            hint = (
                " (a list of ints looks like lod_levels: lod_levels come after dtypes here, unlike Paddle's "
                "open_files; pass shapes, dtypes and lod_levels by keyword)"
            )
        raise TypeError(f"dtypes[{index}] = {value!r} is not a dtype: {exc}{hint}") from None


class SlotChecker:
    """Checks (and normalises) instances against declared shapes, dtypes and LoD levels."""

    def __init__(self, shapes: ShapesArg = None, dtypes: DtypesArg = None, lod_levels: LodArg = None) -> None:
        self.shapes = None if shapes is None else [[int(d) for d in s] for s in shapes]
        self.dtypes = None if dtypes is None else [_dtype(i, d, dtypes) for i, d in enumerate(dtypes)]
        counts = {len(x) for x in (self.shapes, self.dtypes, lod_levels) if x is not None}
        if len(counts) > 1:
            raise ValueError(f"shapes, dtypes and lod_levels describe different numbers of slots: {sorted(counts)}")
        self.num_slots = counts.pop() if counts else None
        self.lod_levels = [int(v) for v in lod_levels] if lod_levels is not None else None
        if self.lod_levels is not None and any(v < 0 for v in self.lod_levels):
            raise ValueError(f"lod_levels must be >= 0, got {self.lod_levels}")
        if self.shapes is not None:
            for i, shape in enumerate(self.shapes):
                if not shape:
                    raise ValueError(f"declared shape of slot {i} is empty; the first entry is the batch axis (-1)")

    @property
    def active(self) -> bool:
        return self.shapes is not None or self.dtypes is not None or self.num_slots is not None

    def lod_level(self, slot: int) -> int:
        return self.lod_levels[slot] if self.lod_levels is not None else 0

    def check(
        self, instance: list[np.ndarray], where: str, index: int, names: Sequence[str] | None
    ) -> list[np.ndarray]:
        """The instance, normalised; ``ShapeMismatchError`` naming where, record, slot and shapes."""
        if self.num_slots is not None and len(instance) != self.num_slots:
            raise ShapeMismatchError(f"{where}: record {index} has {len(instance)} slots, {self.num_slots} declared")
        if self.shapes is None and self.dtypes is None:
            return instance
        out = list(instance)
        for i, array in enumerate(instance):
            if self.shapes is not None:
                out[i] = self._check_shape(array, i, where, index, names)
            if self.dtypes is not None and array.dtype != self.dtypes[i]:
                raise ShapeMismatchError(
                    f"{where}: record {index}, slot {_slot(i, names)}: dtype {array.dtype} "
                    f"does not match declared {self.dtypes[i]}"
                )
        return out

    def _check_shape(
        self, array: np.ndarray, i: int, where: str, index: int, names: Sequence[str] | None
    ) -> np.ndarray:
        declared = self.shapes[i]  # type: ignore[index]
        rest = declared[1:]
        if self.lod_level(i) > 0:
            got = array.shape[1:] if array.ndim == len(declared) else None
        elif array.ndim == len(rest):
            got = array.shape
        elif array.ndim == len(declared) and array.shape[0] == 1:
            got, array = array.shape[1:], array[0]
        elif array.ndim == 0 and rest and all(want == 1 for want in rest):
            # A scalar label for a [-1, 1] slot (the original's MNIST shapes): same size, so
            # it is delivered as (1,) and batches as (N, 1), as the declaration says.
            got, array = tuple(rest), array.reshape(rest)
        else:
            got = None
        if got is None or any(want != -1 and want != have for want, have in zip(rest, got)):
            kind = "sequence instance" if self.lod_level(i) > 0 else "instance"
            raise ShapeMismatchError(
                f"{where}: record {index}, slot {_slot(i, names)}: {kind} shape {tuple(array.shape)} "
                f"does not match declared {declared} (the first entry is the batch axis)"
            )
        return array

    def check_rows(self, arrays: list[np.ndarray], where: str, names: Sequence[str] | None) -> list[np.ndarray]:
        """Check arrays whose first axis runs over instances (``.npy``/``.npz``) once for all rows.

        Returns the arrays reshaped (as views) the way single instances are normalised.
        """
        # Zero-memory stand-ins for one row: only shape and dtype matter.
        rows = [np.broadcast_to(np.empty((), a.dtype), a.shape[1:]) for a in arrays]
        checked = self.check(rows, where, 0, names)
        return [a if r.shape == a.shape[1:] else a.reshape((a.shape[0],) + r.shape) for a, r in zip(arrays, checked)]


def _slot(i: int, names: Sequence[str] | None) -> str:
    if names is not None and i < len(names):
        return f"{i} ({names[i]!r})"
    return str(i)


__all__ = ["SlotChecker", "as_instance", "default_slot_names"]
