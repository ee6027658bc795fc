"""loader.config: every shipped config loads, every rejection names file, key and reason."""

from __future__ import annotations

import copy
import dataclasses
import glob
import json
import os
import pickle
import re
import sys

import msgpack
import pytest

from loader.config import (
    DEFAULT_BIND,
    ClientConfig,
    LoaderConfig,
    PipelineConfig,
    ServiceConfig,
    SourceConfig,
    WorkersConfig,
    load_config,
    resolve,
)
from loader.errors import ConfigError
from loader.examples import datagen as _datagen
from loader.runtime.imports import import_object
from tests.helpers import REPO_ROOT

ROOT = REPO_ROOT
CONFIGS = sorted(glob.glob(os.path.join(ROOT, "configs", "*.toml")))
ORIGIN = "configs/train.toml"


def make(source: dict | None = None, **sections: dict) -> LoaderConfig:
    data = {"source": {"files": ["data/*.npy"]} if source is None else source, **sections}
    return LoaderConfig.from_dict(data, origin=ORIGIN)


def rejects(match: str, source: dict | None = None, **sections: dict) -> str:
    with pytest.raises(ConfigError, match=match) as info:
        make(source, **sections)
    text = str(info.value)
    assert ORIGIN in text, text
    return text


# -- shipped configs ---------------------------------------------------------------


def test_the_shipped_configs_exist() -> None:
    names = {os.path.basename(p) for p in CONFIGS}
    assert {"example.toml", "npy.toml", "npz.toml", "recordio.toml", "text.toml", "provider.toml"} <= names


def test_every_built_in_format_has_a_shipped_config() -> None:
    # The service issue: "configs/ holds a working example per built-in format" (npz had none).
    formats = {load_config(path).source.format for path in CONFIGS}
    assert {"npy", "npz", "recordio", "text"} <= formats, formats


@pytest.mark.parametrize("path", CONFIGS, ids=os.path.basename)
def test_every_shipped_config_loads_and_round_trips(path: str) -> None:
    config = load_config(path)
    assert config.origin == path
    # Plain data: JSON and msgpack both carry it, and it comes back equal.
    again = LoaderConfig.from_dict(json.loads(json.dumps(config.to_dict())))
    assert again == config
    assert LoaderConfig.from_dict(msgpack.unpackb(msgpack.packb(config.to_dict()))) == config
    config.check_imports()  # every "module:function" in a shipped config imports


@pytest.mark.parametrize("path", CONFIGS, ids=os.path.basename)
def test_every_shipped_config_points_inside_the_repo(path: str) -> None:
    source = load_config(path).source
    for pattern in source.files + ((source.list_file,) if source.list_file else ()):
        assert os.path.isabs(pattern) and pattern.startswith(ROOT), pattern


def test_example_documents_every_key() -> None:
    # Every key is written (as a value or commented out) under its own section header.
    documented: set[tuple[str, str]] = set()
    section = ""
    for line in open(os.path.join(ROOT, "configs", "example.toml"), encoding="utf-8"):
        header = re.match(r"^\[(\w+)(?:\.(\w+))?\]", line)
        if header:
            section = header[1]
            if header[2]:
                documented.add((section, header[2]))
            continue
        key = re.match(r"^#? ?(\w+) =", line)
        if key:
            documented.add((section, key[1]))
    for name, values in make().to_dict().items():
        if not isinstance(values, dict):  # a top-level key, written above the first section
            assert ("", name) in documented, f"{name} is not documented"
            continue
        for key in values:
            assert (name, key) in documented, f"{name}.{key} is not documented"


def test_example_shows_the_defaults() -> None:
    # "every other key has the default shown here"
    config = load_config(os.path.join(ROOT, "configs", "example.toml"))
    assert (config.pipeline, config.workers, config.service, config.client) == (
        PipelineConfig(),
        WorkersConfig(),
        ServiceConfig(),
        ClientConfig(),
    )


def test_shipped_npy_config_expands_generated_data(tmp_path) -> None:
    data = load_config(os.path.join(ROOT, "configs", "npy.toml")).to_dict()
    _datagen.generate(str(tmp_path), format="npy", files=3, samples=4)
    data["source"]["files"] = [os.path.join(tmp_path, os.path.basename(p)) for p in data["source"]["files"]]
    files = LoaderConfig.from_dict(data).source.expand_files()
    # The glob picks the feature files, not their *.labels.npy siblings.
    assert [os.path.basename(f) for f in files] == ["part-00000.npy", "part-00001.npy", "part-00002.npy"]


