"""The service benchmark: ``loader serve`` + ``Client`` against ``torch.utils.data.DataLoader``.

``run(quick=False) -> list[dict]``, one dict per measurement with the keys
``name, ours, peer, unit, ratio, target, passed, detail`` (the ``scripts/bench``
driver prints them). Run alone: ``python scripts/bench_service.py [--quick]``.

How it is kept honest (both sides in one run, same files, same work):

* Data is written once by ``loader.examples.datagen`` into a temp dir; both sides read
  the same files. Small samples: uncompressed ``.npz`` (``x`` float32[64] +
  ``label`` int64), which our reader memory-maps; torch's map-style Dataset
  loads the same two arrays with ``np.load`` (in RAM: if anything faster than
  our memory map). 1 MiB samples: ``.npy``, memory-mapped on both sides.
* Ours: a real daemon (``python -m loader.cli serve``) in its own process
  with N worker processes, and a ``Client`` in a fresh Python process (this
  script re-run with ``--child``), so this process never holds a ZeroMQ
  context that torch's forked workers would inherit. Torch: a
  ``DataLoader`` with the same batch size and ``num_workers=N``, default
  collate, no shuffling on either side (``shuffle_buffer = 0``), no pinning.
* ``persistent_workers=True`` for torch: its workers then stay up between
  epochs as our daemon's do, which is the faster, fairer choice for the peer
  (without it every epoch pays a fork of N workers).
* One full warm-up epoch on each side is excluded; then ``E`` epochs run back
  to back and the rate is total samples (or bytes) over their total time, as a
  training loop would see it. The consumer only counts rows on both sides.
* Each side is measured ``trials`` times (3 in a full run, 2 in a quick one),
  alternating ours/peer, and the best of each is kept: on a shared machine the
  best run is the one least disturbed by other load, for both sides alike.
* 1 MiB samples: ``workers.samples_per_message = 8`` (one batch per message);
  the default gives the same chunks, since a worker sizes blocks by bytes.
* Small samples: the defaults (blocks of about 1 MiB from the worker, batches
  packed up to 1 MiB per message to the client).
* The CPU-heavy mapper is ``loader.examples:cpu_heavy`` on both sides
  (~0.3 ms of numpy per sample), applied per sample inside the workers.
* The batch-mapper case is not like for like, and says so: ours runs
  ``loader.examples:cpu_heavy_batch`` (the same function, vectorised: the same
  values bit for bit) as a ``pipeline.batch_mappers`` entry, once per block of up
  to 256 samples; the DataLoader runs the per-sample ``cpu_heavy``, as a
  map-style Dataset does. It measures what moving a per-sample numpy transform
  to a batch mapper gains over the usual DataLoader code.
* Time to first batch: a fresh ``Client`` against a warm daemon (workers up,
  one epoch served), median of several; the peer figure is torch's
  ``iter(DataLoader)`` to first batch with non-persistent workers.

BLAS/OpenMP pools are one thread in our processes (``child_env``), as torch
sets in its workers, so neither side gets hidden parallelism (the mapper's
64x64 products are below BLAS threading thresholds anyway). On a shared or 2-core machine the figures move with load:
read ``detail`` and rerun before trusting a near miss.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

# scripts/demo.py (this directory is on sys.path): starting, awaiting and stopping `loader serve`.
from demo import free_port, start_daemon, stop_daemon, wait_ready

from loader.examples import cpu_heavy, datagen

ONE_THREAD = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
SERVE_START_TIMEOUT_S = 30.0
CLIENT_TIMEOUT_S = 60.0
CHILD_TIMEOUT_S = 300.0
MIB = 1024 * 1024
SMALL_TARGET_RATE = 2_000_000  # samples/s of 64 float32 + label (the goal: bytes, not Python, bound it)


@dataclass(frozen=True)
class Sizes:
    small_files: int
    small_samples: int  # per file
    heavy_files: int
    heavy_samples: int
    large_files: int
    large_samples: int  # 1 MiB each
    large_epochs: int  # measured: our side's epoch of 1 MiB rows lasts ~50 ms, too short alone to time
    epochs: int  # measured, after one warm-up epoch
    first_batch_tries: int
    trials: int  # each side measured this many times, alternating; the best of each is kept
    metrics_samples: int  # a run of the metrics-overhead case: long enough for scrapes to add up


QUICK = Sizes(4, 16384, 4, 768, 4, 48, 2, 2, 3, 2, 1_000_000)
FULL = Sizes(8, 32768, 8, 1024, 8, 32, 12, 3, 7, 3, 10_000_000)


# -- results ------------------------------------------------------------------------


def child_env() -> dict[str, str]:
    """The environment for our processes: BLAS/OpenMP pools of one thread, like torch's workers."""
    return {**os.environ, **{var: "1" for var in ONE_THREAD}}


