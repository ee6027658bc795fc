"""Where the rows of a ``.npy``/``.npz`` member lie, read from the file's own header (``file_rows``).

A reference into a file is only honoured with a layout taken from the file
itself: numpy's header readers (one thread at a time, never ``allow_pickle``),
refusing object dtypes, Fortran order, compressed members and files shorter
than their header says. ``member_file`` maps a member to its file: the leased
``.npz`` itself, or the leased ``.npy`` (``data``) and its companions
(``NAME.FIELD.npy``, a plain field name, so a member cannot name another path).
"""

from __future__ import annotations

import os
import re
import stat
import zipfile
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

from loader.errors import DataError
from loader.io.formats_numpy import _HEADER_LOCK
from loader.service.shm.arena import ArenaError

_MEMBER = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")  # a companion field, as formats_numpy names them
_LOCAL_HEADER_BYTES = 30  # a zip local file header before its name and extra field
Identity = tuple[int, int, int, int]  # st_size, st_mtime_ns, st_ino, st_dev


class FileRowsError(ArenaError, DataError):
    """A file-row reference cannot be honoured: not a mappable array, a bad row, or the file changed.

    An ``ArenaError`` where the stage refuses a chunk; a ``DataError`` to a training loop, since a
    changed data file is the user's to fix."""


class FileChangedError(FileRowsError):
    """The data file changed (size, mtime or inode) while its rows were read or in flight: a fact about the
    file, seen by the daemon's own stat, never a claim of a peer (so the daemon fails that file, by name). A worker
    raises it too, for a file whose size is not the daemon's at start-up (``file_job.changed_file``)."""


@dataclass(frozen=True)
class Layout:
    """Where the rows of one member lie: read from the file's header, never from a peer."""

    path: str  # the leased path (an .npy, whose companions are members, or an .npz)
    member: str
    file: str  # the file holding the rows: ``path`` or a companion
    offset: int
    dtype: str
    row_shape: tuple[int, ...]
    rows: int
    identity: Identity

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.row_shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    @property
    def spec(self) -> tuple[str, tuple[int, ...]]:
        return self.dtype, self.row_shape

    def describe(self) -> list[Any]:
        """The wire form a client opens it by: ``[path, member, size, mtime_ns, inode, device]``."""
        return [self.path, self.member, *self.identity]


def member_file(path: str, member: str) -> str:
    """The file holding ``member`` of the leased ``path``; ``FileRowsError`` when it is not a numpy file."""
    lower = path.lower()
    if lower.endswith(".npz"):
        return path
    if not lower.endswith(".npy"):
        raise FileRowsError(f"{path} is not an .npy or .npz file")
    if member == "data":
        return path
    if not _MEMBER.match(member):
        raise FileRowsError(f"{path} has no field {member[:40]!r}")
    return f"{path[: -len('.npy')]}.{member}.npy"


def identity(st: os.stat_result) -> Identity:
    return (int(st.st_size), int(st.st_mtime_ns), int(st.st_ino), int(st.st_dev))


def read_layout(path: str, member: str) -> tuple[Layout, int]:
    """The layout of ``member`` and a file descriptor open on its file (the caller closes it)."""
    target = member_file(path, member)
    try:
        # O_NONBLOCK: a FIFO put in a file's place would otherwise block the open until a writer
        # comes, and the stage opens on the daemon's loop thread. Reads of a regular file ignore it.
        fd = os.open(target, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        # Usually a client that shares the daemon's /dev/shm but not its data files (another container).
        raise FileRowsError(
            f"cannot open {target} for its rows: {exc} (a client that cannot see the daemon's data files "
            "needs workers.file_rows = false in the daemon's config, or Client(shm=False))"
        ) from exc
    fh = os.fdopen(fd, "rb")  # closed by the with below; its descriptor is dup()ed for the reader
    with fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise FileRowsError(f"{target} is not a regular file")
        try:
            end = st.st_size  # where the array's bytes must end: the file's end, or its member's
            if target.lower().endswith(".npz"):
                offset, shape, fortran, dtype, end = _npz_member(fh, member)
            else:
                offset, shape, fortran, dtype = _npy_header(fh, target)
        # RuntimeError: zipfile's for an encrypted member (the file a daemon names may be anyone's making).
        except (ValueError, EOFError, KeyError, zipfile.BadZipFile, OSError, RuntimeError) as exc:
            raise FileRowsError(f"{target}: no readable array {member[:40]!r} ({exc})") from exc
        layout = _checked(path, member, target, offset, shape, fortran, dtype, st, min(end, st.st_size))
        try:
            return layout, os.dup(fh.fileno())
        except OSError as exc:  # no descriptor left
            raise FileRowsError(f"cannot open {target} for its rows: {exc}") from exc


def _npy_header(fh: BinaryIO, target: str) -> tuple[int, tuple[int, ...], bool, np.dtype]:
    version = np.lib.format.read_magic(fh)
    with _HEADER_LOCK:  # numpy parses headers with ast.literal_eval: one thread at a time (formats_numpy)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
        elif version in ((2, 0), (3, 0)):  # 3.0: 2.0 with a UTF-8 header (np.load reads both)
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
        else:
            raise ValueError(f"unsupported .npy format version {version}")
    return fh.tell(), shape, fortran, dtype


def _npz_member(fh: BinaryIO, member: str) -> tuple[int, tuple[int, ...], bool, np.dtype, int]:
    """(offset, shape, fortran, dtype, end) of a stored member: ``end`` is where its bytes stop, so a header
    claiming more rows than the member holds cannot name the next member's bytes as rows."""
    with zipfile.ZipFile(fh) as archive:
        info = archive.getinfo(member + ".npy")
        if info.compress_type != zipfile.ZIP_STORED:
            raise ValueError("the member is compressed")
        with archive.open(info) as raw:
            _, shape, fortran, dtype = _npy_header(raw, member)  # type: ignore[arg-type]
            header_len = raw.tell()
    fh.seek(info.header_offset)
    local = fh.read(_LOCAL_HEADER_BYTES)
    if len(local) != _LOCAL_HEADER_BYTES or local[:4] != b"PK\x03\x04":
        raise ValueError("bad local header")
    name_len, extra_len = int.from_bytes(local[26:28], "little"), int.from_bytes(local[28:30], "little")
    payload = info.header_offset + _LOCAL_HEADER_BYTES + name_len + extra_len
    return payload + header_len, shape, fortran, dtype, payload + info.compress_size


def _checked(
    path: str,
    member: str,
    target: str,
    offset: int,
    shape: tuple[int, ...],
    fortran: bool,
    dtype: np.dtype,
    st: os.stat_result,
    end: int,
) -> Layout:
    if dtype.hasobject or dtype.itemsize == 0:
        raise FileRowsError(f"{target}: array {member[:40]!r} has dtype {dtype}, which is never read by reference")
    if len(shape) == 0 or (fortran and len(shape) > 1):
        raise FileRowsError(f"{target}: array {member[:40]!r} has no C-order rows")
    rows = int(shape[0])
    layout = Layout(path, member, target, int(offset), dtype.str, tuple(int(d) for d in shape[1:]), rows, identity(st))
    if layout.offset + rows * layout.row_bytes > end:
        what = target if end == st.st_size else f"{target} member {member[:40]!r}"
        raise FileRowsError(f"{what} is shorter than its header says")
    return layout


__all__ = ["FileChangedError", "FileRowsError", "Identity", "Layout", "identity", "member_file", "read_layout"]
