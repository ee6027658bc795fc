"""Starting worker processes: the one place in ``loader`` that names the ``workers`` package.

The entry point travels as a ``"module:function"`` string, so ``loader`` never
imports ``workers`` itself; the spawned child imports it. The function is
called as ``function(connect, worker_id=...)`` and returns an exit code;
``connect`` is the daemon's control address, or (transports "pipe" and
"queue") the worker's end of its ``mp_transport`` link.
"""

from __future__ import annotations

import sys
from typing import Any

from loader import processes
from loader._imports import import_object

DEFAULT_WORKER_ENTRY = "workers.main:run_worker"


def start_worker(connect: Any, worker_id: str, entry: str = DEFAULT_WORKER_ENTRY) -> Any:
    """Spawn one worker process that connects to the daemon at ``connect`` (an address or a link)."""
    return processes.start_process(
        _worker_process,
        (entry, connect, worker_id),
        name=f"loader-worker-{worker_id}",
        method="spawn",
    )


def _worker_process(entry: str, connect: Any, worker_id: str) -> None:
    run = import_object(entry, what="worker entry point")
    sys.exit(run(connect, worker_id=worker_id))


__all__ = ["start_worker", "DEFAULT_WORKER_ENTRY"]