def result(
    name: str, ours: float, peer: float, unit: str, target: str, passed: bool, detail: str, ratio: float | None = None
) -> dict[str, Any]:
    """One row for the driver; ``ratio`` defaults to ours / peer (higher is better for us)."""
    if ratio is None:
        ratio = ours / peer if peer else 0.0
    return {
        "name": name,
        "ours": round(ours, 4),
        "peer": round(peer, 4),
        "unit": unit,
        "ratio": round(ratio, 3),
        "target": target,
        "passed": bool(passed),
        "detail": detail,
    }


# -- counting what a consumer receives ------------------------------------------------


def rows_in(batch: Any) -> int:
    """Samples in a batch from either side: a dict of columns, a tuple/list of tensors, or an array."""
    if isinstance(batch, dict):
        batch = next(iter(batch.values()))
    if isinstance(batch, (list, tuple)):
        batch = batch[0]
    return int(batch.shape[0])


def stream_rate(epochs: Callable[[], Iterable[Any]], count: int) -> tuple[float, int, float]:
    """Run ``count`` epochs back to back: (samples per second, samples, seconds)."""
    samples = 0
    start = time.perf_counter()
    for _ in range(count):
        for batch in epochs():
            samples += rows_in(batch)
    seconds = time.perf_counter() - start
    return samples / seconds, samples, seconds


# -- our side: a daemon process and a client ----------------------------------------


CONFIG = """\
[source]
files = [{files}]
records_per_lease = {records_per_lease}

[pipeline]
batch_size = {batch_size}
mappers = [{mappers}]
batch_mappers = [{batch_mappers}]
shuffle_buffer = 0
epochs = 0

[workers]
count = {workers}
samples_per_message = {samples_per_message}

[service]
bind = "{bind}"
metrics = "{metrics}"
"""
SCRAPE_INTERVAL_S = 1.0  # a scraper far more eager than Prometheus's usual 15 s


class Daemon:
    """``loader serve`` in a child process; stopped with SIGTERM (killed if it will not stop)."""

    def __init__(
        self,
        work: str,
        files: list[str],
        *,
        batch_size: int,
        workers: int,
        mappers: Iterable[str] = (),
        batch_mappers: Iterable[str] = (),
        samples_per_message: int = 4096,
        ipc: bool = False,
        metrics: bool = False,
        records_per_lease: int = 0,
    ) -> None:
        name = f"bench-{os.getpid()}-{time.monotonic_ns()}"
        self.address = f"ipc://{work}/{name}.sock" if ipc else f"tcp://127.0.0.1:{free_port()}"
        config = os.path.join(work, f"{name}.toml")
        self.metrics = f"127.0.0.1:{free_port()}" if metrics else ""  # the operators' endpoint, when measured
        with open(config, "w", encoding="utf-8") as fh:
            fh.write(
                CONFIG.format(
                    files=", ".join(json.dumps(f) for f in files),
                    batch_size=batch_size,
                    mappers=", ".join(json.dumps(m) for m in mappers),
                    batch_mappers=", ".join(json.dumps(m) for m in batch_mappers),
                    workers=workers,
                    samples_per_message=samples_per_message,
                    bind=self.address,
                    metrics=self.metrics,
                    records_per_lease=records_per_lease,
                )
            )
        self.proc = start_daemon(config)
        try:
            wait_ready(self.address, self.proc, 1, SERVE_START_TIMEOUT_S)
        except BaseException:
            self.close()
            raise

    def close(self) -> int | None:
        return stop_daemon(self.proc)

    def __enter__(self) -> Daemon:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Scraper:
    """Scrapes ``/metrics`` every ``SCRAPE_INTERVAL_S`` on a thread while a measurement runs."""

    def __init__(self, address: str) -> None:
        import threading

        self.address, self.scrapes, self.stop = address, 0, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        import urllib.request

        while not self.stop.wait(SCRAPE_INTERVAL_S):
            with urllib.request.urlopen(f"http://{self.address}/metrics", timeout=5) as answer:
                answer.read()
            self.scrapes += 1

    def close(self) -> int:
        self.stop.set()
        self.thread.join(10)
        return self.scrapes


