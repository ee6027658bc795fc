"""Paddle's decorator_test and creator_test (np_array, text_file) through the ``paddle`` alias, assertions
unchanged; then the names and behaviours a port relies on: ``fake``, ``decorator``, ``shuffle`` and
``random.seed``, ``multiprocess_reader``'s carried objects and its ``ValueError``."""

from __future__ import annotations

import functools
import importlib
import random
import tempfile
import time
import unittest

import numpy as np
import pytest

from loader import reader as lreader
from loader.errors import WorkerError
from tests import paddle_shim
from tests.helpers import RangeReader


@pytest.fixture
def paddle(monkeypatch):
    return paddle_shim.install(monkeypatch)


def _ten(dur):
    def read():
        for i in range(10):
            time.sleep(dur)
            yield i

    return read


class DecoratorCases(unittest.TestCase):
    """Upstream's decorator_test cases (2.x version), assertions unchanged."""

    __test__ = False

    def setUp(self):
        self.paddle = importlib.import_module("paddle")
        importlib.import_module("paddle.reader")

    def test_map(self):
        d = {"h": 0, "i": 1}

        def read():
            yield "h"
            yield "i"

        r = self.paddle.reader.map_readers(lambda x: d[x], read)
        for i, e in enumerate(r()):
            self.assertEqual(e, i)

    def test_buffered_read(self):
        for size in range(20):
            b = self.paddle.reader.buffered(_ten(0), size)
            c = 0
            for i in b():
                self.assertEqual(i, c)
                c += 1
            self.assertEqual(c, 10)

    def test_buffering(self):
        b = self.paddle.reader.buffered(_ten(0.03), 10)
        last_time = time.time()
        for idx, i in enumerate(b()):
            elapsed_time = time.time() - last_time
            if i == 0:
                time.sleep(0.3)
            else:
                self.assertLess(elapsed_time, 0.05)
            last_time = time.time()

    def test_compose(self):
        reader = self.paddle.reader.compose(_ten(0), _ten(0))
        for idx, e in enumerate(reader()):
            self.assertEqual(e, (idx, idx))

    def test_compose_not_aligned(self):
        total = 0
        reader = self.paddle.reader.compose(self.paddle.reader.chain(_ten(0), _ten(0)), _ten(0))
        with self.assertRaises(self.paddle.reader.ComposeNotAligned):
            for e in reader():
                total += 1
        self.assertEqual(total, 10)

    def test_compose_not_aligned_no_check(self):
        total = 0
        reader = self.paddle.reader.compose(self.paddle.reader.chain(_ten(0), _ten(0)), _ten(0), check_alignment=False)
        for e in reader():
            total += 1
        self.assertEqual(total, 10)

    def test_chain(self):
        c = self.paddle.reader.chain(_ten(0), _ten(0))
        idx = 0
        for e in c():
            self.assertEqual(e, idx % 10)
            idx += 1
        self.assertEqual(idx, 20)

    def test_shuffle(self):
        case = [(0, True), (1, True), (10, False), (100, False)]
        a = _ten(0)
        for size, check_eq in case:
            s = self.paddle.reader.shuffle(a, size)
            total = 0
            for idx, e in enumerate(s()):
                if check_eq:
                    self.assertEqual(idx, e)
                total += 1
            self.assertEqual(total, 10)

    def test_xmap(self):
        def mapper(x):
            return x + 1

        for order in (True, False):
            for t_num in (1, 2, 4, 8, 16):
                for size in (1, 2, 4, 8, 16):
                    reader = self.paddle.reader.xmap_readers(mapper, _ten(0), t_num, size, order)
                    for n in range(3):
                        result = list(reader())
                        if not order:
                            result.sort()
                        for idx, e in enumerate(result):
                            self.assertEqual(e, mapper(idx))

    def test_pipe_reader(self):
        records = [str(i) for i in range(5)]
        temp = tempfile.NamedTemporaryFile()
        try:
            with open(temp.name, "w") as f:
                for r in records:
                    f.write("%s\n" % r)
            pr = self.paddle.reader.PipeReader("cat %s" % temp.name, bufsize=128)
            result = list(pr.get_line())
            for idx, e in enumerate(records):
                self.assertEqual(e, result[idx])
        finally:
            temp.close()

    def test_multi_process_reader(self):
        samples = [[[i], [i + 1, i + 2], i + 3] for i in range(1000)]

        def read(index):
            for i in range(len(samples)):
                if i % 3 == index:
                    yield samples[i]

        for use_pipe in (False, True):
            readers = [functools.partial(read, k) for k in range(3)]
            results = list(self.paddle.reader.multiprocess_reader(readers, 100, use_pipe)())
            self.assertEqual(sorted(samples), sorted(results))

    def test_fake_reader(self):
        def read():
            for i in range(10):
                yield i

        data_num = 100
        fake_reader = self.paddle.reader.fake(read, data_num)
        i = 0
        for data in fake_reader():
            self.assertEqual(data, 0)
            i += 1
        self.assertEqual(i, data_num)

    def test_numpy_array(self):
        creator = importlib.import_module("paddle.reader.creator")
        rows = [[1, 2, 3], [4, 5, 6]]
        for idx, e in enumerate(creator.np_array(np.array(rows, np.int32))()):
            self.assertCountEqual(e, rows[idx])

    def test_text_file(self):
        creator = importlib.import_module("paddle.reader.creator")
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as fh:
            fh.write("".join(f"{i * 2} {i * 2 + 1}\n" for i in range(4)))
        for idx, e in enumerate(creator.text_file(fh.name)()):
            self.assertEqual(e, str(idx * 2) + " " + str(idx * 2 + 1))


