"""Property tests: random stacks of decorators neither lose nor repeat a sample."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import loader
from loader import reader
from tests.helpers import RangeReader, child_pids, wait_until

CHAIN_OFFSET = 1_000_000  # values added by chain/multiprocess never collide with mapped ones


class Add:
    def __init__(self, k: int) -> None:
        self.k = k

    def __call__(self, x: int) -> int:
        return x + self.k


@dataclass
class Model:
    """What the output must be: ``values`` exactly when ordered and complete, else a weaker check."""

    values: list[int]
    count: int
    ordered: bool = True
    complete: bool = True
    extra_seq: int = field(default=1)

    def fresh(self, m: int) -> list[int]:
        start = CHAIN_OFFSET * self.extra_seq
        self.extra_seq += 1
        return list(range(start, start + m))


def _apply(op: tuple, r, model: Model):
    kind = op[0]
    if kind == "map":
        model.values = [v + op[1] for v in model.values]
        return reader.map_readers(Add(op[1]), r)
    if kind == "shuffle":
        model.ordered = model.ordered and op[1] <= 1
        return reader.shuffle(r, op[1], seed=op[2])
    if kind == "buffered":
        return reader.buffered(r, op[1])
    if kind == "chain":
        extra = model.fresh(op[1])
        model.values += extra
        model.count += len(extra)
        return reader.chain(r, RangeReader(extra[-1] + 1 if extra else 0, extra[0] if extra else 0))
    if kind == "xmap":
        _, threads, size, order, k = op
        model.values = [v + k for v in model.values]
        model.ordered = model.ordered and order
        return reader.xmap_readers(Add(k), r, threads, size, order)
    if kind == "firstn":
        n = op[1]
        if n >= 0 and n < model.count:
            model.count = n
            if model.ordered and model.complete:
                model.values = model.values[:n]
            else:
                model.complete = False
        return reader.firstn(r, n)
    if kind == "multiprocess":
        extra = model.fresh(op[1])
        model.values += extra
        model.count += len(extra)
        model.ordered = False
        other = RangeReader(extra[-1] + 1, extra[0]) if extra else RangeReader(0)
        return reader.multiprocess_reader([r, other], use_pipe=op[2])
    raise AssertionError(kind)


OPS = st.one_of(
    st.tuples(st.just("map"), st.integers(0, 50)),
    st.tuples(st.just("shuffle"), st.integers(-1, 12), st.integers(0, 3)),
    st.tuples(st.just("buffered"), st.integers(-1, 5)),
    st.tuples(st.just("chain"), st.integers(0, 8)),
    st.tuples(st.just("xmap"), st.integers(1, 4), st.integers(-1, 4), st.booleans(), st.integers(0, 50)),
    st.tuples(st.just("firstn"), st.integers(-1, 40)),
)
MP_OP = st.tuples(st.just("multiprocess"), st.integers(0, 8), st.booleans())


def _check(out: list[int], model: Model) -> None:
    assert len(out) == model.count
    assert len(set(out)) == len(out), "a sample was repeated"
    if model.complete and model.ordered:
        assert out == model.values
    elif model.complete:
        assert sorted(out) == sorted(model.values)
    else:
        assert set(out) <= set(model.values)


def _no_leaks(threads_before: set, children_before: set) -> None:
    assert wait_until(lambda: not (set(threading.enumerate()) - threads_before), 5.0)
    assert wait_until(lambda: child_pids() <= children_before, 5.0)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(0, 40), ops=st.lists(OPS, max_size=5))
def test_thread_decorator_stacks_keep_every_sample(n, ops):
    threads, children = set(threading.enumerate()), child_pids()
    model = Model(list(range(n)), n)
    r = RangeReader(n)
    for op in ops:
        r = _apply(op, r, model)
    _check(list(r()), model)
    _no_leaks(threads, children)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(0, 30),
    before=st.lists(OPS, max_size=2),
    mp=MP_OP,
    after=st.lists(OPS, max_size=2),
    batch_size=st.integers(1, 7),
    drop_last=st.booleans(),
)
def test_stacks_with_multiprocess_and_batch(n, before, mp, after, batch_size, drop_last):
    threads, children = set(threading.enumerate()), child_pids()
    model = Model(list(range(n)), n)
    r = RangeReader(n)
    for op in [*before, mp, *after]:
        r = _apply(op, r, model)
    batches = list(loader.batch(r, batch_size, drop_last)())
    assert all(len(b) == batch_size for b in batches[:-1])
    if batches:
        assert 0 < len(batches[-1]) <= batch_size
        assert len(batches[-1]) == batch_size or not drop_last
    flat = [x for b in batches for x in b]
    if drop_last:
        kept = model.count // batch_size * batch_size
        assert len(flat) == kept and len(set(flat)) == kept and set(flat) <= set(model.values)
    else:
        _check(flat, model)
    _no_leaks(threads, children)
