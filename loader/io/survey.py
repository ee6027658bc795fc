"""What a dataset holds: samples per field, with shapes and dtypes (``loader check``).

Built-in formats are read in blocks (``.npy``/``.npz`` only read their headers'
worth of rows: the blocks are views of the memory-mapped files); a
``source.reader`` is iterated sample by sample. A field whose samples differ in
shape shows ``varies``.

The survey also keeps what a batch cannot take, which ``loader check`` reports
before training does: files whose fields differ (another name, a missing ``.npy``
companion), a field whose dtype or shape differs between files or records (a
stacked batch needs one of each per field), and files that hold no samples.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from time import monotonic
from typing import Any

import numpy as np

from loader.errors import ConfigError, DataError

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
class Mismatch:
    """Something a batch cannot take: ``kind`` "fields" (files with other field names), "field count"
    (``source.fields`` naming more or fewer fields than a file has), "dtype" or "shape" (a field's, between
    files or records); ``text`` says where, naming the files."""

    kind: str
    text: str


@dataclass
class Survey:
    """Files, samples and fields of a dataset; ``samples`` is None where it was not counted (a provider).

    ``empty`` lists the files without a sample; ``mismatches`` the first difference of field names
    between files, and per field the first of its dtype and of its shape (between files or records)."""

    files: int = 0
    samples: int | None = 0
    fields: list[FieldSummary] = field(default_factory=list)
    empty: list[str] = field(default_factory=list)
    mismatches: list[Mismatch] = field(default_factory=list)
    # The first file with samples: its path and field names, and each field's first (path, record, shape, dtype).
    _first: tuple[str, list[str]] | None = None
    _seen: dict[str, tuple[str, int, tuple[int, ...], str]] = field(default_factory=dict)
    _reported: set[tuple[str, str]] = field(default_factory=set)
    _by_name: dict[str, FieldSummary] = field(default_factory=dict)

    def _field(self, name: str) -> FieldSummary:
        found = self._by_name.get(name)  # once per value of every sample: no scan of the fields
        if found is None:
            found = self._by_name[name] = FieldSummary(name)
            self.fields.append(found)
        return found

    def _file(self, path: str, names: list[str], samples: int) -> None:
        """A file's field names, once its samples are read: compared with the first file's."""
        if samples == 0:
            self.empty.append(path)
            return
        if self._first is None:
            self._first = (path, names)
            return
        first, first_names = self._first
        if set(names) != set(first_names) and ("fields", "") not in self._reported:
            self._reported.add(("fields", ""))
            self.mismatches.append(Mismatch("fields", _fields_differ(first, first_names, path, names)))

    def _named(self, path: str, given: list[str] | None, own: list[str]) -> None:
        """``source.fields`` (``given``) against a file's own slots: names of another count are kept only
        where the mappers give that many fields (without mappers the batch names the slots "0", "1", ...)."""
        if not given or len(given) == len(own) or ("field count", "") in self._reported:
            return
        self._reported.add(("field count", ""))
        self.mismatches.append(Mismatch("field count", field_count_text(shown(path), given, own)))

    def _value(self, path: str, record: int, name: str, value: Any) -> None:
        """One sample's ``value`` of field ``name`` (a block's column when ``value`` is ``_Rows``)."""
        shape, dtype = (value.shape, value.dtype) if isinstance(value, _Rows) else _layout(value)
        self._field(name).add(shape, dtype)
        if not _stackable(value):
            return  # objects and strings: a batch does not stack them as fixed rows, nor check them
        shape, dtype_text = tuple(int(n) for n in shape), "" if _python_number(value) else str(dtype)
        seen = self._seen.setdefault(name, (path, record, shape, dtype_text))
        compared = [("shape", str(seen[2]), str(shape))]
        if seen[3] and dtype_text:  # a Python number takes the dtype of the column it joins
            compared.insert(0, ("dtype", seen[3], dtype_text))
        for kind, was, now in compared:
            if was != now and (kind, name) not in self._reported:
                self._reported.add((kind, name))
                where = _where(seen[0], seen[1], path, record, name)
                self.mismatches.append(
                    Mismatch(kind, f"field {name!r} has {kind} {was} {where[0]} but {now} {where[1]}")
                )


@dataclass
class _Rows:
    """The rows of a block's column: each has ``shape`` and ``dtype``."""

    shape: tuple[int, ...]
    dtype: np.dtype


def _layout(value: Any) -> tuple[tuple[int, ...], Any]:
    array = np.asarray(value) if not isinstance(value, np.ndarray) else value
    return array.shape, array.dtype


