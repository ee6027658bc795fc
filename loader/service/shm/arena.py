"""Shared-memory arenas: large sample arrays cross processes on one host by reference.

An arena is one file in ``/dev/shm`` (a temp dir where there is none), made and
unlinked by the daemon (``ArenaPool``), mapped by one writer (a worker) and by
readers (the stage, clients). Layout::

    [header: magic, version, block_bytes, n_blocks, token]   HEADER_BYTES
    [one state byte per block: 0 free, 1 used]               n_blocks bytes
    [padding to a page]
    [n_blocks blocks of block_bytes]                          the data

A row occupies a run of contiguous blocks. Only the writer turns a state byte
from free to used (``alloc``); only a reader that is done with a row turns it
back (``free``). So the writer's numpy snapshot of the states can be stale
only in the safe direction (a block just freed still looks used), and no lock
is needed. A reader copies a row out before zeroing its states, and the writer
writes a row only after seeing them zero; the message that carries the
reference (a socket write, a syscall) orders the writer's data before any read.

Space is reserved with ``fallocate`` as the used prefix grows (``reserve``), so
a full ``/dev/shm`` is a failed allocation (the row travels inline) and never
a SIGBUS. The file holds raw array bytes and a fixed header: nothing in it is
ever unpickled. The token, a random value the daemon writes into the header and
announces in its welcome, tells a peer it mapped the daemon's file and not a
same-named one on another host.
"""

from __future__ import annotations

import errno
import mmap
import os
import secrets
import stat
import struct
import tempfile

import numpy as np

from loader.errors import TransportError

MAGIC = b"LDRARENA"
ARENA_VERSION = 1
BLOCK_BYTES = 64 * 1024
HEADER_BYTES = 64
PAGE_BYTES = 4096
TOKEN_BYTES = 16
RESERVE_STEP_BYTES = 8 * 1024 * 1024  # fallocate grows the reserved prefix in steps of this
SHM_DIR = "/dev/shm"
FREE, USED = 0, 1

_HEADER = struct.Struct("<8sIIQ16s")  # magic, version, block_bytes, n_blocks, token


PROBE_ID = 0  # the header-only file a client maps to learn whether it shares the daemon's host


# Flags for opening a file a peer names (POSIX; absent elsewhere, where the regular-file check still holds).
_OPEN_PEER_NAMED = sum(getattr(os, flag, 0) for flag in ("O_NONBLOCK", "O_NOCTTY", "O_NOFOLLOW", "O_CLOEXEC"))


def arena_path(directory: str, prefix: str, arena_id: int) -> str:
    """The file of arena ``arena_id`` of the daemon whose files start with ``prefix``."""
    return os.path.join(directory, f"{prefix}-{arena_id}")


class ArenaError(TransportError):
    """An arena cannot be opened, or it is not the daemon's (another host, a stale file)."""


class RowsNotKeptError(ArenaError):
    """A batch's arena rows were copied after the daemon stopped keeping them for its client (``Batch.kept``):
    what was copied may be other rows written there since."""


def shm_directory() -> str:
    """Where arenas live: ``/dev/shm`` when it is a writable directory, else the temp dir."""
    if os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK | os.X_OK):
        return SHM_DIR
    return tempfile.gettempdir()


def new_token() -> bytes:
    return secrets.token_bytes(TOKEN_BYTES)


