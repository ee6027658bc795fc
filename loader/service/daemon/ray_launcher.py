"""Workers as Ray actors (``[workers] launcher = "ray"``): the one module of ``loader`` that imports ``ray``.

Ray only places and supervises the workers; the data path stays ours. Each
worker the daemon starts is one actor requesting ``workers.ray_cpus_per_worker``
CPUs, whose single method runs the normal worker loop (the entry point, as a
spawned local worker does) against the daemon's control address, with the
claimed id and CURVE keys the daemon gives its own workers. So Ray's scheduler
(and its autoscaler, which adds nodes for pending CPU requests) decides where
workers run, while every sample still travels over the worker's ZeroMQ sockets.

* Liveness: the handle of a worker (``RayWorker``) is alive while the actor's
  ``run`` call has not resolved; a finished run, a crashed or killed actor or a
  lost node resolves it, and the daemon's usual checks (``Coordinator.find_dead``)
  re-lease the worker's files and start a replacement, as for a dead process.
* Ownership: the actors are not detached, so they share the fate of the process
  that created them (the daemon): Ray kills them if the daemon dies. ``stop``
  kills an actor even after its run returned, since an idle actor keeps its CPUs;
  ``close`` kills any left and disconnects from Ray, shutting Ray down only when
  this launcher started it.
* Connecting: ``ray.init`` (at the first ``start``) runs in a thread of the launcher while start-up waits
  at most ``workers.ray_connect_timeout_s`` (60 s): an address where no cluster answers fails start-up in
  one line, and a stop signal meanwhile ends the wait at once.
* Reachability: a daemon bound to loopback or ipc:// can only be reached from its
  own node, so its actors are pinned there (``NodeAffinitySchedulingStrategy``);
  a wildcard bind (``tcp://0.0.0.0:PORT``) is dialled at this node's Ray address.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

from loader.errors import MissingDependencyError, TransportError
from loader.runtime.imports import import_object, import_shipped_package
from loader.service.daemon.launcher import CLAIM_SEP
from loader.service.transport.auth import Dial

log = logging.getLogger("loader.daemon")

INSTALL_HINT = (
    "install the ray extra from the project's checkout (pip install '/path/to/loader[ray]') or pip install ray"
)
# After ray.kill, how long stop() waits for Ray to report the actor dead (its CPUs then go back to the cluster).
KILL_TIMEOUT_S = 5.0
DEATH_POLL_S = 0.02
# Reading the exit code of a run that has resolved (a small value held by this process: at once in practice).
RESULT_TIMEOUT_S = 5.0
# The main thread waits for the connect in slices this long, so that a stop signal ends the wait promptly.
CONNECT_POLL_S = 0.1
_WILDCARD_HOSTS = ("0.0.0.0", "*", "[::]", "::")


def require_ray(origin: str = "the config") -> Any:
    """The ``ray`` module, or ``MissingDependencyError`` saying how to install it."""
    try:
        import ray
    except ImportError as exc:
        if exc.name == "ray":
            raise MissingDependencyError(
                f"workers.launcher = 'ray' ({origin}) needs the ray package, which is not installed: {INSTALL_HINT}"
            ) from None
        raise MissingDependencyError(
            f"workers.launcher = 'ray' ({origin}) needs the ray package, which fails to import: {exc}"
        ) from exc
    return ray


class LoaderWorker:
    """The actor class (``ray.remote`` is applied at run time, so this module imports without Ray)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:  # Ray prefixes the actor's log lines with this: the worker id, as status shows it
        return f"LoaderWorker({self.name})"

    def run(self, entry: str, connect: Any, worker_id: str) -> int:
        """Serve the daemon until it says goodbye; the worker's exit code."""
        import_shipped_package("workers")  # not a workers.py of the user's, first on the inherited path
        run = import_object(entry, what="worker entry point")
        # Never set: an actor outlives no daemon (Ray kills it with its owner), unlike a local orphan.
        stop = threading.Event()
        return int(run(connect, worker_id=worker_id, stop_event=stop))


