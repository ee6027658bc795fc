"""`loader status` shows, per client, the files of its epoch and how many are done (the issue: files done/left)."""

from __future__ import annotations

import pytest

from loader import Client
from loader.cli import format_status
from loader.service.client.client import query_status
from tests.integration.conftest import make_config, running_daemon, write_id_files

pytestmark = pytest.mark.integration


def test_status_shows_each_clients_epoch_files_and_files_done(tmp_path) -> None:
    ids = write_id_files(tmp_path, 4, 64)
    config = make_config(tmp_path, pipeline={"batch_size": 16}, workers={"count": 1})
    with running_daemon(config) as daemon, Client(daemon.endpoint, timeout_s=10.0, prefetch=1) as client:
        batches = iter(client.epoch())
        next(batches)  # the epoch has begun: its files are known, not all of them read
        during = query_status(daemon.endpoint)["clients"][0]
        assert during["epoch_files"] == 4
        assert 0 <= during["epoch_files_done"] <= 4
        taken = 16 + sum(len(batch["data"]) for batch in batches)
        assert taken == len(ids)
        after = query_status(daemon.endpoint)
    assert (after["clients"][0]["epoch_files"], after["clients"][0]["epoch_files_done"]) == (4, 4)
    # The epoch whose END was sent is still the client's (it said "-" while the gauge said 0).
    assert after["clients"][0]["epoch"] == 0
    assert "EPOCH_FILES_DONE" in format_status(after)
