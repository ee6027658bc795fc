"""``open_files``: many files read by prefetching threads into one bounded channel.

``MultiFileReader`` keeps a queue of the files of a pass. ``thread_num`` threads
(one ``ThreadPipeline``) each take the next file when they finish one, open it
with the format registry, and put its instances into the channel in *blocks*
(``read_block``: a slice of a memory-mapped file, or a stack of instances),
because one queue hand-over costs several microseconds, more than reading one
small instance. ``buffer_size`` bounds the number of blocks in the channel; a
block holds at most ``BLOCK_MAX_INSTANCES`` instances and about
``BLOCK_TARGET_BYTES`` bytes, and takes about ``BLOCK_TARGET_S`` to read at most
(so ``close()`` is prompt over slow readers). ``read_next`` still returns one instance.

Every instance of every file is delivered exactly once per pass. Records of one
file keep their order; with several threads, files interleave in whatever order
the threads finish (as in the original). ``is_test=True`` reads the files one
after another in list order, on one prefetching thread: a deterministic order.

An exception in a file reader (opening or reading) reaches the consumer as the
original object, with a note naming the file (our own errors name it in their
message too); later reads raise it again until ``reinit()``. ``reinit()`` stops
the threads and starts a clean pass; ``close()`` stops them (bounded wait).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from loader.errors import add_note
from loader.io.base import ReaderBase
from loader.io.decorated import MultiPassReader
from loader.io.prefetch import END, Prefetcher
from loader.io.registry import create_file_reader
from loader.io.slots import DtypesArg, LodArg, ShapesArg, SlotChecker
from loader.runtime.processes import cpu_count
from loader.runtime.threads import StopRequested, ThreadPipeline

BLOCK_FIRST_INSTANCES = 16  # before the instance size of a file is known
BLOCK_MAX_INSTANCES = 256
BLOCK_TARGET_BYTES = 256 * 1024
# A block takes about this long to read, at most (after a file's first): close() waits for the blocks being
# read, so a slow reader (a decoder at 30 ms an instance) must not read 256 instances at a time.
BLOCK_TARGET_S = 0.01


class _FileQueue:
    """The files of one pass, handed out one at a time to whichever thread asks."""

    def __init__(self, paths: Sequence[str]) -> None:
        self._paths = list(paths)
        self._next = 0
        self._lock = threading.Lock()

    def take(self) -> str | None:
        with self._lock:
            if self._next >= len(self._paths):
                return None
            self._next += 1
            return self._paths[self._next - 1]


@contextlib.contextmanager
def _naming(path: str, action: str) -> Iterator[None]:
    try:
        yield
    except StopRequested:
        raise
    except Exception as exc:
        add_note(exc, f"(open_files: while {action} {path})")
        raise


def _read_files(pipe: ThreadPipeline, files: _FileQueue, spec: dict, names: list[str]) -> None:
    while not pipe.stopping:
        path = files.take()
        if path is None:
            return
        with _naming(path, "opening"):
            reader = create_file_reader(path, **spec)
        try:
            with _naming(path, "reading"):
                _put_blocks(pipe, reader, _slot_order(path, reader.slot_names, names))
        finally:
            reader.close()


def _slot_order(path: str, got: list[str], names: list[str]) -> list[int] | None:
    """Where each of ``names`` (the first file's slots) lies among a file's own slots ``got``, when they are
    the same names in another order (an ``.npz`` written with its keys in another order would otherwise
    swap two fields of one shape without a word); None when in place, or when the names are not the same
    set (files of other formats name their slots by position: "slot0", "data")."""
    if not names or not got or got == names or sorted(got) != sorted(names) or len(set(got)) != len(got):
        return None
    return [got.index(name) for name in names]


def _first_slot_names(filenames: Sequence[str], spec: dict) -> list[str]:
    """The slots of the first file that knows them (an empty recordio file without declared shapes does not)."""
    for path in filenames:
        with _naming(path, "opening"):
            with create_file_reader(path, **spec) as reader:
                names = reader.slot_names
        if names:
            return list(names)
    return []


def _put_blocks(pipe: ThreadPipeline, reader: ReaderBase, order: list[int] | None) -> None:
    count = BLOCK_FIRST_INSTANCES
    while True:
        if pipe.stopping:  # not one more block for a consumer that has gone
            raise StopRequested
        started = time.monotonic()
        block = reader.read_block(count)
        seconds = time.monotonic() - started
        if not block:
            return
        if order is not None:
            block = [block[i] for i in order]
        pipe.put(block)
        rows = len(block[0])
        per_instance = max(1, sum(a.nbytes for a in block) // rows)
        by_time = int(BLOCK_TARGET_S * rows / seconds) if seconds > 0 else BLOCK_MAX_INSTANCES
        count = max(1, min(BLOCK_MAX_INSTANCES, BLOCK_TARGET_BYTES // per_instance, by_time))


class MultiFileReader(ReaderBase):
    """Instances of many files, read by ``thread_num`` prefetching threads."""

    def __init__(
        self,
        filenames: Sequence[str | os.PathLike[str]],
        shapes: ShapesArg = None,
        dtypes: DtypesArg = None,
        lod_levels: LodArg = None,
        thread_num: int | None = None,
        buffer_size: int | None = None,
        is_test: bool = False,
    ) -> None:
        super().__init__()
        self.filenames = [os.fspath(f) for f in filenames]
        if not self.filenames:
            raise ValueError("open_files: no file to be read")
        checker = SlotChecker(shapes, dtypes, lod_levels)  # validates the declarations once, here
        self.shapes, self.dtypes, self.lod_levels = checker.shapes, checker.dtypes, checker.lod_levels
        self.is_test = bool(is_test)
        if thread_num is None:
            thread_num = min(len(self.filenames), cpu_count())
        if thread_num <= 0:
            raise ValueError(f"thread_num must be > 0, got {thread_num}")
        self.thread_num = 1 if self.is_test else thread_num
        self.buffer_size = 3 * self.thread_num if buffer_size is None else buffer_size
        if self.buffer_size <= 0:
            raise ValueError(f"buffer_size must be > 0, got {self.buffer_size}")
        self._spec: dict[str, Any] = {"shapes": shapes, "dtypes": dtypes, "lod_levels": lod_levels}
        self._names: list[str] | None = None
        self._prefetcher = Prefetcher(self.buffer_size, "loader-open-files", self._spawner())
        self._reset_pass()

    def _spawner(self) -> Callable[[ThreadPipeline], None]:
        # A closure over plain values, not over self: dropping the reader stops its threads.
        filenames, spec, thread_num = list(self.filenames), dict(self._spec), self.thread_num

        known: list[list[str]] = []  # the first file's slot names, read at the first pass only

        def spawn(pipe: ThreadPipeline) -> None:
            files = _FileQueue(filenames)  # a new queue, hence a full pass, every start
            if not known:
                known.append(_first_slot_names(filenames, spec))
            for _ in range(thread_num):
                pipe.spawn(_read_files, files, spec, known[0])

        return spawn

    def _reset_pass(self) -> None:
        self._prefetcher.reset()
        self._block: list[np.ndarray] = []
        self._pos = self._len = 0

    @property
    def slot_names(self) -> list[str]:
        if self._names is None:
            names = _first_slot_names(self.filenames, self._spec)
            if not names:
                return []
            self._names = names
        return list(self._names)

    def _next_block(self) -> bool:
        block = self._prefetcher.next()
        if block is END:
            return False
        self._block = block
        self._pos, self._len = 0, len(block[0])
        return True

    def _read_next_impl(self) -> list[np.ndarray]:
        pos = self._pos
        if pos >= self._len:
            if not self._next_block():
                return []
            pos = 0
        self._pos = pos + 1
        return [a[pos, ...] for a in self._block]

    def read_block(self, max_instances: int) -> list[np.ndarray]:
        """The rest of the current block, at most ``max_instances`` rows (views, no copy)."""
        if self._start_slicing_block(max_instances):
            self._pos -= 1  # the looked-ahead row is still in the current block: give it back
        if self._pos >= self._len and not self._next_block():
            return []
        start, stop = self._pos, min(self._len, self._pos + max_instances)
        self._pos = stop
        return [a[start:stop] for a in self._block]

    def _reinit_impl(self) -> None:
        self._reset_pass()

    def _close_impl(self) -> None:
        self._prefetcher.stop()
        self._block = []


def open_files(
    filenames: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    shapes: ShapesArg,
    dtypes: DtypesArg,
    lod_levels: LodArg = None,
    thread_num: int | None = None,
    buffer_size: int | None = None,
    pass_num: int = 1,
    is_test: bool = False,
) -> ReaderBase:
    """A reader of the instances of ``filenames`` (one name or a list), ``pass_num`` times.

    ``thread_num`` defaults to ``min(len(filenames), cpu_count)``, ``buffer_size``
    (blocks in flight) to ``3 * thread_num``; ``is_test=True`` keeps list order.
    """
    if isinstance(filenames, (str, os.PathLike)):
        filenames = [filenames]
    if pass_num <= 0:
        raise ValueError(f"pass_num must be > 0, got {pass_num}")
    reader: ReaderBase = MultiFileReader(filenames, shapes, dtypes, lod_levels, thread_num, buffer_size, is_test)
    if pass_num > 1:
        reader = MultiPassReader(reader, pass_num)
    return reader


__all__ = ["MultiFileReader", "open_files", "BLOCK_MAX_INSTANCES", "BLOCK_TARGET_BYTES", "BLOCK_TARGET_S"]
