"""Module-level providers used by tests/unit/provider/ (module level so they pickle)."""

from __future__ import annotations

import random
import threading

import numpy as np

from loader.provider import (
    CacheType,
    dense_vector,
    integer_value,
    integer_value_sequence,
    integer_value_sub_sequence,
    provider,
    sparse_binary_vector,
    sparse_float_vector,
)


class Counter:
    """Thread-safe counters the providers report into (files open, samples produced, calls)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.open_now = 0
        self.open_max = 0
        self.produced = 0
        self.calls = 0

    def enter(self) -> None:
        with self.lock:
            self.calls += 1
            self.open_now += 1
            self.open_max = max(self.open_max, self.open_now)

    def leave(self) -> None:
        with self.lock:
            self.open_now -= 1


COUNTER = Counter()


@provider(input_types=[dense_vector(200)])
def dense_no_seq(settings, filename):
    for i in range(200):
        yield [(j - 100) * (i + 1) / 200.0 for j in range(200)]


@provider(input_types=[integer_value(200)])
def index_no_seq(settings, filename):
    for i in range(200):
        yield i


def _init_hook(settings, value, **kwargs):
    settings.value = value


@provider(input_types=[integer_value(20)], init_hook=_init_hook)
def with_init_hook(settings, filename):
    yield from settings.value


def _hook_sets_types(settings, **kwargs):
    settings.input_types = {"word": integer_value_sequence(100), "label": integer_value(2)}


@provider(init_hook=_hook_sets_types)
def types_from_hook(settings, filename):
    yield {"label": 1, "word": [1, 2, 3]}


@provider(input_types=[sparse_binary_vector(200000)])
def sparse_non_value(settings, filename):
    for i in range(200):
        yield [(i + 1) * (j + 1) for j in range(10)]


@provider(input_types=[sparse_float_vector(200000)])
def sparse_value(settings, filename):
    for i in range(200):
        yield [((i + 1) * (j + 1), float(j) / float(i + 1)) for j in range(10)]


@provider(input_types=[integer_value_sequence(200)])
def index_seq(settings, filename):
    for i in range(200):
        yield list(range(i + 1))


@provider(input_types=[integer_value_sub_sequence(200)])
def index_sub_seq(settings, filename):
    for i in range(200):
        yield [list(range(j + 1)) for j in range(i % 4 + 1)]


@provider(input_types=[integer_value(2**20)], min_pool_size=1000)
def min_pool(settings, filename):
    for i in range(2**14):
        COUNTER.produced += 1
        yield i


@provider(
    input_types=[integer_value_sequence(100)],
    can_over_batch_size=False,
    calc_batch_size=lambda sample: len(sample[0]),
)
def weighted_no_over(settings, filename):
    rng = random.Random(filename)
    for _ in range(500):
        yield [rng.randrange(100) for _ in range(rng.randint(1, 100))]


@provider(input_types=[integer_value_sequence(100)], calc_batch_size=lambda sample: len(sample[0]))
def weighted_over(settings, filename):
    rng = random.Random(filename)
    for _ in range(500):
        yield [rng.randrange(100) for _ in range(rng.randint(1, 100))]


@provider(input_types={"input1": integer_value(10), "input2": integer_value(10)})
def dict_slots(settings, filename):
    for _ in range(100):
        yield {"input1": 0, "input2": 1}


@provider(input_types=[integer_value(10)], check=True, check_fail_continue=True, should_shuffle="123")
def checked_continue(settings, filename):
    rng = random.Random(7)
    for _ in range(1000):
        yield rng.randrange(20)


@provider(input_types=[integer_value(2**20)], min_pool_size=100, cache=CacheType.CACHE_PASS_IN_MEM)
def cached(settings, filename):
    COUNTER.enter()
    try:
        for i in range(1000):
            yield i
    finally:
        COUNTER.leave()


@provider(input_types=[integer_value(10**9)])
def numbered(settings, filename):
    """``count`` samples per file, numbered ``file index * 1000 + i`` (file names are ints)."""
    COUNTER.enter()
    try:
        for i in range(getattr(settings, "count", 10)):
            COUNTER.produced += 1
            yield int(filename) * 1000 + i
    finally:
        COUNTER.leave()


@provider(input_types=[dense_vector(256)], pool_size=100)
def one_sample_files(settings, filename):
    """Reads one small file and yields one 1 KiB sample (the 10,000 small files case)."""
    COUNTER.enter()
    try:
        with open(filename, encoding="utf-8") as fh:
            value = float(fh.read())
        yield np.full(256, value, dtype=np.float32)
    finally:
        COUNTER.leave()


@provider(
    input_types={"x": dense_vector(3), "y": integer_value(5), "ids": sparse_binary_vector(8)},
    check=True,
)
def checked_strict(settings, filename):
    yield from settings.samples


@provider(input_types={"id": integer_value(10**9), "vec": dense_vector(3)})
def numbered_file_lines(settings, filename):
    """For the service: one sample per line of a text file of integers: ``{"id": n, "vec": [n, n, n]}``."""
    with open(filename, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                n = int(line)
                yield {"id": n, "vec": [float(n)] * 3}
