"""Reader decorators: functions that take reader(s) and return a new reader.

A reader is a zero-argument callable returning a fresh iterable of samples.
Every decorator here is lazy (building the decorated reader calls nothing; each
call of it calls its sources again) except :func:`cache`, which reads its source
once, at decoration time, as the original did.

Every generator here closes the sources it opened in ``finally``, so ``break``,
``close()`` and garbage collection release files and stop threads promptly.
The threaded and multi-process decorators live in their own modules
(:mod:`.xmap`, :mod:`.multiprocess`, :mod:`.pipe`) and are re-exported here,
where the original ``paddle.reader.decorator`` had them.
"""

from __future__ import annotations

import itertools
import random
import threading
from collections.abc import Callable, Iterator
from typing import Any

from loader.errors import ComposeNotAligned, DataError
from loader.reader._util import Reader, as_count, check_function, check_reader, close_quietly, forked_pass, open_source
from loader.reader.multiprocess import multiprocess_reader
from loader.reader.pipe import PipeReader
from loader.reader.xmap import xmap_readers
from loader.runtime.threads import ThreadPipeline


def map_readers(func: Callable[..., Any], *readers: Reader) -> Reader:
    """A reader yielding ``func(a, b, ...)`` over items taken in step from ``readers``.

    Stops at the shortest reader (no error, like the built-in ``map``). With no
    readers at all it raises ``TypeError`` here (the original failed only when
    iterated).
    """
    check_function(func, "map_readers: func")
    if not readers:
        raise TypeError("map_readers needs at least one reader")
    for r in readers:
        check_reader(r, "map_readers")

    def mapped_reader() -> Iterator[Any]:
        sources = [open_source(r) for r in readers]
        try:
            for items in zip(*sources):
                yield func(*items)
        finally:
            for source in sources:
                close_quietly(source)

    return mapped_reader


def _pump(pipeline: ThreadPipeline, reader: Reader) -> None:
    # Runs in the producer thread: the source's generator body runs here too.
    source = open_source(reader)
    try:
        for item in source:
            pipeline.put(item)
    finally:
        close_quietly(source)


def buffered(reader: Reader, size: int) -> Reader:
    """Prefetch up to ``size`` items of ``reader`` in a background thread.

    ``size <= 0`` means an unbounded buffer (the original's meaning). Order is
    kept. An exception in the source is re-raised to the consumer (the original
    exception object) after the items before it; abandoning the iteration stops
    the thread.
    """
    check_reader(reader, "buffered")
    size = as_count(size, "buffered: size")

    def buffered_reader() -> Iterator[Any]:
        pipeline = ThreadPipeline(size, name="buffered")
        try:
            pipeline.spawn(_pump, reader)
            yield from pipeline
        finally:
            pipeline.close()

    return buffered_reader


class _Missing:
    """The private fill value that marks a reader that ran out (never a sample)."""

    __slots__ = ()


_MISSING = _Missing()


def _as_tuple(item: Any) -> tuple[Any, ...]:
    # Tuples are spliced into the output; anything else (lists too) is one element.
    return item if isinstance(item, tuple) else (item,)


def compose(*readers: Reader, check_alignment: bool = True) -> Reader:
    """A reader of flat tuples joining one item from each reader.

    ``compose(a, b)`` yields ``a_item + b_item`` where tuples are spliced in
    and anything else (a list included) counts as one element:
    ``(1, 2)``, ``3``, ``(4, 5)`` -> ``(1, 2, 3, 4, 5)``.

    ``check_alignment=True``: when the readers run out at different lengths,
    the rows that all readers gave are yielded and then ``ComposeNotAligned``
    (a ``ValueError``) is raised. Unlike the original, a reader that yields
    ``None`` is fine: the end of a reader is detected with a private marker.
    ``check_alignment=False``: stops at the shortest reader.

    Unknown keyword arguments raise ``TypeError`` (the original ignored them,
    hiding typos such as ``check_aligment=False``).
    """
    for r in readers:
        check_reader(r, "compose")

    def composed_reader() -> Iterator[tuple[Any, ...]]:
        sources = [open_source(r) for r in readers]
        try:
            if not check_alignment:
                rows: Iterator[tuple[Any, ...]] = zip(*sources)
            else:
                rows = itertools.zip_longest(*sources, fillvalue=_MISSING)
            for row in rows:
                if any(item is _MISSING for item in row):
                    raise ComposeNotAligned("outputs of readers are not aligned.")
                yield sum(map(_as_tuple, row), ())
        finally:
            for source in sources:
                close_quietly(source)

    return composed_reader


def chain(*readers: Reader) -> Reader:
    """A reader yielding all of ``readers[0]``, then all of ``readers[1]``, and so on.

    Each source is called when it is reached (the original called them all
    up front, which opens every file at once); no readers -> nothing.
    """
    for r in readers:
        check_reader(r, "chain")

    def chained_reader() -> Iterator[Any]:
        for r in readers:
            source = open_source(r)
            try:
                yield from source
            finally:
                close_quietly(source)

    return chained_reader


