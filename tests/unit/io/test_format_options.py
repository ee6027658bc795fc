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
