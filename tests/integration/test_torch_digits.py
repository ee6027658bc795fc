"""``loader.torch`` over a real daemon, and the digits example: killed mid-epoch, resumed, same weights."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import loader

pytestmark = pytest.mark.integration
torch = pytest.importorskip("torch", reason="loader.torch needs torch: pip install -e '.[test]' installs it")
pytest.importorskip("sklearn", reason="the digits example needs scikit-learn: pip install -e '.[test]' installs it")

from loader.examples.torch_digits import prepare  # noqa: E402  (after the skips: it needs both)
from loader.torch import DataLoader  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DIGITS, BATCHES = 1797, 29  # ceil(1797 / 64)
RESUME_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> str:
    return prepare(str(tmp_path_factory.mktemp("digits")))


def _labels(batches) -> np.ndarray:
    return np.concatenate([batch["label"].numpy() for batch in batches])


def test_a_config_gives_epochs_of_torch_tensors_with_their_length(config, no_leaks):
    from sklearn.datasets import load_digits

    with DataLoader(config, device="cpu") as data:
        assert len(data) == BATCHES
        batches = list(data)
        assert len(batches) == BATCHES
        first = batches[0]
        assert first["image"].dtype == torch.float32 and tuple(first["image"].shape) == (64, 64)
        assert first["label"].dtype == torch.int64
        assert sorted(_labels(batches)) == sorted(load_digits().target)
        data.set_epoch(0)
        again = _labels(data)
    assert np.array_equal(again, _labels(batches))  # epoch 0 again: the same batches (seeded, one worker)


def test_an_address_gives_the_daemon_s_batches(config, no_leaks):
    with loader.Loader(loader.load_config(config)) as local, DataLoader(local.endpoint, device="torch") as data:
        labels = _labels(data)
        assert isinstance(next(iter(data))["image"], torch.Tensor)
    assert len(labels) == DIGITS


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(loader.Loader, "state_dict"), reason="needs the checkpoint API (Loader.state_dict)")
def test_a_training_killed_mid_epoch_and_resumed_ends_with_the_same_weights():
    done = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "digits_resume.py")],
        capture_output=True,
        text=True,
        timeout=RESUME_TIMEOUT_S,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "resumed from" in done.stdout and "identical weights" in done.stdout
