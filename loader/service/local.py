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

import atexit
import contextlib
import dataclasses
import itertools
import os
import shutil
import signal
import sys
import tempfile
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from loader.config import LoaderConfig, load_config
from loader.errors import ClosedError, ServiceUnavailableError
from loader.reader.batches import batch_reader
from loader.service.client.ask import query_status
from loader.service.client.client import Client, EpochBatches, NotADataset
from loader.service.daemon.launcher import DEFAULT_WORKER_ENTRY
from loader.service.daemon.loop import Daemon

DAEMON_JOIN_TIMEOUT_S = 5.0
STATUS_TIMEOUT_S = 5.0


def _private_endpoint() -> tuple[str, str | None]:
    if sys.platform == "win32":
        return "tcp://127.0.0.1:*", None
    tmpdir = tempfile.mkdtemp(prefix="loader-")
    return f"ipc://{os.path.join(tmpdir, 'control')}", tmpdir


class _Parts:
    """What a ``Loader`` owns, apart from the ``Loader`` itself, so a finalizer can stop it all
    without keeping the ``Loader`` alive (``weakref.finalize`` must not hold its object)."""

    def __init__(self) -> None:
        self.tmpdir: str | None = None
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        self.client: Client | None = None
        self.more_clients: list[Client] = []  # Loader.client(dataset=...)
        self.daemon: Daemon | None = None

    def remove_tmpdir(self) -> None:
        if self.tmpdir is not None:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            self.tmpdir = None


# Loaders not closed yet, closed at interpreter exit by ``_close_live_loaders``, before pyzmq's exit hook.
_LIVE_LOADERS: weakref.WeakSet[Loader] = weakref.WeakSet()


@atexit.register
def _close_live_loaders() -> None:
    """Close the Loaders left open, first thing at exit: exit hooks run last registered first, and pyzmq's,
    which stops the thread that frees what zero-copy sends hold, was registered when ``transport`` was
    imported, before this module's. A Loader left to its finalizer (``weakref.finalize`` registered its
    hook before any of these) was closed after it, while its daemon thread still sent batches: a
    "zmq gc socket requested during shutdown" traceback, and one exit in four aborted in libzmq."""
    for loader in [loader for loader in _LIVE_LOADERS if loader._pid == os.getpid()]:  # a fork's are its parent's
        try:
            loader.close()
        except Exception:  # best effort on the way out
            pass


def _shut_down(parts: _Parts) -> None:
    """Stop the client, the daemon thread and the workers; release the shared memory and the endpoint."""
    with _interrupts_deferred():
        for client in [parts.client, *parts.more_clients]:
            if client is not None:
                client.close()
        parts.stop.set()
        if parts.thread is not None:
            parts.thread.join(DAEMON_JOIN_TIMEOUT_S)
        if parts.daemon is not None:
            parts.daemon.close()
        parts.remove_tmpdir()


