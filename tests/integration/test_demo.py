"""scripts/demo runs end to end: dataset, daemon, two epochs, status, clean SIGTERM stop."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.helpers import REPO_ROOT

ROOT = REPO_ROOT
DEMO_TIMEOUT_S = 60.0


def run_demo(*args: str) -> subprocess.CompletedProcess[str]:
    # scripts/demo only sets up .venv and execs scripts/demo.py; call the latter with this interpreter.
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "demo.py"), *args],
        capture_output=True,
        text=True,
        timeout=DEMO_TIMEOUT_S,
        cwd=ROOT,
    )


@pytest.mark.integration
@pytest.mark.slow
def test_demo_serves_two_epochs_and_stops_cleanly() -> None:
    result = run_demo()
    assert result.returncode == 0, result.stdout + result.stderr
    epochs = re.findall(r"^epoch (\d): (\d+) batches, (\d+) samples", result.stdout, re.M)
    assert epochs == [("0", "47", "6000"), ("1", "47", "6000")], result.stdout
    # The issue: the demo "prints samples/s and batches per epoch".
    assert len(re.findall(r"^epoch \d: .*\([0-9,]+ samples/s\)", result.stdout, re.M)) == 2, result.stdout
    assert_loss_falls(result.stdout)
    assert "workers:" in result.stdout  # the loader status table
    assert "exit code 0" in result.stdout
    assert "Traceback" not in result.stderr


def test_demo_local_pipeline() -> None:
    result = run_demo("--local")
    assert result.returncode == 0, result.stderr
    assert len(re.findall(r"^epoch \d: 47 batches, 6000 samples", result.stdout, re.M)) == 2
    assert_loss_falls(result.stdout)


def assert_loss_falls(stdout: str) -> None:
    losses = [float(x) for x in re.findall(r"^epoch \d: .* loss ([0-9.]+),", stdout, re.M)]
    assert len(losses) == 2 and losses[1] < losses[0] < 2.31, stdout  # 2.30 = ln(10), a model that knows nothing


def test_demo_script_is_executable() -> None:
    path = os.path.join(ROOT, "scripts", "demo")
    assert os.access(path, os.X_OK)
    assert open(path, encoding="utf-8").read().startswith("#!/usr/bin/env bash")
