"""loader.examples.torch_digits: a user's mistake on its command line ends in one line, not a traceback."""

from __future__ import annotations

import pytest

from loader.examples import torch_digits

pytest.importorskip("torch", reason="the digits example trains with torch")


def _one_error_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert torch_digits.main(argv) == 1
    (line,) = capsys.readouterr().err.splitlines()
    return line


def test_a_config_that_does_not_exist_is_one_line(tmp_path, capsys) -> None:
    # The example's README command with a mistyped path raised ConfigError through a traceback.
    line = _one_error_line(capsys, ["train", str(tmp_path / "digts.toml")])
    assert line.startswith("torch_digits: error: config file") and "digts.toml' does not exist" in line


def test_resuming_from_a_checkpoint_that_does_not_exist_is_one_line_before_any_worker_starts(tmp_path, capsys) -> None:
    # torch.load's FileNotFoundError came through a traceback, after the loader had started its workers.
    missing = tmp_path / "ck.pt"
    line = _one_error_line(capsys, ["train", str(tmp_path / "any.toml"), "--checkpoint", str(missing), "--resume"])
    assert line == f"torch_digits: error: --resume: the checkpoint {str(missing)!r} does not exist"
