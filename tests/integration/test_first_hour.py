"""A new user's first hour, as that user meets it: scripts run as subprocesses, configs beside their code."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import loader
from loader.errors import ConfigError
from loader.examples.datagen import generate
from tests.helpers import REPO_ROOT

pytestmark = pytest.mark.integration

SCRIPT_TIMEOUT_S = 90.0
BROKEN_MAPPER_ERROR_S = 20.0


def _run_script(path, cwd, timeout_s: float = SCRIPT_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": REPO_ROOT}  # the library, never the config's directory
    return subprocess.run(
        [sys.executable, str(path)], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s
    )


def _project(tmp_path, mapper_source: str = "def double(sample):\n    x, y = sample\n    return x * 2, y\n"):
    """A data directory, a config with a mapper module beside it, and a script in another directory."""
    generate(str(tmp_path / "data"), format="npy", files=3, samples=50, dim=4)
    conf_dir = tmp_path / "conf"
    conf_dir.mkdir()
    (conf_dir / "my_maps.py").write_text(mapper_source)
    (conf_dir / "train.toml").write_text(
        textwrap.dedent(
            """\
            [source]
            files = ["../data/part-*.npy"]
            [pipeline]
            batch_size = 10
            mappers = ["my_maps:double"]
            [workers]
            count = 2
            """
        )
    )
    (tmp_path / "scripts").mkdir()
    return conf_dir / "train.toml"


def test_a_script_without_a_main_guard_finishes_and_runs_once(tmp_path):
    config = _project(tmp_path)
    marker = tmp_path / "imports.txt"
    script = tmp_path / "scripts" / "train.py"
    script.write_text(
        textwrap.dedent(
            f"""\
            import os
            import loader
            with open({str(marker)!r}, "a") as fh:  # every interpreter that runs this script adds a line
                fh.write(str(os.getpid()) + "\\n")
            with loader.Loader(loader.load_config({str(config)!r})) as local:
                labels = [int(v) for batch in local.epoch() for v in batch["label"]]
            print("samples", len(labels))
            """
        )
    )
    done = _run_script(script, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "samples 150" in done.stdout
    assert len(marker.read_text().split()) == 1, "a worker imported the training script"


def test_a_workers_module_of_the_users_beside_the_script_does_not_shadow_ours(tmp_path):
    config = _project(tmp_path)
    (tmp_path / "scripts" / "workers.py").write_text("GPUS_PER_NODE = 8  # the user's own module\n")
    script = tmp_path / "scripts" / "train.py"
    script.write_text(
        textwrap.dedent(
            f"""\
            import loader
            import workers  # the user's, in the training script
            assert workers.GPUS_PER_NODE == 8
            with loader.Loader(loader.load_config({str(config)!r})) as local:
                print("samples", sum(len(batch["label"]) for batch in local.epoch()))
            """
        )
    )
    done = _run_script(script, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "samples 150" in done.stdout


def test_mapper_beside_the_config_is_found_and_labels_travel_with_npy(tmp_path):
    config = loader.load_config(_project(tmp_path))
    with loader.Loader(config) as local:
        batches = list(local.epoch())
    features = np.concatenate([b["data"] for b in batches])
    labels = np.concatenate([b["label"] for b in batches])
    expected = {
        tuple(row) + (int(label),)
        for i in range(3)
        for row, label in zip(
            np.load(tmp_path / "data" / f"part-{i:05d}.npy") * 2, np.load(tmp_path / "data" / f"part-{i:05d}.label.npy")
        )
    }
    assert {tuple(row) + (int(label),) for row, label in zip(features, labels)} == expected
    assert len(labels) == 150


def test_a_missing_mapper_module_names_the_module_the_path_and_the_fix(tmp_path):
    config_path = _project(tmp_path)
    config_path.write_text(config_path.read_text().replace("my_maps:double", "no_such_maps:double"))
    with pytest.raises(ConfigError) as caught:
        loader.Loader(loader.load_config(config_path))
    message = str(caught.value)
    assert "no_such_maps" in message and str(config_path.parent) in message and "PYTHONPATH" in message


def test_a_broken_mapper_module_fails_the_script_with_its_error(tmp_path):
    config = _project(tmp_path, mapper_source="raise RuntimeError('typo in my mapper module')\n")
    script = tmp_path / "scripts" / "train.py"
    script.write_text(f"import loader\nloader.Loader(loader.load_config({str(config)!r}))\n")
    # The import fails in this process, before any worker starts: the error comes within seconds (a
    # generous bound for a loaded 2-core machine; a script that hung or retried workers would not).
    done = _run_script(script, cwd=tmp_path, timeout_s=BROKEN_MAPPER_ERROR_S)
    assert done.returncode != 0
    assert "typo in my mapper module" in done.stderr and "my_maps" in done.stderr


@pytest.mark.parametrize(
    "name, source, says",
    [
        ("raising_maps", "raise RuntimeError('typo in my mapper module')\n", "RuntimeError: typo in my mapper module"),
        ("needy_maps", "import surely_no_such_dependency_xyz\n", "install surely_no_such_dependency_xyz"),
        ("unparsable_maps", "def double(:\n", "SyntaxError"),
    ],
)
def test_a_broken_mapper_module_names_its_file_the_path_searched_and_the_fix(tmp_path, name, source, says):
    # A module found but failing is an import failure too: the error names the file, the directories
    # searched and a fix, as for a missing one. A name of its own per case: this process caches modules.
    config_path = _project(tmp_path)
    (config_path.parent / f"{name}.py").write_text(source)
    config_path.write_text(config_path.read_text().replace("my_maps:double", f"{name}:double"))
    with pytest.raises(ConfigError) as caught:
        loader.Loader(loader.load_config(config_path))
    message = str(caught.value)
    assert says in message and name in message and "fix:" in message
    assert str(config_path.parent / f"{name}.py") in message
    assert f"import_path: {config_path.parent}" in message or f", {config_path.parent}" in message


def test_a_mapper_in_a_broken_package_names_the_module(tmp_path):
    # Before the module itself is imported, the check for the training script looks it up, which runs
    # the package's __init__: its error escaped as itself, naming neither the module nor the config key.
    config_path = _project(tmp_path)
    package = config_path.parent / "broken_pkg_of_maps"
    package.mkdir()
    (package / "__init__.py").write_text("raise RuntimeError('typo in my package')\n")
    (package / "maps.py").write_text("def double(sample):\n    return sample\n")
    config_path.write_text(config_path.read_text().replace("my_maps:double", "broken_pkg_of_maps.maps:double"))
    with pytest.raises(ConfigError) as caught:
        loader.Loader(loader.load_config(config_path))
    message = str(caught.value)
    assert "pipeline.mappers" in message and "broken_pkg_of_maps.maps" in message
    assert "typo in my package" in message and str(package) in message and "fix:" in message


def _arena_files(pid: int) -> set[str]:
    """Shared-memory arena files made by the daemon in process ``pid``."""
    from loader.service.shm.arena import shm_directory
    from loader.service.shm.stale import parse_name

    return {name for name in os.listdir(shm_directory()) if (parse_name(name) or (0, 0))[1] == pid}


def test_an_unclosed_loader_releases_its_workers_and_shared_memory_when_collected(tmp_path):
    import gc

    from tests.helpers import child_pids, wait_until

    config = loader.load_config(_project(tmp_path))
    local = loader.Loader(config)
    next(iter(local.epoch()))
    assert child_pids()
    assert _arena_files(os.getpid()), "the workers' arenas exist while the Loader lives"
    del local
    gc.collect()
    assert wait_until(lambda: not (child_pids() - _trackers()), timeout_s=15.0)
    assert not _arena_files(os.getpid())


@pytest.mark.alone  # another test's daemon starting meanwhile could sweep the files the script left
def test_an_unclosed_loader_leaves_nothing_when_the_script_exits(tmp_path):
    config = _project(tmp_path)
    script = tmp_path / "scripts" / "train.py"
    script.write_text(
        textwrap.dedent(
            f"""\
            import os
            import loader
            local = loader.Loader(loader.load_config({str(config)!r}))
            next(iter(local.epoch()))
            print("pid", os.getpid(), "arenas", len(os.listdir("/dev/shm")))
            """  # and exits, the Loader still open
        )
    )
    done = _run_script(script, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    pid = int(done.stdout.split()[1])
    assert not _arena_files(pid), "arena files outlived the interpreter"


def _trackers() -> set[int]:
    """multiprocessing's resource tracker: a child of the test process that lives for the session."""
    from tests.helpers import child_pids

    found = set()
    for pid in child_pids():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if b"resource_tracker" in fh.read():
                    found.add(pid)
        except OSError:
            pass
    return found


