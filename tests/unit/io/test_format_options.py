"""A format given an option it does not take says so in one line (it was "_open() got an unexpected keyword")."""

from __future__ import annotations

import numpy as np
import pytest

from loader.errors import ConfigError, FormatOptionError
from loader.io.registry import create_file_reader


def test_an_unknown_option_is_named_with_the_ones_the_format_takes(tmp_path) -> None:
    path = tmp_path / "lines.txt"
    path.write_text("1\n2\n")
    with pytest.raises(
        FormatOptionError, match=r"lines.txt: TextFileReader takes no option 'bogus' .*parser, encoding"
    ):
        create_file_reader(str(path), parser=int, bogus=1)
    assert issubclass(FormatOptionError, ConfigError) and issubclass(FormatOptionError, TypeError)
    assert create_file_reader(str(path), parser=int).read_next()[0] == 1  # the options it takes still work


def test_a_format_without_options_says_it_takes_none(tmp_path) -> None:
    path = tmp_path / "a.npy"
    np.save(path, np.zeros((3, 2), np.float32))
    with pytest.raises(FormatOptionError, match=r"a.npy: NpyFileReader takes no option 'foo' .*it takes: none"):
        create_file_reader(str(path), foo=1)


def test_an_option_named_by_a_positional_only_parameter_is_refused_in_one_line(tmp_path) -> None:
    # A keyword can never fill it: the check passed it, and _open(**options) raised its own TypeError.
    from loader.io.file_reader import FileReader

    class Lines(FileReader):
        def _open(self, sep: str = ",", /, limit: int = 0) -> None:  # type: ignore[override]
            self.limit = limit

    path = tmp_path / "a.lines"
    path.write_text("1\n")
    with pytest.raises(FormatOptionError, match=r"a.lines: Lines takes no option 'sep' .*it takes: limit"):
        Lines(str(path), None, None, sep=";")
    assert Lines(str(path), None, None, limit=2).limit == 2
