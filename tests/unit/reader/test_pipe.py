"""loader.reader.pipe: PipeReader over a command's output."""

from __future__ import annotations

import gc
import gzip

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loader import reader
from loader.errors import DataError, WorkerDiedError
from tests.helpers import child_pids, open_fd_count


def test_upstream_cat(tmp_path, no_leaks):
    path = tmp_path / "lines.txt"
    path.write_text("".join(f"{i}\n" for i in range(5)))
    lines = list(reader.PipeReader(f"cat {path}", bufsize=128).get_line())
    assert lines == [str(i) for i in range(5)]


def test_last_line_without_newline_is_kept(no_leaks):
    assert list(reader.PipeReader(["printf", "a\\nb\\n\\nc"]).get_line()) == ["a", "b", "", "c"]


def test_string_command_is_split_like_a_shell(no_leaks):
    lines = list(reader.PipeReader("printf '%s\\n' 'hello world' x").get_line())
    assert lines == ["hello world", "x"]


def test_multi_member_gzip(tmp_path, no_leaks):
    path = tmp_path / "two.gz"
    path.write_bytes(gzip.compress(b"a\nb\n") + gzip.compress("c\nd\u00e9".encode()))
    lines = list(reader.PipeReader(["cat", str(path)], bufsize=7, file_type="gzip").get_line())
    assert lines == ["a", "b", "c", "d\u00e9"]


def test_truncated_gzip_is_an_error(tmp_path, no_leaks):
    path = tmp_path / "cut.gz"
    path.write_bytes(gzip.compress(b"x\n" * 1000)[:-12])
    with pytest.raises(DataError, match=r"command 'cat .*cut\.gz' is not valid gzip .*middle of a gzip member"):
        list(reader.PipeReader(["cat", str(path)], file_type="gzip").get_line())


def test_output_that_is_not_gzip_is_a_data_error_naming_the_command(tmp_path, no_leaks):
    # zlib's own error named neither the command nor where, and is not even a ValueError.
    path = tmp_path / "plain.gz"
    path.write_bytes(gzip.compress(b"a\n") + b"not a gzip member\n")
    got = []
    with pytest.raises(DataError) as info:
        for line in reader.PipeReader(["cat", str(path)], file_type="gzip").get_line():
            got.append(line)
    assert got == ["a"]  # the member before the damage
    size = path.stat().st_size
    assert f"output of command 'cat {path}' is not valid gzip (in its first {size} bytes: Error -3" in str(info.value)


@pytest.mark.parametrize("bufsize", [1, 2, 4096])
def test_output_that_is_not_utf8_is_a_data_error_naming_the_command_and_offset(tmp_path, no_leaks, bufsize):
    path = tmp_path / "latin1.txt"
    path.write_bytes("h\u00e9llo\n".encode() * 3 + b"caf\xe9\n")  # 21 good bytes, then Latin-1
    got = []
    with pytest.raises(DataError) as info:
        for line in reader.PipeReader(["cat", str(path)], bufsize=bufsize).get_line():
            got.append(line)
    assert got == ["h\u00e9llo"] * 3
    assert f"command 'cat {path}' is not UTF-8 text (byte 0xe9 at offset 24 of its output" in str(info.value)


def test_utf8_split_across_chunks(tmp_path, no_leaks):
    text = "h\u00e9llo\n\u20acuro \U0001f600\nend"
    path = tmp_path / "u.txt"
    path.write_text(text, encoding="utf-8")
    pipe = reader.PipeReader(["cat", str(path)], bufsize=1)
    assert list(pipe.get_line()) == text.split("\n")
    assert "".join(pipe.get_line(cut_lines=False)) == text  # re-iterable: a new process per call


def test_custom_line_break(no_leaks):
    assert list(reader.PipeReader(["printf", "a;b;c;"]).get_line(line_break=";")) == ["a", "b", "c"]
    with pytest.raises(ValueError):
        reader.PipeReader(["true"]).get_line(line_break="")


def test_empty_output(no_leaks):
    assert list(reader.PipeReader("true").get_line()) == []


def test_nonzero_exit_raises_after_output(no_leaks):
    got = []
    with pytest.raises(WorkerDiedError) as info:
        for line in reader.PipeReader(["sh", "-c", "echo a; echo b; exit 3"]).get_line():
            got.append(line)
    assert got == ["a", "b"]
    assert info.value.exitcode == 3
    assert "code 3" in str(info.value) and "sh -c" in str(info.value)
    # Its standard error went to ours: the error does not say it reported nothing (it may have), and keeps it.
    assert "(its standard error says why)" in str(info.value) and "without reporting" not in str(info.value)
    import pickle

    assert str(pickle.loads(pickle.dumps(info.value))) == str(info.value)


def test_bad_arguments_raise_at_construction():
    with pytest.raises(ValueError, match="file_type"):
        reader.PipeReader("cat x", file_type="bz2")
    with pytest.raises(TypeError):
        reader.PipeReader(42)
    with pytest.raises(ValueError):
        reader.PipeReader("   ")
    with pytest.raises(ValueError):
        reader.PipeReader("cat", bufsize=0)


def test_missing_command():
    with pytest.raises(FileNotFoundError):
        list(reader.PipeReader("no-such-command-for-loader-tests").get_line())


def test_process_starts_lazily(no_leaks):
    before = child_pids()
    pipe = reader.PipeReader("sleep 30")
    lines = pipe.get_line()
    assert child_pids() == before
    del lines, pipe


def test_abandoned_iterations_reap_the_command(no_leaks):
    children, fds = child_pids(), open_fd_count()
    for i in range(100):
        lines = reader.PipeReader("yes").get_line(cut_lines=bool(i % 2))
        next(lines)
        if i % 2:
            lines.close()
        else:
            del lines
    gc.collect()
    assert child_pids() == children
    assert open_fd_count() <= fds


class _Chunks:
    """The decoded chunks of a command's output, as ``_cut`` gets them."""

    def __init__(self, parts: list[str]) -> None:
        self._parts = iter(parts)

    def __iter__(self) -> _Chunks:
        return self

    def __next__(self) -> str:
        return next(self._parts)

    def close(self) -> None:
        pass


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(alphabet="abxyz\r\nq", max_size=80),
    line_break=st.sampled_from(["\n", "\r\n", "ab", "xyz"]),
    cuts=st.lists(st.integers(0, 80), max_size=12),
)
def test_lines_are_cut_the_same_wherever_the_chunks_end(text: str, line_break: str, cuts: list[int]) -> None:
    from loader.reader.pipe import _cut

    bounds = sorted({min(c, len(text)) for c in cuts})
    parts = [text[i:j] for i, j in zip([0, *bounds], [*bounds, len(text)])]
    want = text.split(line_break)
    if want[-1] == "":
        want.pop()
    assert list(_cut(_Chunks(parts), line_break)) == want


def test_a_line_of_thousands_of_chunks_is_cut_whole() -> None:
    # Joined once at its end: before, every chunk re-copied the line so far (a 16 MiB line took 13 s; how long
    # it takes is the benchmark's to say, not a test's: this checks the line arrives whole).
    from loader.reader.pipe import _cut

    parts = ["x" * 4096] * 4096 + ["\nend"]  # one 16 MiB line, then another
    lines = list(_cut(_Chunks(parts), "\n"))
    assert [len(line) for line in lines] == [16 * 1024 * 1024, 3]