@contextlib.contextmanager
def _interrupts_deferred() -> Iterator[None]:
    """Hold Ctrl-C while the ``Loader`` closes (a few seconds at most, every wait is bounded), then raise it.

    A second Ctrl-C during the shutdown the first one began interrupted the join of the workers: a traceback
    from inside ``close`` and, before the daemon freed its arenas in a ``finally``, files left in /dev/shm.
    Only the main thread may set handlers; elsewhere (a finalizer on another thread) nothing is deferred."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    try:
        previous = signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum))
    except ValueError:  # not the main interpreter
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)  # None: set in C
        # The held interrupt is raised now (Python's default handler raises KeyboardInterrupt), unless one is
        # already on its way out: the first Ctrl-C, which began this shutdown.
        if held and callable(previous) and not isinstance(sys.exc_info()[1], KeyboardInterrupt):
            previous(signal.SIGINT, None)


def _serve(daemon: Daemon, stop: threading.Event) -> None:
    """The daemon thread's body. A failure of the loop was logged and told to the client (``Daemon.serve``),
    which raises it in the training loop: not a second time here as a traceback on stderr."""
    try:
        daemon.serve(stop)
    except ServiceUnavailableError:
        pass


class Loader(NotADataset):
    """Coordinator + stage + workers in this process, iterated like a ``Client``. Context manager.

    ``close()`` (or leaving ``with``) releases everything; a ``Loader`` that is never
    closed is closed when it is garbage-collected or, at the latest, when the
    interpreter exits, so its workers and shared memory never outlive the program.
    """

    def __init__(
        self,
        config: LoaderConfig | str | os.PathLike[str],
        *,
        worker_entry: str = DEFAULT_WORKER_ENTRY,
        bind: str | None = None,
    ) -> None:
        if isinstance(config, (str, os.PathLike)):
            config = load_config(config)  # Loader("train.toml"), as loader.torch.DataLoader takes it
        elif not isinstance(config, LoaderConfig):
            as_dict = (
                " (a dict of sections: loader.config.LoaderConfig.from_dict(d))" if isinstance(config, Mapping) else ""
            )
            raise TypeError(
                f"Loader takes a config file's path or loader.load_config(path), got {type(config).__name__}{as_dict}"
            )
        config.check_imports()  # a broken mapper or reader module fails here, not in every worker
        self.config = config
        self._parts = parts = _Parts()
        self._finalizer = weakref.finalize(self, _shut_down, parts)  # also runs at interpreter exit
        self._pid = os.getpid()
        _LIVE_LOADERS.add(self)
        if bind is None:
            bind, parts.tmpdir = _private_endpoint()
        # The daemon thread listens where only this process looks (a private ipc endpoint by default).
        # The private endpoint is this process's own (an ipc socket file of mode 0600): no CURVE keys needed.
        service = dataclasses.replace(config.service, bind=bind, daemon_key=None, authorized_keys=None)
        config = dataclasses.replace(config, service=service)
        try:
            self._daemon = parts.daemon = Daemon(config, worker_entry=worker_entry)
            parts.thread = threading.Thread(
                target=_serve, args=(self._daemon, parts.stop), name="loader-daemon", daemon=True
            )
            parts.thread.start()
            client = config.client
            self._client = parts.client = Client(  # the whole of its own daemon's data, whatever RANK says
                self._daemon.endpoint,
                rank=0,
                world_size=1,
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

    def epoch(self, epoch: int | None = None) -> EpochBatches:
        """The batches of the next epoch (or of ``epoch``); ``len()`` of it is its number of batches when known."""
        self._check_open()
        return self._client.epoch(epoch)

    @property
    def info(self) -> Any:
        """What the daemon told this loader's client when it attached (``Client.info``): ``batch_size``, an
        epoch's ``samples`` and ``batches`` where counted, ``files``, ``batch_format``."""
        return self._client.info

    def client(self, dataset: str = "default", **options: Any) -> Client:
        """Another ``Client`` of this loader's daemon, e.g. for the dataset ``"eval"`` of the config's
        ``[datasets.eval]``; closed with the ``Loader``. ``options`` are ``Client``'s keyword arguments
        (device, prefetch, timeout_s default to the config's ``[client]``; rank and world_size to the whole of it,
        as for the ``Loader``'s own client: this daemon serves this process alone, whatever RANK or
        torch.distributed's process group say)."""
        self._check_open()
        client = self.config.client
        options = {
            "device": client.device,
            "prefetch": client.prefetch,
            "timeout_s": client.timeout_s,
            "rank": 0,
            "world_size": 1,
            **options,
        }
        made = Client(self._daemon.endpoint, dataset=dataset, **options)
        self._parts.more_clients.append(made)
        return made

    def reader(self) -> Callable[[], Iterator[Any]]:
        """A paddle batch reader: each call iterates the next epoch, as lists of sample tuples in field order."""
        return batch_reader(self.epoch)

    def state_dict(self, held: int = 0) -> dict[str, Any]:
        """Where the training loop stands (``Client.state_dict``, ``held`` too): a daemon serving the same
        config, or another ``Loader``, resumes from it with ``load_state_dict``."""
        return self._client.state_dict(held)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: the next ``epoch()`` (or iteration) resumes its epoch where it stood."""
        self._check_open()
        self._client.load_state_dict(state)

    def __iter__(self) -> Iterator[Any]:
        """The batches of every epoch the config names (``pipeline.epochs``; 0: until the caller stops),
        from the epoch a loaded state stands in."""
        epochs = self.config.pipeline.epochs
        first = self._client._next_epoch
        if 0 < epochs <= first:
            # ``for epoch in range(n): for batch in data:`` (as with torch's DataLoader) would train once and
            # then n - 1 times on nothing, with no word: say so.
            warnings.warn(
                f"this Loader has run the {epochs} epoch(s) its config names (pipeline.epochs), so iterating it "
                "again gives no batches: iterate data.epoch() once per epoch, or raise pipeline.epochs",
                stacklevel=2,
            )
        for _ in range(first, epochs) if epochs > 0 else itertools.count():
            yield from self.epoch()

    def stats(self) -> dict[str, Any]:
        """What its client has done (``Client.stats``): batches taken, batches and samples received, seconds
        the training loop waited for data (near 0: the loader keeps up)."""
        return self._client.stats()

    def status(self, timeout_s: float = STATUS_TIMEOUT_S) -> dict[str, Any]:
        """The daemon's status, answered by its loop thread (``ServiceUnavailableError`` after ``timeout_s``)."""
        self._check_open()
        return query_status(self._daemon.endpoint, timeout_s=timeout_s)

    def close(self) -> None:
        """Stop the client, the daemon thread and the workers. Idempotent."""
        self._finalizer()  # runs _shut_down once; later calls do nothing

    def _check_open(self) -> None:
        # After close() an epoch said "the client is closed" (a client the caller never made), and status() waited
        # timeout_s to say that no daemon answered at a private ipc address, as if `loader serve` were missing.
        if not self._finalizer.alive:
            raise ClosedError("this Loader is closed: make a new one (or use it inside its with block)")

    def __repr__(self) -> str:
        state = "closed" if not self._finalizer.alive else f"{self.config.workers.count} workers"
        return f"<Loader {self.config.origin!r}, {state}>"

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


__all__ = ["Loader"]
