"""loader.reader.decorators: map, buffered, compose, chain, shuffle, firstn, cache, Fake."""

from __future__ import annotations

import gc

import pytest

from loader import reader
from loader.errors import ComposeNotAligned, DataError
from tests.helpers import (
    Boom,
    ListReader,
    RangeReader,
    hang_forever,
    live_threads,
    open_fd_count,
    raise_on,
    wait_until,
)

PREFETCH_TIMEOUT_S = 10.0  # only reached when prefetching is broken


class Counting:
    """A reader over 0..n-1 that counts calls and items pulled (side effects to observe)."""

    def __init__(self, n: int) -> None:
        self.n, self.calls, self.pulled = n, 0, 0

    def __call__(self):
        self.calls += 1
        return self._gen()

    def _gen(self):
        for i in range(self.n):
            self.pulled += 1
            yield i


# --- map_readers ---------------------------------------------------------------------------


def test_map_readers_upstream():
    d = {"h": 0, "i": 1}
    r = reader.map_readers(lambda x: d[x], ListReader(["h", "i"]))
    assert list(r()) == [0, 1]


def test_map_readers_stops_at_shortest_and_is_lazy():
    src = Counting(10)
    r = reader.map_readers(lambda a, b: a + b, src, RangeReader(3))
    assert src.calls == 0
    assert list(r()) == [0, 2, 4]
    assert list(r()) == [0, 2, 4]


def test_map_readers_needs_a_reader():
    with pytest.raises(TypeError):
        reader.map_readers(lambda: 0)
    with pytest.raises(TypeError, match="callable"):
        reader.map_readers(abs, [1, 2])


def test_a_reader_that_needs_arguments_is_refused_when_decorating():
    # A creator given where its reader is due (shuffle(text_file, 100)), or xmap_readers' mapper and reader
    # swapped, failed only when iterated, as "text_file() missing 1 required positional argument", naming
    # neither the decorator nor what to write.
    from loader.reader import creator

    with pytest.raises(
        TypeError, match=r"shuffle: a reader must be callable with no arguments; text_file needs 'path'"
    ):
        reader.shuffle(creator.text_file, 100)
    with pytest.raises(
        TypeError, match=r"xmap_readers: a reader must be callable with no arguments; <lambda> needs 'x'"
    ):
        reader.xmap_readers(RangeReader(3), lambda x: x + 1, 2, 4)
    with pytest.raises(TypeError, match=r"batch: .*np_array needs 'x' \(is it a reader creator\? call it"):
        import loader

        loader.batch(creator.np_array, 2)
    # Defaults, *args and callable objects are readers all the same.
    assert list(reader.firstn(lambda n=3: iter(range(n)), 5)()) == [0, 1, 2]
    assert list(reader.firstn(lambda *args: iter(range(2)), 5)()) == [0, 1]
    assert list(reader.firstn(RangeReader(2), 5)()) == [0, 1]


def test_map_readers_refuses_a_function_that_is_not_callable():
    with pytest.raises(TypeError, match=r"map_readers: func must be callable, got int"):
        reader.map_readers(3, RangeReader(3))
    with pytest.raises(TypeError, match=r"xmap_readers: mapper must be callable, got str"):
        reader.xmap_readers("f", RangeReader(3), 2, 4)


def test_map_readers_mapper_error_at_offending_item():
    got = []
    with pytest.raises(Boom):
        for x in reader.map_readers(raise_on(3), RangeReader(10))():
            got.append(x)
    assert got == [0, 1, 2]


# --- shuffle -------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [-5, 0, 1])
def test_shuffle_small_sizes_keep_order(size):
    assert list(reader.shuffle(RangeReader(10), size)()) == list(range(10))


@pytest.mark.parametrize("size", [10, 100])
def test_shuffle_upstream_counts(size):
    assert len(list(reader.shuffle(RangeReader(10), size)())) == 10


def test_shuffle_keeps_blocks():
    out = list(reader.shuffle(RangeReader(25), 10, seed=3)())
    assert sorted(out[:10]) == list(range(10))
    assert sorted(out[10:20]) == list(range(10, 20))
    assert sorted(out[20:]) == list(range(20, 25))


def test_shuffle_seed_reproducible_and_epochs_differ():
    a = reader.shuffle(RangeReader(50), 50, seed=7)
    b = reader.shuffle(RangeReader(50), 50, seed=7)
    first_a, first_b = list(a()), list(b())
    assert first_a == first_b != list(range(50))
    second_a, second_b = list(a()), list(b())
    assert second_a == second_b != first_a  # pass 2 differs from pass 1, repeatably
    assert sorted(second_a) == list(range(50))


