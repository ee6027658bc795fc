"""``--address-file PATH`` when something hostile sits at PATH or next to it: nothing hangs, nothing is read
unboundedly, no write lands through a planted symlink, no temporary file is left behind."""

from __future__ import annotations

import errno
import logging
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from loader.errors import ConfigError
from loader.service.address_file import MAX_ADDRESS_BYTES, read_address_file, remove_address_file, write_address_file

ADDRESS = "tcp://127.0.0.1:4000"
PROMPT_S = 2.0  # a FIFO made the old code block in open() until a writer came
CHILD_MEMORY_BYTES = 1 << 30  # the child that meets /dev/zero: a read without a bound dies at this limit
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def fifo(tmp_path: Any) -> Iterator[str]:
    path = str(tmp_path / "address")
    os.mkfifo(path)
    yield path
    _release_reader(path)


def _release_reader(path: str) -> None:
    """End a reader blocked opening the FIFO (how the old code hung): a writer that opens and closes it."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    except OSError as exc:  # ENXIO: no reader waits; ENOENT: gone
        assert exc.errno in (errno.ENXIO, errno.ENOENT), exc


def _finishes(call: Callable[[], Any], fifo_path: str) -> tuple[bool, list[BaseException]]:
    """Run ``call`` in a thread: whether it finished within PROMPT_S (a blocked one is released), its errors."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(PROMPT_S)
    finished = not thread.is_alive()
    if not finished:
        _release_reader(fifo_path)
        thread.join(PROMPT_S)
    return finished, errors


def _lines(caplog: Any) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("loader")]


def test_remove_leaves_a_fifo_alone_at_once_in_one_line(fifo: str, caplog: Any) -> None:
    caplog.set_level(logging.INFO, logger="loader")
    finished, errors = _finishes(lambda: remove_address_file(fifo, ADDRESS), fifo)
    assert finished, "remove_address_file blocked opening a FIFO put at the address file's path"
    assert not errors
    assert os.path.exists(fifo)  # not ours: left where it is
    lines = _lines(caplog)
    assert len(lines) == 1 and "left in place" in lines[0] and "FIFO" in lines[0] and fifo in lines[0], lines


def test_remove_does_not_follow_a_symlink(tmp_path: Any, fifo: str, caplog: Any) -> None:
    caplog.set_level(logging.INFO, logger="loader")
    to_fifo = str(tmp_path / "to-fifo")
    os.symlink(fifo, to_fifo)
    finished, errors = _finishes(lambda: remove_address_file(to_fifo, ADDRESS), fifo)
    assert finished and not errors, "followed a symlink to a FIFO and blocked"
    # A symlink to a file that does hold the address is not the file the daemon wrote either.
    target = tmp_path / "target"
    target.write_text(ADDRESS + "\n")
    to_file = str(tmp_path / "to-file")
    os.symlink(target, to_file)
    remove_address_file(to_file, ADDRESS)
    assert os.path.islink(to_file) and target.read_text() == ADDRESS + "\n"
    assert all("symlink" in line for line in _lines(caplog)) and len(_lines(caplog)) == 2, _lines(caplog)


def test_remove_reads_a_bounded_prefix_only(tmp_path: Any, caplog: Any) -> None:
    caplog.set_level(logging.INFO, logger="loader")
    path = tmp_path / "address"
    # The address, then far more than any address: the old code read it all (and removed it after strip()).
    path.write_bytes((ADDRESS + "\n").encode() + b" " * (64 * MAX_ADDRESS_BYTES))
    remove_address_file(str(path), ADDRESS)
    assert path.exists()
    lines = _lines(caplog)
    assert len(lines) == 1 and f"more than {MAX_ADDRESS_BYTES} bytes" in lines[0], lines


def test_remove_never_reads_a_symlink_to_dev_zero(tmp_path: Any) -> None:
    """In a child whose address space is capped: a read without a bound fails there, not on this machine."""
    path = tmp_path / "address"
    os.symlink("/dev/zero", path)
    code = textwrap.dedent(
        f"""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_AS, ({CHILD_MEMORY_BYTES}, {CHILD_MEMORY_BYTES}))
        from loader.service.address_file import remove_address_file
        remove_address_file(sys.argv[1], {ADDRESS!r})
        """
    )
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=30, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert os.path.islink(path)
    assert "symlink" in done.stderr and len(done.stderr.strip().splitlines()) <= 1, done.stderr


def test_read_refuses_a_fifo_at_once(fifo: str) -> None:
    finished, errors = _finishes(lambda: read_address_file(fifo), fifo)
    assert finished, "read_address_file blocked opening a FIFO"
    assert len(errors) == 1 and isinstance(errors[0], ConfigError), errors
    assert fifo in str(errors[0]) and "FIFO" in str(errors[0])


def test_write_never_follows_a_symlink_planted_at_the_temporary_name(tmp_path: Any) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    path = tmp_path / "address"
    # The old temporary name (.NAME.PID.tmp) was predictable: a symlink there had its target overwritten.
    planted = tmp_path / f".address.{os.getpid()}.tmp"
    os.symlink(victim, planted)
    probe = tmp_path / "probe" / "file"
    probe.parent.mkdir()
    probe.write_text("")  # created as open(path, "w") creates: 0o666 less the umask
    write_address_file(str(path), ADDRESS)
    assert victim.read_text() == "precious\n"
    assert path.read_text() == ADDRESS + "\n" and not path.is_symlink()
    assert sorted(os.listdir(tmp_path)) == sorted(["victim", "address", "probe", planted.name])  # nothing else
    assert (path.stat().st_mode & 0o777) == 0o644 & probe.stat().st_mode


def test_write_to_a_directory_fails_in_one_line_and_leaves_no_temporary_file(tmp_path: Any) -> None:
    path = tmp_path / "af"
    path.mkdir()
    with pytest.raises(ConfigError) as info:
        write_address_file(str(path), ADDRESS)
    message = str(info.value)
    assert str(path) in message and "\n" not in message
    assert os.listdir(tmp_path) == ["af"] and os.listdir(path) == [], os.listdir(tmp_path)


def test_read_follows_a_symlink_to_the_file(tmp_path: Any) -> None:
    # A trainer may keep a stable name for the current daemon's file; only removal refuses to follow one.
    real = tmp_path / "run-5.address"
    write_address_file(str(real), ADDRESS)
    (tmp_path / "current").symlink_to(real)
    assert read_address_file(str(tmp_path / "current")) == ADDRESS
