"""loader.reader.multiprocess: merging readers run in child processes."""

from __future__ import annotations

import collections
import dataclasses
import multiprocessing
import os
import signal
import threading
import time

import numpy as np
import pytest

from loader import reader
from loader.errors import WorkerDiedError, WorkerError
from loader.reader import multiprocess
from tests.helpers import ListReader, RangeReader, child_pids, exit_with, hang_forever, open_fd_count, raise_on

MODES = [pytest.param(True, id="pipe"), pytest.param(False, id="queue")]


@dataclasses.dataclass(frozen=True)
class Point:
    """A user's own class: loader.runtime.codec cannot encode it, pickle can."""

    x: int
    y: int


def _upstream_samples():
    return [[[i], [i + 1, i + 2], i + 3] for i in range(1000)]


@pytest.mark.parametrize("use_pipe", MODES)
def test_upstream_three_readers(use_pipe, no_leaks):
    samples = _upstream_samples()
    readers = [ListReader([s for i, s in enumerate(samples) if i % 3 == k]) for k in range(3)]
    r = reader.multiprocess_reader(readers, use_pipe, 100)
    assert sorted(r()) == sorted(samples)
    assert sorted(r()) == sorted(samples)  # new processes per call


@pytest.mark.parametrize("use_pipe", MODES)
def test_types_survive(use_pipe, no_leaks):
    samples = [
        (1, 2),
        {1: (1, 2), "k": [3]},
        np.arange(6, dtype=np.float32).reshape(2, 3),
        (np.int64(4), "text", b"raw"),
        None,
    ]
    out = list(reader.multiprocess_reader([ListReader(samples)], use_pipe)())
    assert out[0] == (1, 2) and type(out[0]) is tuple
    assert out[1] == {1: (1, 2), "k": [3]}
    assert out[2].dtype == np.float32 and out[2].shape == (2, 3)
    np.testing.assert_array_equal(out[2], samples[2])
    assert out[3] == samples[3] and type(out[3][0]) is np.int64
    assert out[4] is None


def test_pipe_round_robin_order(no_leaks):
    readers = [ListReader([["a", i] for i in range(3)]), ListReader([["b", 0]]), ListReader([["c", 0], ["c", 1]])]
    out = list(reader.multiprocess_reader(readers)())
    assert out == [["a", 0], ["b", 0], ["c", 0], ["a", 1], ["c", 1], ["a", 2]]


@pytest.mark.parametrize("use_pipe", MODES)
def test_slow_reader_does_not_stall_others(use_pipe, no_leaks):
    r = reader.multiprocess_reader((hang_forever(after=1, limit_s=30), RangeReader(150, 100)), use_pipe)
    it = r()
    start = time.monotonic()
    got = [next(it) for _ in range(51)]
    assert time.monotonic() - start < 5.0
    assert sorted(got) == [0] + list(range(100, 150))
    it.close()  # the hung child is terminated


@pytest.mark.parametrize("use_pipe", MODES)
def test_child_exception_arrives_with_traceback(use_pipe, no_leaks):
    got = []
    with pytest.raises(WorkerError) as info:
        for x in reader.multiprocess_reader([raise_on(4, "bad record")], use_pipe)():
            got.append(x)
    assert got == [0, 1, 2, 3]
    err = info.value
    assert err.type_name == "Boom"
    assert "bad record at sample 4" in err.message
    assert "helpers.py" in err.remote_traceback and "_gen" in err.remote_traceback
    assert err.worker == "multiprocess_reader[0]"


@pytest.mark.parametrize("use_pipe", MODES)
def test_child_exit_is_reported_with_code(use_pipe, no_leaks):
    r = reader.multiprocess_reader([exit_with(3, after=2), hang_forever(limit_s=30)], use_pipe)
    start = time.monotonic()
    with pytest.raises(WorkerDiedError) as info:
        list(r())
    assert time.monotonic() - start < 5.0
    assert info.value.exitcode == 3 and "code 3" in str(info.value)


