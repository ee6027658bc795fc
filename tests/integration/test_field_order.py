"""Files whose fields come in another order (``.npz`` keys, dict samples) are joined by name in batches."""

from __future__ import annotations

import numpy as np
import pytest

from loader import Client
from tests.integration.conftest import make_config, running_daemon


@pytest.mark.parametrize("batch_format", ["stacked", "list"])
def test_npz_files_with_their_keys_in_another_order_make_one_epoch(tmp_path, batch_format) -> None:
    # Before: the second file failed its epoch ("a sample has fields ['weight', 'label'], but the batch has ...").
    np.savez(tmp_path / "a.npz", label=np.array([1, 1]), weight=np.array([100, 100]))
    np.savez(tmp_path / "b.npz", weight=np.array([200, 200]), label=np.array([2, 2]))
    config = make_config(
        tmp_path,
        source={"files": [str(tmp_path / "a.npz"), str(tmp_path / "b.npz")]},
        pipeline={"batch_size": 4, "batch_format": batch_format},
        workers={"count": 1},
    )
    with running_daemon(config) as daemon, Client(daemon.endpoint) as client:
        (batch,) = list(client.epoch())
    if batch_format == "stacked":
        assert batch["label"].tolist() == [1, 1, 2, 2] and batch["weight"].tolist() == [100, 100, 200, 200]
    else:
        assert [(int(label), int(weight)) for label, weight in batch] == [(1, 100), (1, 100), (2, 200), (2, 200)]