def test_len_of_an_epoch_is_its_number_of_batches(tmp_path):
    from loader.config import LoaderConfig

    generate(str(tmp_path / "data"), format="npy", files=3, samples=25, dim=2)

    def config(**pipeline):
        return LoaderConfig.from_dict(
            {
                "source": {"files": [str(tmp_path / "data" / "part-*.npy")]},
                "pipeline": {"batch_size": 10, **pipeline},
                "workers": {"count": 1},
            }
        )

    for pipeline in ({}, {"drop_last": True}, {"shuffle_buffer": 30, "seed": 1}):
        with loader.Loader(config(**pipeline)) as local:
            epoch = local.epoch()
            expected = len(epoch)
            assert len(list(epoch)) == expected


def test_len_of_an_epoch_per_rank_and_when_unknown(tmp_path):
    from loader.config import LoaderConfig
    from tests.integration.conftest import running_daemon

    generate(str(tmp_path / "data"), format="npy", files=3, samples=25, dim=2)
    config = LoaderConfig.from_dict(
        {
            "source": {"files": [str(tmp_path / "data" / "part-*.npy")]},
            "pipeline": {"batch_size": 10},
            "workers": {"count": 1},
            "service": {"bind": "tcp://127.0.0.1:*"},
        }
    )
    with running_daemon(config) as daemon:
        for rank in (0, 1):
            with loader.Client(daemon.endpoint, rank=rank, world_size=2) as client:
                epoch = client.epoch()
                assert len(epoch) == len(list(epoch))
    generate(str(tmp_path / "rio"), format="recordio", files=1, samples=5, dim=2)
    config = LoaderConfig.from_dict({"source": {"files": [str(tmp_path / "rio" / "*")]}, "workers": {"count": 1}})
    with loader.Loader(config) as local:
        epoch = local.epoch()
        with pytest.raises(TypeError, match="not known ahead"):
            len(epoch)
        assert sum(len(b["0"]) if "0" in b else len(next(iter(b.values()))) for b in epoch) == 5


