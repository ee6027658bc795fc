"""Throughput of one "pipe"/"queue" worker link, read the way the daemon reads it.

A spawned writer process sends N messages of one size through a real link
(``transport.links.WorkerLinks``: its ``PipeChannel``/``QueuedChannel``, i.e.
``Connection.send_bytes``); this process polls the daemon's end with
``transport.Poller`` and drains it with ``recv(0)``, as ``Daemon.step`` does.
The clock starts at the first message, so process start-up is not counted.

    .venv/bin/python scripts/pipe_link_bench.py [pipe|queue] [repeats]

Prints the best MB/s of ``repeats`` runs per message size (the machine is shared: compare runs
taken back to back).
"""

from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np

from loader.runtime import processes
from loader.service import transport
from loader.service.transport.links import WorkerLinks

CASES = [  # (name, payload bytes per message, messages)
    ("1 MiB x 2048 (2 GiB)", 1 << 20, 2048),
    ("4 MiB x 512 (2 GiB)", 4 << 20, 512),
    ("64 MiB x 16 (1 GiB)", 64 << 20, 16),
    ("256 MiB x 4 (1 GiB)", 256 << 20, 4),
    ("64 KiB x 16384 (1 GiB)", 64 << 10, 16384),
    ("2 KiB x 200000", 2 << 10, 200_000),
]
STALL_TIMEOUT_S = 30.0


def _writer(end: Any, size: int, count: int) -> None:
    control, data = end.open_channels()
    payload = np.random.default_rng(0).integers(0, 255, size, dtype=np.uint8)
    head = b"h" * 40
    for _ in range(count):
        data.send([head, payload], timeout_s=STALL_TIMEOUT_S)
    data.close()
    control.close()


def run_case(kind: str, size: int, count: int) -> float:
    """MB/s of ``count`` messages of ``size`` bytes through one fresh link."""
    links = WorkerLinks(kind)
    end = links.new_link()
    proc = processes.start_process(_writer, (end, size, count), name="pipe-link-bench-writer")
    end.close()
    poller = transport.Poller()
    poller.register(links.data)
    got = nbytes = 0
    start = None
    try:
        while got < count:
            if links.data not in poller.wait(STALL_TIMEOUT_S):
                raise RuntimeError("the writer stalled")
            while (frames := links.data.recv(0)) is not None:
                start = time.perf_counter() if start is None else start
                got += 1
                nbytes += frames[1].nbytes
        assert start is not None
        return nbytes / (time.perf_counter() - start) / 1e6
    finally:
        processes.stop_process(proc, 5)
        links.close()


def main(argv: list[str]) -> None:
    kind = argv[0] if argv else "pipe"
    repeats = int(argv[1]) if len(argv) > 1 else 3
    for name, size, count in CASES:
        best = max(run_case(kind, size, count) for _ in range(repeats))
        print(f"{kind:5s} {name:24s} best {best:8.0f} MB/s", flush=True)


if __name__ == "__main__":
    if {"-h", "--help"} & set(sys.argv[1:]):  # the docstring is the usage; run nothing
        print(__doc__)
        sys.exit(0)
    main(sys.argv[1:])