def test_shipped_npz_config_reads_generated_data(tmp_path) -> None:
    from loader.io.registry import create_file_reader

    data = load_config(os.path.join(ROOT, "configs", "npz.toml")).to_dict()
    _datagen.generate(str(tmp_path), format="npz", files=2, samples=3, dim=5)
    data["source"]["files"] = [os.path.join(tmp_path, os.path.basename(p)) for p in data["source"]["files"]]
    source = LoaderConfig.from_dict(data).source
    files = source.expand_files()
    assert [os.path.basename(f) for f in files] == ["part-00000.npz", "part-00001.npz"]
    with create_file_reader(files[0], format=source.format, **source.file_reader_options()) as reader:
        rows = list(reader)
        assert reader.slot_names == ["x", "label"]
    assert len(rows) == 3 and rows[0][0].shape == (5,) and rows[0][0].dtype.name == "float32"


def test_shipped_text_and_provider_configs_read_generated_data(tmp_path) -> None:
    from loader.io.registry import create_file_reader
    from loader.provider import iter_file_samples

    path = _datagen.write_text(str(tmp_path / "a.txt"), samples=5)
    (tmp_path / "train.list").write_text("a.txt\n")
    text = load_config(os.path.join(ROOT, "configs", "text.toml")).source
    with create_file_reader(path, format=text.format, **text.file_reader_options()) as reader:
        rows = list(reader)
    assert len(rows) == 5 and rows[0][0].shape == (4,) and rows[0][0].dtype.name == "float32"

    data = load_config(os.path.join(ROOT, "configs", "provider.toml")).to_dict()
    data["source"]["list_file"] = str(tmp_path / "train.list")
    source = LoaderConfig.from_dict(data).source
    assert source.expand_files() == [path]
    samples = list(iter_file_samples(source.resolve_provider(), path))
    assert len(samples) == 5 and int(samples[0][1]) == int(rows[0][1])


# -- defaults, normalization, round trip --------------------------------------------


def test_defaults() -> None:
    config = make()
    assert config.pipeline == PipelineConfig()
    assert config.pipeline.batch_size == 32 and config.pipeline.epochs == 1 and config.pipeline.seed is None
    assert config.workers == WorkersConfig()
    assert config.workers.count == 2 and config.workers.transport == "zmq"
    assert config.workers.samples_per_message == 4096
    assert config.workers.heartbeat_interval_s == 0.5 and config.workers.heartbeat_timeout_s == 5.0
    assert config.service.bind == DEFAULT_BIND == "tcp://127.0.0.1:5555" and config.service.is_loopback
    assert (config.client.prefetch, config.client.device, config.client.timeout_s) == ("auto", "cpu", 30.0)


def test_values_are_normalized_and_frozen() -> None:
    config = make(
        {"files": "data/*.npy", "fields": ["x", "y"]},
        pipeline={"mappers": ["os.path:basename"]},
        workers={"heartbeat_interval_s": 1, "heartbeat_timeout_s": 3},
    )
    assert config.source.files == (os.path.join(os.getcwd(), "data/*.npy"),)
    assert config.source.fields == ("x", "y") and config.pipeline.mappers == ("os.path:basename",)
    assert isinstance(config.workers.heartbeat_interval_s, float)
    with pytest.raises(dataclasses.FrozenInstanceError) as info:
        config.workers.count = 3  # type: ignore[misc]
    hint = "a config is read-only; make a changed copy with config.override({'workers.count': value})"
    assert str(info.value) == f"cannot assign to field 'count': {hint}"
    assert config.override({"workers.count": 3}).workers.count == 3  # the way the error shows
    with pytest.raises(dataclasses.FrozenInstanceError, match=r"config.override\(\{'pipeline.KEY': value\}\)"):
        config.pipeline = config.pipeline  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError, match=r"config.override\(\{'import_path': value\}\)"):
        config.import_path = ()  # type: ignore[misc]
    assert copy.deepcopy(config) == config and pickle.loads(pickle.dumps(config)) == config


