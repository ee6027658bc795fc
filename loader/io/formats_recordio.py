"""The ``recordio`` file format: each record is one sample written by ``loader.recordio``.

A sample is a list or tuple of arrays (slots ``slot0``, ``slot1``, ...), one array
(one slot), or a dict (slot names = the first record's keys; later records are
read by those keys, whatever their order). Values that are not arrays (ints,
lists of floats) become arrays with ``np.asarray``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from loader.errors import DataError, stepped_past
from loader.io.file_reader import FileReader
from loader.io.slots import DictSlots, as_instance
from loader.recordio import Scanner


class RecordIOFileReader(FileReader):
    """Instances from a RecordIO file, read chunk by chunk."""

    def _open(self) -> None:  # type: ignore[override] # a format takes only its own options
        self._scanner = Scanner(self.path)
        self._dicts = DictSlots()

    def _read_instance(self) -> list[np.ndarray] | None:
        found, sample = self._scanner.next_sample()
        if not found:
            return None
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

    def _from_dict(self, sample: dict[Any, Any]) -> list[np.ndarray]:
        arrays = self._dicts.arrays(sample, f"{self.path}: record {self._index}")
        if self._names is None:
            self._set_slot_names(self._dicts.names)
        return arrays

    def _rewind(self) -> None:
        self._scanner.reset()

    def _close_file(self) -> None:
        self._scanner.close()


__all__ = ["RecordIOFileReader"]
