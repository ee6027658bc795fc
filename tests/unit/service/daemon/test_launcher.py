"""``workers.launcher``: its config checks, and one clear line when the Ray extra is missing (Ray itself is
exercised in tests/integration/test_ray_launcher.py)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from loader.cli import main as cli_main
from loader.config import LoaderConfig
from loader.errors import ConfigError, MissingDependencyError
from loader.service.daemon.launcher import LocalLauncher, make_launcher

ORIGIN = "configs/ray.toml"


def _config(tmp_path, **workers) -> LoaderConfig:
    np.save(tmp_path / "a.npy", np.arange(4))
    mapping = {"source": {"files": [str(tmp_path / "a.npy")]}, "workers": workers}
    return LoaderConfig.from_dict(mapping, origin=ORIGIN)


def test_defaults_keep_local_workers(tmp_path):
    config = _config(tmp_path)
    assert (config.workers.launcher, config.workers.ray_address, config.workers.ray_cpus_per_worker) == (
        "local",
        "auto",
        1.0,
    )
    assert isinstance(make_launcher(config), LocalLauncher)


@pytest.mark.parametrize(
    ("values", "match"),
    [
        ({"launcher": "kubernetes"}, "workers.launcher must be one of 'local', 'ray', got 'kubernetes'"),
        ({"launcher": "ray", "transport": "pipe"}, "workers.transport must be 'zmq' with workers.launcher = 'ray'"),
        ({"ray_cpus_per_worker": 0}, "workers.ray_cpus_per_worker must be > 0"),
        ({"ray_address": ""}, "workers.ray_address must be a non-empty string"),
    ],
)
def test_bad_launcher_values_name_key_and_file(tmp_path, values, match):
    with pytest.raises(ConfigError, match=match) as info:
        _config(tmp_path, **values)
    assert ORIGIN in str(info.value)


def test_fractional_cpus_are_allowed(tmp_path):
    assert _config(tmp_path, launcher="ray", ray_cpus_per_worker=0.25).workers.ray_cpus_per_worker == 0.25


def test_missing_ray_is_one_clear_error_before_anything_is_bound(tmp_path, monkeypatch, capsys):
    from loader.service.daemon.loop import Daemon

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now fails as if it were not installed
    config = _config(tmp_path, launcher="ray")
    with pytest.raises(MissingDependencyError, match=r"pip install '/path/to/loader\[ray\]'") as info:
        Daemon(config)
    assert "workers.launcher = 'ray'" in str(info.value) and ORIGIN in str(info.value)
    assert isinstance(info.value, ImportError)

    # `loader serve` says it in one line, with no traceback.
    path = tmp_path / "ray.toml"
    path.write_text(f'[source]\nfiles = ["{tmp_path / "a.npy"}"]\n[workers]\nlauncher = "ray"\n')
    assert cli_main(["serve", str(path)]) != 0
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1].startswith("loader: error: workers.launcher = 'ray'")
    assert "pip install '/path/to/loader[ray]'" in lines[-1]
    assert not any("Traceback" in line for line in lines)
