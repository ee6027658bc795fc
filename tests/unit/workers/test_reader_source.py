"""``source.reader`` as a newcomer writes it: ``function(path)`` must return a reader, not the samples."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from loader.config import LoaderConfig
from workers.sources import FileSource


def yields_samples(path: str) -> Iterator[tuple[int]]:
    """The usual slip: the function is itself the generator of samples."""
    yield (1,)


def returns_samples(path: str) -> list[tuple[int]]:
    return [(1,)]


def reader_returning_nothing(path: str) -> Callable[[], None]:
    def read() -> None:
        pass  # a forgotten yield

    return read


def good_reader(path: str) -> Callable[[], Iterator[tuple[int]]]:
    def read() -> Iterator[tuple[int]]:
        yield (1,)
        yield (2,)

    return read


def _source(tmp_path: Any, function: str) -> FileSource:
    path = tmp_path / "a.txt"
    path.write_text("x\n")
    name = f"tests.unit.workers.test_reader_source:{function}"
    return FileSource(LoaderConfig.from_dict({"source": {"files": [str(path)], "reader": name}}), str(path))


@pytest.mark.parametrize(
    ("function", "message"),
    [
        ("yields_samples", r"source.reader '.*:yields_samples' returned a generator, not a reader: function\(path\)"),
        ("returns_samples", r"source.reader '.*:returns_samples' returned a list, not a reader"),
        ("reader_returning_nothing", r"the reader it returned gave a NoneType, not an iterable of samples"),
    ],
)
def test_a_reader_function_of_the_wrong_shape_says_what_it_must_return(tmp_path, function, message) -> None:
    # They failed with "'generator' object is not callable" (or "'NoneType' object is not iterable"), which named
    # the file but not what source.reader is to return.
    with pytest.raises(TypeError, match=message) as caught:
        _source(tmp_path, function)
    assert "\n" not in str(caught.value)


def test_a_reader_of_the_right_shape_gives_its_samples(tmp_path) -> None:
    assert list(_source(tmp_path, "good_reader").samples()) == [(1,), (2,)]
