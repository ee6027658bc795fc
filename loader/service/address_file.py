"""``loader serve --address-file PATH``: the address the daemon bound, for jobs that bind port ``*``.

A scheduler's job script starts the daemon on any free port and hands the
address to its trainers (``LOADER_ADDRESS=$(cat PATH)``), so no port is fixed
in advance. The file is written atomically (a reader never sees half an
address) once the daemon is bound and serving, and removed when it stops, if
it still holds this daemon's address, so a stale file does not send trainers to
a daemon that is gone.

The path is in a directory others may write to (a job's shared scratch space), so
whatever is found there is treated as hostile: the file is written through a
temporary file created exclusively (never through a symlink planted at its name),
and at shutdown only a regular file is read, and only its first bytes, so a FIFO,
a device or a symlink put in its place can neither hang nor exhaust the daemon.
"""

from __future__ import annotations

import errno
import logging
import os
import secrets
import stat

from loader.errors import ConfigError

log = logging.getLogger("loader.cli")

# An address is one short line (``tcp://[v6 address]:port``, ``ipc://`` and a socket path): a file
# longer than this is not the one the daemon wrote, and more of it is never read.
MAX_ADDRESS_BYTES = 4096
# The written file's mode (less the umask), as ``open(path, "w")`` with a usual umask: trainers of
# other users may read it.
FILE_MODE = 0o644
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def write_address_file(path: str, address: str) -> None:
    """Write ``address`` and a newline to ``path`` (replacing it atomically); ``ConfigError`` naming
    ``path`` when it cannot be written, with no temporary file left behind."""
    directory = os.path.dirname(os.path.abspath(path))
    # An unpredictable name, created exclusively: a symlink (or anything else) already there makes the
    # creation fail instead of the write landing on its target.
    temporary = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.{secrets.token_hex(8)}.tmp")
    created = False
    try:
        fd = os.open(temporary, _CREATE_FLAGS, FILE_MODE)
        created = True
        try:
            data = (address + "\n").encode("utf-8")
            while data:
                data = data[os.write(fd, data) :]
        finally:
            os.close(fd)
        os.replace(temporary, path)  # a symlink at PATH is replaced itself, never followed
    except OSError as exc:
        if created:
            try:
                os.unlink(temporary)  # the name is ours (created exclusively); unlink never follows a link
            except OSError:
                pass
        raise ConfigError(f"--address-file {path!r} cannot be written: {exc.strerror or exc}") from None


def remove_address_file(path: str, address: str) -> None:
    """Remove ``path`` when it still is a regular file naming ``address`` (another daemon may have taken
    it over); anything else there is left alone, with at most one log line saying why. Never blocks."""
    try:
        text = _read_bounded(path)
    except FileNotFoundError:
        return  # already gone, or never written: nothing to clean
    except (OSError, _NotAnAddressFile) as exc:
        log.warning("--address-file %r left in place: %s", path, _reason(exc))
        return
    # errors="replace" (in _read_bounded): a file rewritten with other bytes is someone else's now
    if text.strip() != address:
        log.info("--address-file %r left in place: it names another address now", path)
        return
    try:
        os.remove(path)  # unlink: whatever was swapped in meanwhile is unlinked, never followed
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("--address-file %r cannot be removed: %s", path, exc.strerror or exc)


def read_address_file(path: str) -> str:
    """The address in ``path`` (what a trainer's launcher script does with ``cat``); ``ConfigError`` when
    ``path`` is not a regular file holding a short address (``FileNotFoundError`` when it is missing)."""
    try:
        # A trainer's side may follow a symlink (a stable name for the current daemon's file): only reading it, and
        # still a regular file's first bytes, so nothing there can block or exhaust it.
        return _read_bounded(path, follow=True).strip()
    except FileNotFoundError:
        raise
    except (OSError, _NotAnAddressFile) as exc:
        raise ConfigError(f"--address-file {path!r} cannot be read: {_reason(exc)}") from None


class _NotAnAddressFile(Exception):
    """What is at the path is not a file the daemon could have written (its text says what it is)."""


def _read_bounded(path: str, follow: bool = False) -> str:
    """The text of the regular file at ``path``, read without following a symlink (unless ``follow``), without
    blocking (a FIFO or device is refused before it is opened) and at most ``MAX_ADDRESS_BYTES`` of it."""
    kind = _kind((os.stat if follow else os.lstat)(path).st_mode)
    if kind:
        raise _NotAnAddressFile(f"it is {kind}, not a regular file")
    # ELOOP if a symlink was swapped in after the lstat (not following); a FIFO does not block either way
    fd = os.open(path, _READ_FLAGS & ~os.O_NOFOLLOW if follow else _READ_FLAGS)
    try:
        kind = _kind(os.fstat(fd).st_mode)  # what was opened, in case the path was swapped after the lstat
        if kind:
            raise _NotAnAddressFile(f"it is {kind}, not a regular file")
        data = b""
        while len(data) <= MAX_ADDRESS_BYTES:
            chunk = os.read(fd, MAX_ADDRESS_BYTES + 1 - len(data))
            if not chunk:
                break
            data += chunk
    finally:
        os.close(fd)
    if len(data) > MAX_ADDRESS_BYTES:
        raise _NotAnAddressFile(f"it holds more than {MAX_ADDRESS_BYTES} bytes, longer than any address")
    return data.decode("utf-8", errors="replace")


def _kind(mode: int) -> str:
    """What a non-regular file is, in words ("" for a regular file)."""
    if stat.S_ISREG(mode):
        return ""
    for test, name in (
        (stat.S_ISLNK, "a symlink"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "a file of an unknown kind"


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError):
        if exc.errno == errno.ELOOP:
            return "it is a symlink now, not a regular file"
        return exc.strerror or str(exc)
    return str(exc)


__all__ = ["write_address_file", "remove_address_file", "read_address_file", "MAX_ADDRESS_BYTES"]
