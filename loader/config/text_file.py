"""Reading a text file a config names (the config itself, ``source.list_file``): a regular file, bounded.

Both paths come from users' files and command lines, so what lies there is checked before it is read:
a FIFO's ``open`` waited for a writer, and a device (``/dev/zero`` behind a symlink) was read until
memory ran out. The kind is checked before opening and again on what was opened, with ``O_NONBLOCK``,
so a FIFO swapped in meanwhile cannot block either.
"""

from __future__ import annotations

import os
import stat

from loader.errors import ConfigError

# The most bytes such a file may hold. A config is a few KiB; one, or a list file, that names every file of a
# dataset can be megabytes (100 MB of config loads in about 2 s).
MAX_TEXT_FILE_BYTES = 256 * 1024 * 1024
_FILE_KINDS = (
    (stat.S_ISFIFO, "a named pipe"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def read_text_file(path: str, what: str, expected: str, max_bytes: int = MAX_TEXT_FILE_BYTES) -> str:
    """The UTF-8 text of ``path``, a regular file of at most ``max_bytes``; else a ``ConfigError`` naming it
    as ``what`` ("config file") and saying what it should be (``expected``: "a TOML file"). Its ``OSError``
    and ``UnicodeDecodeError`` are left to the caller."""
    _refuse_not_regular(path, os.stat(path).st_mode, what, expected)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with open(fd, "rb") as fh:
        _refuse_not_regular(path, os.fstat(fh.fileno()).st_mode, what, expected)
        raw = fh.read(max_bytes + 1)
    if len(raw) > max_bytes:
        raise ConfigError(f"{what} {path!r} is larger than {max_bytes / (1024 * 1024):g} MiB: not {expected}")
    return raw.decode("utf-8")


def _refuse_not_regular(path: str, mode: int, what: str, expected: str) -> None:
    if stat.S_ISDIR(mode):
        raise ConfigError(f"{what} {path!r} is a directory")
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _FILE_KINDS if test(mode)), f"mode {stat.filemode(mode)}")
        raise ConfigError(f"{what} {path!r} is not a regular file ({kind}): give the path of {expected}")


__all__ = ["MAX_TEXT_FILE_BYTES", "read_text_file"]
