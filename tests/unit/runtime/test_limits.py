"""loader.runtime.limits: the soft limit on open files is raised to what the hard limit allows."""

from __future__ import annotations

import subprocess
import sys

import pytest

resource = pytest.importorskip("resource")

CHILD = """
import resource
from loader.runtime.limits import raise_open_files_limit
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
print(soft, raise_open_files_limit(), resource.getrlimit(resource.RLIMIT_NOFILE)[0], hard)
"""


def test_a_small_soft_limit_is_raised_within_the_hard_one() -> None:
    # In a child started with a soft limit of 256 (as some containers have): this process keeps its own.
    def small() -> None:
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))

    done = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60, preexec_fn=small, check=True
    )
    before, returned, after, hard = (int(v) for v in done.stdout.split())
    assert before == 256
    assert after == returned > 256 or hard == 256
    assert hard == resource.RLIM_INFINITY or after <= hard
