"""Small helpers shared by the reader toolkit: the reader type and closing sources."""

from __future__ import annotations

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
    """Raise ``TypeError`` when ``reader`` is not callable (a common mistake: passing ``r()``)."""
    if not callable(reader):
        raise TypeError(f"{who}: a reader must be a zero-argument callable, got {type(reader).__name__}")


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


__all__ = ["Reader", "close_quietly", "open_source", "check_reader", "as_count"]
