"""Rough edges a newcomer met in a first hour: install lines, check's metrics and lease advice, status's no-answer
line, gen-data over an earlier run, list batches in check, and a loader.torch state given to a loader."""

from __future__ import annotations

import pathlib
import re
import sys

import numpy as np
import pytest

from loader.cli import main
from loader.errors import ConfigError, ServiceUnavailableError
from loader.service.client import ask
from loader.service.client.ask import query_status
from loader.service.client.checkpoint import TORCH_READER_KEY, Place, place_of
from tests.helpers import free_port
from tests.unit.test_cli import loader_cmd, write_config

ROOT = pathlib.Path(__file__).resolve().parents[2]
# `pip install 'loader-service[...]'` finds no distribution: the package is on no index (README, "Install").
FROM_THE_INDEX = re.compile(r"pip install\s+['\"]?loader-service\[")


# -- A: extras are installed from the checkout ---------------------------------------------------------------------
def test_the_docs_install_extras_from_the_checkout_not_the_index() -> None:
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text(encoding="utf-8")
        found = FROM_THE_INDEX.search(text)
        assert found is None, f"{path.name}:{text.count(chr(10), 0, found.start()) + 1} installs from the index"


def test_the_missing_metrics_package_says_to_install_the_extra_from_the_checkout(monkeypatch) -> None:
    from loader.service.daemon.metrics import require_prometheus_client

    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(ConfigError) as info:
        require_prometheus_client()
    assert not FROM_THE_INDEX.search(str(info.value)), str(info.value)
    assert "pip install '/path/to/loader[metrics]'" in str(info.value)


# -- B: check refuses service.metrics without prometheus_client, as serve does -------------------------------------
def _one_npy(tmp_path: pathlib.Path, rows: int = 10) -> None:
    np.save(tmp_path / "one.npy", np.zeros((rows, 3), np.float32))
    np.save(tmp_path / "one.label.npy", np.arange(rows, dtype=np.int64))


@pytest.mark.parametrize(
    ("body", "flags", "source"),
    [
        ("", ["--set", 'service.metrics="127.0.0.1:9100"'], '(--set service.metrics="127.0.0.1:9100")'),
        ('[service]\nmetrics = "127.0.0.1:9100"\n', [], "c.toml)"),
    ],
)
def test_check_refuses_metrics_without_prometheus_client(tmp_path, capsys, monkeypatch, body, flags, source) -> None:
    _one_npy(tmp_path)
    cfg = write_config(tmp_path / "c.toml", '[source]\nfiles = ["one.npy"]\n' + body)
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    assert main(["check", cfg, "--no-batch", *flags]) == 1
    out, err = capsys.readouterr()
    assert out == "", out  # no "ok" before the error
    (line,) = err.splitlines()
    assert line.startswith("loader: error: service.metrics is set but the prometheus_client package is not installed")
    assert line.endswith(source), line


def test_check_with_metrics_and_prometheus_client_is_ok(tmp_path, capsys) -> None:
    pytest.importorskip("prometheus_client")
    _one_npy(tmp_path)
    cfg = write_config(tmp_path / "c.toml", '[source]\nfiles = ["one.npy"]\n[service]\nmetrics = "127.0.0.1:9100"\n')
    assert main(["check", cfg, "--no-batch"]) == 0
    assert ": ok, " in capsys.readouterr().out


# -- C: the size clause only where a peer listens ------------------------------------------------------------------
@pytest.mark.parametrize("where", ["tcp", "ipc"])
def test_no_answer_where_nothing_listens_says_nothing_of_oversized_answers(tmp_path, where) -> None:
    address = f"tcp://127.0.0.1:{free_port()}" if where == "tcp" else f"ipc://{tmp_path}/no-daemon"
    with pytest.raises(ServiceUnavailableError) as info:
        query_status(address, timeout_s=0.3)
    line = str(info.value)
    said = f"no loader daemon answered at {address} within 0.3s: nothing listens there, its connections are refused"
    assert line.startswith(said), line
    assert "MiB" not in line and "dropped unread" not in line, line


def test_the_probe_looks_up_no_host_name_and_tries_localhost(monkeypatch) -> None:
    port = free_port()
    assert ask._nothing_listens(f"tcp://localhost:{port}")  # /etc/hosts, no resolver: probed
    assert ask._nothing_listens(f"tcp://127.0.0.1:{port}")

    def no_lookup(*args, **kwargs):
        raise AssertionError(f"looked up {args[0]!r}: a broken resolver would hold the error line for seconds")

    monkeypatch.setattr(ask.socket, "create_connection", no_lookup)
    assert ask._nothing_listens(f"tcp://daemon.example:{port}") is False  # cannot tell: the size clause stays


