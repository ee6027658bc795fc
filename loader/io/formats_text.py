"""The ``text`` file format: one sample per line, turned into arrays by a user parser.

``create_file_reader(path, format="text", parser=fn)``: ``fn(line)`` gets each line
without its line ending and returns a sample (a list/tuple of values, one value,
or a dict whose keys name the slots), or ``None`` to skip the line (headers,
comments, blank lines). An exception from the parser propagates unchanged, with
a note naming the file and line number.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from loader.errors import add_note
from loader.io.file_reader import FileReader
from loader.io.slots import as_instance


class TextFileReader(FileReader):
    """Instances parsed from the lines of a text file."""

    def _open(  # type: ignore[override] # a format takes only its own options
        self, parser: Callable[[str], Any] | None = None, encoding: str = "utf-8"
    ) -> None:
        if parser is None or not callable(parser):
            raise ValueError("the text format needs parser=callable(line) -> sample")
        self._parser = parser
        self._file = open(self.path, encoding=encoding)  # universal newlines: \r\n reads as \n
        self._line_no = 0

    def _read_instance(self) -> list[np.ndarray] | None:
        while True:
            line = self._file.readline()
            if not line:
                return None
            self._line_no += 1
            try:
                sample = self._parser(line[:-1] if line.endswith("\n") else line)
            except Exception as exc:
                add_note(exc, f"while parsing line {self._line_no} of {self.path}")
                raise
            if sample is None:
                continue
            arrays, names = as_instance(sample)
            if names is not None and self._names is None:
                self._set_slot_names(names)
            return arrays

    def _rewind(self) -> None:
        self._file.seek(0)
        self._line_no = 0

    def _close_file(self) -> None:
        self._file.close()


__all__ = ["TextFileReader"]
