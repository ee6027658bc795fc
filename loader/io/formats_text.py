"""The ``text`` file format: one sample per line, turned into arrays by a user parser.

``create_file_reader(path, format="text", parser=fn)``: ``fn(line)`` gets each line
without its line ending and returns a sample (a list/tuple of values, one value,
or a dict whose keys name the slots), or ``None`` to skip the line (headers,
comments, blank lines). An exception from the parser propagates unchanged, with
a note naming the file and line number.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np

from loader.errors import DataError, add_note, stepped_past
from loader.io.file_reader import FileReader
from loader.io.slots import DictSlots, as_instance

# What surrogateescape turns an undecodable byte into: never part of text decoded without error.
_UNDECODED = re.compile("[\udc80-\udcff]")


def refuse_undecoded(line: str, path: str, line_no: int, encoding: str, fix: str) -> None:
    """``DataError`` naming the line when ``line`` (read with errors="surrogateescape") holds bytes that are
    not ``encoding`` text. A strict decode fails in the file's read buffer instead: thousands of lines
    before the bad one, naming neither the file nor the line."""
    bad = _UNDECODED.search(line)
    if bad is not None:
        raise DataError(
            f"{path}: line {line_no} is not {encoding} text (byte {ord(bad.group()) - 0xDC00:#04x} at "
            f"character {bad.start() + 1}); {fix}"
        )


class TextFileReader(FileReader):
    """Instances parsed from the lines of a text file."""

    def _open(  # type: ignore[override] # a format takes only its own options
        self, parser: Callable[[str], Any] | None = None, encoding: str = "utf-8"
    ) -> None:
        if parser is None or not callable(parser):
            # open_files passes no format options: say how a parser reaches it there, too.
            raise ValueError(
                "the text format needs parser=callable(line) -> sample: create_file_reader(path, parser=...), "
                "[source] format_options in a config, or for open_files a format of your own, "
                "loader.io.register_file_reader(NAME, functools.partial(loader.io.formats_text.TextFileReader, parser=...), ['.txt'])"
            )
        self._parser = parser
        # Universal newlines: \r\n reads as \n. Bytes that do not decode are kept (surrogateescape) and
        # refused with their line: a strict decode failed in readline's buffer, 2,000 lines before the bad
        # one and naming neither the file nor a line.
        self._file = open(self.path, encoding=encoding, errors="surrogateescape")
        self._encoding = encoding
        self._line_no = 0
        self._dicts = DictSlots()

    def _read_instance(self) -> list[np.ndarray] | None:
        while True:
            line = self._file.readline()
            if not line:
                return None
            self._line_no += 1
            # A line that fails is one record, read and passed (stepped_past): the next read parses the next line.
            try:
                refuse_undecoded(line, self.path, self._line_no, self._encoding, "set the format option encoding")
            except DataError as exc:
                stepped_past(exc)
                raise
            try:
                sample = self._parser(line[:-1] if line.endswith("\n") else line)
            except Exception as exc:
                add_note(exc, f"while parsing line {self._line_no} of {self.path}")
                stepped_past(exc)
                raise
            if sample is None:
                continue
            try:
                if isinstance(sample, dict):  # joined by key, not by each dict's own order
                    arrays = self._dicts.arrays(sample, f"{self.path}: line {self._line_no}")
                    if self._names is None:
                        self._set_slot_names(self._dicts.names)
                    return arrays
                arrays, _ = as_instance(sample)
            except DataError as exc:
                stepped_past(exc)
                raise
            except ValueError as exc:  # np.asarray of a ragged nest of lists
                error = DataError(f"{self.path}: line {self._line_no} parses to no arrays ({exc})")
                raise stepped_past(error) from exc
            return arrays

    def _rewind(self) -> None:
        self._file.seek(0)
        self._line_no = 0

    def _close_file(self) -> None:
        self._file.close()


__all__ = ["TextFileReader", "refuse_undecoded"]