def test_check_names_the_line_a_text_parser_refused(tmp_path, capsys) -> None:
    lines = [f"{i}\t1 2 3 4" for i in range(1, 5)] + ["bad line", "6\t1 2 3 4"]
    (tmp_path / "a.txt").write_text("\n".join(lines) + "\n")
    cfg = write_config(
        tmp_path / "c.toml",
        '[source]\nfiles = ["a.txt"]\nformat = "text"\n'
        '[source.format_options]\nparser = "loader.examples:parse_labeled_line"\n',
    )
    assert main(["check", cfg]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    # The parser's own words, then where: the reader's note (it said neither file nor line).
    assert line == (
        "loader: error: invalid literal for int() with base 10: 'bad line' "
        f"(while parsing line 5 of {tmp_path / 'a.txt'})"
    ), line


# -- D: gen-data over an earlier run's files ------------------------------------------------------------------------
def test_gen_data_warns_of_part_files_an_earlier_run_left(tmp_path, capsys) -> None:
    out = str(tmp_path / "g")
    assert main(["gen-data", out, "--files", "4", "--samples", "8", "--dim", "64"]) == 0
    assert main(["gen-data", out, "--files", "4", "--samples", "8", "--dim", "64"]) == 0  # the same files again
    assert capsys.readouterr().err == ""
    assert main(["gen-data", out, "--files", "2", "--samples", "8", "--dim", "32"]) == 0
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"loader: warning: {out} still holds 4 part files of an earlier run ("), line
    assert "part-00002.label.npy, part-00002.npy, ..." in line and "reads too" in line, line
    # Kept: they may be the user's.
    assert sorted(p.name for p in (tmp_path / "g").iterdir())[-2:] == ["part-00003.label.npy", "part-00003.npy"]
    assert main(["gen-data", out, "--files", "1", "--samples", "8", "--format", "npz"]) == 0
    (line,) = capsys.readouterr().err.splitlines()
    assert "still holds 8 part files" in line, line  # another format's parts match the glob too


# -- E: lease advice as check's own warning -------------------------------------------------------------------------
def test_check_gives_the_records_per_lease_advice_as_its_own_warning_once(tmp_path) -> None:
    np.save(tmp_path / "big.npy", np.zeros((40_000, 64), np.float32))
    cfg = write_config(tmp_path / "c.toml", '[source]\nfiles = ["big.npy"]\n[workers]\ncount = 4\n')
    result = loader_cmd("check", cfg, "--no-batch")
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [
        "loader: warning: dataset 'default': 1 file(s) for 4 workers, one lease each, so at most 1 read at once: "
        "source.records_per_lease = 2500 would cut them into pieces that every worker reads"
    ]


# -- F: a list batch's fields by name -------------------------------------------------------------------------------
def test_check_names_the_fields_of_a_list_batch(tmp_path) -> None:
    _one_npy(tmp_path)
    body = '[source]\nfiles = ["one.npy"]\n[pipeline]\nbatch_format = "list"\nbatch_size = 4\n[workers]\ncount = 1\n'
    result = loader_cmd("check", write_config(tmp_path / "c.toml", body))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    start = lines.index("  first batch, after the pipeline: 4 samples")
    rows = [line.split()[0] for line in lines[start + 2 : lines.index("settings (value, and where it came from):")]]
    assert rows == ["data", "label"]


# -- G: a loader.torch.DataLoader state given to a loader -----------------------------------------------------------
def test_a_torch_data_loader_state_is_named_as_one() -> None:
    import loader.torch

    assert TORCH_READER_KEY in loader.torch.STATE_KEYS  # where loader.torch keeps the reader's state
    inner = Place(0, 8).state("default", 1, None)
    wrapped = {"epoch": 0, "resume": True, TORCH_READER_KEY: inner}
    with pytest.raises(ConfigError) as info:
        place_of(wrapped, "default", None)
    line = str(info.value)
    assert "loader.torch.DataLoader state" in line and f"state[{TORCH_READER_KEY!r}]" in line, line
    assert place_of(wrapped[TORCH_READER_KEY], "default", None) == Place(0, 8)
    with pytest.raises(ConfigError, match=r"not a loader state \(truncated or of something else\): missing kind"):
        place_of({"epoch": 0, "reader": {"kind": "other"}}, "default", None)
