"""How a worker's C allocator treats freed memory (glibc ``mallopt``), so mapped samples reuse pages.

A mapper that makes a large array per sample (a decoded, normalised image is 588 KiB) gets it
from ``malloc``. glibc serves such sizes with a fresh ``mmap`` at first and gives freed memory
back to the kernel soon after, so every sample's array faults its pages in again: on the
benchmark VM that made keeping a batch's outputs cost 0.93 ms per image against 0.70 ms with
pages reused (``scripts/bench_images.py --steps``). Raising the mmap threshold to its ceiling
and the trim threshold to ``keep_mib`` keeps up to that much freed memory in the worker for
the next samples. It only ever changes this process's allocator; other C libraries, and
platforms without glibc, are left as they are.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger("loader.worker")

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_MAX = 32 * 1024 * 1024  # glibc's ceiling on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX)


def keep_freed_memory(keep_mib: int) -> bool:
    """Let this process's allocator keep up to ``keep_mib`` MiB it freed; False where it cannot (not
    glibc) or ``keep_mib`` is 0 (the allocator's defaults stay)."""
    if keep_mib <= 0:
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to tune
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    keep = min(keep_mib * 1024 * 1024, 2**31 - 1)
    done = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX) == 1 and mallopt(M_TRIM_THRESHOLD, keep) == 1
    if not done:
        log.debug("mallopt refused the worker's memory settings; the allocator's defaults stay")
    return done


__all__ = ["keep_freed_memory"]
