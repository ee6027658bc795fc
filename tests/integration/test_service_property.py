"""Every record exactly once per epoch across worker counts, shuffle on/off, whole files or pieces of them,
and two ranks."""

from __future__ import annotations

import collections

import pytest

from loader import Client
from tests.integration.conftest import (
    assert_ranks_cover_once,
    collect_ids,
    collect_ranks,
    make_config,
    running_daemon,
    write_id_files,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SIZES = [97, 0, 250, 31, 180, 1, 64]


@pytest.mark.parametrize("workers", [1, 2, 3])
@pytest.mark.parametrize("shuffle", [0, 64])
@pytest.mark.parametrize("per_lease", [0, 40], ids=["files", "pieces"])  # source.records_per_lease
def test_exactly_once(tmp_path, workers, shuffle, per_lease):
    ids = write_id_files(tmp_path, len(SIZES), SIZES)
    config = make_config(
        tmp_path,
        source={"files": [str(tmp_path / "*.npy")], "records_per_lease": per_lease},
        pipeline={"batch_size": 17, "shuffle_buffer": shuffle},
        workers={"count": workers, "samples_per_message": 23},
    )
    with running_daemon(config) as daemon:
        # One client, then two ranks of world_size 2, against the same warm daemon.
        with Client(daemon.endpoint) as client:
            for _ in range(2):
                assert collections.Counter(collect_ids(client.epoch())) == collections.Counter(ids)
        with Client(daemon.endpoint, rank=0, world_size=2) as a, Client(daemon.endpoint, rank=1, world_size=2) as b:
            for _ in range(2):
                assert_ranks_cover_once(collect_ranks([a, b]), ids)