def in_child(func: str, **kwargs: Any) -> tuple[float, str]:
    """Run one of our measurements in a fresh Python process and return its (figure, detail).

    Our client then lives in its own process, as torch's consumer lives in this
    one; and this process never holds a ZeroMQ context, which torch's forked
    workers would inherit (forking a live ZeroMQ context is unsupported).
    """
    cmd = [sys.executable, os.path.abspath(__file__), "--child", json.dumps({"func": func, "kwargs": kwargs})]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, env=child_env())
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"]
        raise RuntimeError(f"{func} failed: {lines[-1]}")
    figure, detail = json.loads(proc.stdout.strip().splitlines()[-1])
    return float(figure), str(detail)


def _child_main(spec: str) -> int:
    call = json.loads(spec)
    func = {"ours_rate": ours_rate_here, "ours_first_batch": ours_first_batch_here}[call["func"]]
    print(json.dumps(list(func(**call["kwargs"]))))
    return 0


def ours_rate(work: str, files: list[str], **kwargs: Any) -> tuple[float, str]:
    return in_child("ours_rate", work=work, files=files, **kwargs)


def ours_first_batch(work: str, files: list[str], **kwargs: Any) -> tuple[float, str]:
    return in_child("ours_first_batch", work=work, files=files, **kwargs)


def ours_rate_here(
    work: str,
    files: list[str],
    *,
    batch_size: int,
    workers: int,
    epochs: int,
    read_ahead: bool = True,
    **daemon_options: Any,
) -> tuple[float, str]:
    from loader.service.client.client import Client

    with Daemon(work, files, batch_size=batch_size, workers=workers, **daemon_options) as daemon:
        with Client(daemon.address, timeout_s=CLIENT_TIMEOUT_S, read_ahead=read_ahead) as client:
            stream_rate(client.epoch, 1)  # warm-up: workers import, open files, page cache
            scraper = Scraper(daemon.metrics) if daemon.metrics else None
            split = CpuSplit(daemon.proc.pid)
            rate, samples, seconds = stream_rate(client.epoch, epochs)
            cpu = split.stop()
            scrapes = scraper.close() if scraper is not None else 0
    detail = f"ours {samples} samples in {seconds:.2f}s (CPU s: {cpu})"
    return rate, detail + (f", {scrapes} scrapes" if scraper else "")


