"""A config path that is not a regular file, a config too large to be one, and values from ``--set`` or the
environment nested too deeply: each is one clear line, and nothing blocks or reads without end."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

import loader.config.sections as sections_module
from loader.cli import main as cli_main
from loader.config import load_config
from loader.config.overrides import MAX_VALUE_DEPTH, parse_value
from loader.errors import ConfigError
from tests.helpers import set_flags

CMD_TIMEOUT_S = 20.0  # a FIFO's open blocked until a writer came: the code before this fix never returned
# The child's address space: a config read without end (/dev/zero) stops at a MemoryError, not at the machine's.
CHILD_MEMORY_BYTES = 1024 * 1024 * 1024
CONFIG = '[source]\nfiles = ["/nonexistent/*.npy"]\n'


def loader_cmd(*args: str) -> subprocess.CompletedProcess[str]:
    """``loader ARGS`` in a child process with its memory limited to ``CHILD_MEMORY_BYTES``."""
    run = (
        "import resource, sys\n"
        f"resource.setrlimit(resource.RLIMIT_AS, ({CHILD_MEMORY_BYTES}, {CHILD_MEMORY_BYTES}))\n"
        "from loader.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    return subprocess.run([sys.executable, "-c", run, *args], capture_output=True, text=True, timeout=CMD_TIMEOUT_S)


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err[:2000]
    assert lines[0].startswith("loader: error: ") and "unexpected" not in lines[0], lines[0]
    return lines[0]


# -- what the path names -----------------------------------------------------------------------------------------
@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
@pytest.mark.parametrize("command", ["check", "serve", "status"])
def test_a_symlink_to_a_device_is_refused_before_it_is_read(tmp_path, command) -> None:
    # It was read until memory ran out ("unexpected MemoryError" under a ulimit).
    path = tmp_path / "train.toml"
    path.symlink_to("/dev/zero")
    result = loader_cmd(command, str(path))
    assert result.returncode == 1
    line = one_error_line(result.stderr)
    assert f"config file '{path}' is not a regular file (a character device)" in line


@pytest.mark.parametrize("command", ["check", "status"])
def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path, command) -> None:
    # `loader check FIFO` waited in open() for a writer that never came.
    path = tmp_path / "train.toml"
    os.mkfifo(path)
    result = loader_cmd(command, str(path))
    assert result.returncode == 1
    assert f"config file '{path}' is not a regular file (a named pipe)" in one_error_line(result.stderr)


def test_a_socket_is_refused_and_a_symlink_to_a_regular_file_read(tmp_path) -> None:
    path = tmp_path / "train.toml"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listening:
        listening.bind(str(path))
        with pytest.raises(
            ConfigError, match=r"is not a regular file \(a socket\): give the path of a loader config \(a TOML file\)"
        ):
            load_config(path)
    real = tmp_path / "real.toml"
    real.write_text('[source]\nfiles = ["data/*.npy"]\n[pipeline]\nbatch_size = 7\n')
    link = tmp_path / "link.toml"
    link.symlink_to(real)
    assert load_config(link).pipeline.batch_size == 7


# -- how much it holds -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bound", [4096, 10_000])
def test_a_config_over_the_size_bound_is_refused_and_one_at_it_is_read(tmp_path, monkeypatch, bound) -> None:
    # A config path read without a bound read /dev/zero until memory ran out; the real bound is 256 MiB.
    monkeypatch.setattr(sections_module, "MAX_CONFIG_BYTES", bound, raising=False)
    at_bound = tmp_path / "at.toml"
    at_bound.write_text(CONFIG + "#" * (bound - len(CONFIG) - 1) + "\n")
    assert os.path.getsize(at_bound) == bound
    assert list(load_config(at_bound).source.files) == ["/nonexistent/*.npy"]
    over = tmp_path / "over.toml"
    over.write_text(CONFIG + "#" * (bound - len(CONFIG)) + "\n")
    with pytest.raises(
        ConfigError, match=f"config file '{over}' is larger than .* MiB: not a loader config \\(a TOML file\\)"
    ):
        load_config(over)


def test_the_size_bound_is_far_above_any_config() -> None:
    assert sections_module.MAX_CONFIG_BYTES >= 256 * 1024 * 1024


# -- values from --set and the environment nested too deeply -----------------------------------------------------
def deep(depth: int) -> str:
    return "[" * depth + "1" + "]" * depth


@pytest.mark.parametrize("depth", [MAX_VALUE_DEPTH + 1, 450, 3000])
def test_a_deeply_nested_set_value_is_one_clear_line(tmp_path, depth) -> None:
    # 3,000 levels (or 450: the parser passed, the check of the value recursed) were "unexpected RecursionError".
    path = tmp_path / "c.toml"
    path.write_text(CONFIG)
    # MAX_VALUE_DEPTH levels are read (the section's check refuses the list), one more is not.
    with pytest.raises(ConfigError, match=r"^pipeline\.batch_size must be an integer"):
        load_config(path, overrides=[f"pipeline.batch_size={deep(MAX_VALUE_DEPTH)}"], environ={})
    value = parse_value(deep(MAX_VALUE_DEPTH))
    for _ in range(MAX_VALUE_DEPTH):
        assert isinstance(value, list) and len(value) == 1
        value = value[0]
    assert value == 1
    with pytest.raises(ConfigError, match=r"^--set pipeline\.batch_size=\[+\.\.\. nests arrays or tables too deeply"):
        load_config(path, overrides=set_flags(f"pipeline.batch_size={deep(depth)}"), environ={})


@pytest.mark.parametrize("depth", [MAX_VALUE_DEPTH + 1, 450, 3000])
def test_a_deeply_nested_environment_value_is_one_clear_line(tmp_path, depth) -> None:
    path = tmp_path / "c.toml"
    path.write_text(CONFIG)
    with pytest.raises(
        ConfigError, match="^environment variable LOADER_PIPELINE__BATCH_SIZE nests arrays or tables too deeply"
    ):
        load_config(path, environ={"LOADER_PIPELINE__BATCH_SIZE": deep(depth)})


@pytest.mark.parametrize("how", ["set", "environment"])
def test_the_cli_says_it_in_one_line(tmp_path, monkeypatch, capsys, how) -> None:
    path = tmp_path / "c.toml"
    path.write_text(CONFIG)
    args = ["check", str(path), "--no-batch"]
    if how == "set":
        args += ["--set", f"pipeline.batch_size={deep(3000)}"]
    else:
        monkeypatch.setenv("LOADER_PIPELINE__BATCH_SIZE", deep(3000))
    assert cli_main(args) == 1
    line = one_error_line(capsys.readouterr().err)
    assert "nests arrays or tables too deeply" in line and len(line) < 300


# -- source.list_file, read the same way ----------------------------------------------------------------------
def test_a_list_file_that_is_a_fifo_or_not_utf8_is_one_line(tmp_path) -> None:
    # A FIFO as source.list_file blocked `loader check` in open(); bytes that are not UTF-8 were an unexpected error.
    fifo = tmp_path / "files.txt"
    os.mkfifo(fifo)
    config = tmp_path / "c.toml"
    config.write_text(f'[source]\nlist_file = "{fifo}"\n')
    result = loader_cmd("check", str(config), "--no-batch")
    assert f"source.list_file '{fifo}' is not a regular file (a named pipe)" in one_error_line(result.stderr)
    os.remove(fifo)
    fifo.write_bytes(b"\xff\xfe not text\n")
    result = loader_cmd("check", str(config), "--no-batch")
    assert f"source.list_file '{fifo}' is not UTF-8 text" in one_error_line(result.stderr)