def test_relative_paths_resolve_against_the_config_file(tmp_path) -> None:
    (tmp_path / "sub").mkdir()
    path = tmp_path / "sub" / "c.toml"
    path.write_text('[source]\nfiles = ["../data/*.npy"]\n')
    assert load_config(path).source.files == (str(tmp_path / "data" / "*.npy"),)
    path.write_text('[source]\nlist_file = "train.list"\n')
    assert load_config(path).source.list_file == str(tmp_path / "sub" / "train.list")


def test_round_trip_keeps_every_value() -> None:
    config = make(
        {
            "list_file": "/data/train.list",
            "format": "text",
            "fields": ["a"],
            "format_options": {"parser": "m:f", "n": [1, 2]},
        },
        pipeline={
            "mappers": ["a:b", "c.d:e"],
            "batch_mappers": ["f.g:h"],
            "shuffle_buffer": 10,
            "batch_size": 3,
            "drop_last": True,
            "seed": 7,
            "epochs": 0,
            "on_error": "skip",
            "batch_format": "list",
        },
        workers={"count": 3, "transport": "pipe", "samples_per_message": 8},
        service={"bind": "ipc:///tmp/x.sock"},
        client={"prefetch": 1, "device": "cuda:1", "timeout_s": 2.5},
    )
    assert LoaderConfig.from_dict(config.to_dict()) == config
    assert LoaderConfig.from_dict(json.loads(json.dumps(config.to_dict()))).to_dict() == config.to_dict()


def test_format_options_are_copied() -> None:
    options = {"nested": {"a": 1}}
    config = make({"files": ["x"], "format_options": options})
    options["nested"]["a"] = 2
    assert config.source.format_options == {"nested": {"a": 1}}


def test_override_checks_values_and_keeps_the_origin() -> None:
    config = make(workers={"count": 2})
    changed = config.override({"workers.count": 5, "service.bind": "tcp://0.0.0.0:6000"})
    assert changed.workers.count == 5 and changed.origin == ORIGIN
    assert not changed.service.is_loopback  # allowed: named explicitly
    with pytest.raises(ConfigError, match=r"workers.count must be >= 1, got 0 \(command line\)"):
        config.override({"workers.count": 0})
    with pytest.raises(ConfigError, match="did you mean workers.count"):
        config.override({"workers.cout": 1})


def test_sections_can_be_built_directly() -> None:
    assert SourceConfig(files=("a",)).files == ("a",)
    with pytest.raises(ConfigError, match=r"workers.count must be >= 1, got 0 \(<dict>\)"):
        WorkersConfig(count=0)


# -- rejections -------------------------------------------------------------------


def test_the_documented_message_shape() -> None:
    text = rejects("count", workers={"count": 0})
    assert text == "workers.count must be >= 1, got 0 (configs/train.toml)"


