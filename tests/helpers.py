"""Picklable fakes and fault injectors shared by the tests.

Every factory returns a module-level class instance (not a closure), so it can
cross a ``spawn`` process boundary as well as a ``fork``.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

# The repository's root, for tests that read shipped files (configs, scripts).
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Boom(RuntimeError):
    """The exception the injectors raise, so tests can match it exactly."""


class RangeReader:
    """A reader of ``start .. stop-1`` (a zero-argument callable, as the seeds define)."""

    def __init__(self, stop: int, start: int = 0) -> None:
        self.start, self.stop = start, stop

    def __call__(self) -> Iterator[int]:
        return iter(range(self.start, self.stop))


class ListReader:
    """A reader over a fixed list of samples."""

    def __init__(self, items: list[Any]) -> None:
        self.items = list(items)

    def __call__(self) -> Iterator[Any]:
        return iter(list(self.items))


class raise_on:  # reads like the function it stands for
    """A reader yielding ``0..n-1`` then raising ``Boom`` at sample ``n``.

    Also usable as a mapper: ``raise_on(n)(x)`` raises when ``x == n``.
    """

    def __init__(self, n: int, message: str = "injected failure") -> None:
        self.n, self.message = n, message

    def __call__(self, *value: Any) -> Any:
        if value:
            if value[0] == self.n:
                raise Boom(f"{self.message} at sample {self.n}")
            return value[0]
        return self._gen()

    def _gen(self) -> Iterator[int]:
        yield from range(self.n)
        raise Boom(f"{self.message} at sample {self.n}")


class exit_with:
    """A reader that yields ``after`` samples then kills its process with ``os._exit(code)``."""

    def __init__(self, code: int, after: int = 0) -> None:
        self.code, self.after = code, after

    def __call__(self) -> Iterator[int]:
        yield from range(self.after)
        os._exit(self.code)


class hang_forever:
    """A reader that yields ``after`` samples then blocks (bounded by ``limit_s``)."""

    def __init__(self, after: int = 0, limit_s: float = 600.0) -> None:
        self.after, self.limit_s = after, limit_s

    def __call__(self) -> Iterator[int]:
        yield from range(self.after)
        time.sleep(self.limit_s)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(predicate: Callable[[], bool], timeout_s: float = 10.0, interval_s: float = 0.02) -> bool:
    """Poll ``predicate`` until it is true or ``timeout_s`` passes; returns its last value."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return bool(predicate())


def threads_cpu_s(threads: Iterable[threading.Thread]) -> float:
    """CPU seconds used so far by ``threads``, which must be alive (per-thread CPU clocks).

    A blocked thread's clock stands still however loaded the machine is, so "used little CPU
    while waiting" is a check that cannot fail because the machine is busy.
    """
    return sum(time.clock_gettime(time.pthread_getcpuclockid(t.ident or 0)) for t in threads)


class CpuWhileWaiting:
    """Holds a gate shut and measures the CPU that the threads waiting behind it use meanwhile.

    ``hold(threads)`` (from a helper thread) reads their clocks, keeps the gate shut for
    ``WINDOW_S`` (a measuring window: a spinning thread burns CPU through it), reads the clocks
    again and opens the gate. ``used_s`` is the difference.
    """

    WINDOW_S = 0.3
    GATE_TIMEOUT_S = 30.0

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.used_s: float | None = None

    def hold(self, threads: Callable[[], list[threading.Thread]], ready: Callable[[], bool]) -> threading.Thread:
        def measure() -> None:
            try:
                if wait_until(ready, timeout_s=self.GATE_TIMEOUT_S, interval_s=0.01):
                    waiting = threads()
                    start = threads_cpu_s(waiting)
                    time.sleep(self.WINDOW_S)
                    self.used_s = threads_cpu_s(waiting) - start
            finally:
                self.gate.set()

        thread = threading.Thread(target=measure, name="cpu-while-waiting", daemon=True)
        thread.start()
        return thread


def live_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.is_alive()}


def _proc_state(pid: int | str) -> tuple[bytes, int] | None:
    """(state letter, parent pid) of a process from /proc, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return fields[0], int(fields[1])


def child_pids(parent: int | None = None) -> set[int]:
    """Live child processes of ``parent`` (default: this process), zombies excluded (Linux /proc)."""
    parent = os.getpid() if parent is None else parent
    found: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        state = _proc_state(entry)
        if state is not None and state[1] == parent and state[0] != b"Z":
            found.add(int(entry))
    return found


def is_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    state = _proc_state(pid)
    return state is not None and state[0] != b"Z"


def open_fd_count() -> int:
    return len(os.listdir(f"/proc/{os.getpid()}/fd"))


# --- service test helpers (picklable mappers and readers for spawned workers) ---


class slow_mapper:
    """A mapper that sleeps ``delay_s`` per sample and returns it unchanged."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s

    def __call__(self, sample: Any) -> Any:
        time.sleep(self.delay_s)
        return sample


