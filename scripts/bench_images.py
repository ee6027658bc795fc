"""A real image pipeline: JPEGs decoded, randomly cropped and flipped to 224x224, normalised to float32.

``run(quick) -> list[dict]`` (the driver's group ``images``). Run alone:
``python scripts/bench_images.py [--quick]``. Needs Pillow (the ``bench`` extra).

The workload: a few thousand 256x256 RGB JPEGs (quality 90) generated at benchmark time (a smooth
colour field, a coarser texture, a few filled shapes, a slight blur and pixel noise: about 21 KiB
each, like small natural photographs), stored twice, in one temp dir that is removed afterwards:

* as RecordIO files, each record ``[jpeg bytes as uint8, label]``, stored uncompressed (JPEG is
  compressed already);
* as files in class folders (``root/class-NN/img-NNNNN.jpg``, the ``ImageFolder`` layout), read
  by ``loader.examples.images:read_image_file``, one file per sample, leased 64 at a time
  (``source.files_per_lease``).

Both sides map every sample with the same function, ``loader.examples.images:decode_crop_flip``
(decode with Pillow, random 224x224 crop, random horizontal flip, uint8 -> float32 normalised,
channels first: 588 KiB per sample), batch 64, the same worker count, no shuffling:

* ours: ``loader serve`` in a child process (``bench_tools.Serve``) and a ``Client`` in another
  fresh process, default ``[workers]`` settings (the decoded rows go through shared memory, in
  chunks of up to 64 MiB: ``docs/internals.md``, chunk sizes);
* the peer: ``torch.utils.data.DataLoader``, ``persistent_workers=True``, default collate, over a
  map-style dataset: for the RecordIO case the same records read once into RAM (the peer gets its
  bytes from memory, if anything faster than our reading), for the folders case the same files,
  opened and read in ``__getitem__``. Each sample's generator is ``default_rng(index)``; the draws
  differ from ours, the work does not.

One warm-up epoch is excluded on each side; then several epochs run back to back, and the side's
best of ``trials`` alternating runs is kept (``bench_service``'s rules). CPU time is that of every
process of the side (daemon, workers and client; torch's main process and workers), read from
``/proc`` before and after the measured epochs, per image.

The limit: ``workers x`` the single-core rate of the same mapper, over the same bytes in RAM (best of a
few passes), in a fresh process whose allocator keeps freed memory as our workers' does
(``single_core_rate`` says why). Each worker runs exactly that loop plus reading and sending;
on a machine with as many cores as workers, the daemon and the client share those cores. The
RecordIO case runs again with one worker on each side (``recordio_spare_core``), as workers run
below the core count on a machine with a GPU: what is left of the gap is then the worker's own.
``python scripts/bench_images.py --workers 4,8,14`` runs the RecordIO and folders cases at each of those worker
counts over 56 files (for a machine of many cores). ``python scripts/bench_images.py --steps`` prints what each step of a batching pipeline costs per
image on one core (mapping with a batch's outputs kept, stacking, copying into an arena and out),
the diagnosis behind the gap to that limit in ``docs/performance.md``.
"""

from __future__ import annotations

import dataclasses
import io
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

# Helpers in this directory (on sys.path when a script here runs).
from bench_service import CpuSplit, best_of, stream_rate
from bench_tools import CpuMeter, Serve, child_command, group_main, in_child, row

MAPPER = "loader.examples.images:decode_crop_flip"
FOLDER_READER = "loader.examples.images:read_image_file"
FILES_PER_LEASE = 64  # the folders case: a lease per image costs more than the image (docs/performance.md)
BATCH = 64
WORKERS = 2
IMAGE_SIZE = 256
CROP_PIXELS = 224 * 224
CLIENT_TIMEOUT_S = 60.0
GENERATE_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Sizes:
    images: int
    files: int  # RecordIO files, and class folders
    epochs: int  # measured, after one warm-up epoch
    trials: int
    single_core_images: int  # for the single-core rate


QUICK = Sizes(512, 4, 1, 1, 128)
FULL = Sizes(3072, 16, 2, 3, 512)
# ``--workers`` (many cores): 56 files divide 1, 2, 4, 7, 8 and 14 workers, so every worker reads as many;
# measured epochs grow with the worker count (``max(2, (workers + 1) // 2)``) so each figure covers a similar wall
# time.
MANY = Sizes(56 * 128, 56, 2, 2, 512)


