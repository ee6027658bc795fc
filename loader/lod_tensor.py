"""``LoDTensor``: flat data plus per-level sequence lengths (fluid's length-based LoD).

Made by ``DataFeeder.feed`` for every field (as fluid's feeder did) and by the
provider's batches for sequence slots, so both hand sequences over in one form.

Fluid code reads it unchanged: ``t.shape()`` (a list), ``t.lod()``,
``t.set_lod(offsets)``, ``t.recursive_sequence_lengths()``,
``t.set_recursive_sequence_lengths(lengths)``, ``t.set(array, place)``,
``numpy.array(t)``, ``t._dtype()``. NumPy-style code reads it too: ``t.shape``
also compares equal to a tuple (``t.shape == (9, 1)``), ``t.dtype``, ``t.ndim``,
``len(t)``, ``t[i]``; ``t.numpy()`` and ``t.data`` give the array itself.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np


class Shape(tuple[int, ...]):
    """A shape that is a tuple (``t.shape == (9, 1)``) and, called, the list fluid's ``shape()`` gave."""

    def __call__(self) -> list[int]:
        return [int(d) for d in self]


@dataclasses.dataclass
class LoDTensor:
    """Flat data plus per-level sequence lengths (the length-based LoD of fluid).

    ``data`` is a numpy array (or a device tensor after placement, or a
    ``loader.provider.SparseBatch`` for sparse sequence slots); ``lengths[0]`` has one
    entry per sample, each deeper level one entry per element of the level above.
    """

    data: Any
    lengths: list[list[int]] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        # As fluid.create_lod_tensor asserted: lengths that do not cut the data's rows would give every
        # sequence after the first wrong one the wrong rows, with no error anywhere. (set() and the
        # set_* methods check nothing, as in fluid: data and LoD may be set one after the other.)
        problem = self._lengths_problem()
        if problem:
            raise ValueError(f"LoDTensor: the sequence lengths {self.lengths} do not fit the data: {problem}")

    def recursive_sequence_lengths(self) -> list[list[int]]:
        return [list(level) for level in self.lengths]

    def set_lod(self, lod: Sequence[Sequence[int]]) -> None:
        """Set the LoD from offsets per level (``[[0, 3, 5, 9]]``): fluid's offset form."""
        lengths = []
        for level in lod:
            offsets = [int(n) for n in level]
            if not offsets or offsets[0] != 0 or any(b < a for a, b in zip(offsets, offsets[1:])):
                raise ValueError(f"a LoD level must be non-decreasing offsets starting at 0, got {offsets}")
            lengths.append([b - a for a, b in zip(offsets, offsets[1:])])
        self.lengths = lengths

    def set(self, array: Any, place: Any = None) -> None:
        """Replace the data (fluid's ``t.set(array, place)``; ``place`` is ignored: data stays where it is)."""
        self.data = np.asarray(array)

    def set_recursive_sequence_lengths(self, lengths: Sequence[Sequence[int]]) -> None:
        self.lengths = [[int(n) for n in level] for level in lengths]

    def lod(self) -> list[list[int]]:
        """Offsets per level: ``[[3, 2, 4]]`` -> ``[[0, 3, 5, 9]]``."""
        return [[0, *itertools.accumulate(level)] for level in self.lengths]

    def start_positions(self) -> list[list[int]]:
        """Offsets per level counted in rows of ``data`` (PyDataProvider2's start positions).

        For two levels this is ``[sequenceStartPositions, subSequenceStartPositions]``.
        """
        offsets = self.lod()
        result = [offsets[-1]] if offsets else []
        for level in reversed(offsets[:-1]):
            inner = result[0]
            result.insert(0, [inner[i] for i in level])
        return result

    def has_valid_recursive_sequence_lengths(self) -> bool:
        return self._lengths_problem() is None

    def _lengths_problem(self) -> str | None:
        """What is wrong with ``lengths`` for ``data`` (each level one length per element of the level above,
        none negative, the last summing to the data's rows), or None."""
        rows = len(self.data) if hasattr(self.data, "__len__") else None
        expected = len(self.lengths[0]) if self.lengths else None
        for depth, level in enumerate(self.lengths):
            if any(n < 0 for n in level):
                return f"level {depth} has a negative length"
            if expected is not None and len(level) != expected:
                return f"level {depth} has {len(level)} lengths, but level {depth - 1} sums to {expected}"
            expected = sum(level)
        if rows is not None and expected is not None and expected != rows:
            return f"they sum to {expected} rows, but the data has {rows}"
        return None

    @property
    def shape(self) -> Shape:
        """The data's shape: a tuple, which called gives a list (fluid's ``t.shape()``)."""
        return Shape(int(d) for d in self.data.shape)

    @property
    def dtype(self) -> Any:
        return self.data.dtype

    @property
    def ndim(self) -> int:
        return len(self.data.shape)

    def _dtype(self) -> Any:
        """Fluid's spelling of ``dtype``."""
        return self.data.dtype

    def numpy(self) -> np.ndarray:
        """The data as a numpy array (no copy when it is one already)."""
        return np.asarray(self.data)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: Any) -> Any:
        return self.data[index]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        # numpy >= 2 passes copy=True for numpy.array(t) and does not copy again: handing back the data
        # itself would let the caller's array write into this tensor (fluid's numpy.array(t) is a copy).
        if copy is None:
            return np.asarray(self.data, dtype=dtype)
        return np.array(self.data, dtype=dtype, copy=copy)


__all__ = ["LoDTensor", "Shape"]
