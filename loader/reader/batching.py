"""``loader.batch``: turn a reader of samples into a reader of batches (lists of samples)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from loader.reader._util import check_reader, close_quietly, open_source


def batch(
    reader: Callable[[], Iterable[Any]], batch_size: int, drop_last: bool = False
) -> Callable[[], Iterator[list[Any]]]:
    """A batch reader yielding lists of ``batch_size`` samples of ``reader``, in order.

    ``batch_size`` goes through ``int()`` as in the original (``2.9`` -> 2,
    ``"3"`` -> 3); a value below 1 after that raises ``ValueError`` here, when
    the batch reader is made. The last, shorter batch is yielded unless
    ``drop_last`` is truthy. (The original tested ``drop_last == False`` in 1.x
    and ``drop_last is False`` in 3.x, so ``None`` dropped the tail in both;
    here ``None`` and ``0`` keep it, ``True``/``1`` drop it.) Samples are not
    copied; each batch is a new ``list``.
    """
    check_reader(reader, "batch")
    try:
        size = int(batch_size)
    except (TypeError, ValueError) as exc:
        # int()'s own message ("invalid literal for int() with base 10: 'many'") names no argument.
        raise type(exc)(f"batch_size should be a positive integer value, but got batch_size={batch_size!r}") from None
    if size <= 0:
        raise ValueError(f"batch_size should be a positive integer value, but got batch_size={size}")
    drop = bool(drop_last)

    def batch_reader() -> Iterator[list[Any]]:
        source = open_source(reader)
        current: list[Any] = []
        try:
            for sample in source:
                current.append(sample)
                if len(current) == size:
                    yield current
                    current = []
            if current and not drop:
                yield current
        finally:
            close_quietly(source)

    return batch_reader


__all__ = ["batch"]