@pytest.mark.parametrize(
    "section, values, match",
    [
        ("pipeline", {"batch_size": 0}, "pipeline.batch_size must be >= 1, got 0"),
        ("pipeline", {"batch_size": "8"}, "pipeline.batch_size must be an integer"),
        ("pipeline", {"batch_size": True}, "pipeline.batch_size must be an integer, got True"),
        ("pipeline", {"batch_size": 2.0}, "pipeline.batch_size must be an integer"),
        ("pipeline", {"shuffle_buffer": -1}, "pipeline.shuffle_buffer must be >= 0"),
        ("pipeline", {"epochs": -1}, "pipeline.epochs must be >= 0"),
        ("pipeline", {"seed": -5}, "pipeline.seed must be >= 0"),
        ("pipeline", {"seed": "x"}, "pipeline.seed must be an integer"),
        ("pipeline", {"drop_last": 1}, "pipeline.drop_last must be true or false"),
        ("workers", {"file_rows": "yes"}, "workers.file_rows must be true or false"),
        ("pipeline", {"on_error": "ignore"}, "pipeline.on_error must be one of 'raise', 'skip', got 'ignore'"),
        ("pipeline", {"batch_format": "dict"}, "pipeline.batch_format must be one of"),
        ("pipeline", {"mappers": "a:b"}, "pipeline.mappers must be a list of strings"),
        ("pipeline", {"mappers": ["nocolon"]}, "pipeline.mappers must look like 'module:function'"),
        ("pipeline", {"mappers": [3]}, "pipeline.mappers must be a list of non-empty strings"),
        ("pipeline", {"batch_mappers": "a:b"}, "pipeline.batch_mappers must be a list of strings"),
        ("pipeline", {"batch_mappers": ["nocolon"]}, "pipeline.batch_mappers must look like 'module:function'"),
        ("workers", {"count": 0}, "workers.count must be >= 1, got 0"),
        ("workers", {"transport": "tcp"}, "workers.transport must be one of 'zmq', 'pipe', 'queue'"),
        ("workers", {"samples_per_message": 0}, "workers.samples_per_message must be >= 1"),
        ("workers", {"heartbeat_interval_s": 0}, "workers.heartbeat_interval_s must be > 0"),
        ("workers", {"heartbeat_interval_s": "1"}, "workers.heartbeat_interval_s must be a number"),
        ("workers", {"heartbeat_interval_s": 1.0, "heartbeat_timeout_s": 0.8}, "must be greater than workers.heart"),
        ("service", {"bind": "localhost:5555"}, "service.bind must look like 'tcp://HOST:PORT'"),
        ("service", {"bind": "tcp://127.0.0.1"}, "service.bind must look like"),
        ("service", {"bind": "tcp://127.0.0.1:70000"}, "service.bind has a port outside"),
        ("service", {"bind": ""}, "service.bind must be a non-empty string"),
        ("client", {"prefetch": 0}, "client.prefetch must be >= 1"),
        ("client", {"prefetch": "fast"}, 'client.prefetch must be "auto" or an integer from 1 to 32'),
        ("client", {"device": "tpu"}, "client.device must be 'cpu', 'torch', 'torch:cpu', 'cuda', 'cuda:N', 'gpu' or"),
        ("client", {"timeout_s": -1}, "client.timeout_s must be > 0"),
    ],
)
def test_bad_values_are_rejected(section: str, values: dict, match: str) -> None:
    rejects(match, **{section: values})


@pytest.mark.parametrize(
    "source, match",
    [
        ({}, "source.files or source.list_file is required"),
        ({"files": []}, "source.files is an empty list"),
        ({"files": ["a"], "list_file": "l"}, "source.files and source.list_file are exclusive"),
        ({"files": [""]}, "source.files must be a list of non-empty strings"),
        ({"files": 3}, "source.files must be a list of strings"),
        ({"files": ["a"], "reader": "m:f", "provider": "m:g"}, "source.reader and source.provider are exclusive"),
        ({"files": ["a"], "reader": "m:f", "format": "npy"}, "source.format has no effect with source.reader"),
        ({"files": ["a"], "provider": "m:f", "format_options": {"x": 1}}, "source.format_options has no effect"),
        ({"files": ["a"], "reader": "m"}, "source.reader must look like 'module:function'"),
        ({"files": ["a"], "provider": "m:f:g"}, "source.provider must look like"),
        ({"files": ["a"], "format": ""}, "source.format must be a non-empty string"),
        ({"files": ["a"], "fields": "x"}, "source.fields must be a list of strings"),
        ({"files": ["a"], "format_options": 3}, "source.format_options must be a table"),
    ],
)
def test_bad_sources_are_rejected(source: dict, match: str) -> None:
    rejects(match, source)


def test_unknown_keys_suggest_the_closest() -> None:
    rejects(r"unknown key workers.cuont \(configs/train.toml\); did you mean workers.count\?", workers={"cuont": 2})
    rejects(r"unknown key source.file .*did you mean source.files\?", {"file": ["a"]})
    rejects(r"unknown section pipline .*did you mean pipeline\?", pipline={})
    text = rejects(r"unknown key client.zzz", client={"zzz": 1})
    assert "known keys: client.device, client.prefetch, client.progress_timeout_s, client.timeout_s" in text


def test_a_section_must_be_a_table() -> None:
    rejects(r"workers must be a table", workers=3)
    with pytest.raises(ConfigError, match="a config must be a table"):
        LoaderConfig.from_dict([], origin=ORIGIN)  # type: ignore[arg-type]


