"""A worker's allocator keeps freed memory (``runtime.memory``): large outputs reuse pages."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from loader.runtime.memory import keep_freed_memory

# Batches of 64 outputs of 588 KiB (decoded images), kept together then freed, as a worker's chunks are.
CHURN = textwrap.dedent(
    """
    import resource, sys
    import numpy as np
    from loader.runtime.memory import keep_freed_memory
    kept = keep_freed_memory(int(sys.argv[1]))
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(12):
        batch = [np.ones(147_000, np.float32) for _ in range(64)]
        del batch
    print(kept, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults)
    """
)


def _faults(keep_mib: int) -> tuple[bool, int]:
    out = subprocess.run([sys.executable, "-c", CHURN, str(keep_mib)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    kept, faults = out.stdout.split()
    return kept == "True", int(faults)


def test_freed_pages_are_reused_instead_of_faulted_in_again():
    kept, with_keep = _faults(512)
    if not kept:
        pytest.skip("this platform's allocator is not glibc: nothing to tune")
    changed, default_faults = _faults(0)
    assert not changed  # 0 leaves the defaults
    # 12 batches of 37 MiB: the defaults fault every page in each time, kept memory only the first.
    assert with_keep * 3 < default_faults, (with_keep, default_faults)


def test_zero_or_an_allocator_that_is_not_glibc_changes_nothing(monkeypatch):
    assert keep_freed_memory(0) is False
    import ctypes

    def no_libc(*args, **kwargs):
        raise OSError("no such library")

    monkeypatch.setattr(ctypes, "CDLL", no_libc)
    assert keep_freed_memory(64) is False
