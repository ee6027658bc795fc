"""``Loader(config)``: the daemon's coordinator, stage and workers inside the training process.

The same ``Daemon`` runs on a background thread, bound to a private endpoint
(an ipc socket in a temporary directory, or a loopback TCP port where ipc is not
available), and a ``Client`` reads from it, so local and service mode share
every line of the data path. Iterating a ``Loader`` runs
``config.pipeline.epochs`` epochs (0: until the caller stops).

``config.workers.transport`` picks how the workers reach the daemon: "zmq"
(the private endpoint, as in service mode), or "pipe" / "queue" (a pipe link
per worker made with ``multiprocessing``: see ``transport.links``). The ``Client``
inside a ``Loader`` always reaches its daemon thread over the private endpoint.

``status()`` is asked of the daemon's loop over that endpoint, like
``loader status``, so it never reads the loop's state from another thread.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from typing import Any

from loader.config import LoaderConfig
from loader.reader.batches import batch_reader
from loader.service.client.client import Client, query_status
from loader.service.daemon.launcher import DEFAULT_WORKER_ENTRY
from loader.service.daemon.loop import Daemon

DAEMON_JOIN_TIMEOUT_S = 5.0
STATUS_TIMEOUT_S = 5.0


def _private_endpoint() -> tuple[str, str | None]:
    if sys.platform == "win32":
        return "tcp://127.0.0.1:*", None
    tmpdir = tempfile.mkdtemp(prefix="loader-")
    return f"ipc://{os.path.join(tmpdir, 'control')}", tmpdir


class Loader:
    """Coordinator + stage + workers in this process, iterated like a ``Client``. Context manager."""

    def __init__(
        self, config: LoaderConfig, *, worker_entry: str = DEFAULT_WORKER_ENTRY, bind: str | None = None
    ) -> None:
        self.config = config
        self._tmpdir: str | None = None
        if bind is None:
            bind, self._tmpdir = _private_endpoint()
        # The daemon thread listens where only this process looks (a private ipc endpoint by default).
        config = dataclasses.replace(config, service=dataclasses.replace(config.service, bind=bind))
        self._stop = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._client: Client | None = None
        try:
            self._daemon = Daemon(config, worker_entry=worker_entry)
        except BaseException:
            self._remove_tmpdir()
            raise
        try:
            self._thread = threading.Thread(
                target=self._daemon.serve, args=(self._stop,), name="loader-daemon", daemon=True
            )
            self._thread.start()
            client = config.client
            self._client = Client(
                self._daemon.endpoint,
                device=client.device,
                prefetch=client.prefetch,
                timeout_s=client.timeout_s,
                progress_timeout_s=client.progress_timeout_s,
            )
        except BaseException:
            self.close()
            raise

    @property
    def endpoint(self) -> str:
        return self._daemon.endpoint

    def epoch(self, epoch: int | None = None) -> Iterator[Any]:
        """The batches of the next epoch (or of ``epoch``)."""
        assert self._client is not None
        return self._client.epoch(epoch)

    def reader(self) -> Callable[[], Iterator[Any]]:
        """A paddle batch reader: each call iterates the next epoch, as lists of sample tuples in field order."""
        return batch_reader(self.epoch)

    def __iter__(self) -> Iterator[Any]:
        epochs = self.config.pipeline.epochs
        for _ in range(epochs) if epochs > 0 else itertools.count():
            yield from self.epoch()

    def status(self, timeout_s: float = STATUS_TIMEOUT_S) -> dict[str, Any]:
        """The daemon's status, answered by its loop thread (``ServiceUnavailableError`` after ``timeout_s``)."""
        return query_status(self._daemon.endpoint, timeout_s=timeout_s)

    def close(self) -> None:
        """Stop the client, the daemon thread and the workers. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._client is not None:
            self._client.close()
        self._stop.set()
        if self._thread is not None:
            self._thread.join(DAEMON_JOIN_TIMEOUT_S)
        self._daemon.close()
        self._remove_tmpdir()

    def _remove_tmpdir(self) -> None:
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


__all__ = ["Loader"]
