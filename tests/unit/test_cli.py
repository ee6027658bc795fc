"""The ``loader`` command: version, one-line errors with a non-zero exit, serve/status/SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

import pytest

from loader import __version__
from loader.cli import format_status, main
from loader.errors import LoaderError
from loader.examples import datagen
from tests.helpers import free_port, wait_until

CMD_TIMEOUT_S = 60.0
SERVE_READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0


def loader_cmd(*args: str, timeout: float = CMD_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "loader.cli", *args], capture_output=True, text=True, timeout=timeout)


def assert_one_line_error(result: subprocess.CompletedProcess[str], match: str) -> str:
    assert result.returncode != 0, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("loader: error: "), lines[0]
    assert "Traceback" not in result.stderr
    assert match in lines[0], lines[0]
    return lines[0]


def write_config(path, body: str) -> str:
    path.write_text(body)
    return str(path)


def test_version() -> None:
    result = loader_cmd("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"loader {__version__}"


def test_no_command_prints_help_and_fails(capsys) -> None:
    assert main([]) == 2
    assert "serve" in capsys.readouterr().err


def test_missing_config() -> None:
    assert_one_line_error(
        loader_cmd("serve", "/nonexistent/train.toml"), "config file '/nonexistent/train.toml' does not exist"
    )


def test_malformed_config(tmp_path) -> None:
    bad = write_config(tmp_path / "bad.toml", "[source\n")
    assert_one_line_error(loader_cmd("serve", bad), "is not valid TOML")


def test_bad_value_names_key_and_file(tmp_path) -> None:
    bad = write_config(tmp_path / "bad.toml", '[source]\nfiles = ["*.npy"]\n[workers]\ncount = 0\n')
    assert_one_line_error(loader_cmd("serve", bad), f"workers.count must be >= 1, got 0 ({bad})")


def test_unknown_key_suggests(tmp_path) -> None:
    bad = write_config(tmp_path / "bad.toml", '[source]\nfiles = ["*.npy"]\n[pipeline]\nbatchsize = 3\n')
    assert_one_line_error(loader_cmd("check", bad), "did you mean pipeline.batch_size?")


def test_no_matching_files(tmp_path) -> None:
    cfg = write_config(tmp_path / "c.toml", '[source]\nfiles = ["data/*.npy"]\n')
    assert_one_line_error(loader_cmd("serve", cfg), "matched no files")


def test_empty_file_list(tmp_path) -> None:
    (tmp_path / "train.list").write_text("\n# nothing here\n")
    cfg = write_config(tmp_path / "c.toml", '[source]\nlist_file = "train.list"\n')
    assert_one_line_error(loader_cmd("serve", cfg), "lists no files")


def test_missing_listed_file(tmp_path) -> None:
    (tmp_path / "train.list").write_text("gone.npy\n")
    cfg = write_config(tmp_path / "c.toml", '[source]\nlist_file = "train.list"\n')
    assert_one_line_error(loader_cmd("serve", cfg), "names 'gone.npy', which does not exist")


def test_bad_import_in_config(tmp_path) -> None:
    datagen.generate(str(tmp_path), files=1, samples=2)
    cfg = write_config(
        tmp_path / "c.toml", '[source]\nfiles = ["*.npy"]\n[pipeline]\nmappers = ["no_such_mod_xyz:f"]\n'
    )
    assert_one_line_error(loader_cmd("serve", cfg), "cannot import module 'no_such_mod_xyz'")


def test_bad_command_line_override(tmp_path) -> None:
    datagen.generate(str(tmp_path), files=1, samples=2)
    cfg = write_config(tmp_path / "c.toml", '[source]\nfiles = ["*.npy"]\n')
    assert_one_line_error(loader_cmd("serve", cfg, "--workers", "0"), "workers.count must be >= 1, got 0 (--workers 0)")
    assert_one_line_error(loader_cmd("serve", cfg, "--bind", "nowhere"), "service.bind must look like")


def test_check_reports_files(tmp_path) -> None:
    datagen.generate(str(tmp_path), files=3, samples=2)
    cfg = write_config(tmp_path / "c.toml", '[source]\nfiles = ["*.npy"]\n')
    result = loader_cmd("check", cfg)
    assert result.returncode == 0 and "dataset default: 3 files" in result.stdout


def test_check_shows_the_pieces_and_refuses_too_many_as_serve_does(tmp_path) -> None:
    import numpy as np

    np.save(tmp_path / "big.npy", np.zeros(100_001, dtype=np.int8))
    cfg = write_config(tmp_path / "c.toml", '[source]\nfiles = ["big.npy"]\nrecords_per_lease = 25000\n')
    result = loader_cmd("check", cfg, "--no-batch")
    assert result.returncode == 0 and "1 file in 5 leases (source.records_per_lease = 25000)" in result.stdout
    result = loader_cmd("check", cfg, "--no-batch", "--set", "source.records_per_lease=1")
    assert_one_line_error(result, "cuts its files into 100,001 leases, more than 100,000: give at least 2")


def test_check_of_a_broken_file_prints_only_the_error_naming_it(tmp_path) -> None:
    datagen.generate(str(tmp_path), files=2, samples=2)
    (tmp_path / "part-00001.npy").write_bytes(b"")
    cfg = write_config(tmp_path / "c.toml", '[source]\nfiles = ["*.npy"]\n')
    result = loader_cmd("check", cfg)
    assert_one_line_error(result, "part-00001.npy: not a readable .npy array (the file is empty)")
    assert result.stdout == "", "no 'ok' before the error"


def test_gen_data(tmp_path) -> None:
    result = loader_cmd(
        "gen-data", str(tmp_path / "d"), "--format", "npz", "--files", "2", "--samples", "5", "--dim", "3"
    )
    assert result.returncode == 0, result.stderr
    assert sorted(os.listdir(tmp_path / "d")) == ["part-00000.npz", "part-00001.npz"]
    assert_one_line_error(loader_cmd("gen-data", str(tmp_path / "e"), "--files", "0"), "must be >= 1")


def test_unexpected_exception_is_one_line_with_a_hint(monkeypatch, capsys) -> None:
    import loader.examples.datagen

    def explode(*args, **kwargs):
        raise KeyError("boom")

    monkeypatch.setattr(loader.examples.datagen, "generate", explode)
    assert main(["gen-data", "/unused"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["loader: error: unexpected KeyError: 'boom' (run with --debug for the traceback)"]
    with pytest.raises(KeyError):
        main(["gen-data", "/unused", "--debug"])


def test_status_of_nothing_is_one_line() -> None:
    address = f"tcp://127.0.0.1:{free_port()}"
    result = loader_cmd("status", address, "--timeout", "0.5")
    assert_one_line_error(result, f"no loader daemon answered at {address}")


def test_format_status_tables() -> None:
    text = format_status(
        {
            "endpoint": "tcp://127.0.0.1:1",
            "samples_per_s": 1234.5,
            "files": {"total": 4, "leased": 1},
            "workers": [{"id": "w0", "alive": True}, {"id": "w1", "alive": False}],
            "clients": [],
        }
    )
    assert text.splitlines() == [
        "endpoint:      tcp://127.0.0.1:1",
        "samples_per_s: 1,234.5",
        "files:",
        "  total:  4",
        "  leased: 1",
        "workers:",
        "  ID  ALIVE",
        "  w0  True",
        "  w1  False",
        "clients: (none)",
    ]


# -- serve + status + SIGTERM -------------------------------------------------------


def start_serve(cfg: str, address: str, workers: int, **popen: Any) -> subprocess.Popen:
    """``loader serve CFG`` in a child process (the caller stops it)."""
    command = [sys.executable, "-m", "loader.cli", "serve", cfg, "--bind", address, "--workers", str(workers)]
    return subprocess.Popen(command, **popen)


def status_or_none(address: str) -> dict[str, Any] | None:
    """The daemon's status, or None while nothing answers at ``address``."""
    from loader.service.client.client import query_status

    try:
        return query_status(address, timeout_s=0.5)
    except LoaderError:
        return None