def test_shuffle_without_seed_is_fresh():
    r = reader.shuffle(RangeReader(50), 50)
    assert len({tuple(r()) for _ in range(3)}) > 1


# --- chain ---------------------------------------------------------------------------------


def test_chain_upstream():
    out = list(reader.chain(RangeReader(10), RangeReader(10))())
    assert len(out) == 20
    assert all(x == i % 10 for i, x in enumerate(out))


def test_chain_empty_and_lazy_sources():
    assert list(reader.chain()()) == []
    a, b = Counting(2), Counting(2)
    it = reader.chain(a, b)()
    assert next(it) == 0
    assert (a.calls, b.calls) == (1, 0)  # the second source is called when reached
    assert list(it) == [1, 0, 1]


# --- compose -------------------------------------------------------------------------------


def test_compose_upstream():
    r10 = RangeReader(10)
    assert list(reader.compose(r10, r10)()) == [(i, i) for i in range(10)]
    got = []
    with pytest.raises(ComposeNotAligned):
        for row in reader.compose(reader.chain(r10, r10), r10)():
            got.append(row)
    assert len(got) == 10
    assert len(list(reader.compose(reader.chain(r10, r10), r10, check_alignment=False)())) == 10


def test_compose_flattens_tuples_only():
    r = reader.compose(ListReader([(1, 2)]), ListReader([3]), ListReader([(4, 5)]), ListReader([[6]]))
    assert list(r()) == [(1, 2, 3, 4, 5, [6])]


def test_compose_allows_none_samples():
    r = reader.compose(ListReader([None, 1]), ListReader([2, None]))
    assert list(r()) == [(None, 2), (1, None)]


def test_compose_edges():
    assert list(reader.compose()()) == []
    assert list(reader.compose(RangeReader(2))()) == [(0,), (1,)]
    assert issubclass(reader.ComposeNotAligned, ValueError)
    with pytest.raises(TypeError):
        reader.compose(RangeReader(2), check_aligment=False)  # typo is not silently ignored


# --- buffered ------------------------------------------------------------------------------


@pytest.mark.parametrize("size", range(20))
def test_buffered_upstream_order(size, no_leaks):
    assert list(reader.buffered(RangeReader(10), size)()) == list(range(10))


class Recording:
    """A reader over 0..n-1 that records each item as the source produces it."""

    def __init__(self, n: int) -> None:
        self.n, self.produced = n, []

    def __call__(self):
        for i in range(self.n):
            self.produced.append(i)
            yield i


def test_buffered_prefetches(no_leaks):
    source = Recording(10)
    it = reader.buffered(source, 10)()
    assert next(it) == 0
    # The consumer asks for nothing more, yet the source is read to the end: the buffer's thread
    # prefetched (a lazy pass-through would stop at item 0 or 1 and time out here).
    assert wait_until(lambda: source.produced == list(range(10)), timeout_s=PREFETCH_TIMEOUT_S)
    assert list(it) == list(range(1, 10))


def test_buffered_source_error_reaches_consumer(no_leaks):
    got = []
    with pytest.raises(Boom, match="at sample 5") as info:
        for x in reader.buffered(raise_on(5), 2)():
            got.append(x)
    assert got == [0, 1, 2, 3, 4]
    assert "_gen" in "".join(__import__("traceback").format_tb(info.value.__traceback__))


def test_buffered_abandon_stops_thread_of_slow_source(no_leaks):
    it = reader.buffered(hang_forever(after=3, limit_s=0.5), 2)()
    assert [next(it) for _ in range(3)] == [0, 1, 2]
    it.close()  # joins (bounded) once the source returns from its sleep


# --- firstn --------------------------------------------------------------------------------


def test_firstn_does_not_pull_extra():
    src = Counting(10)
    assert list(reader.firstn(src, 3)()) == [0, 1, 2]
    assert src.pulled == 3
    assert list(reader.firstn(src, 0)()) == []
    assert src.pulled == 3


def test_firstn_negative_and_short_sources():
    assert list(reader.firstn(RangeReader(5), -1)()) == list(range(5))
    assert list(reader.firstn(RangeReader(5), 50)()) == list(range(5))
    assert list(reader.firstn(RangeReader(5), 2.0)()) == [0, 1]
    with pytest.raises(TypeError):
        reader.firstn(RangeReader(5), 2.5)


