"""``loader status`` against a peer that answers garbage: one clear line, bounded time and memory.

The fake daemon is a zmq ROUTER on loopback that answers every message with one crafted status header, as a
daemon's ``Status`` answer is framed (``loader.service.protocol``), whatever it holds.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import msgpack
import pytest
import zmq

from loader.cli import MAX_TABLE_COLUMNS, MAX_TABLE_ROWS, format_status
from loader.cli import main as cli_main
from loader.errors import ServiceUnavailableError
from loader.service.client.ask import MAX_STATUS_BYTES, MAX_STATUS_DEPTH, MAX_STATUS_VALUES, query_status

CMD_TIMEOUT_S = 20.0  # a subprocess's limit: the code before these fixes took 44 s (or forever)
NOT_A_STATUS = "did not answer with a loader daemon's status"


class FakeDaemon:
    """A ROUTER bound to a free loopback port, answering each message with ``{"k": "status", "status": ...}``."""

    def __init__(self, status: Any) -> None:
        self.frame = msgpack.packb({"k": "status", "status": status}, use_bin_type=True)
        self.context = zmq.Context()
        self.router = self.context.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        port = self.router.bind_to_random_port("tcp://127.0.0.1")
        self.address = f"tcp://127.0.0.1:{port}"
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._answer, daemon=True)
        self.thread.start()

    def _answer(self) -> None:
        while not self.stop.is_set():
            if self.router.poll(50):
                identity, *_ = self.router.recv_multipart()
                self.router.send_multipart([identity, self.frame])

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        self.router.close()
        self.context.term()


@pytest.fixture
def fake_daemon() -> Iterator[Callable[[Any], FakeDaemon]]:
    started: list[FakeDaemon] = []

    def start(status: Any) -> FakeDaemon:
        started.append(FakeDaemon(status))
        return started[-1]

    yield start
    for daemon in started:
        daemon.close()


def status_cmd(*args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """``loader status ARGS`` in a child process, and the seconds it took."""
    began = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "loader.cli", "status", *args], capture_output=True, text=True, timeout=CMD_TIMEOUT_S
    )
    return result, time.monotonic() - began


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err[:2000]
    assert lines[0].startswith("loader: error: ") and "unexpected" not in lines[0], lines[0]
    return lines[0]


# -- 1a: a table of rows that each bring their own keys ----------------------------------------------------------
@pytest.mark.parametrize("rows", [10_000, 20_000])
def test_rows_with_a_key_each_print_a_bounded_table_quickly(fake_daemon, rows) -> None:
    # One column per distinct key took 44 s and 1.3 GB for 10,000 rows; 20,000 ran past 30 s.
    daemon = fake_daemon({"endpoint": "tcp://x:1", "workers": [{f"key{i}": i} for i in range(rows)]})
    result, took = status_cmd(daemon.address, "--timeout", "5")
    assert result.returncode == 0, result.stderr
    assert took < 5.0
    lines = result.stdout.splitlines()
    assert len(lines) <= MAX_TABLE_ROWS + 5
    header = lines[lines.index("workers:") + 1]
    assert len(header.split()) == MAX_TABLE_COLUMNS
    more_fields = MAX_TABLE_ROWS - MAX_TABLE_COLUMNS  # the rows shown have a key each
    assert lines[-1] == f"  ... {rows - MAX_TABLE_ROWS} more rows, {more_fields} more fields (--json shows them)"


def test_a_table_shows_the_first_columns_and_counts_the_rest() -> None:
    row = {f"f{i:02}": i for i in range(MAX_TABLE_COLUMNS + 6)}
    lines = format_status({"clients": [row, row]}).splitlines()
    assert lines[1].split() == [f"F{i:02}" for i in range(MAX_TABLE_COLUMNS)]
    assert lines[-1] == "  ... 6 more fields (--json shows them)"
    # A daemon's own rows (clients, its widest) are shown whole.
    client = {
        "session": "s1",
        "dataset": "default",
        "rank": 0,
        "world_size": 1,
        "job": "j",
        "credits": 4,
        "epoch": 0,
        "epoch_files": 4,
        "epoch_files_done": 1,
        "batches_sent": 10,
        "samples_sent": 640,
        "wait_s": 0.01,
        "epoch_waiting": None,
    }
    lines = format_status({"clients": [client] * 3}).splitlines()
    assert len(lines) == 5 and len(lines[1].split()) == len(client)
    assert "more" not in lines[-1]


def test_a_long_list_of_plain_values_is_cut_on_its_line() -> None:
    line = format_status({"files": list(range(MAX_TABLE_ROWS + 4000))}).splitlines()[-1]
    assert line.endswith(f"{MAX_TABLE_ROWS - 1}, ... 4000 more")


# -- 1b: an answer larger than any status ------------------------------------------------------------------------
def test_an_answer_over_the_size_bound_is_one_line_not_an_answer(fake_daemon) -> None:
    # A 200 MB status string was taken whole (640 MB RSS). zmq now drops an answer over the bound unread.
    daemon = fake_daemon({"endpoint": "x" * (MAX_STATUS_BYTES + 4 * 1024 * 1024)})
    result, took = status_cmd(daemon.address, "--timeout", "1")
    assert result.returncode == 1 and result.stdout == ""
    line = one_error_line(result.stderr)
    assert f"no loader daemon answered at {daemon.address} within 1s" in line
    assert f"an answer of more than {MAX_STATUS_BYTES // (1024 * 1024)} MiB is dropped unread" in line
    assert took < 10.0
    # One of a few MiB is still a status.
    daemon = fake_daemon({"endpoint": "x" * (4 * 1024 * 1024)})
    assert query_status(daemon.address, timeout_s=5.0)["endpoint"] == "x" * (4 * 1024 * 1024)


# -- 1c: a status that is not plain data with text keys ----------------------------------------------------------
def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


NOT_STATUSES = {
    "keys that are bytes and integers": {b"raw": 1, 5: 2},
    "a row's key that is bytes": {"workers": [{b"id": "w0"}, {"id": "w1"}]},
    "a nested map's key that is an integer": {"files": {"total": 1, 7: 2}},
    "a bytes value": {"endpoint": b"\x00\x01"},
    "an extension type": {"endpoint": msgpack.ExtType(5, b"x")},
    "nesting past the bound": {"deep": nested(MAX_STATUS_DEPTH + 4)},
    "more values than the bound": {"files": [0] * (MAX_STATUS_VALUES + 1)},
}


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
@pytest.mark.parametrize("status", list(NOT_STATUSES.values()), ids=list(NOT_STATUSES))
def test_a_status_that_is_not_a_daemons_is_refused_in_one_line(fake_daemon, capsys, status, as_json) -> None:
    # {b"raw": 1, 5: 2} was "unexpected TypeError: sequence item 0: expected str instance, bytes found"
    # ('<' not supported between 'int' and 'bytes' with --json).
    daemon = fake_daemon(status)
    code = cli_main(["status", daemon.address, "--timeout", "5", *(["--json"] if as_json else [])])
    out, err = capsys.readouterr()
    assert code == 1 and out == ""
    assert f"the peer at {daemon.address} {NOT_A_STATUS}" in one_error_line(err)


def test_a_status_is_taken_to_its_depth_bound_and_no_deeper(fake_daemon) -> None:
    at_bound = fake_daemon({"deep": nested(MAX_STATUS_DEPTH - 1)})  # the status itself is a level
    assert query_status(at_bound.address, timeout_s=5.0) == {"deep": nested(MAX_STATUS_DEPTH - 1)}
    past = fake_daemon({"deep": nested(MAX_STATUS_DEPTH)})
    with pytest.raises(ServiceUnavailableError, match=f"{NOT_A_STATUS}: maps and lists nested more than"):
        query_status(past.address, timeout_s=5.0)


# -- 1d: NaN and infinity under --json ---------------------------------------------------------------------------
def test_json_of_nan_and_infinity_is_valid_json(fake_daemon, capsys) -> None:
    # They were printed bare, NaN and Infinity, which no JSON reader takes: they are null now.
    status = {"a": math.nan, "b": math.inf, "c": -math.inf, "ok": 1.5, "rows": [{"r": math.nan, "s": [math.inf]}]}
    daemon = fake_daemon(status)
    assert cli_main(["status", daemon.address, "--timeout", "5", "--json"]) == 0

    def not_json(name: str) -> Any:
        raise AssertionError(f"{name} is not JSON")

    shown = json.loads(capsys.readouterr().out, parse_constant=not_json)
    assert shown == {"a": None, "b": None, "c": None, "ok": 1.5, "rows": [{"r": None, "s": [None]}]}
