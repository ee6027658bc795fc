"""Bridges between the two toolkits: class-based readers <-> paddle-style readers.

``to_reader(reader_base)`` gives a paddle-style reader: a zero-argument callable;
each call re-initialises ``reader_base`` and returns a generator of samples, each
a tuple of arrays (one per slot). The generator and the reader are one cursor:
use one generator at a time. A generator closed or dropped mid-pass
re-initialises the reader, which stops its prefetching threads (they start
again at the next read).

``from_reader(reader, shapes, dtypes)`` wraps a paddle-style reader as a
``ReaderBase``: each pass calls ``reader()`` afresh; a sample (tuple/list of
values, one value, or a dict naming the slots) becomes a list of arrays. Values
that are not arrays yet (Python ints, floats, lists) are converted to the
declared dtype; arrays must already have it. Shapes are checked as for files
(see :mod:`loader.io.slots`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from loader.errors import DataError
from loader.io.base import ReaderBase
from loader.io.slots import DtypesArg, LodArg, ShapesArg, SlotChecker, default_slot_names


class _PaddleReader:
    """The callable returned by :func:`to_reader`."""

    def __init__(self, reader: ReaderBase) -> None:
        self.reader = reader
        self._passes = 0  # generators started: only the newest may stop the reader's pass

    def __call__(self) -> Iterator[tuple[np.ndarray, ...]]:
        return self._generate()

    def _generate(self) -> Iterator[tuple[np.ndarray, ...]]:
        self._passes += 1
        mine = self._passes
        self.reader.reinit()
        finished = False
        try:
            while True:
                item = self.reader.read_next()
                if not item:
                    finished = True
                    return
                yield tuple(item)
        finally:
            # Abandoned mid-pass (closed, or dropped by a loop that broke out): stop the reader's prefetching
            # threads now rather than at the next call or close(). Not when a newer generator owns the pass.
            if not finished and mine == self._passes and not self.reader.closed:
                # Only a clean-up: a reader that cannot start again says so at the next pass, not here
                # (this may run in a garbage collection, where an exception is only printed).
                with contextlib.suppress(Exception):
                    self.reader.reinit()

    def __repr__(self) -> str:
        return f"to_reader({self.reader!r})"


def to_reader(reader_base: ReaderBase) -> Callable[[], Iterator[tuple[np.ndarray, ...]]]:
    """A paddle-style reader over ``reader_base`` (every call starts a new pass)."""
    if not isinstance(reader_base, ReaderBase):
        raise TypeError(f"to_reader needs a ReaderBase, got {type(reader_base).__name__}")
    return _PaddleReader(reader_base)


class FromReader(ReaderBase):
    """A ``ReaderBase`` over a paddle-style reader (see :func:`from_reader`)."""

    def __init__(
        self,
        reader: Callable[[], Iterable[Any]],
        shapes: ShapesArg = None,
        dtypes: DtypesArg = None,
        lod_levels: LodArg = None,
    ) -> None:
        if not callable(reader):
            raise TypeError(f"from_reader needs a zero-argument callable, got {type(reader).__name__}")
        super().__init__()
        self.source = reader
        self._checker = SlotChecker(shapes, dtypes, lod_levels)
        self.shapes, self.dtypes, self.lod_levels = self._checker.shapes, self._checker.dtypes, self._checker.lod_levels
        self._where = f"reader {getattr(reader, '__name__', None) or type(reader).__name__}"
        self._iterator: Iterator[Any] | None = None
        self._names: list[str] | None = None
        self._index = 0

    @property
    def slot_names(self) -> list[str]:
        if self._names is not None:
            return list(self._names)
        if self._checker.num_slots is not None:
            return default_slot_names(self._checker.num_slots)
        if self._peeked is None and not self._closed:
            self.has_next()
        return list(self._names) if self._names is not None else default_slot_names(len(self._peeked or []))

    def _convert(self, sample: Any, index: int) -> list[np.ndarray]:
        if sample is None:
            raise DataError(f"{self._where}: sample {index} is None")
        values = list(sample.values()) if isinstance(sample, dict) else sample
        if isinstance(sample, dict) and self._names is None:
            self._names = [str(k) for k in sample]
        if not isinstance(values, (list, tuple)):
            values = [values]
        dtypes = self._checker.dtypes
        return [
            v if isinstance(v, np.ndarray) else np.asarray(v, dtype=dtypes[i] if dtypes and i < len(dtypes) else None)
            for i, v in enumerate(values)
        ]

    def _read_next_impl(self) -> list[np.ndarray]:
        if self._iterator is None:
            self._iterator = iter(self.source())
        try:
            sample = next(self._iterator)
        except StopIteration:
            return []
        # Counted before it is checked: a caller that reads on past a refused sample gets the next
        # sample's own index (every later error named one too few).
        index = self._index
        self._index += 1
        instance = self._checker.check(self._convert(sample, index), self._where, index, self._names)
        if not instance:
            raise DataError(f"{self._where}: sample {index} has no slots")
        return instance

    def _drop_iterator(self) -> None:
        iterator, self._iterator = self._iterator, None
        close = getattr(iterator, "close", None)
        if close is not None:
            close()  # runs the generator's finally blocks (files, threads) now

    def _reinit_impl(self) -> None:
        self._drop_iterator()
        self._index = 0

    def _close_impl(self) -> None:
        self._drop_iterator()


def from_reader(
    reader: Callable[[], Iterable[Any]],
    shapes: ShapesArg,
    dtypes: DtypesArg,
    lod_levels: LodArg = None,
) -> ReaderBase:
    """Wrap a paddle-style reader (zero-argument callable) as a ``ReaderBase``.

    ``shapes``/``dtypes`` may be ``None`` to skip the checks (and the conversion to a dtype).
    """
    return FromReader(reader, shapes, dtypes, lod_levels)


__all__ = ["to_reader", "from_reader", "FromReader"]
