"""Names of a daemon's shared-memory files, and the sweep of those whose daemon is dead.

A daemon's arena files are named ``loader-<pid namespace>-<pid>-<8 hex>-<id>``
(``owner_prefix`` makes the part before ``-<id>``). ``close`` unlinks them, but
a daemon killed with SIGKILL cannot, and ``/dev/shm`` is memory: its files
would pin RAM until reboot. So its orphaned workers remove its files as they
exit (``sweep_after``), and a daemon starting up removes the files of daemons
that are provably dead (those killed together with their workers):

* only names of exactly this shape (nothing else in the directory is touched);
* only from this daemon's own pid namespace: another container sharing
  ``/dev/shm`` has its own pid numbers, where "no such pid here" proves
  nothing (without a readable ``/proc/self/ns/pid`` nothing is swept);
* only when no process of that pid exists (``kill(pid, 0)``). A pid reused by
  a live process keeps the old files: a leak, never a deletion of a live
  daemon's arena.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import time

log = logging.getLogger("loader.daemon")

# How long an orphaned worker waits for its dead daemon to be reaped before sweeping its files.
ORPHAN_SWEEP_WAIT_S = 2.0

_NAME = re.compile(r"^loader-(\d+)-(\d+)-[0-9a-f]{8}-\d+$")


def pid_namespace() -> int | None:
    """The inode of this process's pid namespace, or None when it cannot be read."""
    try:
        link = os.readlink("/proc/self/ns/pid")  # "pid:[4026531836]"
    except OSError:
        return None
    match = re.search(r"\[(\d+)\]", link)
    return int(match.group(1)) if match else None


def owner_prefix() -> str:
    """A fresh prefix for this process's arena files (see the module docstring)."""
    return f"loader-{pid_namespace() or 0}-{os.getpid()}-{secrets.token_hex(4)}"


def parse_name(name: str) -> tuple[int, int] | None:
    """``(pid namespace, pid)`` of the daemon that made arena file ``name``; None for any other name."""
    match = _NAME.match(name)
    return None if match is None else (int(match.group(1)), int(match.group(2)))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def sweep(directory: str, *, owner: int | None = None) -> list[str]:
    """Unlink the arena files in ``directory`` of dead daemons of this pid namespace (of daemon pid ``owner``
    only, when given); returns their names."""
    namespace = pid_namespace()
    if namespace is None:
        return []
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    removed, dead = [], set()
    for name in sorted(names):
        parsed = parse_name(name)
        if parsed is None or parsed[0] != namespace:
            continue
        pid = parsed[1]
        if pid == os.getpid() or (owner is not None and pid != owner) or (pid not in dead and _pid_alive(pid)):
            continue
        dead.add(pid)
        try:
            os.unlink(os.path.join(directory, name))
        except FileNotFoundError:
            continue  # another daemon starting beside us swept it first
        except OSError as exc:
            log.warning("cannot remove stale shared-memory file %s: %s", os.path.join(directory, name), exc)
            continue
        removed.append(name)
    if removed:
        log.info(
            "removed %d shared-memory file(s) left in %s by dead loader daemon(s) (pids %s)",
            len(removed),
            directory,
            ", ".join(str(p) for p in sorted(dead)),
        )
    return removed


def sweep_after(pid: int, directory: str, wait_s: float = ORPHAN_SWEEP_WAIT_S) -> list[str]:
    """Unlink the files of daemon ``pid``, which just died (called by its orphaned workers).

    A dead process stays a zombie until its own parent reaps it, and ``kill(pid, 0)`` cannot tell a zombie
    from a live process: wait up to ``wait_s`` for it to go. Several workers may sweep at once (an unlink
    that loses the race is skipped)."""
    deadline = time.monotonic() + wait_s
    while _pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return sweep(directory, owner=pid)


__all__ = ["owner_prefix", "parse_name", "pid_namespace", "sweep", "sweep_after"]
