"""Expanding ``source.files`` patterns: every real file once, and no walk around a symlink loop.

``glob.glob(recursive=True)`` follows directory symlinks under ``**``: a link back to
an ancestor is walked until the path is too long (about 40 times), and every file
comes back under each of those names. Here ``**`` enters each real directory once
(per remaining pattern), and files are deduplicated by their real path, keeping the
shortest name a pattern gave (so a file is named as the user would name it).
Patterns without ``**`` cannot loop and go to ``glob.glob`` unchanged.
"""

from __future__ import annotations

import fnmatch
import glob
import os
from collections.abc import Iterable, Iterator


def glob_files(pattern: str) -> list[str]:
    """Absolute paths of the regular files ``pattern`` matches (``**`` recursive), each real file once."""
    pattern = os.path.abspath(os.path.expanduser(pattern))
    parts = pattern.split(os.sep)
    if "**" not in parts:
        return unique_files(glob.glob(pattern))
    start = 0
    while start < len(parts) and not glob.has_magic(parts[start]):
        start += 1
    base = os.sep.join(parts[:start]) or os.sep
    if not os.path.isdir(base):
        return []
    return unique_files(_walk(base, tuple(parts[start:]), set()))


def unique_files(paths: Iterable[str]) -> list[str]:
    """The regular files among ``paths`` (absolute), one name per real file, sorted."""
    by_real: dict[str, str] = {}
    for path in dict.fromkeys(paths):  # a name given twice is looked up once
        if not os.path.isfile(path):
            continue
        path = os.path.abspath(path)
        real = os.path.realpath(path)
        known = by_real.get(real)
        if known is None or (len(path), path) < (len(known), known):
            by_real[real] = path
    return sorted(by_real.values())


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


__all__ = ["glob_files", "unique_files"]