class CpuSplit:
    """CPU seconds of the daemon, its workers (together) and this process (the client) from now on:
    where a case's time goes, printed with every run of ours."""

    def __init__(self, daemon_pid: int) -> None:
        from bench_tools import process_tree  # here: bench_tools imports this module

        self.daemon_pid = daemon_pid
        self.workers = [pid for pid in process_tree(daemon_pid) if pid != daemon_pid]
        self.before = self._now()
        self.faults_before = self._faults()

    def _faults(self) -> list[int]:
        from bench_tools import minor_faults

        return [minor_faults(pid) for pid in self.workers]

    def _now(self) -> tuple[float, list[float], float]:
        from bench_tools import cpu_seconds

        own = os.times()
        # A live worker's CPU is not in its parent's (children count there only once waited for).
        return cpu_seconds(self.daemon_pid), [cpu_seconds(pid) for pid in self.workers], own.user + own.system

    def stop(self) -> str:
        (daemon_after, workers_after, client_after), (daemon_before, workers_before, client_before) = (
            self._now(),
            self.before,
        )
        # Per worker, and never below 0: one that ended meanwhile reads 0 (its time then lands in the daemon's).
        workers = sum(max(0.0, a - b) for a, b in zip(workers_after, workers_before))
        faults = sum(max(0, a - b) for a, b in zip(self._faults(), self.faults_before))
        daemon, client = daemon_after - daemon_before, client_after - client_before
        return (
            f"daemon {daemon:.2f}, its {len(self.workers)} child processes {workers:.2f} "
            f"({faults:,} page faults), client {client:.2f}"
        )


def ours_first_batch_here(
    work: str, files: list[str], *, batch_size: int, workers: int, tries: int
) -> tuple[float, str]:
    from loader.service.client.client import Client

    times = []
    with Daemon(work, files, batch_size=batch_size, workers=workers) as daemon:
        with Client(daemon.address, timeout_s=CLIENT_TIMEOUT_S) as client:
            stream_rate(client.epoch, 1)  # the daemon is warm: workers connected, files seen once
        for _ in range(tries):
            start = time.perf_counter()
            with Client(daemon.address, timeout_s=CLIENT_TIMEOUT_S) as client:
                batches = client.epoch()
                next(batches)
                times.append(time.perf_counter() - start)
                batches.close()
    return statistics.median(times), f"ours: {', '.join(f'{t * 1000:.0f}' for t in times)} ms"


# -- the peer: torch DataLoader --------------------------------------------------------


class NpzDataset:
    """Map-style: sample i = (x[i], label[i]) over the same .npz files, optionally mapped."""

    def __init__(self, files: list[str], mapper: Callable[[Any], Any] | None = None) -> None:
        xs, labels = [], []
        for path in files:
            with np.load(path) as archive:
                xs.append(archive["x"])
                labels.append(archive["label"])
        self.x, self.label = np.concatenate(xs), np.concatenate(labels)
        self.mapper = mapper

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> Any:
        sample = (self.x[i], self.label[i])
        return tuple(self.mapper(sample)) if self.mapper is not None else sample


class NpyDataset:
    """Map-style: sample i = row i of the concatenated, memory-mapped .npy files."""

    def __init__(self, files: list[str]) -> None:
        self.arrays = [np.load(path, mmap_mode="r") for path in files]
        self.offsets = np.cumsum([0] + [len(a) for a in self.arrays])

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __getitem__(self, i: int) -> Any:
        f = int(np.searchsorted(self.offsets, i, side="right")) - 1
        return self.arrays[f][i - self.offsets[f]]


def torch_loader(dataset: Any, *, batch_size: int, workers: int, persistent: bool = True) -> Any:
    from torch.utils.data import DataLoader

    return DataLoader(
        dataset,
        batch_size=batch_size,
        num_workers=workers,
        shuffle=False,
        persistent_workers=persistent and workers > 0,
        pin_memory=False,
    )


def peer_rate(dataset: Any, *, batch_size: int, workers: int, epochs: int) -> tuple[float, str]:
    # Persistent workers stop when the DataLoader is dropped, on return.
    from bench_tools import CpuMeter  # here: bench_tools imports this module

    data_loader = torch_loader(dataset, batch_size=batch_size, workers=workers)
    stream_rate(lambda: iter(data_loader), 1)  # warm-up, as on our side
    # Its CPU beside ours: a lone torch worker well ahead of ours on a many-core machine (the H200: 0.76x) could
    # be running a mapper's numpy on more than one core, which CPU seconds above the wall time would show.
    meter = CpuMeter()
    meter.start()
    rate, samples, seconds = stream_rate(lambda: iter(data_loader), epochs)
    cpu, processes = meter.stop()
    return rate, f"torch {samples} samples in {seconds:.2f}s (CPU s: {cpu:.2f} in {processes} processes)"


