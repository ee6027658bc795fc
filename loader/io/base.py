"""``ReaderBase`` and ``DecoratedReader``: the interface every reader of the graph shares.

A reader is a cursor over instances (or batches): ``read_next()`` returns a list
of numpy arrays, one per slot, and ``[]`` at the end of the data; it stays at the
end until ``reinit()`` starts a new pass from the beginning. Iterating a reader
continues from where it is, like iterating a file. ``has_next()`` looks ahead
without consuming (the looked-at item is kept for the next ``read_next``).

Readers are used by one consumer thread at a time; the threaded readers
(``open_files``, ``DoubleBufferReader``) own their threads and stop them in
``reinit()`` and ``close()``. ``close()`` is idempotent; any read after it raises
``ClosedError``. A decorated reader owns its underlying reader and closes it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from loader.errors import ClosedError


class ReaderBase:
    """Abstract reader. Subclasses implement ``_read_next_impl`` and ``_reinit_impl``."""

    #: Declared slot shapes/dtypes/LoD levels, when known (``None`` = not declared).
    shapes: list[list[int]] | None = None
    dtypes: list[np.dtype] | None = None
    lod_levels: list[int] | None = None

    # A failure met while looking ahead past the items of a block (``read_block``): raised by the next read.
    _failed_ahead: Exception | None = None

    def __init__(self) -> None:
        self._peeked: list[np.ndarray] | None = None
        self._closed = False

    # -- to implement ---------------------------------------------------------
    # A subclass that overrides only the public read_next()/reinit() (the names users see) gets a bare
    # NotImplementedError from has_next() or a decorator otherwise: these say what to implement.
    @property
    def slot_names(self) -> list[str]:
        raise NotImplementedError(f"{type(self).__name__} must define the slot_names property (a ReaderBase subclass)")

    def _read_next_impl(self) -> list[np.ndarray]:
        raise NotImplementedError(_unimplemented(self, "_read_next_impl", "read_next(), has_next() and iteration"))

    def _reinit_impl(self) -> None:
        raise NotImplementedError(_unimplemented(self, "_reinit_impl", "reinit()"))

    def _close_impl(self) -> None:
        """Release resources; called once by ``close()``."""

    # -- public interface -----------------------------------------------------
    def read_next(self) -> list[np.ndarray]:
        """The next instance or batch (one array per slot), or ``[]`` at the end."""
        peeked = self._peeked
        if peeked is not None:
            self._peeked = None
            return peeked
        self._check_open()
        self._raise_failed_ahead()
        return self._read_next_impl()

    def has_next(self) -> bool:
        """Whether ``read_next`` would return data; reads ahead one item at most."""
        if self._peeked is None:
            self._check_open()
            self._raise_failed_ahead()
            self._peeked = self._read_next_impl()
        return bool(self._peeked)

    def reinit(self) -> None:
        """Start again from the beginning of the data (a clean pass, even mid-pass)."""
        self._check_open()
        self._peeked = self._failed_ahead = None
        self._reinit_impl()

    def close(self) -> None:
        """Stop threads and release files. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._peeked = self._failed_ahead = None
        self._close_impl()

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"{type(self).__name__} is closed")

    def _raise_failed_ahead(self) -> None:
        failure, self._failed_ahead = self._failed_ahead, None
        if failure is not None:
            raise failure

    def read_block(self, max_instances: int) -> list[np.ndarray]:
        """Up to ``max_instances`` items at once: one array per slot with a leading axis of
        ``n`` items (``1 <= n <= max_instances``), or ``[]`` at the end.

        This default stacks ``read_next`` results. It ends a block early, before an
        item whose shapes or dtypes differ from the block's first (variable-length
        data then comes in short blocks, never as an error). Readers that hold
        their data as arrays (``.npy``, ``.npz``) return slices without copying.

        A failure after the first item also ends the block: the items before it
        are returned and the next read raises it. So a failure is met at its own
        record whatever the block size, and a caller that reads on past it (a
        lease group, a re-read that skips records) numbers the records after it
        the same way every time.
        """
        _check_block_size(max_instances)
        first = self.read_next()
        if not first:
            return []
        items = [first]
        while len(items) < max_instances:
            try:
                more = self.has_next()
            except Exception as exc:
                self._failed_ahead = exc
                break
            if not more:
                break
            following = self._peeked
            assert following is not None
            if not _same_layout(first, following):
                break
            items.append(self.read_next())
        return [np.stack([item[i] for item in items]) for i in range(len(first))]

    def _start_slicing_block(self, max_instances: int) -> bool:
        """What a ``read_block`` that slices rows out of arrays does first.

        Checks the arguments and takes back the item ``has_next()`` looked ahead
        at. Returns True when that item was a row, which the caller gives back by
        stepping its row cursor back one; a looked-ahead end needs nothing, since
        a reader stays at its end.
        """
        _check_block_size(max_instances)
        self._check_open()
        peeked, self._peeked = self._peeked, None
        return bool(peeked)

    def __iter__(self) -> Iterator[list[np.ndarray]]:
        while True:
            item = self.read_next()
            if not item:
                return
            yield item

    def __enter__(self) -> ReaderBase:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _unimplemented(reader: ReaderBase, method: str, callers: str) -> str:
    return (
        f"{type(reader).__name__} does not implement {method}(), which {callers} call: a ReaderBase subclass "
        "implements _read_next_impl() and _reinit_impl() rather than overriding read_next() and reinit()"
    )


def _check_block_size(max_instances: int) -> None:
    if max_instances < 1:
        raise ValueError(f"max_instances must be >= 1, got {max_instances}")


def _same_layout(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(x.shape == y.shape and x.dtype == y.dtype for x, y in zip(a, b))


class DecoratedReader(ReaderBase):
    """A reader over another reader (its ``reader``), which it owns.

    Slot names and declared shapes/dtypes/LoD levels are those of the underlying
    reader unless a subclass changes them (``BatchReader`` adds length slots).
    """

    def __init__(self, reader: ReaderBase) -> None:
        if not isinstance(reader, ReaderBase):
            raise TypeError(f"a decorated reader needs a ReaderBase, got {type(reader).__name__}")
        super().__init__()
        self.reader = reader

    @property
    def slot_names(self) -> list[str]:
        return self.reader.slot_names

    @property
    def shapes(self) -> list[list[int]] | None:  # type: ignore[override]
        return self.reader.shapes

    @property
    def dtypes(self) -> list[np.dtype] | None:  # type: ignore[override]
        return self.reader.dtypes

    @property
    def lod_levels(self) -> list[int] | None:  # type: ignore[override]
        return self.reader.lod_levels

    def _read_next_impl(self) -> list[np.ndarray]:
        return self.reader.read_next()

    def _reinit_impl(self) -> None:
        self.reader.reinit()

    def _close_impl(self) -> None:
        self.reader.close()


__all__ = ["ReaderBase", "DecoratedReader"]
