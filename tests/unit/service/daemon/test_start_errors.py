"""A daemon that cannot start on its config says which key's value failed, and where that value came from."""

from __future__ import annotations

import importlib.util
import socket

import pytest

from loader.config import load_config
from loader.errors import ConfigError, TransportError
from loader.examples import datagen
from loader.service.daemon.loop import Daemon


def _config(tmp_path, service: str) -> str:
    datagen.generate(str(tmp_path), files=1, samples=4, dim=2)
    path = tmp_path / "c.toml"
    path.write_text(
        f'[source]\nfiles = ["*.npy"]\n[workers]\ncount = 1\n[service]\nbind = "tcp://127.0.0.1:*"\n{service}'
    )
    return str(path)


def _taken_port() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


def test_a_data_port_in_use_is_blamed_on_service_data_port_not_on_the_bind(tmp_path) -> None:
    with _taken_port() as taken:
        port = taken.getsockname()[1]
        cfg = _config(tmp_path, f"data_port = {port}\n")
        with pytest.raises(TransportError) as info:
            Daemon(load_config(cfg), start_workers=False)
    message = str(info.value)
    assert "address already in use" in message and message.endswith(f"(service.data_port from {cfg})"), message


@pytest.mark.skipif(importlib.util.find_spec("prometheus_client") is None, reason="needs the metrics extra")
def test_a_metrics_port_in_use_names_the_config_file(tmp_path) -> None:
    with _taken_port() as taken:
        port = taken.getsockname()[1]
        cfg = _config(tmp_path, f'metrics = "127.0.0.1:{port}"\n')
        with pytest.raises(ConfigError) as info:
            Daemon(load_config(cfg), start_workers=False)
    message = str(info.value)
    assert message.startswith("service.metrics cannot listen") and message.endswith(f"({cfg})"), message
