"""``loader keys DIR`` run again keeps existing pairs (a new daemon pair locks out every peer); --force replaces."""

from __future__ import annotations

import pytest

from loader.cli import main as cli_main


def _read(path) -> str:
    return path.read_text()


def test_a_second_run_keeps_the_daemon_pair_and_adds_a_peer(tmp_path, capsys) -> None:
    keys = tmp_path / "keys"
    assert cli_main(["keys", str(keys)]) == 0
    first = capsys.readouterr().out
    assert "daemon created" in first and "worker created" in first and "client created" in first
    daemon_secret, worker_secret = _read(keys / "daemon.key_secret"), _read(keys / "peers" / "worker.key_secret")
    admitted = _read(keys / "authorized" / "worker.key")

    assert cli_main(["keys", str(keys), "--peer", "newhost"]) == 0
    out = capsys.readouterr().out
    assert "daemon kept" in out and "newhost created" in out
    assert _read(keys / "daemon.key_secret") == daemon_secret
    assert (keys / "peers" / "newhost.key_secret").exists() and (keys / "authorized" / "newhost.key").exists()

    assert cli_main(["keys", str(keys)]) == 0  # the default peers again: kept, not replaced
    out = capsys.readouterr().out
    assert "worker kept" in out and "client kept" in out
    assert _read(keys / "peers" / "worker.key_secret") == worker_secret
    assert _read(keys / "authorized" / "worker.key") == admitted
    assert _read(keys / "daemon.key_secret") == daemon_secret


def test_a_peer_whose_secret_moved_away_is_kept(tmp_path, capsys) -> None:
    keys = tmp_path / "keys"
    assert cli_main(["keys", str(keys), "--peer", "w"]) == 0
    admitted = _read(keys / "authorized" / "w.key")
    (keys / "peers" / "w.key_secret").unlink()  # handed to the worker's host
    (keys / "peers" / "w.key").unlink()
    capsys.readouterr()
    assert cli_main(["keys", str(keys), "--peer", "w"]) == 0
    assert "w kept" in capsys.readouterr().out
    assert _read(keys / "authorized" / "w.key") == admitted
    assert not (keys / "peers" / "w.key_secret").exists()


def test_force_replaces_and_says_so(tmp_path, capsys) -> None:
    keys = tmp_path / "keys"
    assert cli_main(["keys", str(keys), "--peer", "w"]) == 0
    daemon_secret, peer_secret = _read(keys / "daemon.key_secret"), _read(keys / "peers" / "w.key_secret")
    capsys.readouterr()
    assert cli_main(["keys", str(keys), "--peer", "w", "--force"]) == 0
    out = capsys.readouterr().out
    assert "daemon replaced" in out and "w replaced" in out
    assert _read(keys / "daemon.key_secret") != daemon_secret
    assert _read(keys / "peers" / "w.key_secret") != peer_secret
    assert _read(keys / "authorized" / "w.key") == _read(keys / "peers" / "w.key")


def test_half_a_daemon_pair_is_one_line(tmp_path, capsys) -> None:
    keys = tmp_path / "keys"
    assert cli_main(["keys", str(keys)]) == 0
    (keys / "daemon.key").unlink()
    capsys.readouterr()
    assert cli_main(["keys", str(keys)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("loader: error: ") and "daemon.key is missing" in err and "\n" not in err


@pytest.mark.parametrize("flag", [[], ["--force"]])
def test_key_files_stay_owner_only(tmp_path, flag) -> None:
    keys = tmp_path / "keys"
    assert cli_main(["keys", str(keys)]) == 0
    assert cli_main(["keys", str(keys), *flag]) == 0
    for path in (keys / "daemon.key_secret", keys / "peers" / "worker.key_secret"):
        assert path.stat().st_mode & 0o077 == 0
