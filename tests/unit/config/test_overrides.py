"""Config values over the file from LOADER_SECTION__KEY variables and --set, with their sources."""

from __future__ import annotations

import pytest

from loader.config import load_config
from loader.config.overrides import Override, format_sources, from_assignment, from_environ, parse_value
from loader.errors import ConfigError
from tests.helpers import set_flags


@pytest.fixture
def cfg(tmp_path):
    (tmp_path / "a.npy").write_bytes(b"")
    path = tmp_path / "c.toml"
    path.write_text('[source]\nfiles = ["*.npy"]\n[pipeline]\nbatch_size = 8\nseed = 3\n')
    return str(path)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("64", 64),
        ("1.5", 1.5),
        ("true", True),
        ('"quoted"', "quoted"),
        ('["a:b", "c:d"]', ["a:b", "c:d"]),
        ("tcp://0.0.0.0:5555", "tcp://0.0.0.0:5555"),
        ("plain words", "plain words"),
        ("", ""),
        ("2024-01-01", "2024-01-01"),  # a TOML date is no config value: the text stays
    ],
)
def test_values_are_read_as_toml_else_as_text(text, value):
    assert parse_value(text) == value


def test_environment_names_map_to_dotted_keys_and_others_are_ignored():
    env = {
        "LOADER_PIPELINE__BATCH_SIZE": "64",
        "loader_workers__count": "3",
        "LOADER_ADDRESS": "tcp://h:1",  # the client's address, not an override
        "LOADER_TEST_HANG_MARKER": "/tmp/x",
        "PATH": "/bin",
    }
    got = {o.key: (o.value, o.source) for o in from_environ(env)}
    assert got == {
        "pipeline.batch_size": (64, "environment variable LOADER_PIPELINE__BATCH_SIZE"),
        "workers.count": (3, "environment variable loader_workers__count"),
    }


@pytest.mark.parametrize("name", ["LOADER___X", "LOADER_PIPELINE__", "LOADER_PIPELINE____SEED"])
def test_malformed_environment_names_are_named(name):
    with pytest.raises(ConfigError, match=name):
        from_environ({name: "1"})


@pytest.mark.parametrize("text", ["batch_size=3", "pipeline.batch_size", ".x=1", "pipeline.=1"])
def test_malformed_set_is_named(text):
    with pytest.raises(ConfigError, match="must look like SECTION.KEY=VALUE"):
        from_assignment(text)


def test_precedence_default_file_env_set_and_sources(cfg):
    env = {"LOADER_PIPELINE__BATCH_SIZE": "16", "LOADER_WORKERS__COUNT": "5"}
    config = load_config(cfg, overrides=set_flags("pipeline.batch_size=32"), environ=env)
    assert config.pipeline.batch_size == 32  # --set over the environment over the file
    assert config.workers.count == 5
    assert config.pipeline.seed == 3
    assert config.sources["pipeline.batch_size"] == "--set pipeline.batch_size=32"
    assert config.sources["workers.count"] == "environment variable LOADER_WORKERS__COUNT"
    assert config.sources["pipeline.seed"] == cfg
    assert config.sources["pipeline.epochs"] == "default"
    sections = {s: keys for s, keys in config.to_dict().items() if s not in ("import_path", "datasets")}
    assert set(config.sources) == {f"{s}.{k}" for s, keys in sections.items() for k in keys} | {"import_path"}
    assert config.sources["import_path"] == "default"
    lines = format_sources(config)
    assert any("pipeline.batch_size" in line and "32" in line and "--set" in line for line in lines)


def test_no_overrides_is_the_file(cfg):
    assert load_config(cfg, environ={}) == load_config(cfg, environ={"LOADER_ADDRESS": "tcp://x:1"})
    assert load_config(cfg, environ={}).pipeline.batch_size == 8


def test_os_environ_is_the_default(cfg, monkeypatch):
    monkeypatch.setenv("LOADER_PIPELINE__BATCH_SIZE", "12")
    assert load_config(cfg).pipeline.batch_size == 12


def test_overrides_may_be_a_mapping_of_dotted_keys_as_python_writes_them(cfg):
    # {"pipeline.batch_size": 8} was iterated for its keys and refused as "--set 'pipeline.batch_size' must look
    # like SECTION.KEY=VALUE": the command line's words, to a Python caller.
    config = load_config(cfg, overrides={"pipeline.batch_size": 16, "pipeline.mappers": ["json:dumps"]}, environ={})
    assert config.pipeline.batch_size == 16 and config.pipeline.mappers == ("json:dumps",)
    assert config.sources["pipeline.batch_size"] == "overrides['pipeline.batch_size']"
    with pytest.raises(ConfigError, match=r"must be >= 1, got 0 \(overrides\['pipeline.batch_size'\]\)"):
        load_config(cfg, overrides={"pipeline.batch_size": 0}, environ={})
    with pytest.raises(ConfigError, match=r"overrides\['batch_size'\]: a key must look like SECTION.KEY"):
        load_config(cfg, overrides={"batch_size": 4}, environ={})


def test_a_python_list_of_overrides_is_named_as_such_not_as_set_flags(cfg):
    # load_config(overrides=["pipeline.batch_size=0"]) blamed "(--set pipeline.batch_size=0)": a flag the
    # Python caller never typed.
    with pytest.raises(ConfigError, match=r"got 0 \(overrides item 'pipeline.batch_size=0'\)$"):
        load_config(cfg, overrides=["pipeline.batch_size=0"], environ={})
    with pytest.raises(ConfigError, match=r"^overrides item 'batch_size=4' must look like SECTION.KEY=VALUE, e.g. '"):
        load_config(cfg, overrides=["batch_size=4"], environ={})
    assert (
        "--set" not in load_config(cfg, overrides=["pipeline.batch_size=4"], environ={}).sources["pipeline.batch_size"]
    )


