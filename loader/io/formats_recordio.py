"""The ``recordio`` file format: each record is one sample written by ``loader.recordio``.

A sample is a list or tuple of arrays (slots ``slot0``, ``slot1``, ...), one array
(one slot), or a dict (slot names = the first record's keys; later records are
read by those keys, whatever their order). Values that are not arrays (ints,
lists of floats) become arrays with ``np.asarray``.

A record holding a whole mini-batch, as Fluid's ``convert_reader_to_recordio_file`` wrote
them (a ``DataFeeder``'s tensors, ``(32, 784)`` and ``(32, 1)``), is read as its samples when
shapes are declared and every slot carries the declared rank, batch axis included (``[-1,
784]``), or is a ``LoDTensor`` of one level in a ``lod_level`` 1 slot: its rows (its sequences)
are the instances, numbered on as records, as Fluid's ``open_files`` read such a file.
"""

from __future__ import annotations

import collections
from typing import Any

import numpy as np

from loader.errors import DataError, stepped_past
from loader.io.file_reader import FileReader
from loader.io.slots import DictSlots, as_instance
from loader.lod_tensor import LoDTensor
from loader.recordio import Scanner
from loader.recordio.tensors import batch_rows


class RecordIOFileReader(FileReader):
    """Instances from a RecordIO file, read chunk by chunk."""

    def _open(self) -> None:  # type: ignore[override] # a format takes only its own options
        self._scanner = Scanner(self.path)
        self._dicts = DictSlots()
        self._rows: collections.deque[tuple[Any, ...]] = collections.deque()  # the rest of a batch record

    def _read_instance(self) -> list[np.ndarray] | None:
        while not self._rows:
            found, sample = self._scanner.next_sample()
            if not found:
                return None
            if not self._is_batch(sample):
                return self._sample_arrays(sample)
            try:
                self._rows.extend(batch_rows(sample))  # a batch of no rows: on to the next record
            except ValueError as exc:
                raise stepped_past(
                    DataError(
                        f"{self.path}: record {self._index} does not split into samples of the declared slots: {exc}"
                    )
                ) from None
        return [np.asarray(value) for value in self._rows.popleft()]

    def _sample_arrays(self, sample: Any) -> list[np.ndarray]:
        """One sample's arrays (a record that is not a batch)."""
        # The record was read whatever it holds: a sample that makes no arrays fails alone (stepped_past).
        try:
            if isinstance(sample, dict):
                return self._from_dict(sample)
            arrays, _ = as_instance(sample)
        except DataError as exc:
            stepped_past(exc)
            raise
        except ValueError as exc:  # np.asarray of a ragged nest of lists
            raise stepped_past(DataError(f"{self.path}: record {self._index} makes no arrays ({exc})")) from exc
        return arrays

    def _is_batch(self, sample: Any) -> bool:
        """Whether ``sample`` is a mini-batch of the declared slots (the module's docstring says when)."""
        shapes = self._checker.shapes
        if shapes is None or not isinstance(sample, (list, tuple)) or len(sample) != len(shapes):
            return False
        for i, (value, declared) in enumerate(zip(sample, shapes)):
            level = self._checker.lod_level(i)
            if isinstance(value, LoDTensor):
                if level != 1 or len(value.recursive_sequence_lengths()) != 1:
                    return False
            elif level != 0 or np.ndim(value) != len(declared):
                return False
        return True

    def _from_dict(self, sample: dict[Any, Any]) -> list[np.ndarray]:
        arrays = self._dicts.arrays(sample, f"{self.path}: record {self._index}")
        if self._names is None:
            self._set_slot_names(self._dicts.names)
        return arrays

    def _rewind(self) -> None:
        self._rows.clear()
        self._scanner.reset()

    def _close_file(self) -> None:
        self._scanner.close()


__all__ = ["RecordIOFileReader"]