class RayWorker:
    """One worker actor, answering like a ``multiprocessing`` process (``is_alive``, ``exitcode``, ``pid``)."""

    pid = None  # the actor's process id arrives with its HELLO (WorkerRecord.pid)

    def __init__(self, ray: Any, actor: Any, done: Any, name: str) -> None:
        self.actor = actor  # the ActorHandle (tests kill it with ray.kill)
        self.name = name
        self._ray = ray
        self.done = done  # the ObjectRef of its run() call: resolves when the run returns or the actor dies
        self._ended = False
        self._exitcode: int | None = None
        self.exit_reason: str | None = None  # why it ended, for the daemon's log line
        self.actor_died = False  # its run failed because the actor is gone (not just returned)

    def is_alive(self) -> bool:
        if not self._ended:
            # A local check of a reference this process owns: no round trip, cheap enough for every tick.
            ready, _ = self._ray.wait([self.done], timeout=0, fetch_local=False)
            if ready:
                self._ended = True
                self._read_result()
        return not self._ended

    @property
    def exitcode(self) -> int | None:
        self.is_alive()
        return self._exitcode

    def wait(self, timeout_s: float) -> bool:
        """Until the run resolves, at most ``timeout_s`` seconds; whether it is still going."""
        if timeout_s > 0 and not self._ended:
            self._ray.wait([self.done], timeout=timeout_s, fetch_local=False)
        return self.is_alive()

    def _read_result(self) -> None:
        exceptions = self._ray.exceptions
        try:
            self._exitcode = int(self._ray.get(self.done, timeout=RESULT_TIMEOUT_S))
            self.exit_reason = f"exited with code {self._exitcode}"
        except exceptions.RayActorError as exc:  # killed, crashed, or lost with its node: no exit code
            self.actor_died = True
            self.exit_reason = f"its Ray actor died: {_last_line(exc)}"
        except exceptions.RayTaskError as exc:  # the worker raised; a local worker would exit with 1
            self._exitcode = 1
            cause = getattr(exc, "cause", None) or exc
            self.exit_reason = f"raised {type(cause).__name__}: {_last_line(cause)}"
        except exceptions.GetTimeoutError:
            self.exit_reason = f"its Ray actor ended; no result within {RESULT_TIMEOUT_S:g}s"
        except exceptions.RayError as exc:  # the result itself was lost (its owner's store, a node): no code
            self.exit_reason = f"its Ray call failed: {_last_line(exc)}"


