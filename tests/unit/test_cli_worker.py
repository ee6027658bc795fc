"""``loader worker``: --connect takes what ``loader status`` takes; each missing key file from its own variable."""

from __future__ import annotations

import logging
from typing import Any

import pytest

import workers.main
from loader.cli import main as cli_main
from loader.service.transport import auth
from tests.helpers import free_port


@pytest.fixture
def dialled(monkeypatch) -> list[Any]:
    """What ``run_worker`` was asked to connect to (it is not run)."""
    seen: list[Any] = []

    def fake_run_worker(connect: Any, **kwargs: Any) -> int:
        seen.append(connect)
        return 0

    monkeypatch.setattr(workers.main, "run_worker", fake_run_worker)
    monkeypatch.delenv(auth.ENV_PEER_KEY, raising=False)
    monkeypatch.delenv(auth.ENV_DAEMON_PUBLIC_KEY, raising=False)
    return seen


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    directory = tmp_path_factory.mktemp("keys") / "k"
    assert cli_main(["keys", str(directory), "--peer", "w"]) == 0
    return {"peer": str(directory / "peers" / "w.key_secret"), "daemon": str(directory / "daemon.key")}


@pytest.mark.parametrize(
    ("given", "address"),
    [
        ("127.0.0.1:33401", "tcp://127.0.0.1:33401"),
        (":33401", "tcp://127.0.0.1:33401"),
        ("tcp://10.0.0.5:5555", "tcp://10.0.0.5:5555"),
        ("ipc:///tmp/x.sock", "ipc:///tmp/x.sock"),
    ],
)
def test_connect_takes_host_port_like_status(dialled, given, address) -> None:
    assert cli_main(["worker", "--connect", given]) == 0
    assert [str(d) for d in dialled] == [address]


def test_connect_takes_a_config_file(dialled, tmp_path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[source]\nfiles = ["*.npy"]\n[service]\nbind = "tcp://0.0.0.0:34567"\n')
    assert cli_main(["worker", "--connect", str(cfg)]) == 0
    assert [str(d) for d in dialled] == ["tcp://127.0.0.1:34567"]


def test_a_bad_connect_is_one_line(dialled, capsys) -> None:
    assert cli_main(["worker", "--connect", "nonsense"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("loader: error: ") and "not a daemon address" in err and "\n" not in err
    assert dialled == []


def test_host_port_without_a_daemon_names_the_tcp_address(capsys) -> None:
    port = free_port()
    assert cli_main(["worker", "--connect", f"127.0.0.1:{port}", "--connect-timeout", "0.5"]) == 1
    err = capsys.readouterr().err
    assert f"no loader daemon answered at tcp://127.0.0.1:{port}" in err and "Invalid argument" not in err


def test_a_worker_waiting_for_its_daemon_says_so_once(monkeypatch, caplog) -> None:
    # Started by hand before the daemon, it printed nothing until one came up (or its timeout).
    monkeypatch.setattr(workers.main, "WAITING_NOTE_S", 0.2)
    caplog.set_level(logging.INFO, logger="loader.worker")
    port = free_port()
    assert cli_main(["worker", "--connect", f"127.0.0.1:{port}", "--connect-timeout", "1.5"]) == 1
    said = [r.getMessage() for r in caplog.records if "yet; trying for up to" in r.getMessage()]
    assert len(said) == 1 and f"no loader daemon answers at tcp://127.0.0.1:{port} yet" in said[0], said


@pytest.mark.parametrize("flag", ["--key", "--daemon-public-key"])
def test_one_flag_and_the_other_variable_make_a_pair(dialled, keys, monkeypatch, flag) -> None:
    if flag == "--key":
        monkeypatch.setenv(auth.ENV_DAEMON_PUBLIC_KEY, keys["daemon"])
        args = ["--key", keys["peer"]]
    else:
        monkeypatch.setenv(auth.ENV_PEER_KEY, keys["peer"])
        args = ["--daemon-public-key", keys["daemon"]]
    assert cli_main(["worker", "--connect", "127.0.0.1:5555", *args]) == 0
    (dial,) = dialled
    assert isinstance(dial, auth.Dial) and dial.curve == auth.peer_keys(keys["peer"], keys["daemon"])


def test_a_flag_wins_over_its_variable(dialled, keys, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv(auth.ENV_PEER_KEY, str(tmp_path / "absent.key_secret"))
    monkeypatch.setenv(auth.ENV_DAEMON_PUBLIC_KEY, keys["daemon"])
    assert cli_main(["worker", "--connect", "127.0.0.1:5555", "--key", keys["peer"]]) == 0
    assert dialled[0].curve == auth.peer_keys(keys["peer"], keys["daemon"])


def test_only_one_key_anywhere_is_one_line(dialled, keys, capsys) -> None:
    assert cli_main(["worker", "--connect", "127.0.0.1:5555", "--key", keys["peer"]]) == 1
    err = capsys.readouterr().err.strip()
    assert "got only one" in err and auth.ENV_DAEMON_PUBLIC_KEY in err and "\n" not in err
    assert dialled == []
