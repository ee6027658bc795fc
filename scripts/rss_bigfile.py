"""Daemon memory against file size: one big .npy, a client that reads a few batches and stops.

    python scripts/rss_bigfile.py [--mib 1024] [--dir /tmp]

Starts a daemon (``loader.service.daemon.loop.Daemon``) in a child process with shared memory
off (rows travel inline, so all buffered rows are the daemon's own memory), connects a client
that takes a few batches and then stops reading for ``--hold-s`` seconds, and prints the
daemon's peak RSS (VmHWM) next to the stage's configured bound
(``2 * buffer_limit_rows`` rows x row bytes). Before the stage stopped reading when full, the
peak grew with the file; now it stays near the bound.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import tempfile
import time

import numpy as np

ROW_FLOATS = 1024  # 4 KiB rows: below the shared-memory threshold anyway


def _serve(config_dict: dict, ready: multiprocessing.Queue, stop: multiprocessing.Event) -> None:
    from loader.config import LoaderConfig
    from loader.service.daemon.loop import Daemon

    with Daemon(LoaderConfig.from_dict(config_dict)) as daemon:
        ready.put(daemon.endpoint)
        while not stop.is_set():
            daemon.step(0.05)


def _kib(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--dir", default=tempfile.gettempdir())
    parser.add_argument("--hold-s", type=float, default=20.0)
    args = parser.parse_args()
    from loader import Client

    path = os.path.join(args.dir, f"rss-bigfile-{os.getpid()}.npy")
    rows = args.mib * 1024 * 1024 // (4 * ROW_FLOATS)
    data = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(rows, ROW_FLOATS))
    data[:] = 1.0
    data.flush()
    del data
    batch_size, prefetch, spm = 64, 4, 256
    config = {
        "source": {"files": [path]},
        "pipeline": {"batch_size": batch_size, "seed": 1},
        "workers": {"count": 2, "shm_arena_mib": 0, "samples_per_message": spm},
        "service": {"bind": "tcp://127.0.0.1:*"},
    }
    ctx = multiprocessing.get_context("spawn")
    ready, stop = ctx.Queue(), ctx.Event()
    proc = ctx.Process(target=_serve, args=(config, ready, stop))
    proc.start()
    try:
        endpoint = ready.get(timeout=60)
        base = _kib(proc.pid, "VmRSS")
        with Client(endpoint, prefetch=prefetch, timeout_s=60) as client:
            batches = client.epoch()
            for _ in range(3):
                next(batches)
            time.sleep(args.hold_s)  # the training loop stops reading; the daemon must not read on
            peak = _kib(proc.pid, "VmHWM")
        bound_rows = 2 * (batch_size * (prefetch + 2) + spm)
        print(f"file: {args.mib} MiB ({rows} rows of {4 * ROW_FLOATS} bytes)")
        print(f"daemon RSS at start: {base / 1024:.0f} MiB; peak while the client stopped: {peak / 1024:.0f} MiB")
        print(
            f"growth: {(peak - base) / 1024:.0f} MiB; the stage's bound: {bound_rows * 4 * ROW_FLOATS / 2**20:.1f} MiB"
        )
    finally:
        stop.set()
        proc.join(30)
        if proc.is_alive():
            proc.kill()
        os.unlink(path)


if __name__ == "__main__":
    main()
