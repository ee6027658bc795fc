"""What a file was when a worker began to read it, so that a write into it during the read is caught.

The daemon compares each file's size with the one it found at start-up before a lease is read
(``file_job.changed_file``); this covers the read itself. A file written in place while its rows were
read gave rows of zeros, a half-written last line parsed as a sample, old rows beside new ones, or an
epoch that grew for as long as a writer appended: no error, and ``len()`` wrong. The worker checks the
pin after reading a chunk's rows and before sending them, and at the end of the lease.

Here the size, mtime and inode are compared, not the size alone: one worker on one host stats the file
twice, so a new mtime is a write, never a copy of the same bytes from another node. A path that names
another file now (``os.replace``, ``rsync``) leaves the file the reader holds open as it was, so that
is not a change to this read.
"""

from __future__ import annotations

import os

from loader.service.shm.file_layout import Identity, identity


class FilePin:
    """One file's size, mtime and inode when its reader opened it; ``changed()`` says if it was written since."""

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            self._then: Identity | None = identity(os.stat(path))
        except OSError:  # not a path (a provider's or reader's own name for its data), or one the reader will refuse
            self._then = None

    def changed(self) -> str | None:
        """Why the file is not as it was when pinned (written in place: another size or mtime), or None."""
        if self._then is None:
            return None
        try:
            now = identity(os.stat(self.path))
        except OSError:  # removed: the file the reader holds open reads as it was
            return None
        size, mtime_ns, inode, device = self._then
        if (now[2], now[3]) != (inode, device):  # the path names another file now; the open one is as it was
            return None
        if now[:2] == (size, mtime_ns):
            return None
        what = "was written in place" if now[0] == size else f"is {now[0]:,} bytes, not {size:,}"
        return (
            f"{self.path} changed while it was read (it {what}): rows read after the change may be the new "
            "contents, or partly written; write data files elsewhere and move them in place, and restart the "
            "daemon (or the Loader) to serve them"
        )


def changed_since_start(path: str, size: int | None) -> str | None:
    """Why ``path`` is not the file the daemon found at start-up (``Lease.seen``: its size then), or None: the
    epoch's length, its pieces and checkpoints describe that file, so serving another silently would hand the
    training loop other samples than ``len()`` and the resume promise say. Only the size: a copy of the same
    bytes with another mtime (``cp`` without ``-p`` on another node, a ``touch``, an ``rsync`` refresh, a
    filesystem of coarser times) is the same file to a reader. A file that is gone is left to the reader,
    which names it."""
    if size is None:
        return None
    try:
        found = os.stat(path)
    except OSError:
        return None
    if found.st_size == size:
        return None
    return (
        f"{path} changed since the daemon started ({size:,} bytes then, {found.st_size:,} now): its epochs, "
        "pieces and checkpoints describe the file it found then; restart the daemon (or the Loader) to serve the "
        "new contents"
    )


def first_change(pins: list[FilePin]) -> tuple[str, str] | None:
    """The first of ``pins`` whose file changed, and why."""
    for pin in pins:
        why = pin.changed()
        if why is not None:
            return pin.path, why
    return None


__all__ = ["FilePin", "changed_since_start", "first_change"]
