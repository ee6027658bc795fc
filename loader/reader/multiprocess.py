"""``multiprocess_reader``: run each reader in its own process and merge their samples.

Each call of the returned reader forks one process per input reader (``fork``,
because users pass closures and lambdas, as with the original) through
``loader.runtime.processes``. Every child has its own one-way ``Pipe`` and sends
messages with ``send_bytes``: a tag byte and, for samples and errors, a body
encoded by ``loader.runtime.codec`` (not JSON), so tuples stay tuples, numpy arrays
stay arrays and dict keys keep their types. A sample the codec cannot encode
(an object of the user's own class, which the original's queue mode carried)
travels pickled: both ends are the user's own code, forked from this process,
not a socket or a file, so nothing foreign is unpickled.

* ``use_pipe=True``: round-robin in list order (r0, r1, r2, r0, ...; a finished
  reader drops out), as the original. A reader whose next sample is not ready
  within ``TURN_PATIENCE_S`` gives up its turn (and later turns, until it has a
  sample ready) instead of stalling the others; the order is therefore
  deterministic whenever every reader keeps up.
* ``use_pipe=False``: samples in arrival order; ``queue_size`` (> 0) bounds the
  samples sent but not yet received, across all children (the original
  ``multiprocessing.Queue(queue_size)``), with a shared semaphore.

Failures: an exception in a child arrives as ``MultiprocessReaderError``, both
a ``WorkerError`` (type name, message, traceback text) and a ``ValueError``
(what the original raised, so code catching that still does); a child that dies without a word (killed,
``os._exit``) shows as end-of-file on its pipe and is raised as
``WorkerDiedError`` with its exit code. A child's death is also seen by its process
sentinel, so it is found even when another process forked meanwhile holds a copy of
the child's write end (a ``multiprocess_reader`` on another thread: forks here
are serialised so they do not, but other code may fork too). The children are
stopped on every exit path of the consumer's generator (end, error, ``break``,
``close()``, GC); those that said goodbye share one grace period to exit.

A ``None`` sample is delivered like any other: the original refused it
(``ValueError("sample has None")``) only because ``None`` was its end marker.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing.connection
import os
import pickle
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from loader.errors import WorkerDiedError, WorkerError
from loader.reader._util import Reader, as_count, check_reader, enter_forked_pass
from loader.runtime import codec
from loader.runtime.processes import PROCESS_JOIN_TIMEOUT_S, context, start_process, stop_process, terminate_now
from loader.runtime.threads import POLL_INTERVAL_S  # idle wait between checks; also the child's credit poll

TURN_PATIENCE_S = 1.0  # how long a reader may keep its round-robin turn waiting

log = logging.getLogger(__name__)

# Held from a child's Pipe() to the close of the parent's copy of its write end: a fork on another thread in
# between (another multiprocess_reader's child) would take a copy of that write end along, and the child's death
# would then never read as end-of-file here.
_FORK_LOCK = threading.Lock()


def _new_fork_lock() -> None:
    """In every forked child (ours, a torch DataLoader's, os.fork's): a copy forked while another thread held the
    lock stays locked for good, and the child's first multiprocess_reader hung."""
    global _FORK_LOCK
    _FORK_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_new_fork_lock)

_SAMPLE = b"s"
_PICKLED = b"p"  # a sample the codec cannot encode, pickled by the user's own child process
_END = b"e"
_ERROR = b"x"


class MultiprocessReaderError(WorkerError, ValueError):
    """An exception raised in a ``multiprocess_reader`` child: a ``WorkerError`` that is also a
    ``ValueError``, the type the original raised for a failed child."""


def _encode(sample: Any) -> bytes:
    try:
        return _SAMPLE + codec.pack(sample, exact=True)
    except TypeError:
        # Parent and child are this program, forked: pickle is only as trusted as the user's code.
        return _PICKLED + pickle.dumps(sample, protocol=pickle.HIGHEST_PROTOCOL)


def _send_credit_wait(credits: Any, parent_pid: int) -> None:
    # A child whose parent vanished (SIGKILL) must not wait for credit forever.
    while not credits.acquire(timeout=POLL_INTERVAL_S):
        if os.getppid() != parent_pid:
            raise SystemExit("multiprocess_reader: parent process went away")


