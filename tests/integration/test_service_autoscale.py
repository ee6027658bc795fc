"""Autoscaled workers: the pool grows to workers.max under a slow mapper, shrinks to min when the client stops,
and every epoch read while it changes is exactly-once."""

from __future__ import annotations

import collections

import pytest

from loader import Client
from loader.config import LoaderConfig
from loader.errors import ConfigError
from loader.service.client.client import query_status
from loader.service.daemon import autoscale
from tests.helpers import wait_until
from tests.integration.conftest import collect_ids, make_config, read_while_growing, running_daemon, write_id_files

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def alive_workers(endpoint: str) -> int:
    return sum(1 for w in query_status(endpoint)["workers"] if w["alive"])


def test_pool_grows_to_max_while_the_client_waits_and_shrinks_when_it_stops(tmp_path, monkeypatch):
    # Shorter delays than the defaults (1 s, 3 s): their hysteresis is tested on a fake clock in
    # tests/unit/service/daemon/test_autoscale.py; here the pool's real growth and shrinking are.
    monkeypatch.setattr(autoscale, "GROW_AFTER_S", 0.5)
    monkeypatch.setattr(autoscale, "SHRINK_AFTER_S", 1.5)
    ids = write_id_files(tmp_path, 12, 150)
    config = make_config(
        tmp_path,
        # ~0.3 s of mapping per file for one worker: a client reading as fast as it can waits.
        pipeline={"mappers": ["tests.helpers:slow_sample_2ms"], "batch_size": 16},
        workers={"count": 1, "min": 1, "max": 3, "samples_per_message": 16},
    )
    with running_daemon(config) as daemon:
        assert wait_until(lambda: alive_workers(daemon.endpoint) == 1, timeout_s=20)
        with Client(daemon.endpoint, timeout_s=20) as client:
            # Epochs, each exactly-once while workers join, until the pool has grown.
            peak = read_while_growing(client, lambda: alive_workers(daemon.endpoint), ids, 3)
            assert peak == 3  # grown to max, never beyond
            assert daemon.autoscaler.desired <= 3
        # The client left: the idle workers are retired, down to min, and not replaced.
        assert wait_until(lambda: alive_workers(daemon.endpoint) == 1, timeout_s=30)
        assert query_status(daemon.endpoint)["worker_restarts"] == 0
        assert daemon.autoscaler.desired == 1
        # The one left still serves an exact epoch.
        with Client(daemon.endpoint, timeout_s=20) as client:
            assert collections.Counter(collect_ids(client.epoch())) == collections.Counter(ids)


@pytest.mark.parametrize(
    ("values", "match"),
    [
        ({"count": 4, "max": 3}, "workers.max must be >= workers.count"),
        ({"count": 1, "min": 2, "max": 3}, "workers.max must be >= workers.count >= workers.min"),
        ({"min": 0}, "workers.min must be >= 1"),
        ({"count": 2, "min": 3}, "workers.min has no effect without workers.max"),  # was accepted, silently
    ],
)
def test_bounds_are_checked(values, match):
    with pytest.raises(ConfigError, match=match):
        LoaderConfig.from_dict({"source": {"files": ["x"]}, "workers": values})
