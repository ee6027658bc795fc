"""Starting worker processes: the one place in ``loader`` that names the ``workers`` package.

The entry point travels as a ``"module:function"`` string, so ``loader`` never
imports ``workers`` itself; the spawned child imports it. The function is
called as ``function(connect, worker_id=..., stop_event=...)`` and returns an
exit code; ``connect`` is the daemon's control address, or (transports "pipe"
and "queue") the worker's end of its ``transport.links`` link. ``stop_event`` is
set when the daemon process dies without stopping its workers (SIGKILL), so an
orphaned worker exits at once rather than after its own timeouts.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

from loader.runtime import processes
from loader.runtime.imports import import_object

DEFAULT_WORKER_ENTRY = "workers.main:run_worker"


def start_worker(connect: Any, worker_id: str, entry: str = DEFAULT_WORKER_ENTRY) -> Any:
    """Spawn one worker process that connects to the daemon at ``connect`` (an address or a link)."""
    return processes.start_process(
        _worker_process,
        (entry, connect, worker_id, os.getpid()),
        name=f"loader-worker-{worker_id}",
        method="spawn",
        import_main=False,  # a worker needs the config, never the training script
    )


def _worker_process(entry: str, connect: Any, worker_id: str, daemon_pid: int) -> None:
    run = import_object(entry, what="worker entry point")
    stop = threading.Event()
    processes.stop_when_orphaned(stop, daemon_pid)
    sys.exit(run(connect, worker_id=worker_id, stop_event=stop))


__all__ = ["start_worker", "DEFAULT_WORKER_ENTRY"]
