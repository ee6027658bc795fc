"""``LoDTensor``: flat data plus per-level sequence lengths (fluid's length-based LoD).

Made by ``DataFeeder.feed`` for ``lod_level > 0`` fields and by the provider's
batches for sequence slots, so both hand sequences over in one form.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Sequence

import numpy as np


@dataclasses.dataclass
class LoDTensor:
    """Flat data plus per-level sequence lengths (the length-based LoD of fluid).

    ``data`` is a numpy array (or a device tensor after placement, or a
    ``loader.provider.SparseBatch`` for sparse sequence slots); ``lengths[0]`` has one
    entry per sample, each deeper level one entry per element of the level above.
    """

    data: Any
    lengths: list[list[int]] = dataclasses.field(default_factory=list)

    def recursive_sequence_lengths(self) -> list[list[int]]:
        return [list(level) for level in self.lengths]

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
        rows = len(self.data) if hasattr(self.data, "__len__") else None
        expected = len(self.lengths[0]) if self.lengths else None
        for level in self.lengths:
            if expected is not None and len(level) != expected or any(n < 0 for n in level):
                return False
            expected = sum(level)
        return rows is None or expected is None or expected == rows

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return np.asarray(self.data, dtype=dtype)


__all__ = ["LoDTensor"]