class RayLauncher:
    """Starts the daemon's workers as Ray actors; see the module docstring."""

    def __init__(self, config: Any) -> None:
        """``config``: the daemon's ``LoaderConfig``. Imports Ray now; connects at the first ``start``."""
        self._ray = require_ray(config.origin)
        workers = config.workers
        self._address: str = workers.ray_address
        self._connect_timeout_s: float = workers.ray_connect_timeout_s
        self._cpus: float = workers.ray_cpus_per_worker
        self._origin: str = config.origin
        self._pinned = config.service.is_loopback  # only this node can dial a loopback or ipc:// address
        self._actor_class: Any = None  # set on connecting
        self._options: dict[str, Any] = {}
        self._node_ip = ""
        self._own_ray = False  # this launcher called ray.init, so ray.shutdown is its to call
        self._live: dict[int, RayWorker] = {}  # id(handle) -> handle: what close() must still stop
        self._connecting: threading.Thread | None = None  # the thread running ray.init (``_init_ray``)

    def _connect(self) -> None:
        if self._actor_class is not None:
            return
        ray = self._ray
        if not ray.is_initialized():  # else this process already is a Ray driver: use its connection
            self._init_ray()
            self._own_ray = True
        options: dict[str, Any] = {"num_cpus": self._cpus, "max_restarts": 0, "max_task_retries": 0}
        if self._pinned:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            node = ray.get_runtime_context().get_node_id()
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=node, soft=False)
        self._node_ip = ray.util.get_node_ip_address()
        self._options = options
        self._actor_class = ray.remote(LoaderWorker)

    def _init_ray(self) -> None:
        """``ray.init`` at workers.ray_address within workers.ray_connect_timeout_s, else ``TransportError``.

        ray.init has no deadline of its own (an address where nothing answers kept ``loader serve`` silent
        for minutes, deaf to SIGTERM), so it runs in a thread of this launcher while the caller waits, in
        slices a signal handler can run between. Off the main thread, Ray also leaves the program's
        SIGTERM/SIGINT handlers alone."""
        where = f"a Ray cluster at workers.ray_address {self._address!r} ({self._origin})"
        if self._connecting is not None and self._connecting.is_alive():  # never two ray.init at once
            raise TransportError(f"workers.launcher = 'ray' is still connecting to {where}, from an earlier start")
        extra = {"include_dashboard": False} if self._address == "local" else {}
        done = threading.Event()
        failed: list[BaseException] = []

        def connect() -> None:
            quiet = logging.getLogger("ray._private.worker")  # Ray's warning that it set no SIGTERM handler
            quiet.addFilter(_not_setting_sigterm)  # is this module's intent (the program keeps its own)
            try:
                self._ray.init(address=self._address, **extra)
            except BaseException as exc:  # ConnectionError, RuntimeError, ValueError, Ray's SystemExit: all fail
                failed.append(exc)
            finally:
                quiet.removeFilter(_not_setting_sigterm)
                done.set()

        # A daemon thread: when the deadline passes it is left behind, still inside ray.init (which cannot be
        # cancelled), and start-up fails, so the process is exiting: a daemon thread does not hold that up.
        # Should ray.init still succeed later, Ray's own exit hook (ray.shutdown at exit) disconnects.
        thread = threading.Thread(target=connect, name="loader-ray-connect", daemon=True)
        self._connecting = thread
        stopped: list[int] = []
        deadline = time.monotonic() + self._connect_timeout_s
        with _program_signal_handlers(), _noting_stop_signals(stopped):
            thread.start()
            while not done.wait(max(0.0, min(CONNECT_POLL_S, deadline - time.monotonic()))):
                if stopped:  # the program's handler ran (and, for `loader serve`, asked the daemon to stop)
                    name = signal.Signals(stopped[0]).name
                    raise TransportError(f"workers.launcher = 'ray': {name} while connecting to {where}")
                if time.monotonic() >= deadline:
                    raise TransportError(
                        f"workers.launcher = 'ray' cannot reach {where}: ray.init did not connect within "
                        f"{self._connect_timeout_s:g}s (workers.ray_connect_timeout_s)"
                    )
        self._connecting = None
        if failed:
            cause = failed[0]
            raise TransportError(f"workers.launcher = 'ray' cannot reach {where}: {_last_line(cause)}") from cause

    def start(self, connect: Any, worker_id: str, entry: str) -> RayWorker:
        """Create one actor and call its ``run``; the call returns at once (the actor may wait for CPUs)."""
        self._connect()
        name = worker_id.partition(CLAIM_SEP)[0]  # never the claim: it would show in Ray's dashboard
        actor = self._actor_class.options(**self._options).remote(name)
        handle = RayWorker(self._ray, actor, actor.run.remote(entry, self._dialable(connect), worker_id), name)
        self._live[id(handle)] = handle
        return handle

    def stop(self, handle: RayWorker, join_timeout_s: float) -> int | None:
        """Wait for the run to end, then kill the actor and wait (bounded) until Ray has it dead."""
        handle.wait(join_timeout_s)
        self._kill([handle])
        return handle.exitcode

    def close(self, join_timeout_s: float) -> None:
        handles = list(self._live.values())
        if handles:  # one wait for all, then one kill deadline for all: bounded however many there are
            refs = [h.done for h in handles]
            self._ray.wait(refs, num_returns=len(refs), timeout=join_timeout_s, fetch_local=False)
            self._kill(handles)
        if self._own_ray:
            self._own_ray = False
            self._ray.shutdown()  # no timeout to give: Ray's own bounded teardown of what ray.init started
        self._actor_class = None

    def _kill(self, handles: list[RayWorker]) -> None:
        """Kill the actors and wait, at most KILL_TIMEOUT_S in all, until Ray has each dead (ray.kill acts
        asynchronously, and only a dead actor gives its CPUs back)."""
        for handle in handles:
            # Killed even when its run returned: an actor keeps its CPUs until it dies.
            self._ray.kill(handle.actor, no_restart=True)
            self._live.pop(id(handle), None)
        deadline = time.monotonic() + KILL_TIMEOUT_S
        undead = [h.name for h in handles if not self._dead_by(h, deadline)]
        if undead:
            log.warning(
                "%d Ray actor(s) still answered %gs after they were killed (workers %s): is the cluster responsive?",
                len(undead),
                KILL_TIMEOUT_S,
                ", ".join(undead[:8]) + (", ..." if len(undead) > 8 else ""),
            )

    def _dead_by(self, handle: RayWorker, deadline: float) -> bool:
        """Whether Ray reports the killed actor dead before ``deadline``."""
        handle.wait(deadline - time.monotonic())  # a run still going fails once its actor is dead
        if handle.actor_died:
            return True
        exceptions = self._ray.exceptions
        while time.monotonic() < deadline:  # its run had returned: only a call to the actor tells
            try:
                self._ray.get(handle.actor.__ray_ready__.remote(), timeout=max(0.0, deadline - time.monotonic()))
            except exceptions.RayActorError:
                return True
            except exceptions.GetTimeoutError:
                return False
            time.sleep(DEATH_POLL_S)
        return False

    def _dialable(self, connect: Any) -> Any:
        """``connect`` with a wildcard host replaced by this node's address, which other nodes can dial."""
        address = connect.address if isinstance(connect, Dial) else connect
        if isinstance(address, str) and address.startswith("tcp://"):
            host, port = address[len("tcp://") :].rsplit(":", 1)
            if host in _WILDCARD_HOSTS:
                address = f"tcp://{self._node_ip}:{port}"
        return dataclasses.replace(connect, address=address) if isinstance(connect, Dial) else address


