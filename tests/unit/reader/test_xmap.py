"""loader.reader.xmap: threaded mapping, ordered and unordered, failures and shutdown."""

from __future__ import annotations

import gc
import random
import threading
import time
import traceback

import pytest

from loader import reader
from tests.helpers import Boom, CpuWhileWaiting, ListReader, RangeReader, hang_forever, live_threads, raise_on


def plus_one(x: int) -> int:
    return x + 1


class Jitter:
    """A mapper that sleeps a random, short time, so threads finish out of order."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)
        self.lock = threading.Lock()

    def __call__(self, x):
        with self.lock:
            delay = self.rng.random() * 0.004
        time.sleep(delay)
        return x


@pytest.mark.parametrize("order", [True, False])
def test_xmap_upstream(order, no_leaks):
    expected = [plus_one(i) for i in range(10)]
    for threads in (1, 2, 4, 8, 16):
        for buffer in (1, 2, 4, 8, 16):
            r = reader.xmap_readers(plus_one, RangeReader(10), threads, buffer, order)
            for _ in range(3):
                out = list(r())
                assert (out if order else sorted(out)) == expected


def test_xmap_ordered_keeps_order_under_jitter(no_leaks):
    r = reader.xmap_readers(Jitter(1), RangeReader(300), 6, 4, order=True)
    assert list(r()) == list(range(300))


def test_xmap_unordered_keeps_multiset(no_leaks):
    r = reader.xmap_readers(Jitter(2), RangeReader(300), 6, 4, order=False)
    assert sorted(r()) == list(range(300))


def test_xmap_none_samples_and_empty(no_leaks):
    assert list(reader.xmap_readers(lambda x: x, ListReader([None, 1, None]), 2, 2, True)()) == [None, 1, None]
    assert list(reader.xmap_readers(plus_one, ListReader([]), 3, 0)()) == []


@pytest.mark.parametrize("bad", [0, -1])
def test_xmap_process_num_below_one_raises_at_decoration(bad):
    with pytest.raises(ValueError, match="process_num"):
        reader.xmap_readers(plus_one, RangeReader(3), bad, 4)


def test_xmap_ordered_mapper_error_in_place(no_leaks):
    got = []
    with pytest.raises(Boom, match="at sample 7") as info:
        for x in reader.xmap_readers(raise_on(7), RangeReader(20), 4, 2, order=True)():
            got.append(x)
    assert got == list(range(7))  # the error comes exactly where item 7 would have
    assert "helpers.py" in "".join(traceback.format_tb(info.value.__traceback__))  # the mapper's frame


def test_xmap_unordered_mapper_error(no_leaks):
    with pytest.raises(Boom):
        list(reader.xmap_readers(raise_on(7), RangeReader(20), 4, 2)())


@pytest.mark.parametrize("order", [True, False])
def test_xmap_source_error(order, no_leaks):
    got = []
    with pytest.raises(Boom, match="at sample 5"):
        for x in reader.xmap_readers(plus_one, raise_on(5), 3, 2, order)():
            got.append(x)
    if order:
        assert got == [1, 2, 3, 4, 5]
    else:  # items mapped before the failure may arrive, each once, and nothing else
        assert len(got) == len(set(got)) and set(got) <= {1, 2, 3, 4, 5}


def test_xmap_source_slow_then_abandoned(no_leaks):
    it = reader.xmap_readers(plus_one, hang_forever(after=2, limit_s=0.5), 3, 2, True)()
    assert [next(it), next(it)] == [1, 2]
    start = time.monotonic()
    it.close()
    assert time.monotonic() - start < 3.0


def test_xmap_thousand_abandoned_calls_leave_no_threads(no_leaks):
    before = len(live_threads())
    for i, order in zip(range(1000), [True, False] * 500):
        it = reader.xmap_readers(plus_one, RangeReader(10_000), 3, 4, order)()
        next(it)
        if i % 2:
            it.close()
        else:
            del it
    gc.collect()
    assert len(live_threads()) <= before


def test_xmap_ordered_does_not_spin():
    # A source that stalls (at a gate) after its first item, while 8 handlers wait for it or for
    # their turn: on their own CPU clocks, they use almost nothing meanwhile (a spin would use
    # about the whole window).
    probe = CpuWhileWaiting()
    stalled = threading.Event()

    def stalling_source():
        yield 0
        stalled.set()
        probe.gate.wait(probe.GATE_TIMEOUT_S)
        yield from range(1, 5)

    before = live_threads()

    def handlers() -> list[threading.Thread]:
        return [t for t in live_threads() - before if t.name.startswith("xmap-")]

    measuring = probe.hold(handlers, ready=lambda: stalled.is_set() and len(handlers()) == 8)
    assert list(reader.xmap_readers(plus_one, stalling_source, 8, 4, order=True)()) == [1, 2, 3, 4, 5]
    measuring.join(probe.GATE_TIMEOUT_S)
    assert probe.used_s is not None, "the handlers never started"
    assert probe.used_s < probe.WINDOW_S / 3, f"waiting handlers used {probe.used_s:.3f} s of CPU"


def _stops_early(x: int) -> int:
    if x == 3:
        next(iter([]))  # a mapper's bug: StopIteration escapes it
    return x


@pytest.mark.parametrize("order", [True, False])
def test_a_mapper_raising_stopiteration_is_an_error_not_the_end_of_the_data(order: bool) -> None:
    # Before: the worker thread's StopIteration read as the end of the stream: 3 of 10 items and no error.
    with pytest.raises(RuntimeError, match="raised StopIteration"):
        list(reader.xmap_readers(_stops_early, RangeReader(10), 2, 4, order=order)())