class KillSelf:
    def __call__(self):
        yield 1
        os.kill(os.getpid(), signal.SIGKILL)
        yield 2


class DieAtOnce:
    def __call__(self):
        os.kill(os.getpid(), signal.SIGKILL)
        yield 1


@pytest.mark.parametrize("use_pipe", MODES)
def test_killed_child_is_reported(use_pipe, no_leaks):
    with pytest.raises(WorkerDiedError) as info:
        list(reader.multiprocess_reader([KillSelf()], use_pipe)())
    assert info.value.exitcode == -signal.SIGKILL


def _bounded(run, seconds: float = 10.0):
    """``run()``'s exception, from a thread given ``seconds``: a hang fails the test instead of stopping it."""
    outcome: list[BaseException | None] = []

    def body():
        try:
            run()
            outcome.append(None)
        except BaseException as exc:  # handed to the test
            outcome.append(exc)

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds:g}s"
    return outcome[0]


@pytest.mark.parametrize("use_pipe", MODES)
def test_a_killed_child_is_found_while_another_process_holds_a_copy_of_its_pipe(use_pipe, monkeypatch):
    # Some other code forks (on another thread) between the child's Pipe() and the parent's close of its write
    # end: that process's copy kept the pipe open, no end-of-file came, and the reader hung until it exited.
    holders = []
    started = multiprocess.start_process

    def start_then_fork_elsewhere(*args, **kwargs):
        proc = started(*args, **kwargs)
        holder = multiprocessing.get_context("fork").Process(target=time.sleep, args=(60,), daemon=True)
        holder.start()
        holders.append(holder)
        return proc

    monkeypatch.setattr(multiprocess, "start_process", start_then_fork_elsewhere)
    try:
        error = _bounded(lambda: list(reader.multiprocess_reader([KillSelf()], use_pipe)()))
        assert isinstance(error, WorkerDiedError) and error.exitcode == -signal.SIGKILL, error
    finally:
        for holder in holders:
            holder.kill()
            holder.join(5)


def test_a_killed_child_is_found_while_another_reader_forks_on_another_thread(no_leaks):
    # The reviewer's case: a train reader and an eval reader, each iterated on its own thread.
    other = reader.multiprocess_reader([RangeReader(10_000_000)], use_pipe=True)
    stop = threading.Event()
    held = []  # the other reader's passes stay open: their children live on, with what they copied

    def fork_often():
        while not stop.is_set() and len(held) < 150:
            it = other()
            next(it)
            held.append(it)

    forker = threading.Thread(target=fork_often, daemon=True)
    forker.start()
    try:
        killed = reader.multiprocess_reader([DieAtOnce()], use_pipe=True)
        for _ in range(15):
            assert isinstance(_bounded(lambda: list(killed())), WorkerDiedError)
    finally:
        stop.set()
        forker.join(30)
        for it in held:
            it.close()


def test_a_process_forked_while_another_thread_starts_a_reader_can_start_readers(no_leaks):
    # A fork (os.fork, a torch DataLoader worker) taken while another thread held the module's fork lock copied it
    # locked: the forked process's first multiprocess_reader waited for it for good.
    with multiprocess._FORK_LOCK:  # as if another thread were inside _Children._start
        pid = os.fork()
        if pid == 0:  # the child: never back into pytest
            code = 3
            try:
                signal.alarm(10)  # a hang ends the child, not the test
                code = 0 if list(reader.multiprocess_reader([RangeReader(3)])()) == [0, 1, 2] else 1
            finally:
                os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child's multiprocess_reader hung (SIGALRM) or failed"


def _linger_then_count(n):
    def lingering():
        threading.Thread(target=time.sleep, args=(30,)).start()  # not a daemon: the child cannot exit
        yield from range(n)

    return lingering


