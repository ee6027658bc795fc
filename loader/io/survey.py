"""What a dataset holds: samples per field, with shapes and dtypes (``loader check``).

Built-in formats are read in blocks (``.npy``/``.npz`` only read their headers'
worth of rows: the blocks are views of the memory-mapped files); a
``source.reader`` is iterated sample by sample. A field whose samples differ in
shape shows ``varies``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from time import monotonic
from typing import Any

import numpy as np

SURVEY_BLOCK_ROWS = 65536
VARIES = "varies"


@dataclass
class FieldSummary:
    """One field of a dataset: the shape of one sample's value (``VARIES`` when samples differ) and its dtype."""

    name: str
    shape: str = ""
    dtype: str = ""

    def add(self, shape: tuple[int, ...], dtype: Any) -> None:
        shape_text, dtype_text = str(tuple(shape)), str(dtype)
        self.shape = shape_text if self.shape in ("", shape_text) else VARIES
        self.dtype = dtype_text if self.dtype in ("", dtype_text) else VARIES


@dataclass
class Survey:
    """Files, samples and fields of a dataset; ``samples`` is None where it was not counted (a provider)."""

    files: int = 0
    samples: int | None = 0
    fields: list[FieldSummary] = field(default_factory=list)

    def _field(self, index: int, name: str) -> FieldSummary:
        while len(self.fields) <= index:
            self.fields.append(FieldSummary(name if len(self.fields) == index else str(len(self.fields))))
        return self.fields[index]


def survey(source: Any) -> Survey:
    """Count the samples of ``source`` (a ``SourceConfig``) per field; errors are the readers' own."""
    paths = source.expand_files()
    result = Survey(files=len(paths))
    if source.provider is not None:
        result.samples = None  # a provider may generate anything from a name: not read here
        return result
    names = list(source.fields) if source.fields else None
    for path in paths:
        if source.reader is not None:
            _survey_samples(result, source.resolve_reader()(path)(), names)
        else:
            _survey_blocks(result, path, source, names)
    return result


def count_samples(source: Any, paths: list[str], budget_s: float | None = None) -> list[int] | None:
    """Samples in each of ``paths`` from the files' headers (``.npy``, ``.npz``); None where a format
    cannot tell without reading everything (a reader, a provider, recordio, text), or when reading the
    headers takes longer than ``budget_s`` (None: no limit)."""
    if source.reader is not None or source.provider is not None:
        return None
    from loader.io.formats_numpy import ArrayFileReader
    from loader.io.registry import create_file_reader

    source.register_formats()
    counts = []
    deadline = None if budget_s is None else monotonic() + budget_s
    for path in paths:
        if deadline is not None and monotonic() > deadline:
            return None
        if not os.path.isfile(path):
            # Replaced since the list was expanded (by a FIFO, whose open would wait for a writer: this
            # runs in the daemon's loop) or gone: the workers will report it; the count is unknown.
            return None
        with create_file_reader(path, format=source.format, **source.file_reader_options()) as reader:
            if not isinstance(reader, ArrayFileReader):
                return None
            counts.append(reader.rows)
    return counts


def _survey_blocks(result: Survey, path: str, source: Any, names: list[str] | None) -> None:
    from loader.io.registry import create_file_reader

    source.register_formats()
    with create_file_reader(path, format=source.format, **source.file_reader_options()) as reader:
        slot_names = names or list(reader.slot_names)
        while True:
            block = reader.read_block(SURVEY_BLOCK_ROWS)
            if not block:
                return
            assert result.samples is not None
            result.samples += len(block[0])
            for i, column in enumerate(block):
                column = np.asarray(column)
                result._field(i, _name(slot_names, i)).add(column.shape[1:], column.dtype)


def _survey_samples(result: Survey, samples: Any, names: list[str] | None) -> None:
    for sample in samples:
        assert result.samples is not None
        result.samples += 1
        if isinstance(sample, dict):
            values = list(sample.values())
            names = names or [str(k) for k in sample]
        else:
            values = list(sample) if isinstance(sample, (tuple, list)) else [sample]
        for i, value in enumerate(values):
            array = np.asarray(value)
            result._field(i, _name(names, i)).add(array.shape, array.dtype)


def _name(names: list[str] | None, index: int) -> str:
    return names[index] if names and index < len(names) else str(index)


__all__ = ["survey", "count_samples", "Survey", "FieldSummary"]
