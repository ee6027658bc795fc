"""The ``loader`` command as a newcomer meets it: addresses, help, check's survey, gen-data's labels, pipes."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import numpy as np
import pytest

from loader.cli import build_parser, main
from loader.config import DEFAULT_BIND, LoaderConfig
from loader.config.address import daemon_address
from loader.errors import ConfigError
from loader.examples import datagen
from loader.io.survey import survey
from tests.helpers import free_port
from tests.unit.test_cli import loader_cmd, write_config

CMD_TIMEOUT_S = 60.0


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


@pytest.mark.parametrize("name", sorted(_subcommands()))
def test_every_argument_of_every_command_is_explained(name) -> None:
    for action in _subcommands()[name]._actions:
        if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
            continue
        assert action.help, f"loader {name}: {'/'.join(action.option_strings) or action.dest} has no help"


def test_every_argument_of_the_digits_example_is_explained() -> None:
    # The README sends newcomers to `python -m loader.examples.torch_digits prepare DIR`: a command too.
    from loader.examples.torch_digits import _parser

    parser = _parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, command in action.choices.items():
        for argument in command._actions:
            if isinstance(argument, argparse._HelpAction) or argument.help == argparse.SUPPRESS:
                continue
            assert argument.help, (
                f"torch_digits {name}: {'/'.join(argument.option_strings) or argument.dest} has no help"
            )


def test_status_finds_the_daemon_from_host_port_a_config_or_nothing(tmp_path) -> None:
    assert daemon_address(None) == DEFAULT_BIND
    assert daemon_address("127.0.0.1:7001") == "tcp://127.0.0.1:7001"
    assert daemon_address(":7002") == "tcp://127.0.0.1:7002"
    assert daemon_address("tcp://10.0.0.2:7003") == "tcp://10.0.0.2:7003"
    datagen.generate(str(tmp_path), files=1, samples=2)
    cfg = write_config(tmp_path / "c.toml", '[source]\nfiles = ["*.npy"]\n[service]\nbind = "tcp://0.0.0.0:7004"\n')
    assert daemon_address(cfg) == "tcp://127.0.0.1:7004"  # a wildcard bind is asked on loopback
    with pytest.raises(ConfigError, match="not a daemon address"):
        daemon_address("localhost")


def test_status_with_host_port_reaches_nobody_in_one_line() -> None:
    port = free_port()
    result = loader_cmd("status", f"127.0.0.1:{port}", "--timeout", "0.5")
    assert result.returncode == 1 and result.stderr.count("\n") == 1
    assert f"no loader daemon answered at tcp://127.0.0.1:{port}" in result.stderr
    # Said as the client says it, not the CURVE keys hint (which sent a first-hour user after keys).
    assert "nothing listens there, its connections are refused" in result.stderr and "CURVE" not in result.stderr


def test_status_by_a_config_that_reaches_nobody_says_where_the_address_came_from(tmp_path, capsys) -> None:
    port = free_port()
    datagen.generate(str(tmp_path), files=1, samples=2)
    cfg = write_config(
        tmp_path / "c.toml", f'[source]\nfiles = ["*.npy"]\n[service]\nbind = "tcp://127.0.0.1:{port}"\n'
    )
    assert main(["status", cfg, "--timeout", "0.3"]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert f"no loader daemon answered at tcp://127.0.0.1:{port}" in line
    assert f"tcp://127.0.0.1:{port} is service.bind of {cfg} (from {cfg}): a daemon started with --bind" in line
    assert "--address-file PATH" in line and "LOADER_ADDRESS=$(cat PATH)" in line
    # An address given as such is not a config's: no such note.
    assert main(["status", f"127.0.0.1:{port}", "--timeout", "0.3"]) == 1
    assert "service.bind" not in capsys.readouterr().err


def test_status_without_an_address_asks_loader_address(monkeypatch, capsys) -> None:
    port = free_port()
    monkeypatch.setenv("LOADER_ADDRESS", f"127.0.0.1:{port}")
    assert main(["status", "--timeout", "0.3"]) == 1
    assert f"no loader daemon answered at tcp://127.0.0.1:{port}" in capsys.readouterr().err


@pytest.mark.parametrize("fmt", datagen.FORMATS)
def test_gen_data_writes_features_and_labels_for_every_format(tmp_path, fmt) -> None:
    result = loader_cmd("gen-data", str(tmp_path), "--format", fmt, "--files", "2", "--samples", "7", "--dim", "3")
    assert result.returncode == 0, result.stderr
    source = LoaderConfig.from_dict({"source": {"files": [str(tmp_path / "*")]}}).source
    found = survey(source)
    assert (found.files, found.samples) == (2, 14)
    assert [(f.shape, f.dtype) for f in found.fields] == [("(3,)", "float32"), ("()", "int64")]


def test_check_counts_samples_per_field(tmp_path) -> None:
    np.save(tmp_path / "a.npy", np.zeros((5, 2, 3), np.float16))
    np.save(tmp_path / "a.label.npy", np.arange(5, dtype=np.int32))
    np.save(tmp_path / "a.weight.npy", np.ones(5, np.float64))
    np.save(tmp_path / "b.npy", np.zeros((4, 2, 3), np.float16))
    np.save(tmp_path / "b.label.npy", np.arange(4, dtype=np.int32))
    np.save(tmp_path / "b.weight.npy", np.ones(4, np.float64))
    cfg = write_config(tmp_path / "c.toml", '[source]\nfiles = ["*.npy"]\n')
    result = loader_cmd("check", cfg)
    assert result.returncode == 0, result.stderr
    assert "dataset default: 2 files, 9 samples" in result.stdout
    lines = result.stdout.splitlines()
    rows = [line.split() for line in lines[3 : lines.index("  first batch, after the pipeline: 9 samples")]]
    assert rows == [["data", "(2,", "3)", "float16"], ["label", "()", "int32"], ["weight", "()", "float64"]]


MAPPERS = """
import numpy as np

