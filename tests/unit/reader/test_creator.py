"""loader.reader.creator: np_array, text_file, recordio."""

from __future__ import annotations

import numpy as np
import pytest

from loader import recordio
from loader.reader import creator
from tests.helpers import open_fd_count


def test_np_array_upstream():
    lists = [[1, 2, 3], [4, 5, 6]]
    rows = list(creator.np_array(np.array(lists, dtype=np.int32))())
    assert len(rows) == 2
    for row, expected in zip(rows, lists):
        assert row.tolist() == expected


def test_np_array_zero_d_yields_once():
    out = list(creator.np_array(np.array(7.5))())
    assert len(out) == 1 and out[0] == 7.5 and out[0].ndim == 0


def test_np_array_vector_and_list_input():
    assert [int(x) for x in creator.np_array(np.arange(4))()] == [0, 1, 2, 3]
    assert [int(x) for x in creator.np_array([5, 6])()] == [5, 6]


def test_text_file_upstream(tmp_path):
    path = tmp_path / "test_data_creator.txt"
    path.write_text("".join(f"{2 * i} {2 * i + 1}\n" for i in range(10)))
    lines = list(creator.text_file(str(path))())
    assert lines == [f"{2 * i} {2 * i + 1}" for i in range(10)]


def test_text_file_lazy_open_and_empty_lines(tmp_path):
    path = tmp_path / "t.txt"
    r = creator.text_file(path)  # the file does not exist yet: nothing is opened here
    path.write_text("a\n\nb")
    assert list(r()) == ["a", "", "b"]
    missing = creator.text_file(tmp_path / "missing.txt")()
    with pytest.raises(FileNotFoundError):
        next(missing)


def test_text_file_closes_when_abandoned(tmp_path):
    path = tmp_path / "many.txt"
    path.write_text("x\n" * 100)
    fds = open_fd_count()
    r = creator.text_file(path)
    for i in range(1000):
        it = r()
        next(it)
        if i % 2:
            it.close()
        else:
            del it
    assert open_fd_count() <= fds


@pytest.fixture
def recordio_files(tmp_path):
    first = tmp_path / "test_reader_recordio.dat"
    with recordio.Writer(str(first)) as writer:
        writer.write((1, 2, 3))
        writer.write((4, 5, 6))
    second = tmp_path / "part-2.dat"
    with recordio.Writer(str(second)) as writer:
        writer.write({"a": np.arange(3, dtype=np.int16)})
    return first, second


def test_recordio_upstream(recordio_files, no_leaks):
    first, _ = recordio_files
    for paths in (str(first), [str(first)]):
        assert list(creator.recordio(paths)()) == [(1, 2, 3), (4, 5, 6)]


def test_recordio_lists_commas_and_globs(recordio_files, tmp_path, no_leaks):
    first, second = recordio_files
    # Files are read in the order given; a glob's matches sorted ("part-2" before "test_...").
    for paths, dict_at in (([str(first), str(second)], 2), (f"{first},{second}", 2), (str(tmp_path / "*.dat"), 0)):
        out = list(creator.recordio(paths, buf_size=1)())
        assert len(out) == 3, paths
        array = out.pop(dict_at)["a"]
        assert out == [(1, 2, 3), (4, 5, 6)], paths
        assert array.dtype == np.int16 and array.tolist() == [0, 1, 2]


def test_recordio_bad_paths(tmp_path, no_leaks):
    with pytest.raises(FileNotFoundError):
        list(creator.recordio(str(tmp_path / "*.none"))())
    with pytest.raises(FileNotFoundError):
        list(creator.recordio(str(tmp_path / "absent.dat"))())
    with pytest.raises(TypeError):
        creator.recordio(42)
    with pytest.raises(ValueError):
        creator.recordio([])


def test_text_file_names_a_line_that_is_not_utf8_after_every_line_before_it(tmp_path):
    from loader.errors import DataError

    path = tmp_path / "t.txt"
    path.write_bytes(b"a\nb\ncaf\xe9\nd\n")
    got = []
    with pytest.raises(DataError, match=r"t.txt: line 3 is not utf-8 text \(byte 0xe9 at character 4\)"):
        for line in creator.text_file(str(path))():
            got.append(line)
    assert got == ["a", "b"]
