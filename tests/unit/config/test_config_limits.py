"""Questionable values are refused with the key, the value and the file; user code errors name the file."""

from __future__ import annotations

import math

import pytest

from loader.config import LoaderConfig, load_config
from loader.errors import ConfigError, TransportError

ORIGIN = "configs/limits.toml"


def _config(tmp_path, **sections):
    (tmp_path / "a.npy").write_bytes(b"")
    mapping = {"source": {"files": [str(tmp_path / "a.npy")]}, **sections}
    return LoaderConfig.from_dict(mapping, origin=ORIGIN)


@pytest.mark.parametrize(
    ("section", "values", "key"),
    [
        ("workers", {"count": 100000}, "workers.count must be <="),
        ("pipeline", {"batch_size": 2**63 - 1}, "pipeline.batch_size must be <="),
        ("pipeline", {"shuffle_buffer": 2**40}, "pipeline.shuffle_buffer must be <="),
        ("workers", {"heartbeat_timeout_s": math.inf}, "workers.heartbeat_timeout_s must be a finite number"),
        ("workers", {"heartbeat_interval_s": 1e-6}, "workers.heartbeat_interval_s must be >= 0.01"),
        ("workers", {"progress_timeout_s": math.nan}, "workers.progress_timeout_s must be a finite number"),
        ("client", {"timeout_s": math.inf}, "client.timeout_s must be a finite number"),
        ("workers", {"shm_arena_mib": 10**8}, "workers.shm_arena_mib must be <="),
        ("workers", {"samples_per_message": 2**40}, "workers.samples_per_message must be <="),
        ("pipeline", {"seed": 2**64}, "pipeline.seed must be <="),
        ("pipeline", {"seed": 2**62}, "pipeline.seed must be <="),  # a lease carries it: below protocol.MAX_INT
        ("client", {"prefetch": 64}, "client.prefetch must be <= 32"),
        # Timeouts a healthy peer cannot meet: 1e-9 took every worker for hung and failed the epoch in 0.4 s.
        ("workers", {"progress_timeout_s": 1e-9}, r"workers.progress_timeout_s must be >= 0.5, got 1e-09"),
        ("workers", {"heartbeat_timeout_s": 0.2, "heartbeat_interval_s": 0.1}, "heartbeat_timeout_s must be >= 0.5"),
        ("workers", {"ray_connect_timeout_s": 0.001}, "workers.ray_connect_timeout_s must be >= 0.5, got 0.001"),
        ("client", {"timeout_s": 0.01}, "client.timeout_s must be >= 0.5, got 0.01"),
        ("client", {"progress_timeout_s": 0.1}, "client.progress_timeout_s must be >= 0.5, got 0.1"),
    ],
)
def test_questionable_values_are_refused_naming_key_and_file(tmp_path, section, values, key):
    with pytest.raises(ConfigError, match=key) as info:
        _config(tmp_path, **{section: values})
    assert ORIGIN in str(info.value)


def test_the_largest_seed_fits_a_lease():
    from loader.config.sections import MAX_SEED
    from loader.service import protocol as P

    assert P.decode(P.encode(P.Lease(lease=0, stream=0, epoch=0, file=0, path="/f", seed=MAX_SEED)))[0].seed == MAX_SEED


def test_a_mapper_that_is_not_callable_is_refused_at_check_imports(tmp_path):
    config = _config(tmp_path, pipeline={"mappers": ["tests.helpers:REPO_ROOT"]})
    with pytest.raises(ConfigError, match=r"pipeline.mappers .*must name a function") as info:
        config.check_imports()
    assert ORIGIN in str(info.value)


def test_a_provider_without_its_decorator_is_refused_at_check_imports(tmp_path):
    """A plain process(settings, filename) let `loader serve` start, then failed every epoch in the workers."""
    config = _config(tmp_path, source={"files": [str(tmp_path / "a.npy")], "provider": "tests.helpers:identity_mapper"})
    with pytest.raises(ConfigError, match=r"source.provider .* is not a @loader.provider.provider function") as info:
        config.check_imports()
    assert ORIGIN in str(info.value) and "@provider(input_types=...)" in str(info.value)


def test_import_errors_name_the_file(tmp_path):
    config = _config(tmp_path, pipeline={"mappers": ["no_such_module_here:f"]})
    with pytest.raises(ConfigError, match="no_such_module_here") as info:
        config.check_imports()
    assert ORIGIN in str(info.value)
    reader = _config(tmp_path, source={"files": [str(tmp_path / "a.npy")], "reader": "tests.helpers:nope"})
    with pytest.raises(ConfigError, match=f"source.reader.*{ORIGIN}"):
        reader.check_imports()


def test_a_further_datasets_import_error_names_its_key_as_the_file_spells_it(tmp_path):
    files = [str(tmp_path / "a.npy")]
    config = _config(tmp_path, datasets={"eval": {"source": {"files": files}, "pipeline": {"mappers": ["nope_x:f"]}}})
    with pytest.raises(ConfigError, match=r"^datasets\.eval\.pipeline\.mappers: cannot import module 'nope_x'"):
        config.check_imports()


def test_a_directory_in_files_is_called_a_directory(tmp_path):
    (tmp_path / "data").mkdir()
    config = LoaderConfig.from_dict({"source": {"files": [str(tmp_path / "data")]}}, origin=ORIGIN)
    with pytest.raises(ConfigError, match=f"is a directory.*{ORIGIN}"):
        config.source.expand_files()


def test_a_bind_failure_names_the_config_file(tmp_path):
    import socket

    from loader.service.daemon.loop import Daemon

    (tmp_path / "a.npy").write_bytes(b"")
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    path = tmp_path / "bind.toml"
    path.write_text(f'[source]\nfiles = ["{tmp_path / "a.npy"}"]\n[service]\nbind = "tcp://127.0.0.1:{port}"\n')
    try:
        with pytest.raises(TransportError, match=f"address already in use.*{path}"):
            Daemon(load_config(path), start_workers=False)
    finally:
        taken.close()


def test_a_file_named_many_times_is_looked_up_once(tmp_path, monkeypatch):
    """200,000 copies of one path (or list file lines) took 28 s: each was globbed and its real path found."""
    import os

    from loader.config import globbing

    (tmp_path / "a.npy").write_bytes(b"")
    (tmp_path / "list.txt").write_text("a.npy\n" * 1000)
    looked_up: list[str] = []
    realpath = os.path.realpath
    monkeypatch.setattr(globbing.os.path, "realpath", lambda p: looked_up.append(p) or realpath(p))
    for source in ({"files": [str(tmp_path / "a.npy")] * 1000}, {"list_file": str(tmp_path / "list.txt")}):
        looked_up.clear()
        assert LoaderConfig.from_dict({"source": source}).source.expand_files() == [str(tmp_path / "a.npy")]
        assert len(looked_up) <= 2, f"{len(looked_up)} lookups of {source.keys()}"