def _child_main(reader: Reader, conn: Any, inherited: list[Any], credits: Any, name: str, number: int) -> None:
    """Body of one child, for pass ``number``: send every sample of ``reader()``, then an end (or error) message."""
    for other in inherited:
        other.close()  # read ends copied by fork; holding them would hide a dead parent
    enter_forked_pass(number)  # a seeded shuffle in here shuffles each pass anew (_util.forked_pass)
    # Started as a daemon (so the parent's exit never waits on it), but a daemon may not start processes:
    # a reader that does (a nested multiprocess_reader, a Pool) failed with multiprocessing's bare
    # AssertionError. The original's children were not daemons. This child's own children are still
    # stopped when it ends: by its reader's cleanup, or by multiprocessing's exit handler.
    multiprocessing.current_process().daemon = False
    parent_pid = os.getppid()
    try:
        for sample in reader():
            message = _encode(sample)
            if credits is not None:
                _send_credit_wait(credits, parent_pid)
            conn.send_bytes(message)
        conn.send_bytes(_END)
    except BaseException as exc:  # every failure is reported to the parent
        info = WorkerError.from_exception(exc, worker=name).to_dict()
        try:
            conn.send_bytes(_ERROR + codec.pack(info))
        except OSError:
            pass  # the parent is gone; nobody is left to tell
    finally:
        conn.close()


class _Children:
    """The processes behind one iteration, their pipes, and how to read them."""

    def __init__(self, readers: Sequence[Reader], credit_count: int, number: int = 0) -> None:
        ctx = context("fork")
        self._number = number  # which pass of the merged reader this is
        self._credits = ctx.Semaphore(credit_count) if credit_count > 0 else None
        self._conns: list[Any] = []
        self._procs: list[Any] = []
        self._names = [f"multiprocess_reader[{i}]" for i in range(len(readers))]
        self.active: list[int] = []  # started children that have not sent their end yet
        try:
            for index, reader in enumerate(readers):
                self._start(ctx, index, reader)
        except BaseException:
            self.close()
            raise

    def _start(self, ctx: Any, index: int, reader: Reader) -> None:
        with _FORK_LOCK:
            read_end, write_end = ctx.Pipe(duplex=False)
            self._conns.append(read_end)
            try:
                args = (reader, write_end, list(self._conns), self._credits, self._names[index], self._number)
                self._procs.append(start_process(_child_main, args, name=self._names[index], method="fork"))
            finally:
                # Only the child may hold the write end, so its death reads as end-of-file here.
                write_end.close()
        self.active.append(index)

    def receive(self, index: int) -> tuple[bool, Any]:
        """Read one message from child ``index``, which ``ready`` named: ``(True, sample)`` or ``(False, None)``
        at its end. ``WorkerDiedError`` when its pipe is at end-of-file, or empty with its process gone."""
        conn = self._conns[index]
        if not conn.poll(0):  # woken by the sentinel alone: the process exited and sent nothing more
            raise self._died(index)
        try:
            message = conn.recv_bytes()
        except (EOFError, OSError):
            raise self._died(index) from None
        tag, body = message[:1], memoryview(message)[1:]
        if tag == _SAMPLE or tag == _PICKLED:
            if self._credits is not None:
                self._credits.release()
            return True, (codec.unpack(body) if tag == _SAMPLE else pickle.loads(body))
        if tag == _END:
            self.active.remove(index)
            return False, None
        if tag == _ERROR:
            raise MultiprocessReaderError.from_dict(codec.unpack(body))
        raise MultiprocessReaderError("ProtocolError", f"unknown message tag {tag!r}", worker=self._names[index])

    def _died(self, index: int) -> WorkerDiedError:
        proc = self._procs[index]
        proc.join(timeout=PROCESS_JOIN_TIMEOUT_S)
        return WorkerDiedError(self._names[index], proc.exitcode, worker=self._names[index])

    def ready(self, indices: list[int], timeout: float) -> list[int]:
        """The children among ``indices`` with a message or end-of-file to read, or whose process has exited,
        in list order (a process's sentinel: its pipe alone says nothing while a copy of its write end lives
        on in a process another thread forked)."""
        flowing = [i for i in indices if self._conns[i].poll(0)]
        if flowing:  # the common case while samples flow: no wait, no selector built
            return flowing
        owners: dict[Any, int] = {}
        for i in indices:
            owners[self._conns[i]] = i
            owners[self._procs[i].sentinel] = i
        woken = {owners[w] for w in multiprocessing.connection.wait(list(owners), timeout=timeout)}
        return [i for i in indices if i in woken]

    def close(self) -> None:
        """Close the pipes (a child blocked on send then fails) and stop every process: at once those still
        sending, the others after one grace period for them all (``PROCESS_JOIN_TIMEOUT_S``)."""
        for conn in self._conns:
            conn.close()
        finished = []
        for index, proc in enumerate(self._procs):
            if index in self.active:
                terminate_now(proc)
            else:
                finished.append((index, proc))
        deadline = time.monotonic() + PROCESS_JOIN_TIMEOUT_S
        for index, proc in finished:  # each said goodbye and is exiting by itself, unless something holds it
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                log.warning(
                    "%s sent all its samples but had not exited %gs later (a thread that is not a daemon?); stopped",
                    self._names[index],
                    PROCESS_JOIN_TIMEOUT_S,
                )
            stop_process(proc, join_timeout_s=0.0)
        self._procs.clear()


