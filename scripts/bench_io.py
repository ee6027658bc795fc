"""Benchmarks of ``loader.io`` (imported by ``scripts/bench``; ``run(quick)`` -> rows).

1. ``open_files`` over 16 ``.npy`` files of 64-float32 rows, 2 threads, read one
   instance at a time, against the plain single-threaded Python loop over the
   same memory-mapped arrays (``for row in np.load(f, mmap_mode="r")``).
   ratio = ours / peer in instances/s; target: ratio >= 0.5.
2. ``DoubleBufferReader`` over a reader that takes 5 ms per batch, for a consumer
   that takes 5 ms per batch, against the same loop without double buffering.
   ratio = ours / peer in seconds (lower is better); target: ratio <= 0.6.

Both sides run in the same process, alternately, best of a few repeats (the
machine is shared); files are written first, so both read from the page cache.
Run alone: ``.venv/bin/python scripts/bench_io.py [--quick]``.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable

import numpy as np

import loader.io as lio

ROW_FLOATS = 64
NUM_FILES = 16
THREADS = 2
BATCH_DELAY_S = 0.005


def _best(fn: Callable[[], float], repeats: int) -> float:
    return min(fn() for _ in range(repeats))


def _write_npy(directory: str, rows: int) -> list[str]:
    rng = np.random.default_rng(0)
    paths = []
    for i in range(NUM_FILES):
        path = os.path.join(directory, f"part-{i:02d}.npy")
        np.save(path, rng.random((rows, ROW_FLOATS), dtype=np.float32))
        paths.append(path)
    return paths


def _peer_loop(paths: list[str]) -> float:
    start = time.perf_counter()
    count = 0
    for path in paths:
        for _row in np.load(path, mmap_mode="r"):
            count += 1
    return time.perf_counter() - start


def _ours_open_files(paths: list[str]) -> float:
    start = time.perf_counter()
    count = 0
    with lio.open_files(paths, [[-1, ROW_FLOATS]], ["float32"], thread_num=THREADS) as reader:
        while reader.read_next():
            count += 1
    return time.perf_counter() - start


def bench_open_files(quick: bool) -> dict:
    rows = 2_000 if quick else 20_000
    repeats = 2 if quick else 3
    directory = tempfile.mkdtemp(prefix="bench_io_")
    try:
        paths = _write_npy(directory, rows)
        total = rows * NUM_FILES
        peer_times, our_times = [], []
        for _ in range(repeats):  # alternate, so both see the same machine load
            peer_times.append(_peer_loop(paths))
            our_times.append(_ours_open_files(paths))
        peer, ours = total / min(peer_times), total / min(our_times)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    ratio = ours / peer
    return {
        "name": "io: open_files 16 npy, 2 threads (inst/s)",
        "ours": ours,
        "peer": peer,
        "unit": "instances/s",
        "ratio": ratio,
        "target": "ours/peer >= 0.5",
        "passed": ratio >= 0.5,
        "detail": f"{NUM_FILES} files x {rows} rows x {ROW_FLOATS} float32; peer = plain loop over memmapped rows; "
        f"best of {repeats}",
    }


class _SlowBatches(lio.ReaderBase):
    """``n`` batches, each taking ``BATCH_DELAY_S`` to produce (sleep: I/O-like, releases the GIL)."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n, self.i = n, 0
        self.batch = [np.zeros((32, ROW_FLOATS), np.float32)]

    @property
    def slot_names(self) -> list[str]:
        return ["x"]

    def _read_next_impl(self) -> list[np.ndarray]:
        if self.i >= self.n:
            return []
        time.sleep(BATCH_DELAY_S)
        self.i += 1
        return self.batch

    def _reinit_impl(self) -> None:
        self.i = 0


def _consume(reader: lio.ReaderBase) -> float:
    start = time.perf_counter()
    with reader:
        for _batch in reader:
            time.sleep(BATCH_DELAY_S)  # the training step
    return time.perf_counter() - start


def bench_double_buffer(quick: bool) -> dict:
    batches = 20 if quick else 100
    repeats = 1 if quick else 3
    serial = _best(lambda: _consume(_SlowBatches(batches)), repeats)
    buffered = _best(lambda: _consume(lio.DoubleBufferReader(_SlowBatches(batches))), repeats)
    ratio = buffered / serial
    return {
        "name": "io: double buffer 5ms read + 5ms step (time)",
        "ours": buffered,
        "peer": serial,
        "unit": "s",
        "ratio": ratio,
        "target": "ours/peer <= 0.6",
        "passed": ratio <= 0.6,
        "detail": f"{batches} batches; peer = the same reader read serially; best of {repeats}",
    }


def run(quick: bool = False) -> list[dict]:
    """Measure every io benchmark once; see the module docstring for what each compares."""
    return [bench_open_files(quick), bench_double_buffer(quick)]


if __name__ == "__main__":
    if {"-h", "--help"} & set(sys.argv[1:]):  # the docstring is the usage; run nothing
        print(__doc__)
        sys.exit(0)
    for row in run(quick="--quick" in sys.argv[1:]):
        print(
            f"{row['name']:<48} ours={row['ours']:.4g} peer={row['peer']:.4g} {row['unit']} "
            f"ratio={row['ratio']:.2f} ({row['target']}) {'ok' if row['passed'] else 'FAILED'}"
        )
