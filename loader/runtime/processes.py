"""The one module that starts and stops processes.

Everything that runs code in another process (``multiprocess_reader``, the
service's workers, the in-process ``Loader``) goes through ``start_process`` and
``stop_process`` so that start methods, naming and bounded shutdown are decided
in one place; an external command (``PipeReader``) is started by ``start_command``.

Start methods: ``"fork"`` is used where a user's reader may be a closure or a
lambda (``multiprocess_reader``, like the original); ``"spawn"`` is used for
service workers, which receive only a definition (a config and a module path) and
must not inherit the parent's threads or sockets.

A spawned service worker is a fresh interpreter that does not import the
parent's ``__main__`` (``import_main=False``): multiprocessing would otherwise
re-run the training script in every worker, which costs the script's imports
(torch: ~190 MB and seconds per worker) and, in a script without an
``if __name__ == "__main__":`` guard, starts the script's own loader again in
each worker, which dies and is replaced forever.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
import os
import signal
import subprocess
import sys
import threading
import types
from collections.abc import Callable, Sequence
from typing import Any

PROCESS_JOIN_TIMEOUT_S = 5.0
PROCESS_KILL_TIMEOUT_S = 2.0
PARENT_CHECK_INTERVAL_S = 0.5


def _context(method: str) -> Any:  # a DefaultContext/SpawnContext/ForkContext: typeshed gives BaseContext no Process
    if method == "fork" and sys.platform == "win32":
        method = "spawn"
    return multiprocessing.get_context(method)


def start_process(
    target: Callable[..., Any],
    args: tuple[Any, ...] = (),
    *,
    name: str,
    method: str = "spawn",
    daemon: bool = True,
    import_main: bool = True,
    ignore_interrupts: bool = False,
) -> multiprocessing.process.BaseProcess:
    """Start ``target(*args)`` in a new named process and return it.

    With ``method="spawn"`` and ``import_main=False`` the child does not import
    the parent's ``__main__`` (``target`` and ``args`` must then live in
    importable modules, which is what pickling by reference needs anyway).

    With ``ignore_interrupts`` the child ignores SIGINT from its first instruction:
    a terminal's Ctrl-C reaches the whole process group, and the parent stops its
    children in order. A spawned child spends its first tenth of a second importing,
    where an interrupt printed a KeyboardInterrupt traceback: it is started with
    SIGINT ignored (``_interrupts_held``), then sets a handler that does nothing.
    """
    if ignore_interrupts:
        target, args = _ignoring_interrupts, (target, *args)
    proc = _context(method).Process(target=target, args=args, name=name, daemon=daemon)
    with _interrupts_held(ignore_interrupts):
        if import_main or method == "fork":
            proc.start()
            return proc
        with _main_hidden():
            proc.start()
    return proc


class _interrupts_held:  # used like a function: with _interrupts_held(True): proc.start()
    """SIGINT held off a child while it starts.

    Blocked in this thread, which a forked child inherits: an interrupt meant for this process meanwhile
    waits (pending) and arrives once the mask is back. A spawned child does not keep the mask (multiprocessing
    starts it with none blocked, seen on Python 3.10 to 3.12), but it keeps an ignored disposition through
    exec, and Python then installs no KeyboardInterrupt handler: on the main thread SIGINT is also ignored for
    the few milliseconds of the start. A Ctrl-C for the process taken by another thread then is lost (this
    thread's waits, blocked, for the handler put back first); the next one stops the parent. Off
    the main thread Python cannot change the disposition, and the import window stays open there: the
    workers an in-process ``Loader``'s daemon thread starts to replace others (its first ones start on the
    thread that made the ``Loader``).
    """

    def __init__(self, hold: bool) -> None:
        self.hold = hold and hasattr(signal, "pthread_sigmask")
        self.ignore = hold and threading.current_thread() is threading.main_thread()
        self.handler: Any = None

    def __enter__(self) -> None:
        if self.hold:
            self.previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        if self.ignore:
            try:
                self.handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
            except ValueError:  # the main thread of another interpreter: only the mask holds
                self.ignore = False

    def __exit__(self, *exc: Any) -> None:
        if self.ignore:
            # None: a handler set outside Python, which cannot be put back; the default is the nearest.
            signal.signal(signal.SIGINT, self.handler if self.handler is not None else signal.default_int_handler)
        if self.hold:
            signal.pthread_sigmask(signal.SIG_SETMASK, self.previous)


def _ignoring_interrupts(target: Callable[..., Any], *args: Any) -> Any:
    # A handler that does nothing, not SIG_IGN: a program this child starts (a mapper's ffmpeg) gets the default
    # disposition back at exec, so Ctrl-C still reaches it; an ignored signal would stay ignored there.
    signal.signal(signal.SIGINT, _interrupt_ignored)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # what this child starts must not inherit it
    return target(*args)


def _interrupt_ignored(signum: int, frame: Any) -> None:
    """SIGINT in a child started with ``ignore_interrupts``: its parent stops it in order."""


_MAIN_LOCK = threading.Lock()


class _main_hidden:  # used like a function: with _main_hidden(): proc.start()
    """While starting a spawned child, ``sys.modules["__main__"]`` is a stand-in without
    ``__file__`` or ``__spec__``, so ``multiprocessing.spawn`` tells the child to leave its
    ``__main__`` alone (the child then imports only what unpickling ``target`` needs).

    The stand-in hands every other attribute on to the real ``__main__``, so code on
    other threads that looks up a class of the script (pickle does) still finds it.
    """

    def __enter__(self) -> None:
        _MAIN_LOCK.acquire()
        self.real = sys.modules["__main__"]
        sys.modules["__main__"] = _stand_in(self.real)

    def __exit__(self, *exc: Any) -> None:
        sys.modules["__main__"] = self.real
        _MAIN_LOCK.release()


def _stand_in(real: types.ModuleType) -> types.ModuleType:
    stub = types.ModuleType("__main__")

    def forward(name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)  # __file__, __spec__, ...: what spawn asks must look absent
        return getattr(real, name)

    stub.__getattr__ = forward  # type: ignore[method-assign]  # PEP 562 module __getattr__
    return stub


def start_command(args: Sequence[str]) -> subprocess.Popen[bytes]:
    """Start the command ``args`` (no shell): standard input ``/dev/null``, standard output an
    unbuffered pipe of bytes for the caller to read, standard error inherited.

    The caller owns the process: it reads, then waits with a timeout (or terminates it).
    """
    return subprocess.Popen(list(args), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, bufsize=0)


def context(method: str = "spawn") -> multiprocessing.context.BaseContext:
    """The multiprocessing context for ``method`` (to build Pipes and Queues that match)."""
    return _context(method)


def stop_process(
    proc: multiprocessing.process.BaseProcess,
    join_timeout_s: float = PROCESS_JOIN_TIMEOUT_S,
) -> int | None:
    """Ask nicely (join), then SIGTERM, then SIGKILL; never wait unboundedly.

    Returns the exit code (negative: killed by that signal).
    """
    if proc.pid is None:
        return None
    proc.join(timeout=join_timeout_s)
    if proc.is_alive():
        proc.terminate()
        _resume(proc.pid)  # a stopped process (SIGSTOP, a debugger) acts on SIGTERM only once resumed
        proc.join(timeout=PROCESS_KILL_TIMEOUT_S)
    if proc.is_alive():
        proc.kill()
        proc.join(timeout=PROCESS_KILL_TIMEOUT_S)
    code = proc.exitcode
    try:
        proc.close()
    except ValueError:
        pass  # still running after SIGKILL (a zombie the kernel has not reaped yet)
    return code


def _resume(pid: int | None) -> None:
    sigcont = getattr(signal, "SIGCONT", None)  # POSIX only
    if pid is None or sigcont is None:
        return
    try:
        os.kill(pid, sigcont)
    except (ProcessLookupError, PermissionError):
        pass  # already gone


def terminate_now(proc: multiprocessing.process.BaseProcess) -> int | None:
    """Stop a process that has no reason to finish on its own (consumer went away)."""
    return stop_process(proc, join_timeout_s=0.0)


def stop_when_orphaned(
    stop: threading.Event, parent_pid: int, interval_s: float = PARENT_CHECK_INTERVAL_S
) -> threading.Thread:
    """Set ``stop`` once this process's parent ``parent_pid`` has died (it was reparented); call in the child.

    A parent killed with SIGKILL cannot stop its children, and a child that is still
    looking for its parent (a worker retrying its hello) would wait out its own timeout.
    The parent passes its pid because it may die before the child gets here. The
    thread ends when ``stop`` is set, by this check or by anyone else.
    """

    def watch() -> None:
        while os.getppid() == parent_pid:
            if stop.wait(interval_s):
                return
        stop.set()

    thread = threading.Thread(target=watch, name="loader-parent-watch", daemon=True)
    thread.start()
    return thread


def cpu_count() -> int:
    """Cores this process may use (respects affinity masks, unlike os.cpu_count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


__all__ = [
    "start_process",
    "start_command",
    "stop_process",
    "terminate_now",
    "context",
    "cpu_count",
    "stop_when_orphaned",
]