def peer_first_batch(dataset: Any, *, batch_size: int, workers: int, tries: int) -> tuple[float, str]:
    times = []
    for _ in range(tries):
        data_loader = torch_loader(dataset, batch_size=batch_size, workers=workers, persistent=False)
        start = time.perf_counter()
        batches = iter(data_loader)
        next(batches)
        times.append(time.perf_counter() - start)
        del batches  # shuts its workers down before the next try
    return statistics.median(times), f"torch: {', '.join(f'{t * 1000:.0f}' for t in times)} ms"


# -- the cases -------------------------------------------------------------------------


def best_of(trials: int, *sides: Callable[[], tuple[float, str]]) -> list[tuple[float, str]]:
    """Run each side ``trials`` times, alternating; the best (rate, detail) of each side."""
    runs: list[list[tuple[float, str]]] = [[] for _ in sides]
    for _ in range(trials):
        for i, side in enumerate(sides):
            runs[i].append(side())
    return [max(r, key=lambda item: item[0]) for r in runs]


def bench_small(work: str, size: Sizes) -> list[dict[str, Any]]:
    files = datagen.generate(
        os.path.join(work, "small"), format="npz", files=size.small_files, samples=size.small_samples, dim=64
    )
    dataset = NpzDataset(files)
    (peer, peer_detail), (ours, ours_detail) = best_of(
        size.trials,
        lambda: peer_rate(dataset, batch_size=256, workers=2, epochs=size.epochs),
        lambda: ours_rate(work, files, batch_size=256, workers=2, epochs=size.epochs),
    )
    ratio = ours / peer
    return [
        result(
            "small_samples_2_workers",
            ours,
            peer,
            "samples/s",
            f">= 10x torch and >= {SMALL_TARGET_RATE:,} samples/s",
            ratio >= 10.0 and ours >= SMALL_TARGET_RATE,
            f"64 float32 + int64 label, batch 256; {ours_detail}; {peer_detail}",
        )
    ]


