"""How cost grows: with the number of files, of clients, of workers, and memory with data and epochs.

``run(quick) -> list[dict]`` (the driver's group ``growth``). Run alone:
``python scripts/bench_growth.py [--quick]``. Ours only: each table's peer is our own figure at
the table's first row (or the ideal), so a ratio reads as "how much worse than the small case".

* **files**: the same samples (64 float32 + an int64 label, ``.npz``) split into 10, 1,000 and
  10,000 files (quick: 10, 100, 1,000); 2 workers, batch 256, no shuffling. Every file is one lease
  (a round trip to the coordinator) and one open, so the extra time per epoch over the 10-file case,
  divided by the extra files, is the service's cost per file on this machine. The most files are
  read once more with ``source.files_per_lease = 64`` (lease groups: a lease per 64 files).
* **clients**: 1, 4 and 16 clients of one daemon, each in its own process, all starting together
  after a warm-up epoch; twice: as the ranks of one job (``world_size`` = N: each epoch is cut into
  global steps of N batches, one per rank), and as N jobs of one rank each (every client reads every
  sample, so the workers read each file N times). Total samples/s is all samples over the span from
  the first start to the last end; per client is each client's own rate (mean and lowest).
* **workers**: 1, 2, 4 and 8 workers with the CPU-bound mapper ``loader.examples:cpu_heavy``
  (~0.3 ms per sample, on both sides of ``bench_service``); efficiency is rate(N) over the ideal,
  N x rate(1) up to the core count and (cores) x rate(1) beyond it, where more workers only share
  the same cores. The target (0.9) applies up to the core count.
* **one file**: the workers table's samples in one ``.npy`` file, 1 and 2 workers: leased whole
  (one worker reads the file at a time, whatever the count) and cut into 16 leases of records
  (``source.records_per_lease``) that every worker reads; compared with each other and with 2 x
  the 1-worker rate. The client reads without ``read_ahead``: with it, a whole file keeps two
  workers busy (one on the epoch being read, one on the next), which on these 2 cores hides that
  it keeps no more than two busy on a machine of many.
* **memory**: RSS of the daemon, of each worker and of the client, from ``/proc/PID/status``
  (VmHWM, the peak, compared; VmRSS now and its parts RssAnon, the process's own memory, and
  RssFile/RssShmem, mapped pages that belong to the page cache or to shared memory, in the
  detail), after the warm-up epoch and after the last one, against dataset size (4x the samples
  in 4x the files of the same size), file size (4x the samples in as many files, 4x the size),
  file count (the files table's runs: the same samples in more, smaller files) and epochs (10
  epochs of the 10-file set, against the peak after its second epoch: the first reads fewer
  messages ahead, before prefetch "auto" sizes the read-ahead, so it is a step by design, given
  in the row's detail). The daemon holds the rows of files that arrive ahead of their turn,
  per stream (the epoch being read and the one read ahead), up to ``service.reorder_window_mib``
  (64 MiB by default): so its memory follows the size of a file up to that bound.
* **cold read**: what a dataset larger than the page cache would be bound by: a 256 MiB file
  written, ``fsync``-ed and dropped from the page cache (``posix_fadvise(DONTNEED)``), read once
  cold and once warm, 1 MiB at a time.

BLAS/OpenMP pools are one thread in our processes, as in ``bench_service``.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Helpers in this directory (on sys.path when a script here runs).
from bench_service import child_env, ours_rate, stream_rate
from bench_tools import Serve, child_command, group_main, in_child, memory_kib, process_tree, row

from loader.examples import datagen

BATCH = 256
WORKERS = 2
CLIENT_TIMEOUT_S = 120.0
CLIENTS_TIMEOUT_S = 300.0
MIB = 1024 * 1024
COLD_READ_BYTES = 256 * MIB
GROUPED_PER_LEASE = 64  # the files table's last run again, small files leased this many at a time


@dataclass(frozen=True)
class Sizes:
    total_samples: int  # the files table's dataset, split N ways
    file_counts: tuple[int, ...]
    client_counts: tuple[int, ...]
    client_files: int
    client_samples: int  # per file
    worker_counts: tuple[int, ...]
    heavy_files: int
    heavy_samples: int  # per file
    epochs: int  # measured, after one warm-up epoch
    memory_epochs: int


QUICK = Sizes(64_000, (10, 100, 1000), (1, 4), 4, 16_384, (1, 2, 4), 8, 128, 1, 4)
FULL = Sizes(640_000, (10, 1000, 10_000), (1, 4, 16), 16, 16_384, (1, 2, 4, 8), 16, 256, 2, 10)


def tables(
    files: list[str], workers: int = WORKERS, mappers: tuple[str, ...] = (), per_lease: int = 1
) -> dict[str, dict[str, Any]]:
    return {
        "source": {"files": files, "files_per_lease": per_lease},
        "pipeline": {"batch_size": BATCH, "mappers": list(mappers), "shuffle_buffer": 0, "epochs": 0},
        "workers": {"count": workers},
    }


# -- memory of a daemon's processes -----------------------------------------------------------


def _is_worker(pid: int) -> bool:
    try:
        return "resource_tracker" not in Path(f"/proc/{pid}/cmdline").read_text(errors="replace")
    except OSError:
        return False


def memory_snapshot(daemon_pid: int) -> dict[str, Any]:
    """KiB of the daemon, its workers (the largest of them) and this process (the client)."""
    workers = [pid for pid in process_tree(daemon_pid) if pid != daemon_pid and _is_worker(pid)]
    worker_memory = [memory_kib(pid) for pid in workers]
    return {
        "daemon": memory_kib(daemon_pid),
        "worker": max(worker_memory, key=lambda m: m["VmRSS"]) if worker_memory else {},
        "client": memory_kib(os.getpid()),
    }


def read_here(work: str, files: list[str], epochs: int, per_lease: int = 1, settle: int = 0) -> dict[str, Any]:
    """In a fresh process: a daemon and a client; rate, seconds per epoch and memory after the warm-up
    ("warm"), after ``settle`` more epochs ("first") and after ``epochs`` more ("last")."""
    from loader.service.client.client import Client

    with Serve(work, tables(files, per_lease=per_lease)) as daemon:
        with Client(daemon.address, timeout_s=CLIENT_TIMEOUT_S) as client:
            stream_rate(client.epoch, 1)  # warm-up
            warm = memory_snapshot(daemon.pid)
            if settle:
                stream_rate(client.epoch, settle)
            first = memory_snapshot(daemon.pid)
            rate, samples, seconds = stream_rate(client.epoch, epochs)
            last = memory_snapshot(daemon.pid)
    return {
        "rate": rate,
        "samples": samples,
        "seconds": seconds,
        "epoch_s": seconds / epochs,
        "warm": warm,
        "first": first,
        "last": last,
    }


def split_files(work: str, total: int, count: int, name: str = "files") -> list[str]:
    """``total`` samples in ``count`` .npz files; as a glob (10,000 paths would not fit a command line)."""
    directory = os.path.join(work, f"{name}-{count}")
    datagen.generate(directory, format="npz", files=count, samples=total // count)
    return [os.path.join(directory, "*.npz")]


# -- files ------------------------------------------------------------------------------------


def bench_files(work: str, size: Sizes) -> tuple[list[dict[str, Any]], dict[int, dict[str, Any]]]:
    runs: dict[int, dict[str, Any]] = {}
    for count in size.file_counts:
        files = split_files(work, size.total_samples, count)
        runs[count] = in_child("bench_growth", "read_here", work=work, files=files, epochs=size.epochs)
    base_count = size.file_counts[0]
    base = runs[base_count]
    rows = [files_row(size, count, got, base, base_count) for count, got in runs.items()]
    # The most files again, leased GROUPED_PER_LEASE at a time (``source.files_per_lease``).
    most = size.file_counts[-1]
    grouped = in_child(
        "bench_growth",
        "read_here",
        work=work,
        files=split_files(work, size.total_samples, most),
        epochs=size.epochs,
        per_lease=GROUPED_PER_LEASE,
    )
    rows.append(files_row(size, most, grouped, base, base_count, per_lease=GROUPED_PER_LEASE))
    return rows, runs


def files_row(
    size: Sizes, count: int, got: dict[str, Any], base: dict[str, Any], base_count: int, per_lease: int = 1
) -> dict[str, Any]:
    extra_ms = (got["epoch_s"] - base["epoch_s"]) / (count - base_count) * 1000 if count != base_count else 0.0
    grouped = per_lease > 1
    return row(
        f"files_{count}" + ("_grouped" if grouped else ""),
        got["rate"],
        base["rate"],
        "samples/s",
        "none (cost per file)",
        None,
        f"{size.total_samples:,} samples (64 float32 + label) in {count:,} .npz files of "
        f"{size.total_samples // count:,}"
        + (f", source.files_per_lease = {per_lease}" if grouped else "")
        + f", {WORKERS} workers, batch {BATCH}; epoch {got['epoch_s']:.2f}s; "
        + (
            f"{extra_ms:.3f} ms per extra file over the {base_count}-file epoch"
            if count != base_count
            else "peer = the first row"
        ),
    )


# -- clients ----------------------------------------------------------------------------------


def client_here(address: str, rank: int, count: int, shared: bool, epochs: int, ready_dir: str) -> dict[str, Any]:
    """Client ``rank`` of ``count``: a warm-up epoch, then wait for every client (files in ``ready_dir``),
    then ``epochs`` epochs. ``shared``: the ranks of one job; else a job of its own (the whole epoch)."""
    from loader.service.client.client import Client

    options = {"rank": rank, "world_size": count} if shared else {"rank": 0, "world_size": 1, "job": f"job-{rank}"}
    with Client(address, timeout_s=CLIENT_TIMEOUT_S, **options) as client:
        stream_rate(client.epoch, 1)
        Path(ready_dir, f"client-{rank}").touch()
        deadline = time.monotonic() + CLIENT_TIMEOUT_S
        while len(os.listdir(ready_dir)) < count and time.monotonic() < deadline:
            time.sleep(0.005)
        start = time.monotonic()
        _, samples, _ = stream_rate(client.epoch, epochs)
        end = time.monotonic()
    return {"samples": samples, "start": start, "end": end}


def clients_run(work: str, files: list[str], count: int, shared: bool, epochs: int) -> dict[str, Any]:
    ready_dir = tempfile.mkdtemp(prefix=f"ready-{count}-", dir=work)
    with Serve(work, tables(files)) as daemon:
        procs = [
            subprocess.Popen(
                child_command(
                    "bench_growth",
                    "client_here",
                    address=daemon.address,
                    rank=rank,
                    count=count,
                    shared=shared,
                    epochs=epochs,
                    ready_dir=ready_dir,
                ),
                stdout=subprocess.PIPE,
                text=True,
                env=child_env(),
            )
            for rank in range(count)
        ]
        try:
            outs = [proc.communicate(timeout=CLIENTS_TIMEOUT_S)[0] for proc in procs]
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(timeout=10)
        if any(proc.returncode for proc in procs):
            raise RuntimeError(f"a client failed: exit codes {[proc.returncode for proc in procs]}")
    got = [json.loads(out.strip().splitlines()[-1]) for out in outs]
    late = max(g["start"] for g in got) - min(g["start"] for g in got)
    span = max(g["end"] for g in got) - min(g["start"] for g in got)
    per_client = [g["samples"] / (g["end"] - g["start"]) for g in got]
    return {
        "total": sum(g["samples"] for g in got) / span,
        "mean": statistics.mean(per_client),
        "lowest": min(per_client),
        "late": late,
        "span": span,
    }


def bench_clients(work: str, size: Sizes) -> list[dict[str, Any]]:
    files = datagen.generate(
        os.path.join(work, "clients"), format="npz", files=size.client_files, samples=size.client_samples
    )
    epoch_samples = size.client_files * size.client_samples
    rows = []
    for shared, kind in ((True, "ranks"), (False, "jobs")):
        runs = {count: clients_run(work, files, count, shared, size.epochs) for count in size.client_counts}
        base = runs[size.client_counts[0]]
        how = (
            "the ranks of one job (each epoch split between them)"
            if shared
            else "one job each (every client reads the whole epoch)"
        )
        rows += [
            row(
                f"clients_{count}_{kind}_total",
                got["total"],
                base["total"],
                "samples/s",
                "none (total, vs 1 client)",
                None,
                f"{count} client process(es), {how}, {WORKERS} workers, batch {BATCH}, {epoch_samples:,} samples "
                f"an epoch x {size.epochs}; per client: mean {got['mean']:,.0f}/s, lowest {got['lowest']:,.0f}/s; "
                f"starts spread over {got['late'] * 1000:.0f} ms",
            )
            for count, got in runs.items()
        ]
    return rows


# -- workers ----------------------------------------------------------------------------------


def bench_workers(work: str, size: Sizes) -> list[dict[str, Any]]:
    files = datagen.generate(
        os.path.join(work, "heavy"), format="npz", files=size.heavy_files, samples=size.heavy_samples
    )
    cores = os.cpu_count() or 1
    rates: dict[int, float] = {}
    for workers in size.worker_counts:
        rates[workers], _ = ours_rate(
            work, files, batch_size=BATCH, workers=workers, epochs=size.epochs, mappers=["loader.examples:cpu_heavy"]
        )
    one = rates[size.worker_counts[0]] / size.worker_counts[0]
    rows = []
    for workers, rate in rates.items():
        ideal = min(workers, cores) * one
        within = workers <= cores
        rows.append(
            row(
                f"workers_{workers}_cpu_heavy",
                rate,
                ideal,
                "samples/s",
                ">= 0.9x ideal" if within else f"none (> {cores} cores)",
                rate >= 0.9 * ideal if within else None,
                f"loader.examples:cpu_heavy, {size.heavy_files * size.heavy_samples:,} samples, batch {BATCH}; "
                f"peer = ideal = {min(workers, cores)} x the 1-worker rate ({one:,.0f}/s)"
                + ("" if within else f"; this machine has {cores} cores, so {workers} workers share them"),
            )
        )
    return rows


def bench_one_file(work: str, size: Sizes) -> list[dict[str, Any]]:
    """One file for 1 and 2 workers: leased whole (one worker reads it at a time), then cut into pieces of
    records (``source.records_per_lease``) that every worker reads."""
    samples = 4 * size.heavy_files * size.heavy_samples  # epochs of about a second: one read at a time
    files = datagen.generate(os.path.join(work, "one"), format="npy", files=1, samples=samples)
    per_lease = max(1, samples // 16)
    heavy = ["loader.examples:cpu_heavy"]
    rates: dict[tuple[int, int], float] = {}
    for workers in (1, 2):
        for pieces in (0, per_lease):
            rates[workers, pieces], _ = ours_rate(
                work,
                files,
                batch_size=BATCH,
                workers=workers,
                epochs=size.epochs,
                mappers=heavy,
                records_per_lease=pieces,
            )
    one = rates[1, per_lease]
    what = f"1 .npy file of {samples:,} samples, loader.examples:cpu_heavy, batch {BATCH}"
    return [
        row(
            "one_file_2_workers_pieces_vs_whole",
            rates[2, per_lease],
            rates[2, 0],
            "samples/s",
            "> 1.0",
            rates[2, per_lease] > rates[2, 0],
            f"{what}; source.records_per_lease = {per_lease:,} against whole-file leases "
            f"(1 worker: {rates[1, per_lease]:,.0f} and {rates[1, 0]:,.0f}/s)",
        ),
        row(
            "one_file_2_workers_pieces_of_ideal",
            rates[2, per_lease],
            2 * one,
            "samples/s",
            ">= 0.9x ideal",
            rates[2, per_lease] >= 0.9 * 2 * one,
            f"{what}; peer = ideal = 2 x the 1-worker rate with pieces ({one:,.0f}/s)",
        ),
    ]


# -- memory -----------------------------------------------------------------------------------


def _mib(kib: int) -> str:
    return f"{kib / 1024:.0f}"


def _memory_detail(snapshot: dict[str, Any]) -> str:
    parts = []
    for who in ("daemon", "worker", "client"):
        m = snapshot[who]
        parts.append(
            f"{who} peak {_mib(m['VmHWM'])} MiB, now {_mib(m['VmRSS'])} (anon {_mib(m['RssAnon'])}, "
            f"file {_mib(m['RssFile'])}, shm {_mib(m['RssShmem'])})"
        )
    return "; ".join(parts)


def _peak_kib(snapshot: dict[str, Any]) -> int:
    """Peak RSS (VmHWM) of the daemon + one worker + the client: what a leak or unbounded buffering would grow."""
    return sum(snapshot[who]["VmHWM"] for who in ("daemon", "worker", "client"))


def _memory_row(name: str, grown: dict[str, Any], base: dict[str, Any], what: str) -> dict[str, Any]:
    ours, peer = _peak_kib(grown) / 1024, _peak_kib(base) / 1024
    return row(
        name,
        ours,
        peer,
        "MiB peak",
        "<= 1.10x (flat)",
        ours <= 1.10 * peer,
        f"{what}; peak RSS of daemon + one worker + client; large: {_memory_detail(grown)}; "
        f"small: {_memory_detail(base)}",
    )


def bench_memory(work: str, size: Sizes, file_runs: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    count = size.file_counts[0]
    small = split_files(work, size.total_samples, count)
    more = split_files(work, 4 * size.total_samples, 4 * count, "more")  # 4x the data in 4x the files
    bigger = split_files(work, 4 * size.total_samples, count, "bigger")  # 4x the data in files 4x the size
    # Epochs: growth from the end of the second epoch on. The first reads 4 messages ahead; from the second on,
    # prefetch "auto" reads as many as fit in 128 MiB (up to 16, docs/internals.md): a step up by design, once,
    # which the row's detail gives (after 1 epoch) apart from what a leak would show (growth over 10 epochs).
    long = in_child("bench_growth", "read_here", work=work, files=small, epochs=size.memory_epochs, settle=1)
    more_run = in_child("bench_growth", "read_here", work=work, files=more, epochs=size.epochs)
    bigger_run = in_child("bench_growth", "read_here", work=work, files=bigger, epochs=size.epochs)
    most = size.file_counts[-1]
    mib = size.total_samples * 264 / MIB  # 64 float32 + an int64 per sample
    base = file_runs[count]["last"]
    return [
        _memory_row(
            "memory_vs_epochs",
            long["last"],
            long["first"],
            f"after {size.memory_epochs + 2} epochs (large) vs after 2 (small), {count} files, {mib:.0f} MiB; "
            f"after 1 epoch (4 messages ahead, before prefetch 'auto' steps up): {_peak_kib(long['warm']) / 1024:.0f} "
            f"MiB peak ({_peak_kib(long['last']) / _peak_kib(long['warm']):.2f}x)",
        ),
        _memory_row(
            "memory_vs_dataset_size",
            more_run["last"],
            base,
            f"{4 * mib:.0f} MiB in {4 * count} files (large) vs {mib:.0f} MiB in {count} (small), "
            f"{mib / count:.0f} MiB a file",
        ),
        _memory_row(
            "memory_vs_file_size",
            bigger_run["last"],
            base,
            f"{count} files of {4 * mib / count:.0f} MiB (large) vs of {mib / count:.0f} MiB (small)",
        ),
        _memory_row(
            "memory_vs_file_count",
            file_runs[most]["last"],
            base,
            f"{most:,} files (large) vs {count} (small), {mib:.0f} MiB in all",
        ),
    ]


# -- what a dataset larger than the page cache would be bound by ---------------------------------


def _read_all(path: str) -> float:
    start = time.perf_counter()
    with open(path, "rb", buffering=0) as fh:
        while fh.read(MIB):
            pass
    return time.perf_counter() - start


def bench_cold_read(work: str) -> list[dict[str, Any]]:
    path = os.path.join(work, "cold.bin")
    with open(path, "wb") as fh:
        block = os.urandom(MIB)
        for _ in range(COLD_READ_BYTES // MIB):
            fh.write(block)
        fh.flush()
        os.fsync(fh.fileno())
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # drops this file's clean pages from the page cache
    finally:
        os.close(fd)
    cold = _read_all(path)
    warm = min(_read_all(path) for _ in range(2))
    os.remove(path)
    cold_mb, warm_mb = COLD_READ_BYTES / cold / 1e6, COLD_READ_BYTES / warm / 1e6
    return [
        row(
            "cold_read_256MiB",
            cold_mb,
            warm_mb,
            "MB/s",
            "none (the disk's bound)",
            None,
            f"{path.rsplit(os.sep, 2)[0]}: read after fsync + posix_fadvise(DONTNEED), 1 MiB reads; "
            "peer = the same file from the page cache; a ratio near 1 means the drop did not reach the device",
        )
    ]


def run(quick: bool = False) -> list[dict[str, Any]]:
    size = QUICK if quick else FULL
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="loader-bench-growth-") as work:
        file_rows, file_runs = bench_files(work, size)
        rows += file_rows
        rows += bench_clients(work, size)
        rows += bench_workers(work, size)
        rows += bench_one_file(work, size)
        rows += bench_memory(work, size, file_runs)
        rows += bench_cold_read(work)
    return rows


def main(argv: list[str] | None = None) -> int:
    return group_main(__doc__ or "", run, "smaller tables (fewer files, clients and workers)", argv)


if __name__ == "__main__":
    sys.exit(main())
