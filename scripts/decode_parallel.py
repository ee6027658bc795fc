"""The image mapper alone in N processes at once: the decode limit when N cores are busy.

    python scripts/decode_parallel.py [N ...]     (default 1 2 4 8 14)

``bench_images``' limit is ``workers x`` the mapper's rate on one core with the others idle. On a
machine whose cores share execution units or a power budget (SMT siblings behind a VM's vCPUs,
all-core turbo below single-core turbo), N busy cores each run slower than one alone; this prints
the summed rate of N processes running only ``decode_crop_flip`` over JPEG bytes in RAM, each for
the same few seconds, beside N x the one-process rate.
"""

from __future__ import annotations

import multiprocessing
import sys
import time

import numpy as np

SECONDS = 3.0


def spin(jpegs: list[bytes], start_at: float, out: multiprocessing.Queue[tuple[float, float]]) -> None:
    from bench_images import allocator_as_in_workers

    from loader.examples.images import decode_crop_flip

    # Left to glibc's defaults, a fresh process gives each image's arrays back to the kernel and faults them in
    # again: about 250 page faults an image, and half the rate on the 2-core VM (the "lone rate" that moved
    # with the process it ran in, docs/performance.md, was this).
    allocator_as_in_workers()
    arrays = [np.frombuffer(data, np.uint8) for data in jpegs]
    decode_crop_flip([arrays[0], np.int64(0)], np.random.default_rng(0))  # Pillow imported before the clock
    while time.time() < start_at:
        time.sleep(0.001)
    late = time.time() - start_at  # a process ready after the others overlaps them less
    count, begin = 0, time.perf_counter()
    while time.perf_counter() - begin < SECONDS:
        decode_crop_flip([arrays[count % len(arrays)], np.int64(0)], np.random.default_rng(count))
        count += 1
    out.put((count / (time.perf_counter() - begin), late))


def summed_rate(jpegs: list[bytes], n: int) -> float:
    ctx = multiprocessing.get_context("spawn")
    out: multiprocessing.Queue[tuple[float, float]] = ctx.Queue()
    start_at = time.time() + 2.0 + 0.2 * n  # every process started, imported and ready before the clock starts
    procs = [ctx.Process(target=spin, args=(jpegs, start_at, out)) for _ in range(n)]
    for p in procs:
        p.start()
    results = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=10)
    late = max(lateness for _, lateness in results)
    if late > 0.05:
        print(f"warning: with {n} processes one began {late:.2f} s late; the sum overstates the rate", flush=True)
    return sum(rate for rate, _ in results)


def main(argv: list[str]) -> int:
    from bench_images import make_jpeg

    counts = [int(a) for a in argv] or [1, 2, 4, 8, 14]
    jpegs = [make_jpeg(i) for i in range(64)]
    one = summed_rate(jpegs, 1)
    print(f"{'processes':>9} {'images/s':>10} {'N x one':>10} {'ratio':>6}")
    for n in counts:
        rate = one if n == 1 else summed_rate(jpegs, n)
        print(f"{n:>9} {rate:>10,.0f} {n * one:>10,.0f} {rate / (n * one):>6.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