def _daemon_config(tmp_path, **workers):
    from loader.config import LoaderConfig

    generate(str(tmp_path / "data"), format="npy", files=2, samples=20, dim=2)
    return LoaderConfig.from_dict(
        {
            "source": {"files": [str(tmp_path / "data" / "part-*.npy")]},
            "workers": {"count": 1, **workers},
            "service": {"bind": "tcp://127.0.0.1:*"},
        }
    )


def _loader_cli(*args: str, **popen) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": REPO_ROOT}
    return subprocess.Popen([sys.executable, "-m", "loader.cli", *args], env=env, **popen)


def test_status_watch_refreshes_in_place_and_a_closed_pipe_ends_it_quietly(tmp_path):
    from tests.integration.conftest import running_daemon

    with running_daemon(_daemon_config(tmp_path)) as daemon:
        host_port = daemon.endpoint[len("tcp://") :]
        proc = _loader_cli("status", host_port, "--watch", "0.1", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            seen = b""
            while seen.count(b"\x1b[H\x1b[J") < 2:  # two frames, each homing the cursor and clearing
                chunk = proc.stdout.read1(65536)
                assert chunk, proc.stderr.read().decode()
                seen += chunk
            assert b"workers:" in seen
            proc.stdout.close()  # like `| head`: the reader goes away
            assert proc.wait(timeout=SCRIPT_TIMEOUT_S) == 0
            err = proc.stderr.read().decode()
            assert "Broken pipe" not in err and "Traceback" not in err, err
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=SCRIPT_TIMEOUT_S)


def test_status_json_into_a_pipe_closed_at_once_ends_quietly(tmp_path):
    from tests.integration.conftest import running_daemon

    with running_daemon(_daemon_config(tmp_path)) as daemon:
        read, write = os.pipe()
        os.close(read)  # like `| head -0`: nobody reads
        try:
            proc = _loader_cli("status", daemon.endpoint, "--json", stdout=write, stderr=subprocess.PIPE)
        finally:
            os.close(write)
        _, err = proc.communicate(timeout=SCRIPT_TIMEOUT_S)
        assert proc.returncode == 0, err
        assert b"Broken pipe" not in err and b"Traceback" not in err, err


def test_a_hand_started_worker_says_where_it_connected_and_the_daemon_logs_it(tmp_path, caplog):
    import logging
    import signal

    from tests.helpers import wait_until
    from tests.integration.conftest import connected_workers, running_daemon

    caplog.set_level(logging.INFO, logger="loader.daemon")
    with running_daemon(_daemon_config(tmp_path), start_workers=False) as daemon:
        proc = _loader_cli("worker", "--connect", daemon.endpoint, stderr=subprocess.PIPE, text=True)
        try:
            line = proc.stderr.readline()
            while line and "connected to" not in line:
                line = proc.stderr.readline()
            assert daemon.endpoint in line
            assert wait_until(lambda: connected_workers(daemon.endpoint) == 1)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=SCRIPT_TIMEOUT_S) == 0
            assert wait_until(lambda: "left" in caplog.text)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=SCRIPT_TIMEOUT_S)
    assert "joined" in caplog.text


def test_a_client_given_a_config_is_told_when_its_address_has_another_configs_daemon(tmp_path, caplog):
    """Two projects' configs on the default port: a script given its own config read the other's data, no word
    (`loader status CONFIG` said so; a Client did not)."""
    import logging

    from loader.config import load_config
    from tests.helpers import free_port
    from tests.integration.conftest import running_daemon

    generate(str(tmp_path / "data"), format="npy", files=2, samples=20, dim=4)
    port = free_port()
    text = f'[source]\nfiles = ["data/*.npy"]\n[service]\nbind = "tcp://127.0.0.1:{port}"\n[workers]\ncount = 1\n'
    (tmp_path / "served.toml").write_text(text)
    (tmp_path / "other.toml").write_text(text)
    caplog.set_level(logging.WARNING, logger="loader.client")
    with running_daemon(load_config(str(tmp_path / "served.toml"))):
        with loader.Client(str(tmp_path / "served.toml"), timeout_s=10):
            assert not [r for r in caplog.records if r.name == "loader.client"], "its own config: no word"
        with loader.Client(str(tmp_path / "other.toml"), timeout_s=10):
            (line,) = [r.getMessage() for r in caplog.records if r.name == "loader.client"]
    assert line == (
        f"the daemon at tcp://127.0.0.1:{port} serves {tmp_path / 'served.toml'}, not {tmp_path / 'other.toml'}: "
        "another config's daemon listens at its address"
    )
