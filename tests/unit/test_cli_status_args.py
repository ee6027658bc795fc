"""``loader status`` refuses a --watch that would flood the daemon and a --timeout that cannot be waited."""

from __future__ import annotations

import math

import pytest

import loader.service.client.ask as ask_module
from loader.cli import main as cli_main
from loader.errors import ServiceUnavailableError
from loader.service.client.ask import query_status


@pytest.fixture
def queries(monkeypatch) -> list[str]:
    asked: list[str] = []

    def fake_query_status(address: str, timeout_s: float, curve: object = None) -> dict:
        asked.append(address)
        return {}

    monkeypatch.setattr(ask_module, "query_status", fake_query_status)
    return asked


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--watch", "0"], "--watch must be 0.1 to 86400 seconds, got 0"),
        (["--watch", "-1"], "--watch must be 0.1 to 86400 seconds, got -1"),
        (["--watch", "0.01"], "--watch must be 0.1 to 86400 seconds, got 0.01"),
        (["--watch", "nan"], "--watch must be 0.1 to 86400 seconds, got nan"),
        (["--watch", "inf"], "--watch must be 0.1 to 86400 seconds, got inf"),
        (["--watch", "soon"], "--watch takes seconds, got 'soon'"),
        (["--timeout", "0"], "--timeout must be > 0 seconds, got 0"),
        (["--timeout", "-1"], "--timeout must be > 0 seconds, got -1"),
        (["--timeout", "nan"], "--timeout must be > 0 seconds"),
    ],
)
def test_refused_in_one_line_before_any_query(queries, capsys, args, match) -> None:
    assert cli_main(["status", "127.0.0.1:1", *args]) == 1
    err = capsys.readouterr().err.strip()
    assert err == f"loader: error: {err.removeprefix('loader: error: ')}" and "\n" not in err
    assert match in err
    assert queries == []


def test_sane_values_still_query(queries, capsys) -> None:
    assert cli_main(["status", "127.0.0.1:1", "--timeout", "0.5"]) == 0
    assert queries == ["tcp://127.0.0.1:1"]


@pytest.mark.parametrize("address", ["127.0.0.1:1", "tcp://127.0.0.1:1"])
def test_watch_followed_by_the_address_watches_that_address(monkeypatch, capsys, address) -> None:
    # argparse gives an optional --watch value the next word: the address (it was "invalid float").
    asked: list[str] = []

    def unreachable(addr: str, timeout_s: float, curve: object = None) -> dict:
        asked.append(addr)
        raise ServiceUnavailableError(f"no daemon answered at {addr}")

    monkeypatch.setattr(ask_module, "query_status", unreachable)
    assert cli_main(["status", "--watch", address]) == 1
    assert asked == ["tcp://127.0.0.1:1"]
    assert "no daemon answered at tcp://127.0.0.1:1" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("timeout", "match"),
    [
        ("inf", "--timeout must be at most 604800 seconds (a week), got inf"),
        ("1e300", "--timeout must be at most 604800 seconds (a week), got 1e+300"),
        ("604801", "--timeout must be at most 604800 seconds (a week), got 604801"),
    ],
)
def test_a_timeout_that_cannot_be_waited_is_refused_before_any_query(queries, capsys, timeout, match) -> None:
    # inf and 1e300 were "unexpected OverflowError: cannot convert float infinity to integer".
    assert cli_main(["status", "127.0.0.1:1", f"--timeout={timeout}"]) == 1
    assert match in capsys.readouterr().err
    assert queries == []


@pytest.mark.parametrize("timeout_s", [math.inf, 1e300, math.nan])
def test_query_status_refuses_a_timeout_it_cannot_wait(timeout_s) -> None:
    with pytest.raises(ValueError, match="timeout_s must be at most 604800 seconds"):
        query_status("tcp://127.0.0.1:1", timeout_s=timeout_s)