def _align(value: int, to: int) -> int:
    return -(-value // to) * to


def _data_offset(n_blocks: int) -> int:
    return _align(HEADER_BYTES + n_blocks, PAGE_BYTES)


class Arena:
    """One mapped arena file; ``create`` (the owner) or ``open`` (a writer or a reader)."""

    def __init__(self, path: str, arena_id: int, fd: int, mm: mmap.mmap, *, owner: bool) -> None:
        magic, version, block_bytes, n_blocks, token = _HEADER.unpack_from(mm, 0)
        if magic != MAGIC or version != ARENA_VERSION:
            raise ArenaError(f"{path} is not a loader arena (version {ARENA_VERSION})")
        if len(mm) != _data_offset(n_blocks) + n_blocks * block_bytes:
            raise ArenaError(f"arena {path} has {len(mm)} bytes, its header says otherwise")
        self.path, self.arena_id, self.owner = path, arena_id, owner
        self.block_bytes, self.n_blocks, self.token = int(block_bytes), int(n_blocks), bytes(token)
        self._fd: int | None = fd
        self._mm: mmap.mmap | None = mm
        self.states = np.frombuffer(mm, np.uint8, count=self.n_blocks, offset=HEADER_BYTES)
        self.data = np.frombuffer(
            mm, np.uint8, count=self.n_blocks * self.block_bytes, offset=_data_offset(self.n_blocks)
        )
        self._reserved_blocks = 0

    # -- lifecycle ----------------------------------------------------------
    @classmethod
    def create(
        cls, directory: str, name: str, arena_id: int, nbytes: int, token: bytes, block_bytes: int = BLOCK_BYTES
    ) -> Arena:
        """Make a new arena file of ``nbytes`` of blocks (sparse until written)."""
        n_blocks = max(0, nbytes // block_bytes)
        path = os.path.join(directory, name)
        size = _data_offset(n_blocks) + n_blocks * block_bytes
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, size)
            os.posix_fallocate(fd, 0, _data_offset(n_blocks))  # header and states: always writable
            mm = mmap.mmap(fd, size)
            _HEADER.pack_into(mm, 0, MAGIC, ARENA_VERSION, block_bytes, n_blocks, token)
            return cls(path, arena_id, fd, mm, owner=True)
        except BaseException:
            os.close(fd)
            os.unlink(path)
            raise

    @classmethod
    def open(cls, path: str, arena_id: int, token: bytes) -> Arena:
        """Map the arena at ``path``; ``ArenaError`` when missing, malformed or with another token."""
        try:
            # A peer names the path (a daemon's welcome): not blocking on a FIFO, not taking a terminal, not
            # following a link at the last step; whatever it is must be a regular file before it is mapped.
            fd = os.open(path, os.O_RDWR | _OPEN_PEER_NAMED)
        except OSError as exc:
            raise ArenaError(f"cannot open arena {path}: {exc.strerror}") from exc
        try:
            status = os.fstat(fd)
            if not stat.S_ISREG(status.st_mode):
                raise ArenaError(f"arena {path} is not a regular file")
            size = status.st_size
            if size < PAGE_BYTES:
                raise ArenaError(f"arena {path} is truncated ({size} bytes)")
            try:
                mm = mmap.mmap(fd, size)
            except OSError as exc:  # no descriptor left for the mapping's own (it dups fd), no address space
                raise ArenaError(f"cannot map arena {path}: {exc.strerror}") from exc
            arena = cls(path, arena_id, fd, mm, owner=False)
        except BaseException:
            os.close(fd)
            raise
        if arena.token != token:
            arena.close()
            raise ArenaError(f"arena {path} has another token: not the daemon's (another host?)")
        return arena

    def close(self) -> None:
        """Unmap (once no array views remain) and, for the owner, unlink. Idempotent."""
        if self._mm is None:
            return
        mm, self._mm = self._mm, None
        self.states = self.data = np.zeros(0, np.uint8)
        try:
            mm.close()
        except BufferError:
            pass  # a view still exists somewhere; the mapping goes when it does
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self.owner:
            self.unlink()

    def unlink(self) -> None:
        """Remove the name; existing mappings stay valid. Idempotent."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    @property
    def closed(self) -> bool:
        return self._mm is None

    def __enter__(self) -> Arena:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- blocks -------------------------------------------------------------
    def blocks_for(self, nbytes: int) -> int:
        return max(1, -(-int(nbytes) // self.block_bytes))

    def used_blocks(self) -> int:
        return int(np.count_nonzero(self.states))

    def alloc(self, count: int, run: int) -> np.ndarray | None:
        """First blocks of ``count`` free runs of ``run`` blocks, now marked used; None when they do not fit.

        All or nothing, so a chunk's column is either all in the arena or all inline.
        """
        if count <= 0 or run <= 0 or self._mm is None:
            return None
        if count == 1:
            # One row, as a worker places each sample's row when it is made: the first free run found by a byte
            # search of the states (about 1 us) instead of ``free_runs``' whole-array passes (25-35 us at 4,096
            # blocks). The same first fit.
            found = self._mm.find(bytes([FREE]) * run, HEADER_BYTES, HEADER_BYTES + self.n_blocks)
            starts = None if found < 0 else np.array([found - HEADER_BYTES], dtype=np.int64)
        else:
            starts = free_runs(self.states, count, run)
        if starts is None or not self.reserve(int(starts[-1]) + run):
            return None
        self.states[run_indexes(starts, run)] = USED
        return starts

    def reserve(self, end_block: int) -> bool:
        """Make blocks [0, end_block) writable for sure (fallocate); False when the filesystem is full."""
        if end_block <= self._reserved_blocks:
            return True
        if self._fd is None:
            return False
        step_blocks = max(1, RESERVE_STEP_BYTES // self.block_bytes)
        target = min(self.n_blocks, _align(end_block, step_blocks))
        offset = _data_offset(self.n_blocks) + self._reserved_blocks * self.block_bytes
        try:
            os.posix_fallocate(self._fd, offset, (target - self._reserved_blocks) * self.block_bytes)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EFBIG, errno.ENOMEM):
                return False
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise
            # a filesystem without fallocate: writes may fail late, as with any plain file
        self._reserved_blocks = target
        return True

    def free(self, starts: np.ndarray, run: int) -> None:
        """Give runs back (their data must not be read again)."""
        if self._mm is None or len(starts) == 0:
            return
        self.states[run_indexes(np.asarray(starts, dtype=np.int64), run)] = FREE

    def readable_bytes(self) -> int:
        """Bytes of ``data`` the file holds now: a reader touching a page of the mapping past the file's end dies of
        SIGBUS, and whoever can write the file (its daemon, a worker) can truncate it under its readers. Asked
        before a copy; a file truncated while the copy runs can still kill the reader."""
        if self._fd is None:
            return 0
        try:
            size = os.fstat(self._fd).st_size
        except OSError:
            return 0
        return max(0, min(len(self.data), size - _data_offset(self.n_blocks)))

    def row(self, start: int, nbytes: int) -> np.ndarray:
        """The bytes of one row (a view into the mapping: copy before freeing)."""
        offset = int(start) * self.block_bytes
        return self.data[offset : offset + int(nbytes)]


def run_indexes(starts: np.ndarray, run: int) -> np.ndarray:
    """Every block index of the runs starting at ``starts``."""
    return (starts[:, None] + np.arange(run, dtype=np.int64)).ravel()


def free_runs(states: np.ndarray, count: int, run: int) -> np.ndarray | None:
    """First-fit starts of ``count`` disjoint runs of ``run`` free blocks, lowest first; None if too few."""
    free = np.concatenate(([0], (states == FREE).view(np.int8), [0]))
    edges = np.diff(free)
    begins = np.flatnonzero(edges == 1)
    ends = np.flatnonzero(edges == -1)
    fits = (ends - begins) // run
    if int(fits.sum()) < count:
        return None
    used = np.minimum(fits, np.maximum(0, count - (np.cumsum(fits) - fits)))
    keep = used > 0
    begins, used = begins[keep], used[keep]
    # within each free stretch, runs at begin, begin + run, ...
    firsts = np.repeat(begins, used)
    steps = np.arange(int(used.sum()), dtype=np.int64) - np.repeat(np.cumsum(used) - used, used)
    return firsts.astype(np.int64) + steps * run


__all__ = [
    "Arena",
    "ArenaError",
    "BLOCK_BYTES",
    "RowsNotKeptError",
    "shm_directory",
    "new_token",
    "free_runs",
    "run_indexes",
]
