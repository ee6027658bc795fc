"""The ``loader`` package itself: its public names, its version, ``python -m loader``."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
import types

import pytest

import loader
from loader import errors

SUBPROCESS_TIMEOUT_S = 60

# The public API of ``import loader``: changing it is a decision, made here too.
PUBLIC_NAMES = {
    "__version__",
    "batch",
    "Client",
    "DataFeeder",
    "Field",
    "LoDTensor",
    "Loader",
    "load_config",
    *errors.__all__,
}
PUBLIC_SUBMODULES = {"codec", "config", "device", "errors", "io", "provider", "reader", "recordio", "service"}

# In a fresh interpreter: resolve every name of __all__, then list what the package namespace holds.
_INSPECT = """
import json, sys, types
import loader
imported_zmq_on_import = "zmq" in sys.modules
imported_metadata_on_import = "importlib.metadata" in sys.modules
resolved = {name: type(getattr(loader, name)).__name__ for name in loader.__all__}
public = {name: isinstance(value, types.ModuleType) for name, value in vars(loader).items() if not name.startswith("_")}
print(json.dumps({"zmq": imported_zmq_on_import, "metadata": imported_metadata_on_import, "resolved": resolved, "public": public}))
"""


def _fresh_package() -> dict:
    done = subprocess.run(
        [sys.executable, "-c", _INSPECT], capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S, check=True
    )
    return json.loads(done.stdout)


def test_all_is_exactly_the_public_names_and_submodules():
    assert len(loader.__all__) == len(set(loader.__all__)), "a name is listed twice"
    assert "load_config" in loader.__all__
    assert set(loader.__all__) == PUBLIC_NAMES | PUBLIC_SUBMODULES


def test_every_name_in_all_resolves_in_a_fresh_interpreter():
    fresh = _fresh_package()
    assert set(fresh["resolved"]) == set(loader.__all__)
    for name in PUBLIC_SUBMODULES:
        assert fresh["resolved"][name] == "module", name
    for name in PUBLIC_NAMES - {"__version__"}:
        assert fresh["resolved"][name] != "module", name
    # Nothing public beyond __all__ but the submodules that importing them loaded on the way.
    extra = {name for name, is_module in fresh["public"].items() if name not in loader.__all__}
    assert extra == {name for name in extra if fresh["public"][name]}, f"public names missing from __all__: {extra}"


def test_import_loader_stays_cheap():
    fresh = _fresh_package()
    assert fresh["zmq"] is False
    # The version is looked up on first use: importlib.metadata alone costs every process 20-30 ms.
    assert fresh["metadata"] is False


def test_a_daemon_and_a_worker_import_neither_asyncio_nor_zmq_auth_without_curve():
    # zmq.auth.thread and zmq.utils.monitor import asyncio: about 40 ms at every worker's start, on the path to
    # the first batch (docs/performance.md, "Start-up"). They are imported where CURVE or a peer watch is used.
    code = (
        "import sys; import loader.cli, loader.service.daemon.loop, workers.main; "
        "print(sorted(m for m in ('asyncio', 'zmq.auth', 'zmq.utils.monitor') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S, check=True
    )
    assert done.stdout.strip() == "[]"


def test_every_name_in_all_resolves_here_too():
    for name in loader.__all__:
        value = getattr(loader, name)
        assert (name in PUBLIC_SUBMODULES) == isinstance(value, types.ModuleType), name
    assert loader.load_config is importlib.import_module("loader.config").load_config


def test_unknown_attribute_raises_attribute_error():
    with pytest.raises(AttributeError, match="no_such_name"):
        loader.no_such_name  # noqa: B018 - the attribute access is the test


def test_version_comes_from_the_installed_metadata():
    assert loader.__version__ == importlib.metadata.version("loader-service")


def test_version_without_metadata_says_so():
    # A source tree that was never installed: no metadata, and a version that says so.
    script = (
        "import importlib.metadata as m\n"
        "def not_installed(name):\n"
        "    raise m.PackageNotFoundError(name)\n"
        "m.version = not_installed\n"
        "import loader\n"
        "print(loader.__version__)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S, check=True
    )
    assert done.stdout.strip() == "0+unknown"


def test_python_dash_m_loader_runs_the_cli():
    done = subprocess.run(
        [sys.executable, "-m", "loader", "--version"], capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"loader {loader.__version__}"