@pytest.mark.parametrize("use_pipe", MODES)
def test_children_that_cannot_exit_share_one_grace_period(use_pipe, monkeypatch, caplog, no_leaks):
    monkeypatch.setattr(multiprocess, "PROCESS_JOIN_TIMEOUT_S", 1.0)
    started = time.monotonic()
    with caplog.at_level("WARNING", logger="loader.reader.multiprocess"):
        got = list(reader.multiprocess_reader([_linger_then_count(3) for _ in range(6)], use_pipe)())
    took = time.monotonic() - started
    assert sorted(got) == sorted(list(range(3)) * 6)
    assert took < 4.0, f"{took:.1f}s: a grace period each (6 x 1 s) instead of one for all"
    stopped = sorted(r.getMessage().split(" ")[0] for r in caplog.records)
    assert stopped == [f"multiprocess_reader[{i}]" for i in range(6)]
    assert "sent all its samples but had not exited 1s later" in caplog.records[0].getMessage()


@pytest.mark.parametrize("use_pipe", MODES)
def test_a_sample_the_codec_cannot_encode_travels_pickled(use_pipe, no_leaks):
    got = list(reader.multiprocess_reader([ListReader([Point(1, 2), (Point(3, 4), 5)])], use_pipe)())
    assert got == [Point(1, 2), (Point(3, 4), 5)]


