"""Starting worker processes: the one place in ``loader`` that names the ``workers`` package.

The entry point travels as a ``"module:function"`` string, so ``loader`` never
imports ``workers`` itself; the spawned child imports it. The function is
called as ``function(connect, worker_id=..., stop_event=...)`` and returns an
exit code; ``connect`` is the daemon's control address, or (transports "pipe"
and "queue") the worker's end of its ``transport.links`` link. ``stop_event`` is
set when the daemon process dies without stopping its workers (SIGKILL), so an
orphaned worker exits at once rather than after its own timeouts.

Where a worker runs is ``workers.launcher``'s choice: a ``Launcher`` starts one
and stops one. "local" (``LocalLauncher``) spawns a child process of the
daemon; "ray" (``ray_launcher.RayLauncher``, imported only then) places a Ray
actor. What ``start`` returns is the worker's handle, kept as
``WorkerRecord.process``: it answers ``is_alive()``, ``exitcode`` and ``pid`` like
a ``multiprocessing`` process, so the coordinator's liveness checks, the pool's
replacements and the autoscaler treat every launcher alike.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from typing import Any, Protocol

from loader.runtime import processes
from loader.runtime.imports import import_object, import_shipped_package
from loader.service.shm import stale as stale_shm
from loader.service.shm.arena import shm_directory

log = logging.getLogger("loader.worker")

DEFAULT_WORKER_ENTRY = "workers.main:run_worker"
CLAIM_SEP = "#"  # between a started worker's id and its claim secret, in the worker id it is started with


class Launcher(Protocol):
    """Starts and stops the workers a daemon owns (see the module docstring)."""

    def start(self, connect: Any, worker_id: str, entry: str) -> Any:
        """Start one worker that runs ``entry`` against ``connect``; its handle."""

    def stop(self, handle: Any, join_timeout_s: float) -> int | None:
        """Wait up to ``join_timeout_s`` for the worker to end by itself, then end it; its exit code (None: unknown)."""

    def close(self, join_timeout_s: float) -> None:
        """Stop every worker started and not yet stopped (waiting ``join_timeout_s`` in all for them to end by
        themselves, then ending them, bounded), and let go of what the launcher holds. Idempotent."""


class LocalLauncher:
    """Workers as spawned child processes of the daemon."""

    def __init__(self) -> None:
        self._live: dict[int, Any] = {}  # id(process) -> process: what close() must still stop

    def start(self, connect: Any, worker_id: str, entry: str) -> Any:
        proc = start_worker(connect, worker_id, entry)
        self._live[id(proc)] = proc
        return proc

    def stop(self, handle: Any, join_timeout_s: float) -> int | None:
        self._live.pop(id(handle), None)
        return processes.stop_process(handle, join_timeout_s=join_timeout_s)

    def close(self, join_timeout_s: float) -> None:
        deadline = time.monotonic() + join_timeout_s
        for proc in list(self._live.values()):
            self.stop(proc, max(0.0, deadline - time.monotonic()))


def make_launcher(config: Any) -> Launcher:
    """The launcher ``config.workers.launcher`` names (``config``: a ``LoaderConfig``).

    "ray" imports Ray now, so a missing package is one ``MissingDependencyError`` before the
    daemon binds anything; it connects to the cluster only when it starts its first worker.
    """
    if config.workers.launcher == "ray":
        from loader.service.daemon.ray_launcher import RayLauncher

        return RayLauncher(config)
    return LocalLauncher()


def start_worker(connect: Any, worker_id: str, entry: str = DEFAULT_WORKER_ENTRY) -> Any:
    """Spawn one worker process that connects to the daemon at ``connect`` (an address or a link)."""
    return processes.start_process(
        _worker_process,
        (entry, connect, worker_id, os.getpid()),
        name=f"loader-worker-{worker_id.partition(CLAIM_SEP)[0]}",  # the claim secret stays out of names and logs
        method="spawn",
        import_main=False,  # a worker needs the config, never the training script
        # A terminal's Ctrl-C reaches the whole process group: the daemon (or the Loader) stops its workers in
        # order, and a worker interrupted on its own only printed a KeyboardInterrupt traceback on the way.
        ignore_interrupts=True,
    )


def _worker_process(entry: str, connect: Any, worker_id: str, daemon_pid: int) -> None:
    import_shipped_package("workers")  # not a workers.py beside the user's script
    run = import_object(entry, what="worker entry point")
    stop = threading.Event()
    processes.stop_when_orphaned(stop, daemon_pid)
    try:
        code = run(connect, worker_id=worker_id, stop_event=stop)
    finally:
        if os.getppid() != daemon_pid:
            # The daemon died without closing (SIGKILL, or a training script ended by SIGTERM with no handler):
            # its shared-memory files are RAM nobody can free but the next daemon. Its workers free them now.
            directory = shm_directory()
            removed = stale_shm.sweep_after(daemon_pid, directory)
            # Said by the worker that removed them only: every worker sweeps, and each used to say so, "removed 0"
            # too; and a Loader's workers have a training script, not a daemon, for their parent.
            log.log(
                logging.WARNING if removed else logging.DEBUG,
                "the process that started this worker (pid %d: a loader daemon, or a training script's Loader) is "
                "gone; removed %d shared-memory file(s) it left in %s",
                daemon_pid,
                len(removed),
                directory,
            )
    sys.exit(code)


__all__ = ["start_worker", "make_launcher", "Launcher", "LocalLauncher", "DEFAULT_WORKER_ENTRY"]