def _round_robin(children: _Children) -> Iterator[Any]:
    lagging: set[int] = set()  # readers that missed a turn: they are only taken when ready
    while children.active:
        progressed = False
        for index in list(children.active):
            patience = 0.0 if index in lagging else TURN_PATIENCE_S
            if not children.ready([index], patience):
                lagging.add(index)
                continue
            lagging.discard(index)
            progressed = True
            got, sample = children.receive(index)
            if got:
                yield sample
        if not progressed and children.active:
            children.ready(children.active, POLL_INTERVAL_S)


def _as_ready(children: _Children) -> Iterator[Any]:
    while children.active:
        for index in children.ready(children.active, POLL_INTERVAL_S):
            got, sample = children.receive(index)
            if got:
                yield sample


def _check_readers(readers: Any) -> None:
    if not isinstance(readers, (list, tuple)):
        raise TypeError(
            f"multiprocess_reader: `readers` must be a list or tuple of readers, got {type(readers).__name__}"
        )
    if not readers:
        raise ValueError("multiprocess_reader: `readers` is empty; give at least one reader")
    for r in readers:
        check_reader(r, "multiprocess_reader")


def multiprocess_reader(readers: Sequence[Reader], use_pipe: bool = True, queue_size: int = 1000) -> Reader:
    """A reader merging the samples of ``readers``, each read in its own process.

    ``readers`` must be a non-empty list or tuple of readers (``TypeError`` /
    ``ValueError`` here otherwise; the original used ``assert``).
    ``use_pipe`` (truthy) merges round-robin, otherwise in arrival order with at
    most ``queue_size`` samples in flight (``<= 0``: no bound). Samples are
    encoded by ``loader.runtime.codec``; any other picklable object is pickled (the
    user's own processes at both ends); one that cannot be pickled either fails
    in the child and arrives as ``MultiprocessReaderError`` naming the error.
    """
    if sys.platform == "win32":
        raise NotImplementedError("multiprocess_reader needs the fork start method, which Windows lacks")
    _check_readers(readers)
    readers = list(readers)
    queue_size = as_count(queue_size, "multiprocess_reader: queue_size")
    credit_count = 0 if use_pipe else queue_size
    passes = itertools.count()  # next() is atomic under the GIL: calls from threads get distinct numbers

    def merged_reader() -> Iterator[Any]:
        children = _Children(readers, credit_count, next(passes))
        try:
            yield from (_round_robin(children) if use_pipe else _as_ready(children))
        finally:
            children.close()

    return merged_reader


__all__ = ["multiprocess_reader", "MultiprocessReaderError", "TURN_PATIENCE_S"]
