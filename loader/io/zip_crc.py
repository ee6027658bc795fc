"""The CRC-32 of a stored (uncompressed) zip member, checked against the archive's once per process.

zipfile checks a member's CRC only when the member is read through it to its end. ``.npz`` members stored by
``np.savez`` are memory-mapped or read straight from the file instead (``formats_numpy``), so a flipped bit in
one was served as data: ``np.load`` refuses the same file ("Bad CRC-32"). Here the member's bytes are read once
and their CRC compared; a member already found good, in a file of the same identity (size, mtime, inode,
device), is not read again, so a worker reading the file every epoch, or in pieces, pays it once.

Members over ``MAX_SUMMED_BYTES`` are not summed: every worker that reads a piece of one would read all of it
first, sending nothing meanwhile (a member of 100 GB on slow storage outlasts the worker's progress timeout).
"""

from __future__ import annotations

import os
import threading
import zlib

from loader.errors import DataError

BLOCK_BYTES = 8 << 20  # read and summed a block at a time: zlib.crc32 releases the GIL for each
MAX_SUMMED_BYTES = 256 << 20  # larger members are served unsummed (a second at most on ordinary storage)
MAX_REMEMBERED = 65536  # members remembered as good; past it the memory starts over (they are read again)

_good: set[tuple[object, ...]] = set()
_lock = threading.Lock()


def check_stored_crc(
    path: str, fd: int, member: str, start: int, size: int, expected: int, data: bytes | None = None
) -> None:
    """``DataError`` naming ``path`` and ``member`` unless the ``size`` bytes at ``start`` of the open file
    ``fd`` (``data``, when the caller has read them already) sum to the CRC-32 ``expected`` (the archive's,
    ``ZipInfo.CRC``). Nothing is read for a member over ``MAX_SUMMED_BYTES``."""
    if size > MAX_SUMMED_BYTES:
        return
    st = os.fstat(fd)
    key = (path, member, start, size, expected, st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev)
    with _lock:
        if key in _good:
            return
    crc = 0
    done = 0
    if data is not None:
        crc, done = zlib.crc32(data), len(data)
    while done < size:
        block = os.pread(fd, min(BLOCK_BYTES, size - done), start + done)
        if not block:
            raise DataError(f"{path}: member {member!r} of the .npz archive is cut short ({done} of {size} bytes)")
        crc = zlib.crc32(block, crc)
        done += len(block)
    if crc != expected:
        raise DataError(
            f"{path}: member {member!r} of the .npz archive is damaged: its bytes sum to CRC-32 {crc:#010x}, "
            f"the archive says {expected:#010x} (np.load refuses it too); write the file again"
        )
    with _lock:
        if len(_good) >= MAX_REMEMBERED:
            _good.clear()
        _good.add(key)


__all__ = ["check_stored_crc", "BLOCK_BYTES", "MAX_SUMMED_BYTES"]