def _python_number(value: Any) -> bool:
    return type(value) in (bool, int, float)


def _stackable(value: Any) -> bool:
    """Whether a stacked batch holds ``value`` as fixed rows, checked per field as the workers check it
    (``workers.sample_check``): numpy values of a fixed dtype, and Python numbers (by shape only)."""
    if _python_number(value):
        return True
    if isinstance(value, (np.ndarray, np.generic, _Rows)):
        return not value.dtype.hasobject and value.dtype.names is None and value.dtype.kind not in "USV"
    return False


def _where(first: str, first_record: int, path: str, record: int, name: str) -> tuple[str, str]:
    if first == path:
        return f"in record {first_record} of {shown(_field_file(path, name))}", f"in record {record}"
    return f"in {shown(_field_file(first, name))}", f"in {shown(_field_file(path, name))}"


def _field_file(path: str, name: str) -> str:
    """The file a field of ``path`` is stored in: its companion for a ``.npy`` file's other fields."""
    if path.endswith(".npy") and name != "data":
        companion = f"{path[: -len('.npy')]}.{name}.npy"
        if os.path.isfile(companion):
            return companion
    return path


def _fields_differ(first: str, first_names: list[str], path: str, names: list[str]) -> str:
    both = f"{shown(first)} has fields {', '.join(first_names)}; {shown(path)} has {', '.join(names) or 'none'}"
    for one, one_names, other, other_names in ((path, names, first, first_names), (first, first_names, path, names)):
        lacking = [n for n in other_names if n not in one_names and n != "data"]
        if one.endswith(".npy") and other.endswith(".npy") and lacking:  # a missing .npy companion
            stem = os.path.basename(one)[: -len(".npy")]
            return f"{shown(one)} has no {stem}.{lacking[0]}.npy ({both})"
    return both


def shown(path: str) -> str:
    """``path`` relative to the current directory when it lies below it (as the user wrote it)."""
    try:
        relative = os.path.relpath(path)
    except ValueError:  # pragma: no cover - another drive (Windows)
        return path
    return path if relative.startswith(os.pardir) else relative


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
            _survey_samples(result, path, _reader_samples(source.reader, source.resolve_reader(), path), names)
        else:
            _survey_blocks(result, path, source, names)
    return result


def count_samples(source: Any, paths: list[str], budget_s: float | None = None) -> list[int] | None:
    """Samples in each of ``paths`` from the files' headers (``.npy``, ``.npz``); None where a format
    cannot tell without reading everything (a reader, a provider, recordio, text), or when reading the
    headers takes longer than ``budget_s`` (None: no limit)."""
    counts = []
    deadline = None if budget_s is None else monotonic() + budget_s
    for path in paths:
        if deadline is not None and monotonic() > deadline:
            return None
        rows = header_rows(source, path)
        if rows is None:
            return None
        counts.append(rows)
    return counts


def header_rows(source: Any, path: str) -> int | None:
    """Samples in ``path`` from its headers alone (the ``.npy``/``.npz`` readers); None where its format
    cannot tell without reading everything (a reader, a provider, recordio, text) or it is not a file.
    A file that cannot be opened raises its reader's error."""
    if source.reader is not None or source.provider is not None:
        return None
    if not os.path.isfile(path):
        # Replaced since the list was expanded (by a FIFO, whose open would wait for a writer: this
        # runs in the daemon's loop) or gone: the workers will report it; the count is unknown.
        return None
    from loader.io.formats_numpy import ArrayFileReader, NpyFileReader, NpzFileReader
    from loader.io.registry import create_file_reader, reader_factory

    source.register_formats()
    # Only the built-in array readers, which read headers alone: this runs in the daemon's loop, where a user's
    # format factory (source.formats) that hung or called sys.exit() on one bad file froze or ended the daemon.
    if reader_factory(source.format, path) not in (NpyFileReader, NpzFileReader):
        return None
    with create_file_reader(path, format=source.format, **source.file_reader_options()) as reader:
        return reader.rows if isinstance(reader, ArrayFileReader) else None


def names_known(reader: Any) -> list[str]:
    """The slot names a reader has before reading a record (an .npz's keys), else none. Not ``slot_names``:
    a format that learns its names from the first record reads it there, and a bad first record then failed
    the whole file at open, even under on_error = "skip" (the records after it lost)."""
    names = getattr(reader, "known_slot_names", None)  # a FileReader's; a user's ReaderBase may have none
    return list(names) if names is not None else []