def test_non_plain_format_options_are_rejected(tmp_path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[source]\nfiles = ["a"]\n[source.format_options]\nwhen = 1979-05-27\n')
    with pytest.raises(ConfigError, match=r"source.format_options.when must hold only strings"):
        load_config(path)


def test_a_dict_given_for_a_config_file_says_how_a_dict_becomes_a_config() -> None:
    # load_config(dict) failed in os.fspath with "expected str, bytes or os.PathLike object, not dict".
    from loader.service.local import Loader

    sections = {"source": {"files": ["data/*.npy"]}}
    with pytest.raises(TypeError, match=r"load_config reads a TOML file .* loader.config.LoaderConfig.from_dict\(d\)"):
        load_config(sections)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"got dict \(a dict of sections: loader.config.LoaderConfig.from_dict"):
        Loader(sections)  # type: ignore[arg-type]
    assert LoaderConfig.from_dict(sections).source.files == (os.path.abspath("data/*.npy"),)  # what it points to


def test_a_data_file_given_for_a_config_is_named_as_one(tmp_path) -> None:
    # DataLoader("data/part-0.npy") said "is not valid TOML: 'utf-8' codec can't decode byte 0x93".
    import numpy as np

    np.save(tmp_path / "part-0.npy", np.zeros(3))
    np.savez(tmp_path / "part-1.npz", x=np.zeros(3))
    (tmp_path / "part-2.recordio").write_bytes(b"\x01\x02\xff\xfe")
    for name, kind in [
        ("part-0.npy", ".npy array"),
        ("part-1.npz", "zip archive"),
        ("part-2.recordio", "a .recordio file"),
    ]:
        with pytest.raises(ConfigError, match=rf"part-.\..*' is a data file \({kind}.*\), not a config"):
            load_config(tmp_path / name)


def test_file_errors_name_the_file(tmp_path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match="is a directory"):
        load_config(tmp_path)
    bad = tmp_path / "bad.toml"
    bad.write_text("[source\nfiles = 1\n")
    with pytest.raises(ConfigError, match=r"bad.toml' is not valid TOML"):
        load_config(bad)
    bad.write_text('[workers]\ncount = 0\n[source]\nfiles=["x"]\n')
    with pytest.raises(ConfigError, match=rf"workers.count must be >= 1, got 0 \({bad}\)"):
        load_config(bad)


# -- expand_files -----------------------------------------------------------------