@pytest.mark.parametrize(
    ("make", "named"),
    [
        (lambda: reader.buffered(RangeReader(3), 2.5), "buffered: size must be an integer, got 2.5 (float)"),
        (lambda: reader.shuffle(RangeReader(3), "8"), "shuffle: buf_size must be an integer, got '8' (str)"),
        (lambda: reader.firstn(RangeReader(3), None), "firstn: n must be an integer, got None (NoneType)"),
        (lambda: reader.xmap_readers(abs, RangeReader(3), 1.5, 1), "xmap_readers: process_num must be an integer"),
        (lambda: reader.xmap_readers(abs, RangeReader(3), 1, "2"), "xmap_readers: buffer_size must be an integer"),
        (lambda: reader.multiprocess_reader([RangeReader(3)], False, 0.5), "multiprocess_reader: queue_size must"),
        (lambda: reader.Fake()(RangeReader(3), "3"), "Fake: data_num must be an integer, got '3' (str)"),
        (lambda: reader.fake(RangeReader(3), [3]), "fake: data_num must be an integer, got [3] (list)"),
        (lambda: reader.PipeReader("true", bufsize=1.5), "PipeReader: bufsize must be an integer, got 1.5 (float)"),
    ],
)
def test_a_size_that_is_not_an_integer_is_named(make, named):
    # operator.index's own message ("'float' object cannot be interpreted as an integer") named no argument.
    with pytest.raises(TypeError) as info:
        make()
    assert named in str(info.value)


def test_firstn_closes_source():
    closed = []

    def src():
        try:
            yield from range(10)
        finally:
            closed.append(True)

    assert list(reader.firstn(src, 2)()) == [0, 1]
    assert closed == [True]


# --- cache ---------------------------------------------------------------------------------


def test_cache_reads_once_at_decoration():
    src = Counting(4)
    r = reader.cache(src)
    assert src.calls == 1
    assert list(r()) == list(r()) == [0, 1, 2, 3]
    assert src.calls == 1
    assert list(reader.cache(ListReader([]))()) == []
    with pytest.raises(Boom):
        reader.cache(raise_on(2))


# --- Fake ----------------------------------------------------------------------------------


def test_fake_upstream():
    fake = reader.Fake()(RangeReader(10), 100)
    for _ in range(10):
        assert list(fake()) == [0] * 100


def test_fake_has_no_shared_counter():
    maker = reader.Fake()
    a = maker(ListReader(["a"]), 5)
    b = maker(ListReader(["b"]), 3)
    it = a()
    next(it)
    it.close()  # abandoned pass: must not shorten the next one
    assert list(a()) == ["a"] * 5
    assert list(b()) == ["b"] * 3
    with pytest.raises(DataError):
        list(maker(ListReader([]), 2)())


# --- resources -----------------------------------------------------------------------------


def _abandon(it, how: int) -> None:
    next(it)
    if how == 0:
        it.close()
    elif how == 1:
        for _ in it:
            break
        del it
    else:
        del it  # refcounting finalises the generator; gc.collect() runs at the end


def test_thousand_abandoned_buffered_leave_nothing(no_leaks):
    threads, fds = len(live_threads()), open_fd_count()
    r = reader.buffered(reader.map_readers(lambda x: x * 2, reader.shuffle(RangeReader(1000), 10)), 4)
    for i in range(1000):
        _abandon(r(), i % 3)
    gc.collect()
    assert len(live_threads()) <= threads
    assert open_fd_count() <= fds


def test_decorators_are_lazy_and_reiterable():
    src = Counting(6)
    chained = reader.chain(src, src)
    rs = [
        reader.map_readers(str, src),
        reader.shuffle(src, 3, seed=1),
        reader.firstn(src, 4),
        reader.buffered(src, 2),
        reader.compose(src, src),
        chained,
    ]
    assert src.calls == 0
    for r in rs:
        assert sorted(r(), key=repr) == sorted(r(), key=repr)


def test_public_names():
    from loader.reader import creator, decorators

    for name in (
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
        "PipeReader",
        "ComposeNotAligned",
    ):
        assert getattr(reader, name) is getattr(decorators, name)
    assert reader.ComposeNotAligned is ComposeNotAligned
    assert reader.creator is creator
    assert callable(creator.np_array) and callable(creator.text_file) and callable(creator.recordio)


def test_the_reader_package_exports_every_decorator():
    import loader.reader as package
    from loader.reader import decorators

    assert package.__all__ == [*decorators.__all__, "MultiprocessReaderError", "creator", "decorator"]
    assert all(hasattr(package, name) for name in package.__all__)