def bench_metrics_overhead(work: str, size: Sizes) -> list[dict[str, Any]]:
    """The small-sample workload with the metrics endpoint on (and scraped) against off: the cost of metrics."""
    files = datagen.generate(
        os.path.join(work, "small"), format="npz", files=size.small_files, samples=size.small_samples, dim=64
    )
    # Long enough for scrapes (one a second) and housekeeping ticks to add up: 10M samples, about 3 s at
    # today's rate (2M lasted 0.5 s, over before the first scrape).
    epochs = max(size.epochs, size.metrics_samples // (size.small_files * size.small_samples))
    options = {"batch_size": 256, "workers": 2, "epochs": epochs}
    # The two sides differ by a few percent at most, less than this machine's noise between runs (10-25%):
    # the ratio is the median of the ratios of back-to-back pairs (off, then on), which cancels slow drift
    # in the machine's load; the best of each side is in the detail.
    pairs = [
        (ours_rate(work, files, **options), ours_rate(work, files, metrics=True, **options))
        for _ in range(size.trials + 4)
    ]
    ratios = sorted(on[0] / off[0] for off, on in pairs)
    ratio = statistics.median(ratios)
    (off, off_detail), (on, on_detail) = (max(side, key=lambda run: run[0]) for side in zip(*pairs))
    return [
        result(
            "metrics_overhead_small",
            on,
            off,
            "samples/s",
            ">= 0.98x without metrics",
            ratio >= 0.98,
            f"peer = the same daemon without metrics; on: /metrics scraped every {SCRAPE_INTERVAL_S:g}s; "
            f"ratio = median of {len(pairs)} back-to-back pairs (" + ", ".join(f"{r:.3f}" for r in ratios) + "); "
            f"ours and peer: the best of each side; {on_detail}; {off_detail}",
            ratio=ratio,
        )
    ]


def bench_cpu_heavy(work: str, size: Sizes) -> list[dict[str, Any]]:
    files = datagen.generate(
        os.path.join(work, "heavy"), format="npz", files=size.heavy_files, samples=size.heavy_samples, dim=64
    )
    mapper = "loader.examples:cpu_heavy"
    dataset = NpzDataset(files, cpu_heavy)

    def ours(workers: int) -> Callable[[], tuple[float, str]]:
        return lambda: ours_rate(work, files, batch_size=256, workers=workers, epochs=size.epochs, mappers=[mapper])

    def peer(workers: int) -> Callable[[], tuple[float, str]]:
        return lambda: peer_rate(dataset, batch_size=256, workers=workers, epochs=size.epochs)

    measured = best_of(size.trials, peer(2), ours(2), ours(1), peer(1))
    (peer2, peer_detail), (ours2, ours2_detail), (ours1, ours1_detail), (peer1, _) = measured
    speedup, peer_speedup = ours2 / ours1, peer2 / peer1
    return [
        result(
            "cpu_heavy_mapper_2_workers",
            ours2,
            peer2,
            "samples/s",
            ">= 1.0x torch",
            ours2 >= peer2,
            f"{mapper} (~0.3 ms/sample) on both sides, batch 256; {ours2_detail}; {peer_detail}",
        ),
        result(
            "cpu_heavy_scaling_1_to_2_workers",
            speedup,
            peer_speedup,
            "x",
            ">= 1.7x (ours, 1 -> 2 workers)",
            speedup >= 1.7,
            f"ratio = our speedup; peer = torch's speedup (1 worker: {peer1:,.0f} samples/s); ours 1 worker: {ours1:,.0f} samples/s "
            f"({ours1_detail}), 2 workers: {ours2:,.0f} samples/s",
            ratio=speedup,
        ),
    ]


def bench_cpu_heavy_batch(work: str, size: Sizes) -> list[dict[str, Any]]:
    """Ours with the vectorised mapper as a batch mapper against torch's DataLoader with the per-sample one."""
    files = datagen.generate(
        os.path.join(work, "heavy"), format="npz", files=size.heavy_files, samples=size.heavy_samples, dim=64
    )  # the same files bench_cpu_heavy wrote
    batch_mapper = "loader.examples:cpu_heavy_batch"
    # Ours runs several times faster: more epochs, so it is timed over seconds too, not a fraction of one.
    ours_epochs = size.epochs * 5
    (peer, peer_detail), (ours, ours_detail) = best_of(
        size.trials,
        lambda: peer_rate(NpzDataset(files, cpu_heavy), batch_size=256, workers=2, epochs=size.epochs),
        lambda: ours_rate(work, files, batch_size=256, workers=2, epochs=ours_epochs, batch_mappers=[batch_mapper]),
    )
    return [
        result(
            "cpu_heavy_batch_mapper_2_workers",
            ours,
            peer,
            "samples/s",
            ">= 1.0x torch",
            ours >= peer,
            f"not like for like: ours = {batch_mapper} as a batch mapper (once per block); peer = torch "
            f"DataLoader with the per-sample loader.examples:cpu_heavy; batch 256; {ours_detail}; {peer_detail}",
        )
    ]


def bench_large(work: str, size: Sizes) -> list[dict[str, Any]]:
    files = datagen.generate(
        os.path.join(work, "large"), format="npy", files=size.large_files, samples=size.large_samples, dim=MIB // 4
    )
    with warnings.catch_warnings():
        # torch.as_tensor on a read-only memory map warns once per worker; the data is never written.
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        (peer, peer_detail), (ours, ours_detail) = best_of(
            size.trials,
            lambda: peer_rate(NpyDataset(files), batch_size=8, workers=2, epochs=size.large_epochs),
            lambda: ours_rate(work, files, batch_size=8, workers=2, epochs=size.large_epochs, samples_per_message=8),
        )
    ours_b, peer_b = ours * MIB / 1e6, peer * MIB / 1e6
    return [
        result(
            "large_samples_1MiB_2_workers",
            ours_b,
            peer_b,
            "MB/s",
            ">= 3x torch",
            ours_b >= 3 * peer_b,
            f"1 MiB float32 rows from .npy, batch 8; {ours_detail}; {peer_detail}",
        )
    ]


def bench_first_batch(work: str, size: Sizes) -> list[dict[str, Any]]:
    files = datagen.generate(
        os.path.join(work, "small"), format="npz", files=size.small_files, samples=size.small_samples, dim=64
    )  # the same files bench_small wrote
    tries = size.first_batch_tries
    ours, ours_detail = ours_first_batch(work, files, batch_size=256, workers=2, tries=tries)
    peer, peer_detail = peer_first_batch(NpzDataset(files), batch_size=256, workers=2, tries=tries)
    return [
        result(
            "first_batch_warm_daemon",
            ours,
            peer,
            "s",
            "< 0.5 s",
            ours < 0.5,
            f"median; Client(...) -> first batch; peer = iter(DataLoader) -> first batch "
            f"(fresh workers); {ours_detail}; {peer_detail}",
            ratio=peer / ours if ours > 0 else 0.0,
        )
    ]


def run(quick: bool = False, only: Iterable[str] = ()) -> list[dict[str, Any]]:
    """Every measurement, both sides in this one run. ``quick`` uses smaller data (about 30 s)."""
    size = QUICK if quick else FULL
    results: list[dict[str, Any]] = []
    cases: list[tuple[str, Callable[[str], list[dict[str, Any]]]]] = [
        ("small_samples_2_workers", lambda work: bench_small(work, size)),
        ("metrics_overhead_small", lambda work: bench_metrics_overhead(work, size)),
        ("first_batch_warm_daemon", lambda work: bench_first_batch(work, size)),
        ("cpu_heavy_mapper_2_workers", lambda work: bench_cpu_heavy(work, size)),
        ("cpu_heavy_batch_mapper_2_workers", lambda work: bench_cpu_heavy_batch(work, size)),
        ("large_samples_1MiB_2_workers", lambda work: bench_large(work, size)),
    ]
    if only:
        cases = [(name, case) for name, case in cases if name in only]
    with tempfile.TemporaryDirectory(prefix="loader-bench-service-") as work:
        for name, case in cases:
            try:
                results += case(work)
            except Exception as exc:  # one broken case is reported as failed; the others still run
                line = " ".join(str(exc).split("--- original traceback ---")[0].split())
                results.append(
                    result(name, 0.0, 0.0, "-", "runs", False, f"error: {type(exc).__name__}: {line}", ratio=0.0)
                )
    return results


def _print(results: list[dict[str, Any]]) -> None:
    for r in results:
        print(
            f"{'PASS' if r['passed'] else 'FAIL'}  {r['name']:<34} ours {r['ours']:>12,.3f}  "
            f"peer {r['peer']:>12,.3f} {r['unit']:<10} ratio {r['ratio']:>6.2f}  target {r['target']}"
        )
        print(f"      {r['detail']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="loader service vs torch DataLoader")
    parser.add_argument("--quick", action="store_true", help="smaller data, about 30 s")
    parser.add_argument("--json", action="store_true", help="print the result dicts as JSON")
    parser.add_argument("--case", action="append", default=[], help="run only this case (repeatable)")
    parser.add_argument("--child", metavar="SPEC", help=argparse.SUPPRESS)  # internal: see in_child
    args = parser.parse_args(argv)
    if args.child:
        return _child_main(args.child)
    results = run(quick=args.quick, only=args.case)
    print(json.dumps(results, indent=2)) if args.json else _print(results)
    return 0 if all(r["passed"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