def _epoch_rng(seed: int | str, epoch: int) -> random.Random:
    if epoch == 0:
        return random.Random(seed)
    # Later passes get their own order, still fixed by (seed, epoch).
    return random.Random(f"{seed!r}/epoch {epoch}")


def shuffle(reader: Reader, buf_size: int, seed: int | str | None = None) -> Reader:
    """Shuffle ``reader`` in consecutive blocks of ``buf_size`` items.

    Items never leave their block (the original's block shuffle, not a sliding
    window); ``buf_size`` of 0 or 1 keeps the order. Without a ``seed`` the
    module-level ``random`` functions are used, as in the original, so a
    program that called ``random.seed(0)`` stays reproducible. With a ``seed``
    the output is reproducible on its own: the first call of the returned
    reader uses ``random.Random(seed)``, call ``k`` a generator seeded by
    ``(seed, k)``, so every pass is shuffled differently yet the whole run
    repeats, whatever else draws from ``random``. Inside a ``multiprocess_reader``
    child, call ``k`` of the merged reader counts as the ``k``-th call.
    """
    check_reader(reader, "shuffle")
    buf_size = as_count(buf_size, "shuffle: buf_size")
    epochs = itertools.count()
    lock = threading.Lock()

    def shuffled_reader() -> Iterator[Any]:
        if seed is None:
            mix: Callable[[list[Any]], None] = random.shuffle  # looked up per call: random.seed() may follow
        else:
            with lock:  # calls from several threads still get distinct epochs
                mix = _epoch_rng(seed, next(epochs) + forked_pass()).shuffle
        source = open_source(reader)
        buf: list[Any] = []
        try:
            for item in source:
                buf.append(item)
                if len(buf) >= buf_size:
                    mix(buf)
                    yield from buf
                    buf = []
            mix(buf)
            yield from buf
        finally:
            close_quietly(source)

    return shuffled_reader


def firstn(reader: Reader, n: int) -> Reader:
    """The first ``n`` items of ``reader``; a negative ``n`` yields everything.

    Unlike the original, no item beyond the ``n``-th is pulled from the source
    (``firstn(r, 0)`` does not touch ``r``'s items), and the source is closed
    as soon as ``n`` items were given. ``n`` must be an integer (an integral
    float such as ``2.0`` is accepted); anything else raises ``TypeError`` here.
    """
    check_reader(reader, "firstn")
    n = as_count(n, "firstn: n")

    def firstn_reader() -> Iterator[Any]:
        source = open_source(reader)
        try:
            yield from (source if n < 0 else itertools.islice(source, n))
        finally:
            close_quietly(source)

    return firstn_reader


def cache(reader: Reader) -> Reader:
    """Read ``reader`` once, now, and return a reader replaying those items.

    Matches the original: the source is drained at decoration time (its errors
    are raised by ``cache`` itself) and never called again.
    """
    check_reader(reader, "cache")
    data = tuple(reader())

    def cached_reader() -> Iterator[Any]:
        yield from data

    return cached_reader


class Fake:
    """``Fake()(reader, data_num)``: a reader repeating ``reader``'s first item.

    For speed tests that should not pay for reading. The first item is read on
    the first call of the fake reader and kept by that fake reader only; every
    call yields exactly ``data_num`` items. (The original kept the item and a
    yield counter on the ``Fake`` instance, so readers made by one instance
    shared both, and an abandoned pass shortened the next.) An empty source
    raises ``DataError`` (a ``ValueError``).
    """

    def __call__(self, reader: Reader, data_num: int) -> Reader:
        check_reader(reader, "Fake")
        data_num = as_count(data_num, "Fake: data_num")
        first: list[Any] = []
        lock = threading.Lock()

        def fake_reader() -> Iterator[Any]:
            with lock:
                if not first:
                    first.append(_first_item(reader))
            for _ in range(data_num):
                yield first[0]

        return fake_reader


def fake(reader: Reader, data_num: int) -> Reader:
    """``fake(reader, data_num)`` (paddle 2.x): a reader yielding ``reader``'s first item ``data_num`` times.

    Each call reads the first item afresh and keeps no state between calls. An
    empty source raises ``DataError`` (a ``ValueError``; the original raised
    ``RuntimeError`` from inside the generator).
    """
    check_reader(reader, "fake")
    data_num = as_count(data_num, "fake: data_num")

    def fake_reader() -> Iterator[Any]:
        item = _first_item(reader)
        for _ in range(data_num):
            yield item

    return fake_reader


def _first_item(reader: Reader) -> Any:
    source = open_source(reader)
    try:
        return next(source)
    except StopIteration:
        name = getattr(reader, "__qualname__", None) or type(reader).__name__
        raise DataError(f"fake: the reader {name} yielded no sample to repeat") from None
    finally:
        close_quietly(source)


__all__ = [
    "map_readers",
    "buffered",
    "compose",
    "chain",
    "shuffle",
    "firstn",
    "xmap_readers",
    "multiprocess_reader",
    "cache",
    "Fake",
    "fake",
    "PipeReader",
    "ComposeNotAligned",
]
