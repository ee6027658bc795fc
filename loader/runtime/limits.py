"""The process's limit on open files, raised for a daemon.

A daemon holds a socket per peer connection, files being read, arenas and pipes. Linux's default soft
limit (often 1,024, 256 in some containers) is far below the hard one: a flood of connections then
exhausted it, and the daemon could answer no status, admit no client and start no worker until the flood
ended. The soft limit is raised to the hard one (never above it: that needs privileges).
"""

from __future__ import annotations

import logging

log = logging.getLogger("loader.daemon")

TARGET_OPEN_FILES = 65536  # enough for any legitimate daemon; the hard limit may be lower


def raise_open_files_limit(target: int = TARGET_OPEN_FILES) -> int | None:
    """Raise the soft limit on open files towards ``target`` (within the hard limit); the new soft limit,
    or None where there is no such limit (Windows)."""
    try:
        import resource
    except ImportError:  # not POSIX
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = target if hard == resource.RLIM_INFINITY else min(target, hard)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        except (ValueError, OSError) as exc:
            log.debug("could not raise the open-files limit from %d to %d: %s", soft, wanted, exc)
            return soft
        return wanted
    return soft


__all__ = ["raise_open_files_limit", "TARGET_OPEN_FILES"]