def field_count_text(path: str, given: list[str], own: list[str]) -> str:
    """Says that ``source.fields`` (``given``) names another number of fields than ``path`` has (``own``);
    ``loader check`` and the workers say it alike."""
    plural = "s" if len(given) != 1 else ""
    return (
        f"source.fields names {len(given)} field{plural} ({', '.join(given)}), but {path} has "
        f"{len(own)} ({', '.join(own)})"
    )


def refuse_shuffled_names(path: str, fields: list[str], slots: list[str]) -> None:
    """``source.fields`` renames a reader's slots by position: a name of one of the file's own slots given at
    another position would hand that slot's name to another slot's data (``fields = ["label", "x"]`` for an
    .npz saved with x then label swaps them), silently. The workers and ``loader check`` refuse it alike."""
    for given, (position, slot) in zip(fields, enumerate(slots)):
        if given != slot and given in slots:
            raise ValueError(
                f"source.fields names the slots of {os.path.basename(path)} by position, and its slots are "
                f"{slots}: {given!r} would name slot {position} ({slot!r}), not the slot called {given!r}; list "
                f"the names in the file's own order (or leave source.fields out to keep them)"
            )


def _survey_blocks(result: Survey, path: str, source: Any, names: list[str] | None) -> None:
    from loader.io.registry import create_file_reader

    source.register_formats()
    samples, width = 0, 0
    with create_file_reader(path, format=source.format, **source.file_reader_options()) as reader:
        if names:
            refuse_shuffled_names(path, names, list(reader.slot_names))
        own_names = list(reader.slot_names)
        slot_names = names or own_names
        while True:
            block = reader.read_block(SURVEY_BLOCK_ROWS)
            if not block:
                break
            width = max(width, len(block))
            for i, column in enumerate(block):
                column = np.asarray(column)
                if column.dtype.hasobject:  # rows of their own shapes and dtypes (a ragged slot)
                    for row, value in enumerate(column):
                        result._value(path, samples + row, _name(slot_names, i), value)
                elif len(column):
                    result._value(path, samples, _name(slot_names, i), _Rows(column.shape[1:], column.dtype))
            samples += len(block[0])
    assert result.samples is not None
    result.samples += samples
    if samples:
        result._named(path, names, own_names or [str(i) for i in range(width)])
    result._file(path, [_name(slot_names, i) for i in range(width or len(slot_names))], samples)


def _reader_samples(name: str, make: Any, path: str) -> Iterator[Any]:
    """The samples ``source.reader`` (``name``, imported as ``make``) gives for ``path``. Its own errors name it,
    the file and the record: the user's code raised them, and their bare text ("too many values to unpack")
    said neither which function nor which file."""
    where = f"source.reader {name!r} failed on {shown(path)}"
    try:
        reader = make(path)
    except Exception as exc:
        raise DataError(f"{where}: {type(exc).__name__}: {exc}") from exc
    if not callable(reader):
        # As the workers say it (workers/sources.py): a function that yields the samples itself.
        raise ConfigError(
            f"source.reader {name!r} returned a {type(reader).__name__}, not a reader: function(path) returns a "
            "zero-argument callable that returns the samples (def make(path): def read(): yield ...; return read)"
        )
    record = 0  # the record being read: the samples given so far
    try:
        for sample in reader():
            yield sample
            record += 1
    except Exception as exc:
        raise DataError(f"{where} at record {record}: {type(exc).__name__}: {exc}") from exc


def _survey_samples(result: Survey, path: str, samples: Any, names: list[str] | None) -> None:
    count, width = 0, 0
    keys: list[str] | None = None  # a dict sample's fields are its keys, in the first one's order (as workers)
    for count, sample in enumerate(samples, 1):
        if isinstance(sample, dict):
            by_key = {str(k): v for k, v in sample.items()}
            keys = keys or list(by_key)
            pairs = [(k, by_key[k]) for k in keys if k in by_key] + [(k, v) for k, v in by_key.items() if k not in keys]
        else:
            values = list(sample) if isinstance(sample, (tuple, list)) else [sample]
            pairs = [(_name(names, i), value) for i, value in enumerate(values)]
        width = max(width, len(pairs))
        for name, value in pairs:
            result._value(path, count - 1, name, value)
    assert result.samples is not None
    result.samples += count
    if count and keys is None:  # a dict's keys are its names: source.fields orders them
        result._named(path, names, [str(i) for i in range(width)])
    result._file(path, keys if keys is not None else [_name(names, i) for i in range(width)], count)


def _name(names: list[str] | None, index: int) -> str:
    return names[index] if names and index < len(names) else str(index)


__all__ = ["survey", "count_samples", "header_rows", "shown", "Survey", "FieldSummary", "Mismatch"]