CASES = [name for name in dir(DecoratorCases) if name.startswith("test_")]


@pytest.mark.parametrize("case", CASES)
def test_upstream_decorator_and_creator_cases(paddle, case):
    outcome = unittest.TestResult()
    DecoratorCases(case).run(outcome)
    assert outcome.testsRun == 1 and outcome.wasSuccessful(), outcome.failures + outcome.errors


def test_paddle_module_names_resolve(paddle):
    decorator = importlib.import_module("paddle.reader.decorator")
    assert decorator.shuffle is lreader.shuffle and decorator.fake is lreader.fake
    assert importlib.import_module("loader.reader.decorator").buffered is lreader.decorators.buffered
    assert set(lreader.decorators.__all__) <= set(dir(decorator))


def test_shuffle_without_seed_follows_random_seed():
    data = RangeReader(50)
    random.seed(0)
    first = list(lreader.shuffle(data, 50)())
    random.seed(0)
    assert list(lreader.shuffle(data, 50)()) == first != list(range(50))
    random.seed(0)
    expected = list(range(50))
    random.shuffle(expected)
    assert first == expected  # exactly the original's random.shuffle of the block


def test_shuffle_with_seed_ignores_the_global_generator():
    data = RangeReader(50)
    random.seed(1)
    first = list(lreader.shuffle(data, 50, seed=3)())
    random.seed(2)
    assert list(lreader.shuffle(data, 50, seed=3)()) == first


def test_fake_reads_the_first_item_each_call_and_refuses_an_empty_reader():
    calls = []

    def source():
        calls.append(1)
        yield from (5, 6)

    fake = lreader.fake(source, 3)
    assert list(fake()) == [5, 5, 5] and list(fake()) == [5, 5, 5] and len(calls) == 2

    def empty_shard():
        return iter(())

    with pytest.raises(ValueError, match=r"^fake: the reader .*empty_shard yielded no sample to repeat$"):
        list(lreader.fake(empty_shard, 2)())


class Token:
    """A user's object the codec cannot encode; paddle's queue mode carried it."""

    def __init__(self, value):
        self.value = value

    def __eq__(self, other):
        return isinstance(other, Token) and other.value == self.value


@pytest.mark.parametrize("use_pipe", [True, False])
def test_multiprocess_reader_carries_user_objects_and_raises_value_error(use_pipe, no_leaks):
    r = lreader.multiprocess_reader([lambda: iter([Token(1), Token(2)])], use_pipe)
    assert list(r()) == [Token(1), Token(2)]

    def failing():
        yield 1
        raise KeyError("bad record")

    with pytest.raises(ValueError) as info:  # what code written for paddle catches
        list(lreader.multiprocess_reader([failing], use_pipe)())
    assert isinstance(info.value, WorkerError) and info.value.type_name == "KeyError"