def _nested_tuple(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = (value,)
    return value


@pytest.mark.parametrize("use_pipe", MODES)
def test_tuples_nested_past_the_codec_limit_travel_pickled(use_pipe, no_leaks):
    # The codec encoded them but refused to decode them: the parent raised a bare "tuples nested deeper than 32".
    deep = _nested_tuple(40)
    assert list(reader.multiprocess_reader([ListReader([deep, 2])], use_pipe)()) == [deep, 2]


NamedPoint = collections.namedtuple("NamedPoint", "x y")


@pytest.mark.parametrize("use_pipe", MODES)
def test_subclasses_of_tuple_and_ndarray_keep_their_class(use_pipe, no_leaks):
    # The codec took them for their base class: a namedtuple arrived as a tuple, a masked array without its mask.
    masked = np.ma.masked_array([1, 2, 3], mask=[0, 1, 0])
    got = list(reader.multiprocess_reader([ListReader([NamedPoint(1, 2), [masked]])], use_pipe)())
    assert type(got[0]) is NamedPoint and got[0].y == 2
    assert type(got[1][0]) is np.ma.MaskedArray and got[1][0].mask.tolist() == [False, True, False]


@pytest.mark.parametrize("use_pipe", MODES)
def test_structured_arrays_keep_their_field_names(use_pipe, no_leaks):
    # The codec names a dtype by dtype.str ('|V12'): a structured array arrived as raw void bytes.
    table = np.array([(1, 2.5), (3, 4.5)], dtype=[("a", "<i4"), ("b", "<f8")])
    got = list(reader.multiprocess_reader([ListReader([table, (table[1], 7)])], use_pipe)())
    assert got[0].dtype == table.dtype and got[0]["b"].tolist() == [2.5, 4.5]
    assert got[1][0].dtype == table.dtype and got[1][0]["a"] == 3 and got[1][1] == 7


@pytest.mark.parametrize("use_pipe", MODES)
def test_a_child_error_is_both_a_worker_error_and_a_value_error(use_pipe, no_leaks):
    # A lambda can be neither encoded nor pickled: the child fails, the parent raises.
    with pytest.raises(ValueError) as info:
        list(reader.multiprocess_reader([ListReader([lambda: 1])], use_pipe)())
    assert isinstance(info.value, WorkerError) and isinstance(info.value, reader.MultiprocessReaderError)
    assert "PicklingError" in info.value.type_name or info.value.type_name in {"AttributeError", "TypeError"}


def test_lambdas_and_closures_work(no_leaks):
    data = [1, 2, 3]
    r = reader.multiprocess_reader([lambda: iter(data), lambda: (x * 10 for x in data)])
    assert sorted(r()) == [1, 2, 3, 10, 20, 30]


@pytest.mark.parametrize(
    "bad, error",
    [([], ValueError), ((), ValueError), (RangeReader(3), TypeError), ("ab", TypeError), ([[1, 2]], TypeError)],
)
def test_arguments_validated_when_called(bad, error):
    with pytest.raises(error):
        reader.multiprocess_reader(bad)


class CountingReader:
    """Counts produced samples in shared memory (inherited by the forked child)."""

    def __init__(self) -> None:
        self.produced = multiprocessing.get_context("fork").Value("i", 0)

    def __call__(self):
        for i in range(1000):
            with self.produced.get_lock():
                self.produced.value += 1
            yield i


def test_queue_size_bounds_samples_in_flight(no_leaks):
    src = CountingReader()
    it = reader.multiprocess_reader([src], use_pipe=False, queue_size=2)()
    assert next(it) == 0
    time.sleep(0.3)
    assert src.produced.value <= 1 + 2 + 1  # taken + in flight + the one waiting for credit
    assert list(it) == list(range(1, 1000))


@pytest.mark.parametrize("use_pipe", MODES)
def test_a_reader_in_a_child_may_start_processes(use_pipe, no_leaks):
    # The children were daemons, which multiprocessing forbids to start processes: a nested
    # multiprocess_reader failed with a bare AssertionError (the original's children were not daemons).
    inner = reader.multiprocess_reader([RangeReader(50), RangeReader(160, start=100)], use_pipe=use_pipe)
    outer = reader.multiprocess_reader([inner, RangeReader(1005, start=1000)], use_pipe=not use_pipe)
    assert sorted(outer()) == [*range(50), *range(100, 160), *range(1000, 1005)]
    one_by_one = reader.multiprocess_reader([reader.multiprocess_reader([RangeReader(300)], use_pipe)], use_pipe)
    assert list(one_by_one()) == list(range(300))


def test_abandoned_iterations_leave_no_processes_or_fds(no_leaks):
    children, fds = child_pids(), open_fd_count()
    for i in range(100):
        use_pipe = bool(i % 2)
        it = reader.multiprocess_reader([RangeReader(10_000), RangeReader(10_000)], use_pipe)()
        next(it)
        if i % 3:
            it.close()
        else:
            del it
    assert child_pids() == children
    assert open_fd_count() <= fds


@pytest.mark.parametrize("use_pipe", [True, False], ids=["pipe", "queue"])
def test_a_seeded_shuffle_in_a_child_shuffles_each_pass_as_it_would_in_one_process(use_pipe):
    # The shuffle's pass counter lives in the parent, which never calls it: every pass of the child shuffled
    # alike. Pass k of the merged reader now shuffles as the k-th call in one process, run after run.
    def shuffled():
        return reader.shuffle(lambda: iter(range(30)), 30, seed=5)

    merged = reader.multiprocess_reader([shuffled()], use_pipe=use_pipe)
    in_children = [list(merged()) for _ in range(3)]
    alone = shuffled()
    assert in_children == [list(alone()) for _ in range(3)]
    assert len({tuple(p) for p in in_children}) == 3


@pytest.mark.parametrize("use_pipe", MODES)
def test_a_bytearray_keeps_its_type(use_pipe, no_leaks):
    # msgpack writes it as bytes without asking the codec: it arrived as bytes, deep in a sample too.
    samples = [bytearray(b"ab"), {"k": [(2, bytearray(b"cd"))]}, (1, b"ef"), {"v": memoryview(b"gh")}]
    got = list(reader.multiprocess_reader([ListReader(samples)], use_pipe)())
    assert type(got[0]) is bytearray and got[0] == bytearray(b"ab")
    assert type(got[1]["k"][0][1]) is bytearray and got[1]["k"][0] == (2, bytearray(b"cd"))
    assert got[2] == (1, b"ef") and type(got[2][1]) is bytes
    # A view cannot cross processes (nor be pickled): its bytes do.
    assert got[3] == {"v": b"gh"}