def test_an_override_may_supply_what_the_file_lacks(tmp_path):
    (tmp_path / "a.npy").write_bytes(b"")
    path = tmp_path / "c.toml"
    path.write_text("[pipeline]\nbatch_size = 8\n")
    config = load_config(path, environ={"LOADER_SOURCE__FILES": '["*.npy"]'})
    assert config.source.files == (str(tmp_path / "*.npy"),)  # relative to the config file, like the file's


def test_bad_values_name_the_variable_or_flag_not_the_file(cfg):
    with pytest.raises(ConfigError) as info:
        load_config(cfg, environ={"LOADER_PIPELINE__BATCH_SIZE": "0"})
    assert "pipeline.batch_size must be >= 1, got 0 (environment variable LOADER_PIPELINE__BATCH_SIZE)" in str(
        info.value
    )
    with pytest.raises(ConfigError, match=r"\(--set workers.count=x\)"):
        load_config(cfg, overrides=set_flags("workers.count=x"), environ={})
    with pytest.raises(ConfigError, match=r"unknown key pipeline.batchsize \(--set pipeline.batchsize=3\).*batch_size"):
        load_config(cfg, overrides=set_flags("pipeline.batchsize=3"), environ={})
    with pytest.raises(ConfigError, match=r"unknown section pipline \(environment variable LOADER_PIPLINE__SEED\)"):
        load_config(cfg, environ={"LOADER_PIPLINE__SEED": "1"})
    with pytest.raises(ConfigError, match=r"pipeline.seed is not a table"):
        load_config(cfg, overrides=[Override("pipeline.seed.x", 1, "--set pipeline.seed.x=1")], environ={})


def test_file_errors_still_name_the_file(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[source]\nfiles = ["*.npy"]\n[pipeline]\nbatch_size = 0\n')
    with pytest.raises(ConfigError, match=rf"got 0 \({path}\)"):
        load_config(path, overrides=set_flags("workers.count=2"), environ={})


def test_unknown_keys_of_the_file_and_of_a_flag_name_both(cfg):
    with open(cfg, "a") as fh:
        fh.write("shuffle_bufer = 4\n")
    with pytest.raises(ConfigError) as info:
        load_config(cfg, overrides=set_flags("pipeline.batchsize=3"), environ={})
    text = str(info.value)
    assert text.startswith(f"2 unknown keys ({cfg}, --set pipeline.batchsize=3): "), text
    assert "pipeline.batchsize (did you mean pipeline.batch_size?)" in text
    assert "pipeline.shuffle_bufer (did you mean pipeline.shuffle_buffer?)" in text


def test_a_missing_file_is_blamed_on_the_flag_or_variable_that_named_it(tmp_path):
    config = tmp_path / "train.toml"
    config.write_text('[source]\nfiles = ["*.npy"]\n')
    (tmp_path / "a.npy").write_bytes(b"")
    flag = Override("source.files", ["nope.npy"], "--set source.files=nope.npy")
    with pytest.raises(ConfigError, match=r"does not exist \(--set source.files=nope.npy\)$"):
        load_config(config, overrides=[flag]).expand_files()
    environ = {"LOADER_SOURCE__FILES": '["nope/*.npy"]'}
    with pytest.raises(ConfigError, match=r"matched no files \(environment variable LOADER_SOURCE__FILES\)$"):
        load_config(config, environ=environ).expand_files()
    (tmp_path / "a.npy").unlink()
    with pytest.raises(ConfigError, match=rf"matched no files \({config}\)$"):  # the file's own value: the file
        load_config(config, environ={}).expand_files()


def test_a_further_datasets_values_and_import_path_can_be_overridden_too(tmp_path):
    """Every config value: ``datasets.NAME.SECTION.KEY`` and ``import_path`` were refused as unknown sections."""
    (tmp_path / "a.npy").write_bytes(b"")
    (tmp_path / "lib").mkdir()
    path = tmp_path / "c.toml"
    path.write_text('[source]\nfiles = ["*.npy"]\n[datasets.eval.source]\nfiles = ["*.npy"]\n')
    env = {"LOADER_DATASETS__EVAL__PIPELINE__SEED": "5", "LOADER_IMPORT_PATH": '["lib"]'}
    config = load_config(path, overrides=set_flags("datasets.eval.pipeline.batch_size=7"), environ=env)
    assert config.dataset("eval").pipeline.batch_size == 7
    assert config.dataset("eval").pipeline.seed == 5
    assert config.import_path == (str(tmp_path / "lib"),)
    assert config.sources["datasets.eval.pipeline.batch_size"] == "--set datasets.eval.pipeline.batch_size=7"
    assert config.sources["datasets.eval.pipeline.seed"] == "environment variable LOADER_DATASETS__EVAL__PIPELINE__SEED"
    assert config.sources["import_path"] == "environment variable LOADER_IMPORT_PATH"
    assert (
        load_config(path, overrides=set_flags('import_path=["."]'), environ={})
        .sources["import_path"]
        .startswith("--set")
    )
    # A bad value names the variable or the flag that gave it, as for the sections.
    with pytest.raises(ConfigError, match=r"LOADER_DATASETS__EVAL__PIPELINE__BATCH_SIZE\)"):
        load_config(path, environ={"LOADER_DATASETS__EVAL__PIPELINE__BATCH_SIZE": "0"})
    with pytest.raises(ConfigError, match=r"\(--set datasets.other.pipeline.batch_size=8\)"):
        load_config(path, overrides=set_flags("datasets.other.pipeline.batch_size=8"), environ={})
