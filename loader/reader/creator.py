"""Reader creators: functions that return a reader over some data.

* ``np_array(x)``: the items of an array along its first axis;
* ``text_file(path)``: the lines of a text file;
* ``recordio(paths, buf_size=100, allow_pickle=False)``: the samples of RecordIO files,
  this package's or PaddlePaddle's (``loader.recordio``).
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from loader.reader._util import Reader
from loader.reader.decorators import buffered


def np_array(x: Any) -> Reader:
    """A reader over ``x`` along its first axis (elements of a vector, rows of a matrix).

    A 0-d array is yielded once, as itself (the original then raised
    ``TypeError``). Anything that is not an ndarray goes through ``np.asarray``.
    """
    array = x if isinstance(x, np.ndarray) else np.asarray(x)

    def array_reader() -> Iterator[Any]:
        if array.ndim < 1:
            yield array
            return
        yield from array

    return array_reader


def text_file(path: str | os.PathLike[str]) -> Reader:
    """A reader over the lines of the text file at ``path``, each without its trailing ``"\\n"``.

    The file is opened when iteration starts (a missing file raises
    ``FileNotFoundError`` at the first ``next``), read as UTF-8 with Python's
    universal newlines (a line that is not UTF-8 is a ``DataError`` naming it,
    after every line before it), and closed at the end or as soon as iteration
    is abandoned.
    """

    def text_reader() -> Iterator[str]:
        from loader.io.formats_text import refuse_undecoded

        name = os.fspath(path)
        with open(path, encoding="utf-8", errors="surrogateescape") as fh:
            for number, line in enumerate(fh, 1):
                refuse_undecoded(line, name, number, "utf-8", "text_file reads UTF-8")
                yield line.rstrip("\n")

    return text_reader


def _path_list(paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> list[str]:
    if isinstance(paths, (str, os.PathLike)):
        items = [p.strip() for p in os.fspath(paths).split(",")]
    elif isinstance(paths, (list, tuple)):
        items = [os.fspath(p) for p in paths]
    else:
        raise TypeError(f"recordio: paths must be a path, a list of paths or a comma-separated string, got {paths!r}")
    items = [p for p in items if p]
    if not items:
        raise ValueError("recordio: no paths given")
    return items


def _expand(patterns: list[str]) -> list[str]:
    """Each glob pattern's matches, sorted; a plain path is kept as it is."""
    files: list[str] = []
    for pattern in patterns:
        if any(ch in pattern for ch in "*?["):
            matches = sorted(glob.glob(pattern))
            if not matches:
                raise FileNotFoundError(f"recordio: no file matches {pattern!r}")
            files.extend(matches)
        else:
            files.append(pattern)
    return files


def recordio(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], buf_size: int = 100, *, allow_pickle: bool = False
) -> Reader:
    """A reader over the samples of RecordIO files, prefetched by ``buffered(.., buf_size)``.

    ``paths`` is a path, a list of paths, or a comma-separated string; each may
    be a glob pattern (matched when iteration starts, sorted). Files are read in
    order with ``loader.recordio.Scanner``: this package's files and PaddlePaddle's
    (Go or Fluid C++ layout, any compressor, detected per file). Records written by
    ``loader`` are decoded by ``loader.runtime.codec``; Paddle's pickled records are
    unpickled only with ``allow_pickle=True``, by a restricted unpickler (numpy
    arrays, numbers, strings, bytes, lists, tuples, dicts), else the first one
    raises ``PickledRecordError`` naming the file and the opt-in; raw records of
    the Go package come back as ``bytes``.
    """
    from loader.recordio import Scanner  # as in the original, a missing module fails here

    patterns = _path_list(paths)

    def recordio_reader() -> Iterator[Any]:
        for path in _expand(patterns):
            with Scanner(path, allow_pickle=allow_pickle) as scanner:
                yield from scanner

    return buffered(recordio_reader, buf_size)


__all__ = ["np_array", "text_file", "recordio"]