class fail_on_values:
    """A mapper raising ``Boom`` for samples whose first part is in ``values``."""

    def __init__(self, values: Any) -> None:
        self.values = {int(v) for v in values}

    def __call__(self, sample: Any) -> Any:
        first = sample[0] if isinstance(sample, (tuple, list)) else sample
        if int(first) in self.values:
            raise Boom(f"bad value {int(first)}")
        return sample


# Module-level instances, so a config can name them as "tests.helpers:NAME".
slow_sample_2ms = slow_mapper(0.002)
slow_sample_500ms = slow_mapper(0.5)
fail_on_1234 = fail_on_values([1234])


def identity_mapper(sample: Any) -> Any:
    return sample


def id_and_code_block(block: dict[str, Any]) -> dict[str, Any]:
    """A row-wise batch mapper: keeps ``data`` (the ids) and adds ``code = 3 * id + 1`` (int64)."""
    ids = block["data"]
    return {"data": ids, "code": ids.astype("int64") * 3 + 1}


def range_file_reader(path: str) -> Callable[[], Iterator[tuple[int, str]]]:
    """A ``source.reader`` for text files holding "start stop": yields (i, "s<i>") samples."""
    with open(path, encoding="utf-8") as fh:
        start, stop = (int(x) for x in fh.read().split())
    return lambda: ((i, f"s{i}") for i in range(start, stop))


class sleep_on_values:
    """A mapper that sleeps ``delay_s`` on samples whose first part is in ``values`` (a slow, live worker)."""

    def __init__(self, values: Any, delay_s: float) -> None:
        self.values, self.delay_s = {int(v) for v in values}, delay_s

    def __call__(self, sample: Any) -> Any:
        first = sample[0] if isinstance(sample, (tuple, list)) else sample
        if int(first) in self.values:
            time.sleep(self.delay_s)
        return sample


class hang_once_on:
    """A mapper that hangs (bounded by ``limit_s``) the first time any process maps ``value``.

    "First" is decided by creating the file named by ``$LOADER_TEST_HANG_MARKER``
    (O_EXCL), so the replacement worker that re-reads the file goes through.
    """

    def __init__(self, value: int, limit_s: float = 60.0) -> None:
        self.value, self.limit_s = value, limit_s

    def __call__(self, sample: Any) -> Any:
        first = sample[0] if isinstance(sample, (tuple, list)) else sample
        marker = os.environ.get("LOADER_TEST_HANG_MARKER")
        if int(first) == self.value and marker:
            try:
                os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                return sample
            time.sleep(self.limit_s)
        return sample


# Module-level instances for configs (ids 7, 5 and 3000 are in file f000 of write_id_files).
sleep_1500ms_on_7 = sleep_on_values([7], 1.5)
hang_once_on_5 = hang_once_on(5)
hang_on_3000 = sleep_on_values([3000], 60.0)  # every time: its workers are stopped as hung, one after another


def ragged_by_value(sample: Any) -> Any:
    """A mapper making sample v a vector of ``v % 3 + 1`` copies of v: ragged samples."""
    value = int(np.asarray(sample[0] if isinstance(sample, (tuple, list)) else sample).reshape(-1)[0])
    return (np.full(value % 3 + 1, value, dtype=np.int64),)


class exit_on_value:
    """A mapper that kills its worker process (``os._exit``) on the sample whose first part is ``value``."""

    def __init__(self, value: int, code: int = 3) -> None:
        self.value, self.code = value, code

    def __call__(self, sample: Any) -> Any:
        first = sample[0] if isinstance(sample, (tuple, list)) else sample
        if int(np.asarray(first).reshape(-1)[0]) == self.value:
            os._exit(self.code)
        return sample


exit_on_123456789 = exit_on_value(123456789)


def die_at_start(connect: Any, *, worker_id: str, stop_event: Any) -> int:
    """A worker entry point that exits at once with code 7, before saying hello (a broken environment)."""
    return 7


def never_says_hello(connect: Any, *, worker_id: str, stop_event: Any) -> int:
    """A worker entry point that never connects (a worker still starting, or waiting for a CPU), bounded by 60 s."""
    stop_event.wait(60.0)
    return 0


def set_flags(*assignments: str) -> list[Any]:
    """``SECTION.KEY=VALUE`` strings as the command line's ``--set`` arguments reach ``load_config`` (its errors
    name the flag; a Python caller's plain strings are named as ``overrides`` items)."""
    from loader.config.overrides import from_assignment

    return [from_assignment(a) for a in assignments]
