"""A PyDataProvider2 provider as ``source.provider``: what init_hook and settings are told under the daemon,
and the options the daemon does not honour, said once by name."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from loader.config import LoaderConfig
from loader.errors import ConfigError
from loader.provider import CacheType, integer_value, provider
from workers import sources
from workers.sources import FileSource

HOOK_CALLS: list[dict[str, Any]] = []


def _hook(settings: Any, file_list: list[str], is_train: bool, **kwargs: Any) -> None:
    HOOK_CALLS.append({"file_list": list(file_list), "is_train": is_train})
    settings.mode = int(is_train)


@provider(input_types={"mode": integer_value(2)}, init_hook=_hook)
def hooked(settings: Any, filename: str) -> Any:
    with open(filename, encoding="utf-8") as fh:
        for _ in fh:
            yield {"mode": settings.mode}


@provider(
    input_types=[integer_value(10)],
    should_shuffle=True,
    pool_size=100,
    calc_batch_size=lambda sample: 2,
    can_over_batch_size=False,
    cache=CacheType.CACHE_PASS_IN_MEM,
)
def tuned(settings: Any, filename: str) -> Any:
    yield 1


def _forget() -> None:
    """Each test a fresh worker process: no session opened, nothing warned of yet."""
    HOOK_CALLS.clear()
    getattr(sources, "_sessions", {}).clear()
    try:
        from loader.provider import daemon
    except ImportError:
        return
    daemon._warned.clear()


@pytest.fixture(autouse=True)
def _fresh() -> Any:
    _forget()
    yield
    _forget()


def _files(tmp_path: Any, count: int) -> list[str]:
    paths = []
    for i in range(count):
        path = tmp_path / f"d{i}.txt"
        path.write_text("a\nb\n")
        paths.append(str(path))
    return paths


def _config(tmp_path: Any, **test_pipeline: Any) -> LoaderConfig:
    (tmp_path / "test.list").write_text("t0.txt\n")
    (tmp_path / "t0.txt").write_text("x\n")
    spec = "tests.unit.workers.test_provider_source:hooked"
    return LoaderConfig.from_dict(
        {
            "source": {"files": [str(tmp_path / "d*.txt")], "provider": spec},
            "datasets": {
                "test": {
                    "source": {"list_file": str(tmp_path / "test.list"), "provider": spec},
                    "pipeline": test_pipeline,
                }
            },
        }
    )


def _read(config: Any, path: str) -> list[Any]:
    source = FileSource(config, path)
    try:
        return list(source.samples())
    finally:
        source.close()


def test_init_hook_runs_once_per_dataset_with_its_whole_file_list(tmp_path: Any) -> None:
    paths = _files(tmp_path, 3)
    config = _config(tmp_path)
    for path in paths:  # three leases of one dataset in one worker
        assert _read(config, path) == [[1], [1]]
    # It ran once per file with file_list=[that file]: a dictionary loaded there was loaded per lease.
    assert HOOK_CALLS == [{"file_list": paths, "is_train": True}]


def test_a_dataset_with_is_train_false_is_read_as_not_training(tmp_path: Any) -> None:
    _files(tmp_path, 1)
    config = _config(tmp_path, is_train=False).dataset("test")
    assert _read(config, str(tmp_path / "t0.txt")) == [[0]]
    assert HOOK_CALLS == [{"file_list": [str(tmp_path / "t0.txt")], "is_train": False}]


def test_is_train_defaults_to_true_for_every_dataset(tmp_path: Any) -> None:
    _files(tmp_path, 1)
    config = _config(tmp_path).dataset("test")
    assert _read(config, str(tmp_path / "t0.txt")) == [[1]]
    assert HOOK_CALLS[0]["is_train"] is True


def test_is_train_false_without_a_provider_is_refused_by_name(tmp_path: Any) -> None:
    with pytest.raises(ConfigError, match=r"pipeline.is_train = false has no effect without source.provider"):
        LoaderConfig.from_dict({"source": {"files": [str(tmp_path / "*.npy")]}, "pipeline": {"is_train": False}})


def test_a_list_the_worker_cannot_read_falls_back_to_the_leased_file_with_a_warning(tmp_path: Any, caplog) -> None:
    _files(tmp_path, 1)
    config = _config(tmp_path, is_train=False).dataset("test")
    (tmp_path / "test.list").unlink()  # the list file is on the daemon's host only
    with caplog.at_level(logging.WARNING, logger="loader.worker"):
        assert _read(config, str(tmp_path / "t0.txt")) == [[0]]
    assert HOOK_CALLS == [{"file_list": [str(tmp_path / "t0.txt")], "is_train": False}]
    assert "init_hook gets file_list=" in caplog.text and "cannot be read on this host" in caplog.text
    # Kept: a list file only the daemon's host has stays so, and a hook loading a vocabulary would load it at
    # every lease (one version opened a session per lease here).
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="loader.worker"):
        assert _read(config, str(tmp_path / "t0.txt")) == [[0]]
    assert "cannot be read on this host" not in caplog.text
    assert len(HOOK_CALLS) == 1


def test_options_the_daemon_ignores_are_named_once_with_what_it_does_instead(tmp_path: Any, caplog) -> None:
    _files(tmp_path, 1)
    config = LoaderConfig.from_dict(
        {
            "source": {
                "files": [str(tmp_path / "d*.txt")],
                "provider": "tests.unit.workers.test_provider_source:tuned",
            },
            "pipeline": {"batch_size": 8, "shuffle_buffer": 0},
        }
    )
    with caplog.at_level(logging.WARNING, logger="loader.provider"):
        config.check_imports()
        config.check_imports()  # loader check checks twice (its own load, then its Loader): said once
    lines = [r.getMessage() for r in caplog.records if r.name == "loader.provider"]
    assert len(lines) == 1, lines
    line = lines[0]
    assert line.startswith("dataset default: source.provider tests.unit.workers.test_provider_source:tuned")
    for said in (
        "should_shuffle=True: samples are shuffled by pipeline.shuffle_buffer = 0",
        "pool_size=100: the daemon's shuffle pool is pipeline.shuffle_buffer = 0 samples",
        "calc_batch_size: every sample counts 1, every batch is pipeline.batch_size = 8 samples",
        "can_over_batch_size=False: every batch is pipeline.batch_size = 8 samples",
        "cache=CACHE_PASS_IN_MEM: every epoch reads the files again",
    ):
        assert said in line


def test_a_provider_with_default_options_is_not_warned_of(tmp_path: Any, caplog) -> None:
    _files(tmp_path, 1)
    config = _config(tmp_path)
    with caplog.at_level(logging.WARNING, logger="loader.provider"):
        config.check_imports()
    assert not [r for r in caplog.records if r.name == "loader.provider"]


@provider(input_types=[integer_value(10)], should_shuffle="false")
def in_order(settings: Any, filename: str) -> Any:
    yield 1


@pytest.mark.parametrize(("buffer", "warned"), [(0, False), (64, True)])
def test_should_shuffle_is_named_only_where_the_pipeline_does_otherwise(tmp_path: Any, caplog, buffer, warned) -> None:
    config = LoaderConfig.from_dict(
        {
            "source": {
                "files": [str(tmp_path / "*.txt")],
                "provider": "tests.unit.workers.test_provider_source:in_order",
            },
            "pipeline": {"shuffle_buffer": buffer},
        }
    )
    with caplog.at_level(logging.WARNING, logger="loader.provider"):
        config.check_imports()
    said = "should_shuffle=False: samples are shuffled by pipeline.shuffle_buffer = 64" in caplog.text
    assert said is warned


def test_a_list_that_fails_to_expand_for_a_passing_reason_is_tried_again(tmp_path: Any, monkeypatch, caplog) -> None:
    # An OSError (EMFILE, a network filesystem's blip) made one worker keep a one-file list for its life while
    # the others had the whole list.
    _files(tmp_path, 1)
    config = _config(tmp_path, is_train=False).dataset("test")
    source = type(config.source)
    real = source.expand_files
    failing = [True]

    def expand(self: Any) -> list[str]:
        if failing[0]:
            raise OSError(24, "Too many open files")
        return real(self)

    monkeypatch.setattr(source, "expand_files", expand)
    with caplog.at_level(logging.WARNING, logger="loader.worker"):
        assert _read(config, str(tmp_path / "t0.txt")) == [[0]]
    assert "for this lease (tried again at the next)" in caplog.text
    failing[0] = False
    assert _read(config, str(tmp_path / "t0.txt")) == [[0]]
    assert _read(config, str(tmp_path / "t0.txt")) == [[0]]
    assert len(HOOK_CALLS) == 2  # the one-file session, then the whole list's, kept
