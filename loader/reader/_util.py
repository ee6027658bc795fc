"""Small helpers shared by the reader toolkit: the reader type and closing sources."""

from __future__ import annotations

import inspect
import operator
from collections.abc import Callable, Iterable, Iterator
from typing import Any

#: A reader: a zero-argument callable returning a fresh iterable of samples.
Reader = Callable[[], Iterable[Any]]


def close_quietly(source: Any) -> None:
    """Close a source iterator if it can be closed (a generator, a file).

    A generator that is still running in another thread cannot be closed
    (``ValueError``); it is left to that thread, whose owner stops it.
    """
    close = getattr(source, "close", None)
    if close is None:
        return
    try:
        close()
    except ValueError:
        pass


def open_source(reader: Reader) -> Iterator[Any]:
    """Call ``reader`` and return an iterator over what it gives."""
    return iter(reader())


def check_reader(reader: Any, who: str) -> None:
    """Raise ``TypeError`` when ``reader`` is not callable (a common mistake: passing ``r()``) or cannot be
    called without arguments (passing a reader creator, ``text_file``, where its reader is due)."""
    if not callable(reader):
        raise TypeError(f"{who}: a reader must be a zero-argument callable, got {type(reader).__name__}")
    try:
        signature = inspect.signature(reader)
    except (TypeError, ValueError):  # a builtin or extension callable without one: taken on trust
        return
    try:
        signature.bind()
    except TypeError:
        needed = [
            name
            for name, parameter in signature.parameters.items()
            if parameter.default is parameter.empty
            and parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)
        ]
        name = getattr(reader, "__name__", type(reader).__name__)
        raise TypeError(
            f"{who}: a reader must be callable with no arguments; {name} needs "
            f"{', '.join(repr(n) for n in needed)} (is it a reader creator? call it with those to get its reader)"
        ) from None


def check_function(function: Any, who: str) -> None:
    """Raise ``TypeError`` when a mapper ``who`` (``"map_readers: func"``) is not callable: found here, not at
    the first sample, where the error names neither the decorator nor the argument."""
    if not callable(function):
        raise TypeError(f"{who} must be callable, got {type(function).__name__}")


def as_count(value: Any, name: str) -> int:
    """An integer size or count; an integral float such as ``2.0`` is accepted.

    Anything else that is not an integer raises ``TypeError`` naming the argument,
    ``name`` (``"buffered: size"``): ``operator.index``'s own message names only the
    type. (The original let floats through to ``Queue`` or ``==`` comparisons, with
    odd results.)
    """
    if isinstance(value, float) and value.is_integer():
        return int(value)
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {value!r} ({type(value).__name__})") from None


# The passes of the multiprocess_readers this process was forked for, summed (0 outside their children). A
# seeded shuffle's pass counter lives in the parent's memory and a child gets a fresh copy each pass, so
# without this every pass of a child shuffled alike; with it, pass k of the merged reader shuffles as the
# k-th call would in one process.
_forked_pass = 0


def forked_pass() -> int:
    return _forked_pass


def enter_forked_pass(number: int) -> None:
    """In a multiprocess_reader's child: this process reads pass ``number`` of it."""
    global _forked_pass
    _forked_pass += number


__all__ = [
    "Reader",
    "close_quietly",
    "open_source",
    "check_reader",
    "check_function",
    "as_count",
    "forked_pass",
    "enter_forked_pass",
]
