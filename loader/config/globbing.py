"""Expanding ``source.files`` patterns: every real file once, and no walk around a symlink loop.

``glob.glob(recursive=True)`` follows directory symlinks under ``**``: a link back to
an ancestor is walked until the path is too long (about 40 times), and every file
comes back under each of those names. Here ``**`` enters each real directory once
(per remaining pattern), and files are deduplicated by their real path, keeping the
shortest name a pattern gave (so a file is named as the user would name it).
Patterns without ``**`` cannot loop and go to ``glob.glob`` unchanged.

A match that is not a regular file (a dangling symlink, a symlink loop, a FIFO, a device) is
left out with one WARNING per pattern naming a few of them and the count: a shard linked to
an unmounted filesystem made the dataset smaller without a word. Directories are left out
without a word: a pattern over a tree of folders matches them by design.
"""

from __future__ import annotations

import errno
import fnmatch
import glob
import logging
import os
import stat
from collections.abc import Iterable, Iterator

log = logging.getLogger("loader.config")
SKIPPED_NAMED = 3  # skipped matches a warning names; the rest are counted


def glob_files(pattern: str) -> list[str]:
    """Absolute paths of the regular files ``pattern`` matches (``**`` recursive), each real file once."""
    pattern = os.path.abspath(os.path.expanduser(pattern))
    parts = pattern.split(os.sep)
    skipped: list[str] = []
    if "**" not in parts:
        files = unique_files(glob.glob(pattern), skipped)
    else:
        start = 0
        while start < len(parts) and not glob.has_magic(parts[start]):
            start += 1
        base = os.sep.join(parts[:start]) or os.sep
        if not os.path.isdir(base):
            return []
        files = unique_files(_walk(base, tuple(parts[start:]), set()), skipped)
    # A directory a pattern matches is no file gone missing: `data/*` over a tree of folders, `**/*`, a final
    # `**` match every directory on the way (an ImageNet-like tree gave a thousand false "left out" names).
    skipped = [path for path in skipped if not os.path.isdir(path)]
    if skipped:
        _warn_once(pattern, skipped_text(pattern, sorted(skipped)))
    else:
        _warned.pop(pattern, None)  # mended: the same fault coming back is said again
    return files


_warned: dict[str, str] = {}  # pattern -> the last "left out" line logged for it, in this process
_WARNED_KEPT = 256


def _warn_once(pattern: str, text: str) -> None:
    """Log ``text`` unless it is what was last logged for ``pattern``: `loader serve` expands each pattern when
    it checks the config and again when it builds the file table, and said the same line twice; a change in
    what is left out is said again."""
    if _warned.get(pattern) == text:
        return
    if len(_warned) >= _WARNED_KEPT:
        _warned.clear()
    _warned[pattern] = text
    log.warning("%s", text)


def unique_files(paths: Iterable[str], skipped: list[str] | None = None) -> list[str]:
    """The regular files among ``paths`` (absolute), one name per real file, sorted; the other names are
    appended to ``skipped`` when given."""
    by_real: dict[str, str] = {}
    for path in dict.fromkeys(paths):  # a name given twice is looked up once
        if not os.path.isfile(path):
            if skipped is not None:
                skipped.append(path)
            continue
        path = os.path.abspath(path)
        real = os.path.realpath(path)
        known = by_real.get(real)
        if known is None or (len(path), path) < (len(known), known):
            by_real[real] = path
    return sorted(by_real.values())


def skipped_text(pattern: str, skipped: list[str]) -> str:
    """One line saying which matches of ``pattern`` are left out as not regular files, and what each is."""
    named = ", ".join(f"{path} ({_what(path)})" for path in skipped[:SKIPPED_NAMED])
    more = f" and {len(skipped) - SKIPPED_NAMED} more" if len(skipped) > SKIPPED_NAMED else ""
    count = (
        "1 match that is not a regular file"
        if len(skipped) == 1
        else f"{len(skipped)} matches that are not regular files"
    )
    return (
        f"source.files pattern {pattern!r}: left out {count}: {named}{more} "
        "(a shard linked to an unmounted filesystem makes the dataset smaller)"
    )


def _what(path: str) -> str:
    """What ``path`` is, in a few words, when it is not a regular file."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "a symlink to a missing file" if os.path.islink(path) else "gone since it was listed"
    except OSError as exc:
        return "a symlink loop" if exc.errno == errno.ELOOP else f"cannot be read: {exc.strerror or exc}"
    for test, what in _KINDS:
        if test(mode):
            return what
    return "not a regular file"  # pragma: no cover - every kind of file is one of the above


_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _walk(directory: str, parts: tuple[str, ...], seen: set[tuple[str, int]]) -> Iterator[str]:
    """Paths under ``directory`` matching the pattern components ``parts``."""
    if not parts:
        yield directory
        return
    head, rest = parts[0], parts[1:]
    if head == "**":
        key = (os.path.realpath(directory), len(parts))
        if key in seen:  # this real directory was walked for this rest of the pattern: a loop or an alias
            return
        seen.add(key)
        yield from _walk(directory, rest, seen)  # "**" matches no directory at all
        for name in _names(directory, "*"):
            child = os.path.join(directory, name)
            if not rest:
                yield child  # a final "**" matches files too
            if os.path.isdir(child):
                yield from _walk(child, parts, seen)
        return
    if not glob.has_magic(head):
        child = os.path.join(directory, head)
        if os.path.lexists(child):
            yield from _walk(child, rest, seen) if rest else iter([child])
        return
    for name in _names(directory, head):
        child = os.path.join(directory, name)
        if not rest:
            yield child
        elif os.path.isdir(child):
            yield from _walk(child, rest, seen)


def _names(directory: str, pattern: str) -> list[str]:
    """Entries of ``directory`` matching one component; hidden ones only for a pattern that starts with a dot."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    if not pattern.startswith("."):
        names = [n for n in names if not n.startswith(".")]
    return sorted(n for n in names if fnmatch.fnmatchcase(n, pattern))


__all__ = ["glob_files", "unique_files", "skipped_text"]
