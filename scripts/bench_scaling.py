"""Worker scaling: our daemon + Client against torch's DataLoader at the same worker counts.

    python scripts/bench_scaling.py [--workers 1,2,4,8,14] [--small-workers 1,4,14] [--json PATH]

It reuses ``bench_service``'s two sides unchanged (``ours_rate``: ``loader
serve`` in its own process and a ``Client`` in a fresh Python process;
``peer_rate``: a ``DataLoader`` with ``persistent_workers=True`` over the same
files, default collate, no pinning), so every rule written there holds here:
same files, same batch size (256), same per-sample work, no shuffling, one
warm-up epoch excluded, BLAS/OpenMP pools of one thread on both sides.

Differences from ``bench_service``, for many workers:

* Files are the unit of work handed to our workers, so the data is split into
  a file count that every measured worker count divides (56 files for
  1, 2, 4, 8 and 14 workers; 28 for the small-samples case at 1, 4 and 14),
  and torch's 256-sample batches divide each worker's share evenly too.
* Measured epochs grow with the worker count (``max(2, workers)``) so each
  figure covers a similar wall time rather than shrinking to a fraction of a
  second at 14 workers. In the small-samples case our side reads 30 epochs
  and torch's 3: each side's rate is its own samples over its own time.
* One run of each side per worker count (ours, then torch), no best-of.

Efficiency is ``rate(N) / (N * rate(1))`` of the same side: 1.0 is ideal scaling.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from typing import Any

if __name__ == "__main__":
    # This process forks torch's workers: they get the one-thread BLAS and OpenMP pools our processes get. Set
    # before numpy loads OpenBLAS, which reads them once (set in main(), they reached torch's pools only).
    for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):  # bench_service.ONE_THREAD
        os.environ[_var] = "1"

# bench_service (this directory is on sys.path when run as a script).
import bench_service as bs

from loader.examples import cpu_heavy, datagen

HEAVY_FILES, HEAVY_SAMPLES = 56, 256  # 14,336 samples; 56 = 1*2*4*7*2: divides 1, 2, 4, 8, 14
SMALL_FILES, SMALL_SAMPLES = 28, 8192  # 229,376 samples; 28 divides 1, 4, 14
BATCH = 256


def measure(
    label: str,
    work: str,
    files: list[str],
    dataset: Any,
    workers: int,
    epochs: int,
    mappers: list[str],
    ours_epochs: int = 0,
) -> dict[str, Any]:
    """One row; ``ours_epochs`` (default ``epochs``) where our side would otherwise measure a fraction of a second."""
    start = time.perf_counter()
    ours_epochs = ours_epochs or epochs
    ours, ours_detail = bs.ours_rate(
        work, files, batch_size=BATCH, workers=workers, epochs=ours_epochs, mappers=mappers
    )
    peer, peer_detail = bs.peer_rate(dataset, batch_size=BATCH, workers=workers, epochs=epochs)
    row = {
        "case": label,
        "workers": workers,
        "epochs": epochs if ours_epochs == epochs else f"{ours_epochs} ours, {epochs} torch",
        "ours": round(ours, 1),
        "torch": round(peer, 1),
        "ratio": round(ours / peer, 3),
        "detail": f"{ours_detail}; {peer_detail}",
        "seconds": round(time.perf_counter() - start, 1),
    }
    print(json.dumps(row), flush=True)
    return row


def efficiency(rows: list[dict[str, Any]]) -> None:
    one = next((r for r in rows if r["workers"] == 1), None)
    for r in rows:
        if one is not None:
            r["ours_eff"] = round(r["ours"] / (r["workers"] * one["ours"]), 3)
            r["torch_eff"] = round(r["torch"] / (r["workers"] * one["torch"]), 3)


def table(title: str, rows: list[dict[str, Any]]) -> str:
    lines = [title, f"{'workers':>7} {'ours/s':>12} {'eff':>6} {'torch/s':>12} {'eff':>6} {'ours/torch':>10}"]
    for r in rows:
        lines.append(
            f"{r['workers']:>7} {r['ours']:>12,.0f} {r.get('ours_eff', 0):>6.2f} {r['torch']:>12,.0f} "
            f"{r.get('torch_eff', 0):>6.2f} {r['ratio']:>10.2f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="worker scaling: loader service vs torch DataLoader")
    parser.add_argument("--workers", default="1,2,4,8,14", help="CPU-heavy case worker counts")
    parser.add_argument("--small-workers", default="1,4,14", help="small-samples case worker counts ('' to skip)")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    for var in bs.ONE_THREAD:  # as at the top, for a caller that imported this module (torch's pools, at least)
        os.environ[var] = "1"
    heavy_workers = [int(w) for w in args.workers.split(",") if w]
    small_workers = [int(w) for w in args.small_workers.split(",") if w]
    import torch

    machine = {
        "cpus": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "processor": platform.processor() or platform.machine(),
    }
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            machine["model"] = next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), "")
    except OSError:
        pass
    print(json.dumps({"machine": machine}), flush=True)
    results: dict[str, Any] = {"machine": machine, "heavy": [], "small": []}
    with tempfile.TemporaryDirectory(prefix="loader-bench-scaling-") as work:
        heavy_files = datagen.generate(
            os.path.join(work, "heavy"), format="npz", files=HEAVY_FILES, samples=HEAVY_SAMPLES, dim=64
        )
        heavy_set = bs.NpzDataset(heavy_files, cpu_heavy)
        for w in heavy_workers:
            results["heavy"].append(
                measure("cpu_heavy", work, heavy_files, heavy_set, w, max(2, w), ["loader.examples:cpu_heavy"])
            )
        if small_workers:
            small_files = datagen.generate(
                os.path.join(work, "small"), format="npz", files=SMALL_FILES, samples=SMALL_SAMPLES, dim=64
            )
            small_set = bs.NpzDataset(small_files)
            for w in small_workers:
                # Ours reads an epoch of these in 0.07-0.09 s on 16 cores (2026-11-29): 30 epochs, about 2-3 s.
                results["small"].append(measure("small", work, small_files, small_set, w, 3, [], ours_epochs=30))
    efficiency(results["heavy"])
    efficiency(results["small"])
    print(
        table(
            f"CPU-heavy mapper (loader.examples:cpu_heavy), {HEAVY_FILES}x{HEAVY_SAMPLES} samples, batch {BATCH}",
            results["heavy"],
        )
    )
    if results["small"]:
        print(
            table(
                f"small samples (64 float32 + int64), {SMALL_FILES}x{SMALL_SAMPLES} samples, batch {BATCH}",
                results["small"],
            )
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(results, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