def _touch(path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    return str(path)


def test_expand_files_sorts_and_deduplicates(tmp_path) -> None:
    b = _touch(tmp_path / "b.npy")
    a = _touch(tmp_path / "a.npy")
    c = _touch(tmp_path / "deep" / "c.npy")
    (tmp_path / "dir.npy").mkdir()  # directories never count as files
    source = SourceConfig(files=(str(tmp_path / "*.npy"), a, str(tmp_path / "**" / "*.npy")))
    assert source.expand_files() == [a, b, c]


def test_expand_files_names_what_is_missing(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"source.files pattern '.*\*.npy' matched no files \(x.toml\)"):
        SourceConfig(files=(str(tmp_path / "*.npy"),), origin="x.toml").expand_files()
    with pytest.raises(ConfigError, match=r"source.files: file '.*nope.npy' does not exist"):
        SourceConfig(files=(str(tmp_path / "nope.npy"),)).expand_files()


def test_expand_files_refuses_a_file_name_that_is_not_utf8_naming_its_bytes(tmp_path) -> None:
    # The daemon's messages carry names as UTF-8: such a name stopped the daemon's loop at the first lease.
    _touch(tmp_path / "good.npy")
    bad = os.fsdecode(b"bad\xff.npy")
    _touch(tmp_path / bad)
    source = SourceConfig(files=(str(tmp_path / "*.npy"),), origin="x.toml")
    with pytest.raises(ConfigError, match=r"source.files: the file name '.*bad\\udcff.npy' is not UTF-8") as info:
        source.expand_files()
    assert "b'bad\\xff.npy'" in str(info.value) and "rename" in str(info.value) and "(x.toml)" in str(info.value)


def test_list_file(tmp_path) -> None:
    a = _touch(tmp_path / "data" / "a.rec")
    b = _touch(tmp_path / "data" / "b.rec")
    listing = tmp_path / "data" / "train.list"
    listing.write_text(f"# comment\n\nb.rec\n{a}\nb.rec\n")
    assert SourceConfig(list_file=str(listing)).expand_files() == [a, b]

    listing.write_text("b.rec\nmissing.rec\n")
    with pytest.raises(ConfigError, match=r"names 'missing.rec', which does not exist"):
        SourceConfig(list_file=str(listing)).expand_files()
    # What stands there instead of a file is named: "does not exist" sent users looking for a missing file.
    os.mkdir(tmp_path / "data" / "dir.rec")
    os.mkfifo(tmp_path / "data" / "fifo.rec")
    os.symlink("loop.rec", tmp_path / "data" / "loop.rec")
    os.symlink("nowhere", tmp_path / "data" / "dangling.rec")
    for name, why in [
        ("dir.rec", "which is a directory, not a file"),
        ("fifo.rec", "which is not a regular file (a FIFO, a socket or a device)"),
        ("loop.rec", "which is a symbolic link that loops"),
        ("dangling.rec", "which is a symbolic link to nothing"),
    ]:
        listing.write_text(f"b.rec\n{name}\n")
        with pytest.raises(ConfigError, match=rf"names '{name}', {re.escape(why)} \("):
            SourceConfig(list_file=str(listing)).expand_files()
    listing.write_text("b.rec\nmissing.rec\n")
    # A provider may take names that are not files: those pass through as written.
    assert SourceConfig(list_file=str(listing), provider="m:f").expand_files() == [b, "missing.rec"]

    listing.write_text("# nothing\n\n")
    with pytest.raises(ConfigError, match=r"source.list_file '.*train.list' lists no files"):
        SourceConfig(list_file=str(listing)).expand_files()
    with pytest.raises(ConfigError, match=r"source.list_file '.*other.list' cannot be read"):
        SourceConfig(list_file=str(tmp_path / "other.list")).expand_files()


# -- "module:function" ------------------------------------------------------------


def test_resolve_imports_lazily() -> None:
    config = make(pipeline={"mappers": ["os.path:basename", "json:dumps"], "batch_mappers": ["json:loads"]})
    assert config.pipeline.resolve_mappers() == [os.path.basename, json.dumps]
    assert config.pipeline.resolve_mappers("batch_mappers") == [json.loads]
    assert resolve("os.path:join") is os.path.join
    assert import_object("collections:OrderedDict.fromkeys") is not None
    # Creating a config never imports: a module only a worker host has is fine here.
    config = make({"files": ["a"], "reader": "surely_not_a_module_xyz:read"})
    assert "surely_not_a_module_xyz" not in sys.modules
    with pytest.raises(ConfigError, match=r"source.reader: cannot import module 'surely_not_a_module_xyz'"):
        config.check_imports()


def test_an_import_error_of_a_config_says_its_words_once_and_keeps_the_users_own_cause(tmp_path) -> None:
    # The config's wrap of its own error was chained to that error: Python printed the words twice, with about
    # 30 lines of the loader's own frames between them.
    import traceback

    config = make(pipeline={"mappers": ["surely_not_a_module_xyz:f"]})
    with pytest.raises(ConfigError) as caught:
        config.check_imports()
    printed = "".join(traceback.format_exception(caught.value))
    assert printed.count("cannot import module 'surely_not_a_module_xyz'") == 1
    (tmp_path / "raises_on_import_xyz.py").write_text("raise RuntimeError('broken at import')\n")
    sys.path.insert(0, str(tmp_path))
    try:
        with pytest.raises(ConfigError) as caught:
            make(pipeline={"mappers": ["raises_on_import_xyz:f"]}).check_imports()
    finally:
        sys.path.remove(str(tmp_path))
    printed = "".join(traceback.format_exception(caught.value))
    assert "broken at import" in printed and 'raises_on_import_xyz.py", line 1' in printed  # the user's traceback


def test_resolve_errors() -> None:
    with pytest.raises(ConfigError, match=r"source.reader: module 'os.path' has no attribute 'nope'"):
        make({"files": ["a"], "reader": "os.path:nope"}).source.resolve_reader()
    with pytest.raises(ConfigError, match=r"must look like 'module:function', got 'os.path'"):
        resolve("os.path")
    with pytest.raises(ConfigError, match=r"source.format_options.parser: cannot import"):
        make({"files": ["a"], "format_options": {"parser": "nope_xyz_mod:f"}}).check_imports()


def test_check_imports_looks_up_the_format() -> None:
    make({"files": ["a"], "format": "npy"}).check_imports()
    with pytest.raises(
        ConfigError, match=r"source.format 'nyp' is not a registered format \(known: .*npy.*\) \(configs/train.toml\)"
    ):
        make({"files": ["a"], "format": "nyp"}).check_imports()


def test_formats_table_registers_user_formats(tmp_path) -> None:
    from loader.io.registry import create_file_reader, registered_formats, unregister_file_reader

    config = make(
        {
            "files": [str(tmp_path / "*.rows")],
            "formats": {"rowsfmt": {"factory": "loader.io.formats_numpy:NpyFileReader", "suffixes": [".rows"]}},
        }
    )
    assert config.source.formats["rowsfmt"]["suffixes"] == [".rows"]
    assert LoaderConfig.from_dict(config.to_dict()) == config
    try:
        config.check_imports()
        assert registered_formats()["rowsfmt"] == [".rows"]
        import numpy as np

        path = tmp_path / "a.rows"
        with open(path, "wb") as fh:
            np.save(fh, np.arange(6, dtype=np.float32).reshape(3, 2))
        with create_file_reader(str(path)) as reader:
            assert [row[0].tolist() for row in reader] == [[0, 1], [2, 3], [4, 5]]
    finally:
        unregister_file_reader("rowsfmt")


@pytest.mark.parametrize(
    "formats, match",
    [
        ({"x": 3}, r"source\.formats\.x must be 'module:factory'"),
        ({"x": {"factory": "a:b", "suffix": [".x"]}}, r"source\.formats\.x has unknown keys"),
        ({"x": {"factory": "a:b", "suffixes": ".x"}}, r"source\.formats\.x\.suffixes must be a list"),
        ([1], r"source\.formats must be a table"),
    ],
)
def test_bad_formats_are_rejected(formats, match) -> None:
    rejects(match, {"files": ["x"], "formats": formats})


def test_a_module_named_like_one_of_loaders_own_packages_is_named_as_the_culprit() -> None:
    # A user's workers.py beside the config: the worker imports loader's own ``workers`` package instead.
    with pytest.raises(ConfigError, match=r"the module imported is .*workers.*'workers' is a package of loader itself"):
        import_object("workers:double", what="pipeline.mappers")


def test_a_users_module_importing_from_its_own_workers_package_is_told_loaders_hides_it(tmp_path, monkeypatch) -> None:
    # my_maps.py does ``from workers import helper``: loader's ``workers`` answered, and the error said "correct it
    # there" of a module that was fine.
    (tmp_path / "maps_using_workers.py").write_text("from workers import helper\n\ndef f(s):\n    return s\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as info:
        import_object("maps_using_workers:f", what="pipeline.mappers")
    message = str(info.value)
    assert "imports from 'workers', which here is a package of loader itself" in message and "my_workers" in message
    assert "correct it there" not in message
    sys.modules.pop("maps_using_workers", None)


def test_key_files_named_in_a_config_are_found_beside_it_wherever_the_command_runs(tmp_path, monkeypatch) -> None:
    from loader.config import load_config

    (tmp_path / "c.toml").write_text(
        '[source]\nfiles = ["x.npy"]\n[service]\ndaemon_key = "keys/daemon.key_secret"\n'
        'authorized_keys = "keys/authorized"\npeer_key = "~/k"\n'
    )
    monkeypatch.chdir("/")
    service = load_config(str(tmp_path / "c.toml")).service
    assert service.daemon_key == str(tmp_path / "keys" / "daemon.key_secret")
    assert service.authorized_keys == str(tmp_path / "keys" / "authorized")
    assert service.peer_key == os.path.expanduser("~/k")


def test_code_named_in_the_training_script_is_refused_before_the_script_runs_again(tmp_path) -> None:
    # Workers never run the script: '__main__:f' failed in every worker, and 'train:f' re-ran the training
    # (a Loader inside a worker: "daemonic processes are not allowed to have children", three tracebacks deep).
    import subprocess

    (tmp_path / "data.npy").write_bytes(b"")  # never read: the config fails first
    (tmp_path / "train.toml").write_text('[source]\nfiles = ["*.npy"]\n')
    script = tmp_path / "train.py"
    for spec in ("train:normalize", "__main__:normalize"):
        script.write_text(
            "import sys\n"
            "import loader\n"
            "def normalize(sample):\n"
            "    return sample\n"
            "print('the script ran', flush=True)\n"
            f"config = loader.load_config('train.toml', overrides=['pipeline.mappers=[\"{spec}\"]'])\n"
            "try:\n"
            "    config.check_imports()\n"
            "except loader.ConfigError as exc:\n"
            "    print(exc)\n"
            "    sys.exit(3)\n"
        )
        done = subprocess.run(
            [sys.executable, str(script)],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONPATH": REPO_ROOT},
        )
        assert done.returncode == 3, done.stdout + done.stderr
        assert done.stdout.count("the script ran") == 1, done.stdout  # imported by its own name, it ran twice
        assert f"'{spec}' is in the " in done.stdout and "move normalize into a module of its own" in done.stdout


def test_every_unknown_key_is_reported_at_once() -> None:
    text = rejects(
        r"^3 unknown keys \(configs/train.toml\): ",
        pipeline={"batchsize": 8, "shuffle_bufer": 64},
        datasets={"eval": {"source": {"files": ["e"]}, "pipeline": {"epoch": 2}}},
    )
    assert "pipeline.batchsize (did you mean pipeline.batch_size?)" in text
    assert "pipeline.shuffle_bufer (did you mean pipeline.shuffle_buffer?)" in text
    assert "datasets.eval.pipeline.epoch (did you mean datasets.eval.pipeline.epochs?)" in text
    assert "\n" not in text


@pytest.mark.parametrize(
    "device", ["cpu", "torch", "torch:cpu", "cuda", "cuda:1", "gpu", "gpu:0", "torch:cuda:0", "cupy:gpu"]
)
def test_every_documented_device_form_is_accepted(device: str) -> None:
    assert make(client={"device": device}).client.device == device


def test_a_bad_device_lists_every_form_and_blames_who_gave_it() -> None:
    text = rejects(r"client.device must be .*got 'tpu' \(configs/train.toml\)", client={"device": "tpu"})
    for form in ("'gpu:N'", "'torch:'", "'cupy:'", "'torch:cuda:0'"):
        assert form in text
    # A value from an argument (as loader.torch.DataLoader's device) names the argument, not the file.
    with pytest.raises(ConfigError, match=r"got 'gpu0' \(DataLoader\(device='gpu0'\)\)$"):
        make().override({"client.device": "gpu0"}, origin="DataLoader(device='gpu0')")


def test_a_guarded_script_and_a_script_from_stdin_may_name_their_own_code(tmp_path) -> None:
    # Under `if __name__ == "__main__":` importing the script runs its definitions only (spawn's idiom), and a
    # script read from stdin is no file to compare (its imports raised FileNotFoundError).
    import subprocess

    (tmp_path / "data.npy").write_bytes(b"")
    (tmp_path / "train.toml").write_text('[source]\nfiles = ["*.npy"]\n')
    body = (
        "import loader\n"
        "def normalize(sample):\n"
        "    return sample\n"
        "{guard}"
        "    config = loader.load_config('train.toml', overrides=['pipeline.mappers=[\"{spec}\"]'])\n"
        "    config.check_imports()\n"
        "    print('accepted', flush=True)\n"
    )
    env = {**os.environ, "PYTHONPATH": REPO_ROOT}
    (tmp_path / "train.py").write_text(body.format(guard='if __name__ == "__main__":\n', spec="train:normalize"))
    done = subprocess.run(
        [sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=60, env=env
    )
    assert done.stdout.count("accepted") == 1, done.stdout + done.stderr
    (tmp_path / "maps.py").write_text("def normalize(sample):\n    return sample\n")
    stdin = body.format(guard="if True:\n", spec="maps:normalize")
    done = subprocess.run(
        [sys.executable, "-"], input=stdin, cwd=tmp_path, capture_output=True, text=True, timeout=60, env=env
    )
    assert done.stdout.count("accepted") == 1, done.stdout + done.stderr
