"""The operators' command line: --set and LOADER_ variables with their sources, --address-file."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import pytest

from loader.examples import datagen
from loader.service.address_file import read_address_file, remove_address_file, write_address_file
from tests.helpers import wait_until
from tests.unit.test_cli import STOP_TIMEOUT_S, assert_one_line_error, loader_cmd, write_config


def run_env(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loader.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )


@pytest.fixture
def cfg(tmp_path) -> str:
    datagen.generate(str(tmp_path), files=2, samples=4)
    return write_config(tmp_path / "c.toml", '[source]\nfiles = ["*.npy"]\n[pipeline]\nbatch_size = 8\n')


def test_check_shows_each_value_and_its_source(cfg) -> None:
    result = run_env("check", cfg, "--set", "pipeline.batch_size=64", LOADER_WORKERS__COUNT="3")
    assert result.returncode == 0, result.stderr
    assert "ok, 3 workers" in result.stdout and "dataset default: 2 files" in result.stdout
    lines = result.stdout.splitlines()
    settings = lines[lines.index("settings (value, and where it came from):") + 1 :]
    rows = {line.split()[0]: line.split(None, 2)[1:] for line in settings}
    assert rows["pipeline.batch_size"] == ["64", "--set pipeline.batch_size=64"]
    assert rows["workers.count"] == ["3", "environment variable LOADER_WORKERS__COUNT"]
    assert rows["pipeline.seed"] == ["None", "default"]
    assert rows["source.files"][1] == cfg


def test_bad_overrides_are_one_line_naming_the_variable_or_flag(cfg) -> None:
    assert_one_line_error(
        run_env("check", cfg, LOADER_PIPELINE__BATCH_SIZE="0"),
        "got 0 (environment variable LOADER_PIPELINE__BATCH_SIZE)",
    )
    assert_one_line_error(loader_cmd("serve", cfg, "--set", "workers.cont=2"), "did you mean workers.count?")
    assert_one_line_error(loader_cmd("check", cfg, "--set", "batch_size"), "--set 'batch_size' must look like")


def test_address_file_helpers(tmp_path) -> None:
    path = str(tmp_path / "addr")
    write_address_file(path, "tcp://127.0.0.1:4000")
    assert read_address_file(path) == "tcp://127.0.0.1:4000"
    remove_address_file(path, "tcp://127.0.0.1:4001")  # another daemon's now: left alone
    assert os.path.exists(path)
    remove_address_file(path, "tcp://127.0.0.1:4000")
    assert not os.path.exists(path)
    remove_address_file(path, "tcp://127.0.0.1:4000")  # already gone: no error
    assert os.listdir(tmp_path) == []  # no temporary file left behind
    with open(path, "wb") as fh:  # rewritten by something else with bytes that are not UTF-8
        fh.write(b"\xff\xfe tcp://127.0.0.1:4000")
    remove_address_file(path, "tcp://127.0.0.1:4000")  # raised UnicodeDecodeError as `loader serve` stopped
    assert os.path.exists(path)


@pytest.mark.integration
def test_serve_writes_the_bound_address_and_removes_it_on_exit(cfg, tmp_path) -> None:
    from loader.service.client.client import Client

    path = tmp_path / "run" / "address"
    path.parent.mkdir()
    command = [sys.executable, "-m", "loader.cli", "serve", cfg, "--bind", "tcp://127.0.0.1:*", "--workers", "1"]
    daemon = subprocess.Popen([*command, "--address-file", str(path)], stderr=subprocess.PIPE, text=True)
    try:
        assert wait_until(path.exists, timeout_s=30, interval_s=0.1), "no address file"
        address = read_address_file(str(path))
        assert address.startswith("tcp://127.0.0.1:") and not address.endswith("*")
        os.environ["LOADER_ADDRESS"] = address
        try:
            with Client.from_env(timeout_s=30) as client:
                assert len(list(client.epoch())) == 1  # 8 samples, batch_size 8
                assert client.stats()["samples_received"] == 8
        finally:
            del os.environ["LOADER_ADDRESS"]
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=STOP_TIMEOUT_S) == 0
        assert not path.exists()
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait(timeout=STOP_TIMEOUT_S)


def test_ctrl_c_of_serve_stops_daemon_and_workers_without_a_traceback(cfg, tmp_path) -> None:
    """A terminal's Ctrl-C signals the whole process group: workers leave it to the daemon to stop them."""
    from loader.service.client.client import Client

    path = tmp_path / "address"
    command = [sys.executable, "-m", "loader.cli", "serve", cfg, "--bind", "tcp://127.0.0.1:*", "--workers", "2"]
    daemon = subprocess.Popen(
        [*command, "--address-file", str(path)], stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert wait_until(path.exists, timeout_s=30, interval_s=0.1), "no address file"
        with Client(read_address_file(str(path)), timeout_s=30) as client:
            assert len(list(client.epoch())) == 1  # the workers are up and have read
        os.killpg(daemon.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        _, err = daemon.communicate(timeout=STOP_TIMEOUT_S)
        assert daemon.returncode == 0, err
        assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    finally:
        if daemon.poll() is None:
            os.killpg(daemon.pid, signal.SIGKILL)
            daemon.wait(timeout=STOP_TIMEOUT_S)


def test_a_bind_given_on_the_command_line_is_blamed_there_not_on_the_config(cfg) -> None:
    # Before: "(train.toml)" for a value the file never held.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        line = assert_one_line_error(
            loader_cmd("serve", cfg, "--set", f"service.bind=tcp://127.0.0.1:{port}"), "address already in use"
        )
        assert line.endswith(f"(service.bind from --set service.bind=tcp://127.0.0.1:{port})"), line
    line = assert_one_line_error(loader_cmd("serve", cfg, "--bind", "tcp://0.0.0.0:5603"), "no authentication")
    assert line.endswith("(--bind tcp://0.0.0.0:5603)"), line


def test_a_mapper_given_with_set_that_does_not_import_is_blamed_on_the_set(cfg) -> None:
    line = assert_one_line_error(
        loader_cmd("check", cfg, "--set", 'pipeline.mappers=["surely_no_such_module:f"]'), "cannot import module"
    )
    assert line.endswith("""(--set pipeline.mappers=["surely_no_such_module:f"])"""), line


def test_status_by_a_config_says_when_the_daemon_at_its_address_serves_another(tmp_path) -> None:
    from tests.helpers import free_port
    from tests.unit.test_cli import SERVE_READY_TIMEOUT_S, status_or_none

    datagen.generate(str(tmp_path), files=1, samples=4)
    address = f"tcp://127.0.0.1:{free_port()}"
    body = f'[source]\nfiles = ["*.npy"]\n[service]\nbind = "{address}"\n'
    serving, other = write_config(tmp_path / "a.toml", body), write_config(tmp_path / "b.toml", body)
    daemon = subprocess.Popen([sys.executable, "-m", "loader.cli", "serve", serving], stderr=subprocess.DEVNULL)
    try:
        assert wait_until(lambda: status_or_none(address) is not None, timeout_s=SERVE_READY_TIMEOUT_S, interval_s=0.2)
        assert "note" not in loader_cmd("status", serving).stderr
        result = loader_cmd("status", other)  # before: b.toml's status, said of a.toml's daemon without a word
        assert result.returncode == 0 and f"serves {tmp_path / 'a.toml'}, not {other}" in result.stderr
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=STOP_TIMEOUT_S)
