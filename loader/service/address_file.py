"""``loader serve --address-file PATH``: the address the daemon bound, for jobs that bind port ``*``.

A scheduler's job script starts the daemon on any free port and hands the
address to its trainers (``LOADER_ADDRESS=$(cat PATH)``), so no port is fixed
in advance. The file is written atomically (a reader never sees half an
address) once the daemon is bound and serving, and removed when it stops, if
it still holds this daemon's address, so a stale file does not send trainers to
a daemon that is gone.
"""

from __future__ import annotations

import os

from loader.errors import ConfigError


def write_address_file(path: str, address: str) -> None:
    """Write ``address`` and a newline to ``path`` (replacing it atomically)."""
    directory = os.path.dirname(os.path.abspath(path))
    temporary = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    try:
        with open(temporary, "w", encoding="utf-8") as fh:
            fh.write(address + "\n")
        os.replace(temporary, path)
    except OSError as exc:
        raise ConfigError(f"--address-file {path!r} cannot be written: {exc.strerror or exc}") from exc


def remove_address_file(path: str, address: str) -> None:
    """Remove ``path`` when it still names ``address`` (another daemon may have taken it over)."""
    try:
        # errors="replace": a file rewritten with other bytes is someone else's now, not a crash at shutdown
        with open(path, encoding="utf-8", errors="replace") as fh:
            if fh.read().strip() != address:
                return
        os.remove(path)
    except OSError:
        pass  # already gone, or never written: nothing to clean


def read_address_file(path: str) -> str:
    """The address in ``path`` (what a trainer's launcher script does with ``cat``)."""
    with open(path, encoding="utf-8") as fh:
        return fh.read().strip()


__all__ = ["write_address_file", "remove_address_file", "read_address_file"]