@pytest.mark.integration
@pytest.mark.slow
def test_serve_status_and_sigterm(tmp_path) -> None:
    from loader.service.client.client import Client
    from tests.helpers import child_pids, is_alive

    datagen.generate(str(tmp_path), files=3, samples=200, dim=8)
    address = f"tcp://127.0.0.1:{free_port()}"
    cfg = write_config(tmp_path / "c.toml", '[source]\nfiles = ["*.npy"]\n[pipeline]\nbatch_size = 50\n')
    # Children that earlier tests left on purpose (multiprocessing's resource tracker).
    children_before = child_pids()
    daemon = start_serve(cfg, address, 2, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:

        def reachable() -> bool:
            assert daemon.poll() is None, daemon.communicate(timeout=STOP_TIMEOUT_S)
            return status_or_none(address) is not None

        assert wait_until(reachable, timeout_s=SERVE_READY_TIMEOUT_S, interval_s=0.2)
        with Client(address, timeout_s=30.0) as client:
            batches = list(client.epoch())
        assert len(batches) == 12  # 600 samples / 50

        status = loader_cmd("status", address, "--json")
        assert status.returncode == 0, status.stderr
        assert len(json.loads(status.stdout)["workers"]) == 2
        table = loader_cmd("status", address)
        assert table.returncode == 0 and "workers:" in table.stdout

        workers = child_pids(daemon.pid)
        assert len(workers) >= 2
        daemon.send_signal(signal.SIGTERM)
        start = time.monotonic()
        code = daemon.wait(timeout=STOP_TIMEOUT_S)
        assert code == 0, daemon.communicate(timeout=STOP_TIMEOUT_S)
        assert time.monotonic() - start < STOP_TIMEOUT_S
        assert wait_until(lambda: not any(is_alive(pid) for pid in workers), timeout_s=5.0), "orphan workers"
        assert "Traceback" not in daemon.communicate(timeout=STOP_TIMEOUT_S)[1]
        assert not child_pids() - children_before - {daemon.pid}
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait(timeout=STOP_TIMEOUT_S)


def _shm_files_of(pid: int) -> list[str]:
    from loader.service.shm.arena import shm_directory

    return [name for name in os.listdir(shm_directory()) if name.startswith("loader-") and f"-{pid}-" in name]


def _serve_with_one_worker(
    tmp_path, address: str, stderr: Any = subprocess.DEVNULL
) -> tuple[subprocess.Popen, list[int]]:
    """``loader serve`` with one worker, once it is up: the process and its workers' pids."""
    tmp_path.mkdir(exist_ok=True)
    datagen.generate(str(tmp_path), files=2, samples=50, dim=4)
    # Orphaned workers notice the silent daemon after heartbeat_timeout_s and exit.
    cfg = write_config(tmp_path / "c.toml", '[source]\nfiles = ["*.npy"]\n[workers]\nheartbeat_timeout_s = 2.0\n')
    proc = start_serve(cfg, address, 1, stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        assert wait_until(
            lambda: len((status_or_none(address) or {}).get("workers", [])) == 1,
            timeout_s=SERVE_READY_TIMEOUT_S,
            interval_s=0.2,
        )
    except BaseException:
        proc.kill()
        proc.wait(timeout=STOP_TIMEOUT_S)
        raise
    return proc, [w["pid"] for w in status_or_none(address)["workers"]]


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.alone  # another test's daemon starting meanwhile would sweep the killed daemon's files
def test_files_of_a_daemon_killed_with_sigkill_are_removed_by_its_orphaned_workers(tmp_path) -> None:
    from tests.helpers import is_alive

    daemon, workers = _serve_with_one_worker(tmp_path, f"tcp://127.0.0.1:{free_port()}", stderr=subprocess.PIPE)
    try:
        assert _shm_files_of(daemon.pid), "the daemon made no shared-memory files"
        daemon.kill()
        daemon.wait(timeout=STOP_TIMEOUT_S)
        # No daemon starts: the worker, orphaned, removes them (a daemon another test starts may sweep first).
        assert wait_until(lambda: _shm_files_of(daemon.pid) == [], timeout_s=10.0), _shm_files_of(daemon.pid)
        assert wait_until(lambda: not any(is_alive(pid) for pid in workers), timeout_s=10.0), "orphan workers"
        # The worker's stderr is the daemon's: its line says it swept (other daemons log nothing there; a worker
        # that found nothing to remove says nothing).
        said = daemon.communicate(timeout=STOP_TIMEOUT_S)[1].decode()
        assert f"(pid {daemon.pid}: a loader daemon, or a training script's Loader) is gone; removed " in said, said
        assert " removed 0 " not in said, said
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait(timeout=STOP_TIMEOUT_S)


def test_files_of_a_daemon_killed_with_its_workers_are_removed_by_the_next(tmp_path) -> None:
    from tests.helpers import is_alive

    first, workers = _serve_with_one_worker(tmp_path / "a", f"tcp://127.0.0.1:{free_port()}")
    second = None
    try:
        left = _shm_files_of(first.pid)
        assert left, "the daemon made no shared-memory files"
        for pid in workers:
            os.kill(pid, signal.SIGSTOP)  # stopped, it cannot clean up: as if killed with its daemon
        first.kill()
        first.wait(timeout=STOP_TIMEOUT_S)
        for pid in workers:
            os.kill(pid, signal.SIGKILL)
        assert wait_until(lambda: not any(is_alive(pid) for pid in workers), timeout_s=10.0), "workers"
        # SIGKILL: nothing could unlink them (but a daemon another test starts meanwhile may sweep them already).
        assert set(_shm_files_of(first.pid)) <= set(left)
        address = f"tcp://127.0.0.1:{free_port()}"
        cfg = write_config(tmp_path / "c.toml", '[source]\nfiles = ["a/*.npy"]\n')
        second = start_serve(cfg, address, 1, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        assert wait_until(lambda: status_or_none(address) is not None, timeout_s=SERVE_READY_TIMEOUT_S, interval_s=0.2)
        assert _shm_files_of(first.pid) == []
        assert _shm_files_of(second.pid)  # its own are there
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=STOP_TIMEOUT_S) == 0
        # Its "removed N shared-memory file(s)" line is not asserted: any daemon starting on the machine meanwhile
        # (another test's) sweeps them as well, and may be first; test_stale.py checks the sweep on its own.
        second.communicate(timeout=STOP_TIMEOUT_S)
        assert _shm_files_of(second.pid) == []
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(timeout=STOP_TIMEOUT_S)


def test_port_in_use_is_one_line(tmp_path) -> None:
    import socket

    datagen.generate(str(tmp_path), files=1, samples=2)
    cfg = write_config(tmp_path / "c.toml", '[source]\nfiles = ["*.npy"]\n')
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        port = sock.getsockname()[1]
        result = loader_cmd("serve", cfg, "--bind", f"tcp://127.0.0.1:{port}")
    assert_one_line_error(result, str(port))


@pytest.mark.integration
@pytest.mark.slow
def test_a_second_daemon_on_a_live_ipc_path_is_one_line_and_the_first_keeps_serving(tmp_path) -> None:
    # zmq rebinds over the socket file: the second daemon silently cut the first off its own path.
    import shutil
    import tempfile

    datagen.generate(str(tmp_path), files=1, samples=10, dim=2)
    cfg = write_config(tmp_path / "c.toml", '[source]\nfiles = ["*.npy"]\n')
    directory = tempfile.mkdtemp(prefix="ipc-", dir="/tmp")  # a socket path has at most 107 bytes
    address = f"ipc://{directory}/d.sock"
    first = start_serve(cfg, address, 1, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_until(lambda: status_or_none(address) is not None, timeout_s=SERVE_READY_TIMEOUT_S)
        before = status_or_none(address)["uptime_s"]  # type: ignore[index]
        assert_one_line_error(loader_cmd("serve", cfg, "--bind", address, "--workers", "1"), "already in use")
        assert (status_or_none(address) or {}).get("uptime_s", -1) > before  # the first daemon, still there
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=STOP_TIMEOUT_S) == 0
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(timeout=STOP_TIMEOUT_S)
        shutil.rmtree(directory, ignore_errors=True)


@pytest.mark.integration
@pytest.mark.slow
def test_hand_started_worker_joins_and_stops_on_sigterm(tmp_path) -> None:
    from loader.service.client.client import Client

    datagen.generate(str(tmp_path), files=4, samples=100, dim=4)
    address = f"tcp://127.0.0.1:{free_port()}"
    cfg = write_config(tmp_path / "c.toml", '[source]\nfiles = ["*.npy"]\n[pipeline]\nbatch_size = 100\n')
    procs = []
    try:
        daemon = start_serve(cfg, address, 1, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(daemon)
        worker = subprocess.Popen(
            # HOST:PORT, as `loader status` takes it (it was a raw zmq "Invalid argument")
            [
                sys.executable,
                "-m",
                "loader.cli",
                "worker",
                "--connect",
                address.removeprefix("tcp://"),
                "--id",
                "by-hand",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        procs.append(worker)

        def joined() -> bool:
            workers = (status_or_none(address) or {}).get("workers", [])
            return any(w.get("id") == "by-hand" and w.get("connected") for w in workers)

        assert wait_until(joined, timeout_s=SERVE_READY_TIMEOUT_S, interval_s=0.2)
        with Client(address, timeout_s=30.0) as client:
            assert sum(len(b["data"]) for b in client.epoch()) == 400
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=STOP_TIMEOUT_S) == 0
        assert "Traceback" not in worker.communicate(timeout=STOP_TIMEOUT_S)[1]
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=STOP_TIMEOUT_S) == 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=STOP_TIMEOUT_S)


def test_worker_without_a_daemon_is_one_line(port) -> None:
    result = loader_cmd("worker", "--connect", f"tcp://127.0.0.1:{port}", "--connect-timeout", "1")
    assert_one_line_error(result, "no loader daemon answered")


def test_a_worker_stopped_while_no_daemon_answers_says_so_and_exits_cleanly(port) -> None:
    # Before: Ctrl-C while it waited for a daemon ended with "no loader daemon answered ... within 30 s".
    command = ["worker", "--connect", f"tcp://127.0.0.1:{port}", "--connect-timeout", "60", "--log-level", "debug"]
    worker = subprocess.Popen([sys.executable, "-m", "loader.cli", *command], stderr=subprocess.PIPE, text=True)
    try:
        assert worker.stderr is not None
        for line in worker.stderr:  # the signal handlers are in place before it starts connecting
            if "connecting to" in line:
                break
        worker.send_signal(signal.SIGINT)
        _, err = worker.communicate(timeout=STOP_TIMEOUT_S)
        assert worker.returncode == 0, err
        assert "stopped before a loader daemon answered" in err and "loader: error" not in err, err
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(timeout=STOP_TIMEOUT_S)


def test_status_shows_what_peers_named_themselves_with_control_characters_escaped() -> None:
    # A client's job or a worker's id could clear the operator's screen or print a fake line.
    text = format_status(
        {"clients": [{"job": "x\x1b[2J\nworkers: (all healthy)\r", "rank": 0}], "workers": [{"id": "\x1b[31mevil"}]}
    )
    assert "\x1b" not in text and "\r" not in text
    assert "x\\x1b[2J\\nworkers: (all healthy)\\r" in text and "\\x1b[31mevil" in text
    assert not any(line.startswith("workers: (all") for line in text.splitlines())


def test_status_from_a_peer_that_is_not_a_loader_daemon_says_so(port) -> None:
    import threading

    import zmq

    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind(f"tcp://127.0.0.1:{port}")

    def answer_garbage() -> None:
        if router.poll(10_000):
            identity, *_ = router.recv_multipart()
            router.send_multipart([identity, b"\x93not a loader message"])

    thread = threading.Thread(target=answer_garbage, daemon=True)
    thread.start()
    try:
        line = assert_one_line_error(loader_cmd("status", f"127.0.0.1:{port}"), "is not a loader daemon's message")
        assert f"tcp://127.0.0.1:{port} answered with something" in line
    finally:
        thread.join(15)
        router.close()
        context.term()


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (
            'import_path = 5\n[source]\nfiles = ["x"]\n',
            "import_path must be a list of directories, got 5",
        ),  # was a TypeError
        ("[pipeline]\nbatch_size = " + "[" * 2000 + "]" * 2000 + "\n", "nests arrays or tables too deeply"),
    ],
)
def test_a_config_of_the_wrong_shape_is_one_line(tmp_path, body, match) -> None:
    assert_one_line_error(loader_cmd("check", write_config(tmp_path / "c.toml", body), "--no-batch"), match)


def test_a_stop_signal_sent_twice_at_once_is_one_stop_and_a_later_one_insists(monkeypatch) -> None:
    # `timeout` (and some supervisors) send SIGTERM to the daemon and to its process group: it arrives twice.
    import threading

    from loader import cli

    clock = [100.0]
    monkeypatch.setattr(cli.time, "monotonic", lambda: clock[0])
    stop = threading.Event()
    handler = cli._stop_on_signals(stop)
    handler._handle(signal.SIGTERM, None)
    assert stop.is_set()
    clock[0] += 0.2
    handler._handle(signal.SIGTERM, None)  # the group's copy: ignored
    with pytest.raises(KeyboardInterrupt):
        handler._handle(signal.SIGINT, None)  # another signal: the operator insists
    again = cli._stop_on_signals(threading.Event())
    again._handle(signal.SIGINT, None)
    with pytest.raises(KeyboardInterrupt):
        again._handle(signal.SIGINT, None)  # a second Ctrl-C is a keypress: it insists however soon
    clock[0] += 2.0
    with pytest.raises(KeyboardInterrupt):
        handler._handle(signal.SIGTERM, None)  # the same one, later: insists too