def to_image(sample):
    data, label, weight = sample
    return np.full((3, 4, 4), data.sum(), np.float32), label * 2


def fails_on_label_3(sample):
    if sample[1] == 3:
        raise ValueError("label 3 is not wanted")
    return sample
"""


def _mapped_dataset(tmp_path, mapper: str) -> str:
    np.save(tmp_path / "a.npy", np.zeros((5, 2, 3), np.float16))
    np.save(tmp_path / "a.label.npy", np.arange(5, dtype=np.int32))
    np.save(tmp_path / "a.weight.npy", np.ones(5, np.float64))
    (tmp_path / "check_mappers.py").write_text(MAPPERS)
    body = f'[source]\nfiles = ["a.npy"]\n[pipeline]\nbatch_size = 4\nmappers = ["check_mappers:{mapper}"]\n'
    return write_config(tmp_path / "c.toml", body)


def test_check_shows_the_first_batch_as_the_mappers_leave_it(tmp_path) -> None:
    result = loader_cmd("check", _mapped_dataset(tmp_path, "to_image"))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    start = lines.index("  first batch, after the pipeline: 4 samples")
    rows = [line.split() for line in lines[start + 2 : lines.index("settings (value, and where it came from):")]]
    # The files' fields are data/label/weight; the mapper returns two values, so the batch has the first two names.
    assert rows == [["data", "(4,", "3,", "4,", "4)", "float32"], ["label", "(4,)", "int32"]]
    assert "starts" not in result.stderr and "INFO" not in result.stderr, result.stderr  # the daemon kept quiet


def test_check_of_a_mapper_that_fails_on_real_data_prints_only_the_error_with_file_and_record(tmp_path) -> None:
    from tests.unit.test_cli import assert_one_line_error

    result = loader_cmd("check", _mapped_dataset(tmp_path, "fails_on_label_3"))
    line = assert_one_line_error(result, "dataset default, first batch: ValueError: label 3 is not wanted")
    assert "a.npy" in line and "record 3" in line, line
    assert result.stdout == "", "no 'ok' before the error"
    assert loader_cmd("check", _mapped_dataset(tmp_path, "fails_on_label_3"), "--no-batch").returncode == 0


def test_check_fails_on_a_dataset_without_samples(tmp_path) -> None:
    from loader import recordio
    from tests.unit.test_cli import assert_one_line_error

    writer = recordio.Writer(str(tmp_path / "part-0.recordio"))  # never closed: nothing reached the file
    writer.write([np.zeros(3, np.float32), 1])
    cfg = write_config(tmp_path / "c.toml", '[source]\nfiles = ["*.recordio"]\n')
    result = loader_cmd("check", cfg)
    line = assert_one_line_error(result, "dataset default holds no samples: ")
    assert "part-0.recordio (0 bytes: a RecordIO writer" in line
    assert "never closed" in line
    assert result.stdout == "", "no 'ok' and no settings before the error"
    writer.close()
    assert loader_cmd("check", cfg).returncode == 0


def test_a_companion_with_a_different_length_is_refused(tmp_path) -> None:
    from loader.errors import ShapeMismatchError
    from loader.io.registry import create_file_reader

    np.save(tmp_path / "a.npy", np.zeros((5, 2)))
    np.save(tmp_path / "a.label.npy", np.zeros(4))
    with pytest.raises(ShapeMismatchError, match="different numbers of rows"):
        create_file_reader(str(tmp_path / "a.npy"))


@pytest.mark.parametrize(("script", "says"), [("bench", "--quick"), ("test", "--fast"), ("demo", "--local")])
def test_help_of_the_scripts_sets_up_and_installs_nothing(tmp_path, script, says) -> None:
    # A copy of scripts/ in a folder with no .venv and no project: help must not need either.
    import shutil

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    shutil.copytree(os.path.join(root, "scripts"), tmp_path / "scripts")
    env = {**os.environ, "PYTHON": sys.executable, "PATH": os.environ.get("PATH", "")}
    done = subprocess.run(
        [str(tmp_path / "scripts" / script), "--help"], capture_output=True, text=True, timeout=CMD_TIMEOUT_S, env=env
    )
    assert done.returncode == 0, done.stderr
    assert says in done.stdout
    assert not (tmp_path / ".venv").exists(), "help set up a virtual environment"


# -- check: files a batch cannot take together -----------------------------------------


def _check(tmp_path, capsys, body: str, *flags: str) -> tuple[int, str, list[str]]:
    """``loader check --no-batch`` of a config in ``tmp_path``, run from there: (code, stdout, stderr lines)."""
    cfg = write_config(tmp_path / "c.toml", body)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        code = main(["check", cfg, "--no-batch", *flags])
    finally:
        os.chdir(cwd)
    out, err = capsys.readouterr()
    return code, out, err.splitlines()


def _error(code: int, out: str, err: list[str]) -> str:
    assert code == 1 and out == "", (out, err)  # the error, and no "ok" before or after it
    (line,) = err
    assert line.startswith("loader: error: dataset default: "), line
    return line


def test_check_fails_when_files_have_other_fields(tmp_path, capsys) -> None:
    np.save(tmp_path / "part-0.npy", np.zeros((6, 4), np.float32))
    np.save(tmp_path / "part-0.label.npy", np.zeros(6, np.int64))
    np.savez(tmp_path / "arch-0.npz", image=np.zeros((5, 8), np.float32), label=np.zeros(5, np.int64))
    line = _error(*_check(tmp_path, capsys, '[source]\nfiles = ["*.np?"]\n'))
    assert "arch-0.npz has fields image, label; part-0.npy has data, label" in line
    assert "every file of a dataset needs the same fields" in line


@pytest.mark.parametrize("fields", [["image"], ["image", "label", "weight"]])
def test_check_fails_when_source_fields_names_another_number_of_fields_than_the_files_have(
    tmp_path, capsys, fields
) -> None:
    # Without mappers the samples are the files' slots, and names of another count were dropped: the batches
    # came as fields "0" and "1", neither the names given nor the files' own, and the loop's batch["image"]
    # failed with KeyError.
    np.save(tmp_path / "part-0.npy", np.zeros((6, 4), np.float32))
    np.save(tmp_path / "part-0.label.npy", np.zeros(6, np.int64))
    line = _error(*_check(tmp_path, capsys, f'[source]\nfiles = ["part-*.npy"]\nfields = {fields!r}\n'))
    assert f"source.fields names {len(fields)} field" in line
    assert "part-0.npy has 2 (data, label)" in line and "name each of them, in order" in line


def test_check_warns_of_a_field_count_the_mappers_may_change(tmp_path, capsys) -> None:
    np.save(tmp_path / "part-0.npy", np.zeros((6, 4), np.float32))
    (tmp_path / "maps.py").write_text("def split(sample):\n    data, label = sample\n    return data, data, label\n")
    body = '[source]\nfiles = ["part-*.npy"]\nfields = ["a", "b", "c"]\n[pipeline]\nmappers = ["maps:split"]\n'
    np.save(tmp_path / "part-0.label.npy", np.zeros(6, np.int64))
    code, out, err = _check(tmp_path, capsys, body)
    assert code == 0 and "ok" in out
    assert any("source.fields names 3 fields" in line and "the mappers must return that many" in line for line in err)


_READERS = """\
def yields_itself(path):
    yield [1.0, 2.0], 0