# -- the images ------------------------------------------------------------------------------


def _pillow() -> Any:
    try:
        from PIL import Image, ImageDraw, ImageFilter
    except ImportError:
        sys.exit("bench_images needs Pillow: pip install '/path/to/loader[bench]' (or pip install pillow)")
    return Image, ImageDraw, ImageFilter


def make_jpeg(index: int, size: int = IMAGE_SIZE) -> bytes:
    """One natural-looking RGB JPEG (quality 90), a pure function of ``index``."""
    image_module, draw_module, filter_module = _pillow()
    rng = np.random.default_rng(index)

    def field(cells: int, amplitude: float) -> np.ndarray:  # a random grid, smoothly upsampled
        grid = rng.integers(0, 256, (cells, cells, 3), dtype=np.uint8)
        smooth = image_module.fromarray(grid, "RGB").resize((size, size), image_module.Resampling.BICUBIC)
        return (np.asarray(smooth, np.float32) - 128.0) * amplitude

    base = np.clip(128.0 + field(4, 1.0) + field(24, 0.25), 0, 255).astype(np.uint8)
    image = image_module.fromarray(base, "RGB")
    draw = draw_module.Draw(image)
    for _ in range(int(rng.integers(3, 9))):
        x, y = (int(v) for v in rng.integers(-32, size, 2))
        w, h = (int(v) for v in rng.integers(16, 128, 2))
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        shape = draw.ellipse if rng.random() < 0.5 else draw.rectangle
        shape((x, y, x + w, y + h), fill=colour)
    image = image.filter(filter_module.GaussianBlur(float(rng.uniform(0.5, 1.5))))
    noisy = np.asarray(image, np.float32) + rng.standard_normal((size, size, 3), dtype=np.float32) * 8.0
    out = io.BytesIO()
    image_module.fromarray(np.clip(noisy, 0, 255).astype(np.uint8), "RGB").save(out, "JPEG", quality=90)
    return out.getvalue()


def image_path(work: str, index: int, label: int) -> str:
    return os.path.join(work, "folders", f"class-{label:02d}", f"img-{index:05d}.jpg")


def write_images(work: str, labels: list[int], start: int, stop: int) -> int:
    """Write images ``start..stop-1`` into their class folders (run in a child process); how many."""
    for i in range(start, stop):
        path = image_path(work, i, labels[i])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(make_jpeg(i))
    return stop - start


