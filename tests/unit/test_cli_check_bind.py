"""``loader check`` refuses what ``loader serve`` refuses: a bind beyond loopback without authentication."""

from __future__ import annotations

from loader.cli import main as cli_main
from loader.examples import datagen


def _config(tmp_path, service: str = "") -> str:
    datagen.generate(str(tmp_path), files=1, samples=4, dim=2)
    path = tmp_path / "c.toml"
    path.write_text(f'[source]\nfiles = ["*.npy"]\n[service]\n{service}')
    return str(path)


def test_a_bind_beyond_loopback_without_keys_is_refused_by_check(tmp_path, monkeypatch, capsys) -> None:
    cfg = _config(tmp_path)
    monkeypatch.setenv("LOADER_SERVICE__BIND", "tcp://0.0.0.0:5555")
    assert cli_main(["check", cfg, "--no-batch"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("loader: error: ") and "reaches beyond this host" in err and "\n" not in err
    assert "LOADER_SERVICE__BIND" in err  # where the bind came from


def test_insecure_or_loopback_or_keys_pass(tmp_path, capsys) -> None:
    keys = tmp_path / "keys"
    assert cli_main(["keys", str(keys)]) == 0
    for service in (
        'bind = "tcp://127.0.0.1:5555"\n',
        'bind = "tcp://0.0.0.0:5555"\ninsecure = true\n',
        f'bind = "tcp://0.0.0.0:5555"\ndaemon_key = "{keys}/daemon.key_secret"\nauthorized_keys = "{keys}/authorized"\n',
    ):
        capsys.readouterr()
        assert cli_main(["check", _config(tmp_path, service), "--no-batch"]) == 0, service
        assert ": ok," in capsys.readouterr().out


def test_an_unreadable_daemon_key_is_refused_by_check(tmp_path, capsys) -> None:
    keys = tmp_path / "keys"
    assert cli_main(["keys", str(keys)]) == 0
    (keys / "daemon.key_secret").write_text("not a key\n")
    service = f'daemon_key = "{keys}/daemon.key_secret"\nauthorized_keys = "{keys}/authorized"\n'
    capsys.readouterr()
    assert cli_main(["check", _config(tmp_path, service), "--no-batch"]) == 1
    assert "daemon.key_secret" in capsys.readouterr().err


def test_unreadable_key_files_name_their_key_and_the_config_file(tmp_path, capsys) -> None:
    # Before: "cannot read CURVE key file ..." and "authorized keys directory ... does not exist", naming neither.
    keys = tmp_path / "keys"
    assert cli_main(["keys", str(keys)]) == 0
    (tmp_path / "empty").mkdir()
    cases = {
        "service.daemon_key": f'daemon_key = "missing.key_secret"\nauthorized_keys = "{keys}/authorized"\n',
        "service.authorized_keys": f'daemon_key = "{keys}/daemon.key_secret"\nauthorized_keys = "nowhere"\n',
    }
    cases["service.authorized_keys "] = f'daemon_key = "{keys}/daemon.key_secret"\nauthorized_keys = "empty"\n'
    for key, service in cases.items():
        capsys.readouterr()
        cfg = _config(tmp_path, service)
        assert cli_main(["check", cfg, "--no-batch"]) == 1, service
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"loader: error: {key.strip()}: ") and "\n" not in err, err
        assert err.endswith(f"({cfg})"), err
