"""Benchmarks of RecordIO's Snappy codec (imported by ``scripts/bench``; ``run(quick)`` -> rows).

Snappy is decoded by cramjam's C code when the ``snappy`` extra is installed (the test and
bench extras install it), else in pure Python. Peer: the same chunk compressed with ZLIB (C
code in the standard library), decoded by the same ``unpack_payload``. Target with the extra:
Snappy decodes at least half as fast as ZLIB; without it the figures are information.

1. decode MB/s of uncompressed payload, for msgpack records of MNIST-like images
   (mostly zeros), noisy small-integer images, and random bytes (stored raw);
2. CRC32C (the per-block checksum): numpy path against pure-Python slicing-by-8.

Run alone: ``.venv/bin/python scripts/bench_recordio.py [--quick]``.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from loader.recordio import Compressor, chunks, crc32c, native
from loader.runtime import codec

BLOCK_BYTES = 32768


def _best(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def _records(kind: str, count: int) -> list[bytes]:
    rng = np.random.default_rng(0)
    if kind == "random":
        return [rng.bytes(1000) for _ in range(count)]
    out = []
    for i in range(count):
        if kind == "mnist-like":
            image = np.zeros((28, 28), np.uint8)
            image[6:20, 8:20] = rng.integers(0, 256, (14, 12)) * (rng.random((14, 12)) < 0.5)
        else:
            image = rng.integers(0, 8, (16, 16), dtype=np.uint8)
        out.append(codec.pack({"image": image, "label": i % 10, "name": f"s{i:06d}"}))
    return out


def _decode_speed(records: list[bytes], compressor: Compressor, repeats: int) -> tuple[float, float]:
    """(MB/s of payload decoded, stored/raw size) for one chunk of ``records``."""
    chunk = chunks.pack_chunk(records, compressor)
    count, checksum, comp, size = chunks.parse_header("bench", 0, chunk[: chunks.HEADER.size])
    stored = chunk[chunks.HEADER.size :]
    raw = sum(chunks.RECORD_LEN.size + len(r) for r in records)
    seconds = _best(lambda: chunks.unpack_payload("bench", 0, count, checksum, comp, stored), repeats)
    return raw / seconds / 1e6, size / raw


def bench_decode(kind: str, quick: bool) -> dict:
    records = _records(kind, 300 if quick else 2000)
    repeats = 2 if quick else 5
    ours, ratio_stored = _decode_speed(records, Compressor.SNAPPY, repeats)
    peer, _ = _decode_speed(records, Compressor.ZLIB, repeats)
    native_codecs = native.SNAPPY is not None
    return {
        "name": f"recordio: Snappy decode, {kind} (MB/s)",
        "ours": ours,
        "peer": peer,
        "unit": "MB/s",
        "ratio": ours / peer,
        "target": ">= 0.5 (within 2x of ZLIB)" if native_codecs else "none (pure Python: information)",
        "passed": ours / peer >= 0.5 if native_codecs else None,
        "detail": f"{len(records)} records in one chunk, Snappy stored/raw {ratio_stored:.2f}; "
        f"peer = the same chunk as ZLIB; best of {repeats}; {native.describe()}",
    }


def bench_crc32c(quick: bool) -> dict:
    block = os.urandom(BLOCK_BYTES)
    repeats = 3 if quick else 10
    crc32c.masked_crc32c(block)  # builds the numpy tables outside the timing
    ours = BLOCK_BYTES / _best(lambda: crc32c.masked_crc32c(block), repeats) / 1e6
    peer = BLOCK_BYTES / _best(lambda: crc32c.crc32c_python(block), repeats) / 1e6
    return {
        "name": "recordio: CRC32C of 32 KiB blocks (MB/s)",
        "ours": ours,
        "peer": peer,
        "unit": "MB/s",
        "ratio": ours / peer,
        "target": "none (information)",
        "passed": None,
        "detail": f"ours = {native.describe()}; peer = the numpy fallback; best of {repeats}",
    }


def run(quick: bool = False) -> list[dict]:
    """Measure the Snappy codec; see the module docstring."""
    return [*(bench_decode(kind, quick) for kind in ("mnist-like", "noisy", "random")), bench_crc32c(quick)]


if __name__ == "__main__":
    if {"-h", "--help"} & set(sys.argv[1:]):  # the docstring is the usage; run nothing
        print(__doc__)
        sys.exit(0)
    for row in run(quick="--quick" in sys.argv[1:]):
        print(
            f"{row['name']:<48} ours={row['ours']:.4g} peer={row['peer']:.4g} {row['unit']} "
            f"ratio={row['ratio']:.2f} ({row['detail']})"
        )