def write_dataset(work: str, size: Sizes) -> tuple[list[str], list[str], list[bytes], list[int]]:
    """Class folders and RecordIO files of the same images: (recordio paths, image paths, jpegs, labels)."""
    from loader import recordio

    per_file = size.images // size.files
    labels = [min(i // per_file, size.files - 1) for i in range(size.images)]
    # Generated by one fresh process per core (10 ms an image): nothing is forked from this process,
    # which may hold torch's threads.
    parts = os.cpu_count() or 1
    bounds = [size.images * k // parts for k in range(parts + 1)]
    makers = [
        subprocess.Popen(
            child_command("bench_images", "write_images", work=work, labels=labels, start=a, stop=b),
            stdout=subprocess.DEVNULL,
        )
        for a, b in zip(bounds, bounds[1:])
    ]
    try:
        codes = [maker.wait(timeout=GENERATE_TIMEOUT_S) for maker in makers]
    finally:
        for maker in makers:
            if maker.poll() is None:
                maker.kill()
                maker.wait(timeout=GENERATE_TIMEOUT_S)
    if any(codes):
        raise RuntimeError(f"generating the images failed (exit codes {codes})")
    image_paths = [image_path(work, i, label) for i, label in enumerate(labels)]
    jpegs = [Path(path).read_bytes() for path in image_paths]
    record_paths = []
    for f in range(size.files):
        path = os.path.join(work, "recordio", f"part-{f:05d}.recordio")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with recordio.Writer(path, recordio.Compressor.NONE, max_num_records=256) as writer:
            for i in (i for i, label in enumerate(labels) if label == f):
                writer.write([np.frombuffer(jpegs[i], np.uint8), np.int64(labels[i])])
        record_paths.append(path)
    return record_paths, image_paths, jpegs, labels


# -- the limit: the mapper on one core --------------------------------------------------------


def allocator_as_in_workers() -> None:
    """Set this process's allocator as our workers set theirs (``workers.keep_freed_mib``,
    ``loader/runtime/memory.py``): left at glibc's defaults, a fresh process faults each image's arrays in
    again and runs the mapper at half its rate (``single_core_rate``)."""
    from loader.config.sections import WorkersConfig
    from loader.runtime.memory import keep_freed_memory

    keep_freed_memory(WorkersConfig().keep_freed_mib)


def single_core_rate(record_paths: list[str], images: int, passes: int = 3) -> tuple[float, float]:
    """(images/s, minor page faults an image) of ``decode_crop_flip`` on one core, best of ``passes``, over the
    first ``images`` JPEGs of ``record_paths`` held in RAM, in a fresh process whose allocator keeps freed
    memory as our workers' does (``workers.keep_freed_mib``, ``loader/runtime/memory.py``).

    Why a fresh process set so: glibc gives the mapper's freed arrays back to the kernel unless the process
    has once freed a large block (which raises its thresholds), and faulting them in again each image halves
    the rate on these VMs: the same loop ran 850-1,000 images/s in a fresh child against 1,500-1,900 in the
    benchmark's own process, depending on what that process had done before. Measured in a known state, the
    limit no longer moves with the process's history, and it is the mapper's rate in a worker of ours.
    """
    rate, faults = in_child("bench_images", "single_core_rate_here", paths=record_paths, images=images, passes=passes)
    return float(rate), float(faults)


def single_core_rate_here(paths: list[str], images: int, passes: int) -> list[float]:
    import resource

    from loader.examples.images import decode_crop_flip

    allocator_as_in_workers()
    arrays = [np.frombuffer(data, np.uint8) for data in recordio_bytes(paths)[:images]]
    decode_crop_flip([arrays[0], np.int64(0)], np.random.default_rng(0))  # Pillow imported before the clock
    best, faults = 0.0, 0
    for _ in range(passes):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        start = time.perf_counter()
        for i, data in enumerate(arrays):
            decode_crop_flip([data, np.int64(0)], np.random.default_rng(i))
        best = max(best, len(arrays) / (time.perf_counter() - start))
        faults += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    return [best, faults / (passes * len(arrays))]


# -- ours ------------------------------------------------------------------------------------


def ours_tables(source: dict[str, Any], workers: int) -> dict[str, dict[str, Any]]:
    return {
        "source": source,
        "pipeline": {"batch_size": BATCH, "mappers": [MAPPER], "shuffle_buffer": 0, "seed": 0, "epochs": 0},
        "workers": {"count": workers},
    }


def ours_here(work: str, source: dict[str, Any], workers: int, epochs: int) -> list[Any]:
    """In a fresh process: a daemon and a client; (images/s, CPU s per image, detail)."""
    from loader.service.client.client import Client

    with Serve(work, ours_tables(source, workers)) as daemon:
        with Client(daemon.address, timeout_s=CLIENT_TIMEOUT_S) as client:
            stream_rate(client.epoch, 1)  # warm-up: workers import Pillow, files in the page cache
            meter = CpuMeter()  # this client, the daemon and its workers
            meter.start()
            split = CpuSplit(daemon.pid)  # where it goes: a client's receiver thread near 1 CPU s a second is the bound
            rate, samples, seconds = stream_rate(client.epoch, epochs)
            cpu, processes = meter.stop()
            where = split.stop()
    detail = f"ours {samples} images in {seconds:.2f}s, {cpu:.1f} CPU s in {processes} processes ({where})"
    return [rate, cpu / samples, detail]


def ours(work: str, source: dict[str, Any], workers: int, epochs: int) -> tuple[float, float, str]:
    rate, cpu, detail = in_child("bench_images", "ours_here", work=work, source=source, workers=workers, epochs=epochs)
    return float(rate), float(cpu), str(detail)


# -- the peer: torch DataLoader ---------------------------------------------------------------


class BytesDataset:
    """Map-style: image ``i`` from JPEG bytes held in RAM, mapped by ``decode_crop_flip``."""

    def __init__(self, jpegs: list[bytes], labels: list[int]) -> None:
        self.jpegs, self.labels = jpegs, labels

    def __len__(self) -> int:
        return len(self.jpegs)

    def _bytes(self, i: int) -> bytes:
        return self.jpegs[i]

    def __getitem__(self, i: int) -> Any:
        from loader.examples.images import decode_crop_flip

        sample = [np.frombuffer(self._bytes(i), np.uint8), np.int64(self.labels[i])]
        return tuple(decode_crop_flip(sample, np.random.default_rng(i)))


class FolderDataset(BytesDataset):
    """Map-style: image ``i`` read from its file in ``__getitem__`` (the ``ImageFolder`` way)."""

    def __init__(self, paths: list[str], labels: list[int]) -> None:
        super().__init__([], labels)
        self.paths = paths

    def __len__(self) -> int:
        return len(self.paths)

    def _bytes(self, i: int) -> bytes:
        with open(self.paths[i], "rb") as fh:
            return fh.read()


def recordio_bytes(paths: list[str]) -> list[bytes]:
    """The JPEG bytes of every record, in order, read with our own scanner (for the peer's RAM copy)."""
    from loader.recordio import Scanner

    out = []
    for path in paths:
        with Scanner(path) as scanner:
            out += [bytes(np.asarray(data, np.uint8)) for data, _ in scanner]
    return out


def peer(dataset: Any, workers: int, epochs: int) -> tuple[float, float, str]:
    from torch.utils.data import DataLoader

    # Persistent workers stop when the DataLoader is dropped, on return.
    data_loader = DataLoader(dataset, batch_size=BATCH, num_workers=workers, persistent_workers=True, shuffle=False)
    stream_rate(lambda: iter(data_loader), 1)  # warm-up, as on our side
    meter = CpuMeter()  # this process and torch's workers
    meter.start()
    rate, samples, seconds = stream_rate(lambda: iter(data_loader), epochs)
    cpu, processes = meter.stop()
    return rate, cpu / samples, f"torch {samples} images in {seconds:.2f}s, {cpu:.1f} CPU s in {processes} processes"


# -- the rows ------------------------------------------------------------------------------


Measured = tuple[tuple[float, float, str], tuple[float, float, str]]  # (ours, torch): rate, CPU s an image, detail


def rows_of(
    label: str, single: float, singles: str, measured: Measured, what: str, workers: int
) -> list[dict[str, Any]]:
    """The three rows of one case: against torch, against the decode limit, CPU per image."""
    (ours_rate, ours_cpu, ours_detail), (peer_rate, peer_cpu, peer_detail) = measured
    limit = workers * single
    return [
        row(
            f"images_{label}_{workers}_worker{'s' if workers > 1 else ''}",
            ours_rate,
            peer_rate,
            "images/s",
            "> 1.0x torch",
            ours_rate > peer_rate,
            f"{what}; decode + crop + flip + normalise, batch {BATCH}; {ours_detail}; {peer_detail}",
        ),
        row(
            f"images_{label}_vs_decode_limit",
            ours_rate,
            limit,
            "images/s",
            f">= 0.9x {workers} x 1 core",
            ours_rate >= 0.9 * limit,
            f"peer = {workers} worker(s) x the mapper's single-core rate ({single:,.0f} images/s, the best of "
            f"{singles}); torch reached {peer_rate / limit:.2f} of it",
        ),
        row(
            f"images_{label}_cpu_per_image",
            ours_cpu * 1000,
            peer_cpu * 1000,
            "CPU ms/img",
            "none (lower is better)",
            None,
            f"every process of each side; ratio = torch / ours; the mapper alone: {1000 / single:.2f} ms",
            ratio=peer_cpu / ours_cpu if ours_cpu else 0.0,
        ),
    ]


def run(quick: bool = False, worker_counts: list[int] | None = None, trials: int = 0) -> list[dict[str, Any]]:
    """The group's rows; with ``worker_counts``, the RecordIO and folders cases at each of those counts."""
    size = QUICK if quick else MANY if worker_counts else FULL
    size = dataclasses.replace(size, trials=trials or size.trials)
    _pillow()
    with tempfile.TemporaryDirectory(prefix="loader-bench-images-") as work:
        record_paths, image_paths, jpegs, labels = write_dataset(work, size)
        mean_kib = sum(map(len, jpegs)) / len(jpegs) / 1024
        folders = {
            "files": [os.path.join(work, "folders", "*", "*.jpg")],
            "reader": FOLDER_READER,
            "files_per_lease": FILES_PER_LEASE,
        }
        cases = scaling_cases(work, size, record_paths, folders, image_paths, labels, worker_counts or [])
        cases = cases or [
            (
                "recordio",
                WORKERS,
                f"{size.images} JPEGs of {IMAGE_SIZE}x{IMAGE_SIZE} (mean {mean_kib:.1f} KiB) in {size.files} RecordIO "
                "files; torch from the same bytes in RAM",
                lambda: ours(work, {"files": record_paths}, WORKERS, size.epochs),
                lambda: peer(BytesDataset(recordio_bytes(record_paths), labels), WORKERS, size.epochs),
            ),
            # Workers below the cores, as on a machine with a GPU (the daemon and the client on a core of their
            # own): one worker here. The gap left to the limit is then the worker's own, not the sharing of cores.
            (
                "recordio_spare_core",
                1,
                "the RecordIO case with 1 worker on each side, so the daemon and client (torch's main process) "
                "have the other core",
                lambda: ours(work, {"files": record_paths}, 1, size.epochs),
                lambda: peer(BytesDataset(recordio_bytes(record_paths), labels), 1, size.epochs),
            ),
            (
                "folders",
                WORKERS,
                f"the same {size.images} JPEGs as files in {size.files} class folders "
                f"(source.files_per_lease = {FILES_PER_LEASE}); torch reads each file in __getitem__",
                lambda: ours(work, folders, WORKERS, size.epochs),
                lambda: peer(FolderDataset(image_paths, labels), WORKERS, size.epochs),
            ),
        ]
        # The limit moves with the machine's load as much as the rates do (1,243 to 1,714 images/s a core in
        # two runs of an hour apart): measured before, between and after the cases, and the best taken, so a
        # quiet moment for the mapper alone counts against us, never for us.
        singles = [single_core_rate(record_paths, size.single_core_images)]
        measured: list[Measured] = []
        print(f"{time.strftime('%H:%M:%S')} {size.images} images written", file=sys.stderr, flush=True)
        for label, _workers, _what, ours_side, peer_side in cases:
            ours_result, peer_result = best_of(size.trials, ours_side, peer_side)
            measured.append((ours_result, peer_result))
            print(f"{time.strftime('%H:%M:%S')} {label}: {ours_result} {peer_result}", file=sys.stderr, flush=True)
            singles.append(single_core_rate(record_paths, size.single_core_images))
    single = max(rate for rate, _ in singles)
    shown = ", ".join(f"{rate:,.0f}" for rate, _ in singles)
    shown += (
        f" measured before, between and after the cases, in a process whose allocator keeps freed memory "
        f"({max(faults for _, faults in singles):.1f} page faults an image at most)"
    )
    rows: list[dict[str, Any]] = []
    for (label, workers, what, _ours, _peer), result in zip(cases, measured):
        rows += rows_of(label, single, shown, result, what, workers)
    return rows


Case = tuple[str, int, str, Any, Any]  # label, workers, what, ours side, peer side


def scaling_cases(
    work: str,
    size: Sizes,
    record_paths: list[str],
    folders: dict[str, Any],
    image_paths: list[str],
    labels: list[int],
    counts: list[int],
) -> list[Case]:
    """The RecordIO and folders cases at each worker count of ``counts`` (``--workers``)."""
    cases: list[Case] = []
    for n in counts:
        epochs = max(size.epochs, (n + 1) // 2)
        cases += [
            (
                f"recordio_{n}w",
                n,
                f"{size.images} JPEGs in {size.files} RecordIO files, {n} workers, {epochs} epochs; torch from RAM",
                lambda n=n, e=epochs: ours(work, {"files": record_paths}, n, e),
                lambda n=n, e=epochs: peer(BytesDataset(recordio_bytes(record_paths), labels), n, e),
            ),
            (
                f"folders_{n}w",
                n,
                f"the same JPEGs as files in {size.files} class folders, {n} workers, {epochs} epochs",
                lambda n=n, e=epochs: ours(work, folders, n, e),
                lambda n=n, e=epochs: peer(FolderDataset(image_paths, labels), n, e),
            ),
        ]
    return cases


def steps(images: int = 512) -> None:
    """``--steps``: the CPU cost per image of each step a batching pipeline takes, on one core.

    Not part of the group's rows: a diagnosis of where time per image goes. Batch by batch, as a
    worker works: map ``BATCH`` images keeping their outputs, stack them into one array, copy the
    rows into a buffer (an arena) and out into a fresh batch (the client's gather). The allocator is
    set as in our workers first (``single_core_rate`` says why: left as it is, the figures depend on
    what this process did before). A worker no longer keeps a batch's outputs: it puts each row into
    its arena as it is made (``ChunkBuilder.add``), so the second line is the path before 2026-11-30.
    """
    from loader.examples.images import decode_crop_flip

    allocator_as_in_workers()
    arrays = [np.frombuffer(make_jpeg(i), np.uint8) for i in range(images)]
    spent = dict.fromkeys(("mapper, outputs dropped at once (the limit)", "mapper, a batch's outputs kept"), 0.0)
    spent |= dict.fromkeys(("stack a batch", "rows into a warm arena", "rows into a fresh batch"), 0.0)
    names = list(spent)
    arena = np.zeros(BATCH * 3 * CROP_PIXELS * 4, np.uint8)
    for i, data in enumerate(arrays):
        start = time.perf_counter()
        decode_crop_flip([data, np.int64(0)], np.random.default_rng(i))
        spent[names[0]] += time.perf_counter() - start
    for first in range(0, images, BATCH):
        clock = time.perf_counter()
        outs = [
            decode_crop_flip([d, np.int64(0)], np.random.default_rng(first + k))[0]
            for k, d in enumerate(arrays[first : first + BATCH])
        ]
        now = time.perf_counter()
        spent[names[1]], clock = spent[names[1]] + now - clock, now
        stacked = np.stack(outs)
        now = time.perf_counter()
        spent[names[2]], clock = spent[names[2]] + now - clock, now
        rows = stacked.reshape(len(outs), -1).view(np.uint8)
        width = rows.shape[1]
        for k in range(len(outs)):
            arena[k * width : (k + 1) * width] = rows[k]
        now = time.perf_counter()
        spent[names[3]], clock = spent[names[3]] + now - clock, now
        batch = np.empty_like(rows)
        for k in range(len(outs)):
            batch[k] = arena[k * width : (k + 1) * width]
        spent[names[4]] += time.perf_counter() - clock
        del outs, stacked, rows, batch
    # What a worker does now: each output into its arena row as it is made, the mapper's array freed at once.
    placed = "mapper, each row into the arena as made (now)"
    spent[placed] = 0.0
    width = 3 * CROP_PIXELS * 4
    start = time.perf_counter()
    for i, data in enumerate(arrays):
        out = decode_crop_flip([data, np.int64(0)], np.random.default_rng(i))[0]
        k = i % BATCH
        arena[k * width : (k + 1) * width] = out.reshape(-1).view(np.uint8)
    spent[placed] += time.perf_counter() - start
    for name, seconds in spent.items():
        print(f"{name:<48} {seconds / images * 1000:6.3f} ms/image")


def scaling_main(args: list[str]) -> int:
    """``--workers 4,8,14 [--trials N] [--quick] [--json]``: for a machine of many cores."""
    import argparse
    import json

    parser = argparse.ArgumentParser(description="the image cases at several worker counts")
    parser.add_argument("--workers", required=True, help="worker counts, comma-separated")
    parser.add_argument("--trials", type=int, default=MANY.trials, help="runs of each side, the best kept")
    parser.add_argument("--quick", action="store_true", help="small data, one trial")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parsed = parser.parse_args(args)
    for got in run(parsed.quick, [int(n) for n in parsed.workers.split(",") if n], parsed.trials):
        print(json.dumps(got) if parsed.json else got)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if args == ["--steps"]:
        steps()
        return 0
    if any(arg == "--workers" or arg.startswith("--workers=") for arg in args):
        return scaling_main(args)
    helps = f"{QUICK.images} images, one trial (--steps: where CPU goes per image; --workers 4,8,14: scaling)"
    return group_main(__doc__ or "", run, helps, args)


if __name__ == "__main__":
    sys.exit(main())