def unpacks_the_path(path):
    image, label = path
    return lambda: iter([])


def fails_at_record_1(path):
    def read():
        yield [1.0, 2.0], 0
        raise OSError("bad block")

    return read
"""


@pytest.mark.parametrize(
    ("function", "says"),
    [
        ("yields_itself", "returned a generator, not a reader: function(path) returns a zero-argument callable"),
        ("unpacks_the_path", "source.reader 'readers:unpacks_the_path' failed on a.txt: ValueError: too many values"),
        ("fails_at_record_1", "source.reader 'readers:fails_at_record_1' failed on a.txt at record 1: OSError: bad"),
    ],
)
def test_check_names_the_source_reader_and_the_file_when_the_reader_fails(tmp_path, capsys, function, says) -> None:
    # check printed the bare exception ("too many values to unpack (expected 2)", "bad block") or an
    # "unexpected TypeError: 'generator' object is not callable", naming neither the reader nor the file.
    (tmp_path / "readers.py").write_text(_READERS)
    (tmp_path / "a.txt").write_text("x\n")
    code, out, err = _check(tmp_path, capsys, f'[source]\nfiles = ["a.txt"]\nreader = "readers:{function}"\n')
    assert code == 1 and out == ""
    (line,) = err
    assert line.startswith("loader: error: ") and says in line, line


def test_check_names_a_missing_npy_companion(tmp_path, capsys) -> None:
    for i in range(2):
        np.save(tmp_path / f"part-{i}.npy", np.zeros((6, 4), np.float32))
    np.save(tmp_path / "part-0.label.npy", np.zeros(6, np.int64))
    line = _error(*_check(tmp_path, capsys, '[source]\nfiles = ["part-*.npy"]\n'))
    assert "part-1.npy has no part-1.label.npy (part-0.npy has fields data, label; part-1.npy has data)" in line


def test_check_fails_on_recordio_files_of_list_and_of_dict_records(tmp_path, capsys) -> None:
    from loader import recordio

    with recordio.Writer(str(tmp_path / "a.recordio")) as writer:
        writer.write([np.zeros(3, np.float32), 1])
    with recordio.Writer(str(tmp_path / "b.recordio")) as writer:
        writer.write({"x": np.zeros(3, np.float32), "y": 1})
    line = _error(*_check(tmp_path, capsys, '[source]\nfiles = ["*.recordio"]\n'))
    assert "a.recordio has fields slot0, slot1; b.recordio has x, y" in line


@pytest.mark.parametrize(
    "label_1, says",
    [
        (np.zeros(5, np.int32), "field 'label' has dtype int64 in part-0.label.npy but int32 in part-1.label.npy"),
        (np.zeros((5, 2), np.int64), "field 'label' has shape () in part-0.label.npy but (2,) in part-1.label.npy"),
    ],
)
def test_check_fails_on_a_field_a_stacked_batch_cannot_take_from_every_file(tmp_path, capsys, label_1, says) -> None:
    for i, label in enumerate([np.zeros(5, np.int64), label_1]):
        np.save(tmp_path / f"part-{i}.npy", np.zeros((5, 4), np.float32))
        np.save(tmp_path / f"part-{i}.label.npy", label)
    body = '[source]\nfiles = ["part-*.npy"]\n'
    line = _error(*_check(tmp_path, capsys, body))
    assert says in line and "a stacked batch needs one" in line and "batch_format = 'list'" in line
    code, out, err = _check(tmp_path, capsys, body + '[pipeline]\nbatch_format = "list"\n')  # list batches: fine
    assert code == 0 and err == [] and ": ok," in out.splitlines()[0], (out, err)


def test_check_warns_of_differences_the_mappers_may_reconcile(tmp_path, capsys) -> None:
    for i, dtype in enumerate([np.int64, np.int32]):
        np.save(tmp_path / f"part-{i}.npy", np.zeros((5, 4), np.float32))
        np.save(tmp_path / f"part-{i}.label.npy", np.zeros(5, dtype))
    (tmp_path / "casts.py").write_text("def cast(sample):\n    return sample[0], int(sample[1])\n")
    code, out, err = _check(
        tmp_path, capsys, '[source]\nfiles = ["part-*.npy"]\n[pipeline]\nmappers = ["casts:cast"]\n'
    )
    assert code == 0 and ": ok," in out.splitlines()[0], out
    (line,) = err
    assert line.startswith("loader: warning: dataset default: field 'label' has dtype int64") and "mappers" in line


def test_check_warns_of_a_file_without_samples_beside_good_ones(tmp_path, capsys) -> None:
    from loader import recordio

    with recordio.Writer(str(tmp_path / "a.recordio")) as writer:
        writer.write([np.zeros(3, np.float32), 1])
    (tmp_path / "b.recordio").write_bytes(b"")  # what a writer that was never closed leaves
    code, out, err = _check(tmp_path, capsys, '[source]\nfiles = ["*.recordio"]\n')
    assert code == 0 and ": ok," in out.splitlines()[0]
    (line,) = err
    assert line.startswith("loader: warning: dataset default: no samples in b.recordio (0 bytes: a RecordIO writer")


@pytest.mark.parametrize(
    ("bad", "said"),
    [
        # The daemon drops a zero-width frame as malformed: the epoch failed as "a chunk was lost on the way".
        (np.zeros(5, "V0"), "field 'data' in part-1.npy has the zero-width dtype |V0 (its values hold no bytes)"),
        (np.zeros(5, [("a", "<i4"), ("b", "<f8")]), "field 'data' in part-1.npy has the structured dtype"),
        (np.array(["x"] * 5), "field 'data' has dtype int64 in part-0.npy but <U1 in part-1.npy: a stacked batch"),
    ],
)
def test_check_fails_on_a_dtype_an_epoch_refuses_naming_file_and_field(tmp_path, capsys, bad, said) -> None:
    # The survey compares numbers only: these passed check and failed the epoch.
    np.save(tmp_path / "part-0.npy", np.arange(5, dtype=np.int64))
    np.save(tmp_path / "part-1.npy", bad)
    np.save(tmp_path / "part-2.npy", np.arange(5, dtype=np.int64))
    line = _error(*_check(tmp_path, capsys, '[source]\nfiles = ["part-*.npy"]\n'))
    assert line.startswith(f"loader: error: dataset default: {said}"), line
    (tmp_path / "casts.py").write_text("def cast(sample):\n    return (0,)\n")
    code, out, err = _check(
        tmp_path, capsys, '[source]\nfiles = ["part-*.npy"]\n[pipeline]\nmappers = ["casts:cast"]\n'
    )
    assert code == 0 and [line.split(": ", 2)[:2] for line in err] == [["loader", "warning"]], err
    assert said in err[0] and err[0].endswith("(the mappers must change it)")


def test_check_fails_on_text_of_two_widths_in_stacked_batches(tmp_path, capsys) -> None:
    # <U2 in one file and <U4 in another passed check; the epoch then failed ("dtype str64, but ... str96").
    for i in range(2):
        np.save(tmp_path / f"part-{i}.npy", np.arange(5, dtype=np.int64))
        np.save(tmp_path / f"part-{i}.name.npy", np.array(["ab" * (i + 1)] * 5))
    line = _error(*_check(tmp_path, capsys, '[source]\nfiles = ["part-*.npy"]\n'))
    assert "field 'name' has dtype <U2 in part-0.npy but <U4 in part-1.npy: a stacked batch" in line, line


@pytest.mark.parametrize(("suffix", "format_line"), [(".NPY", ""), (".arr", 'format = "npy"\n')])
def test_check_compares_text_widths_by_the_files_format_not_its_suffix(tmp_path, capsys, suffix, format_line) -> None:
    # Files read as .npy whose name does not end in ".npy" were not compared: check passed, the epoch failed.
    for i in range(2):
        np.save(tmp_path / f"x{i}.npy", np.array(["ab" * (i + 1)] * 5))
        os.replace(tmp_path / f"x{i}.npy", tmp_path / f"part-{i}{suffix}")
    line = _error(*_check(tmp_path, capsys, f'[source]\nfiles = ["part-*{suffix}"]\n{format_line}'))
    assert "has dtype <U2 in part-0" in line and "but <U4 in part-1" in line, line


def test_check_takes_text_fields_alike_in_every_file(tmp_path, capsys) -> None:
    for i in range(2):
        np.save(tmp_path / f"part-{i}.npy", np.arange(5, dtype=np.int64))
        np.save(tmp_path / f"part-{i}.name.npy", np.array(["ab" * (i + 1)] * 5))  # <U2 and <U4: both text
    code, out, err = _check(tmp_path, capsys, '[source]\nfiles = ["part-*.npy"]\n[pipeline]\nbatch_format = "list"\n')
    assert code == 0 and err == [], err


def test_check_warns_once_of_a_match_that_is_not_a_file(tmp_path, capsys) -> None:
    # A shard symlink to an unmounted filesystem was left out without a word: the dataset just got smaller.
    np.save(tmp_path / "part-0.npy", np.zeros((4, 2), np.float32))
    os.symlink("/nonexistent/part-1.npy", tmp_path / "part-1.npy")
    code, out, err = _check(tmp_path, capsys, '[source]\nfiles = ["part-*.npy"]\n')
    assert code == 0 and ": ok," in out.splitlines()[0]
    (line,) = err  # once, though check lists the files for the config, the survey and the leases
    assert line == (
        f"loader: warning: source.files pattern {str(tmp_path / 'part-*.npy')!r}: left out 1 match that is not a "
        f"regular file: {tmp_path / 'part-1.npy'} (a symlink to a missing file) (a shard linked to an unmounted "
        "filesystem makes the dataset smaller)"
    )
    assert "dataset default: 1 file, 4 samples" in out


def test_check_fails_when_drop_last_leaves_every_epoch_empty(tmp_path, capsys) -> None:
    np.save(tmp_path / "part-0.npy", np.zeros((303, 2), np.float32))
    body = '[source]\nfiles = ["part-0.npy"]\n[pipeline]\nbatch_size = 1000\n'
    line = _error(*_check(tmp_path, capsys, body, "--set", "pipeline.drop_last=true"))
    assert "batch_size 1000 > 303 samples with drop_last: every epoch is empty" in line
    assert _check(tmp_path, capsys, body)[0] == 0  # without drop_last, the one batch is short


def test_survey_takes_python_numbers_and_strings_as_a_batch_does(tmp_path) -> None:
    (tmp_path / "a.txt").write_text("x")
    (tmp_path / "mixed_reader.py").write_text(
        "def read(path):\n    return lambda: iter([(1, 'ab', 0.5), (2.5, 'abc', 1)])\n"
    )
    config = LoaderConfig.from_dict(
        {"source": {"files": [str(tmp_path / "a.txt")], "reader": "mixed_reader:read"}, "import_path": [str(tmp_path)]}
    )
    config.add_import_path()
    found = survey(config.source)
    assert found.samples == 2 and found.mismatches == []  # numbers stack to one dtype; strings are not stacked


def test_the_config_a_daemon_says_it_serves_is_shown_only_when_another_and_fit_for_a_line(tmp_path) -> None:
    """A peer's welcome or status names any `config`: a NUL in it raised ValueError out of Client() (leaking its
    socket), 65,000 characters made one log line of them, a relative path was resolved against this side's cwd."""
    from loader.config.address import MAX_SHOWN_PATH, another_config

    given = write_config(tmp_path / "train.toml", '[source]\nfiles = ["*.npy"]\n')
    assert another_config(given, str(tmp_path / "train.toml")) is None, "the same file"
    assert another_config(given, str(tmp_path / "other.toml")) == str(tmp_path / "other.toml")
    for value in ("/etc/x\0y", "other.toml", None, 5, b"/etc/x"):
        assert another_config(given, value) is None, value
    long = another_config(given, "/" + "a" * 65_000)
    assert long is not None and len(long) == MAX_SHOWN_PATH + 3 and long.endswith("...")
    assert another_config(given, "/etc/\x1b[2Jx\nforged") == "/etc/?[2Jx?forged"