@contextlib.contextmanager
def _program_signal_handlers() -> Iterator[None]:
    """Put back the SIGTERM and SIGINT handlers the program had set, which ``ray.init`` replaces in a
    main-thread driver (here it runs in a thread, but its native core worker may still install its own):
    ``loader serve`` stops on them by closing the daemon, which stops the actors and the Ray it started
    (Ray's own handler would exit at once, leaving the daemon's shared memory behind)."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        if threading.current_thread() is threading.main_thread():  # only it may set handlers
            for sig, handler in saved.items():
                if callable(handler):  # a default disposition is left to Ray
                    signal.signal(sig, handler)


def _not_setting_sigterm(record: logging.LogRecord) -> bool:
    """A logging filter: False for Ray's warning that ray.init off the main thread sets no SIGTERM handler."""
    return not str(record.msg).startswith("SIGTERM handler is not set")


@contextlib.contextmanager
def _noting_stop_signals(noted: list[int]) -> Iterator[None]:
    """In the main thread: SIGTERM and SIGINT still run the program's own handler (which may raise, as
    KeyboardInterrupt does), and are also appended to ``noted``, so a wait that polls it can end. A default
    or ignored disposition is left as it is (the default ends the process at once anyway)."""
    if threading.current_thread() is not threading.main_thread():  # only it may set handlers
        yield
        return
    previous: dict[signal.Signals, Any] = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        program = signal.getsignal(sig)
        if callable(program):

            def chained(signum: int, frame: Any, program: Any = program) -> None:
                noted.append(signum)
                program(signum, frame)

            previous[sig] = signal.signal(sig, chained)
    try:
        yield
    finally:
        for sig, program in previous.items():
            signal.signal(sig, program)


def _last_line(exc: BaseException) -> str:
    """The last non-empty line of an error's text (Ray's end with the reason, after a block of ids)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


__all__ = ["RayLauncher", "RayWorker", "LoaderWorker", "require_ray", "INSTALL_HINT"]
