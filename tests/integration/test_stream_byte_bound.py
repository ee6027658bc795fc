"""A job read under a tight ``service.stream_buffer_mib``: the byte bound cuts what the stream holds ahead
(below what its rows bound would allow), and both ranks still read every record exactly once, epoch after
epoch, with the next epoch read ahead; a bound too small for one step fails the epoch in one line."""

from __future__ import annotations

import collections

import numpy as np
import pytest

from loader import Client
from loader.errors import WorkerError
from tests.integration.conftest import collect_ranks, make_config, running_daemon

pytestmark = pytest.mark.integration

FILES, PER_FILE, PAD = 6, 640, 256  # rows of an int64 id and 256 float32: 1,032 bytes each


def _write(directory) -> list[int]:
    ids = []
    for f in range(FILES):
        data = np.arange(f * 10_000, f * 10_000 + PER_FILE, dtype=np.int64)
        np.savez(directory / f"f{f}.npz", data=data, pad=np.zeros((PER_FILE, PAD), np.float32))
        ids.extend(data.tolist())
    return ids


def _config(directory, mib: int):
    return make_config(
        directory,
        source={"files": [str(directory / "*.npz")]},
        pipeline={"batch_size": 64, "shuffle_buffer": 50, "seed": 3},
        service={"stream_buffer_mib": mib},
    )


def test_two_ranks_read_every_record_once_under_a_tight_byte_bound(tmp_path):
    ids = _write(tmp_path)
    with running_daemon(_config(tmp_path, 2)) as daemon:
        ranks = [Client(daemon.endpoint, rank=r, world_size=2, timeout_s=30, prefetch=16) for r in range(2)]
        try:
            for _ in range(3):
                got = collect_ranks(ranks)
                assert collections.Counter(got[0] + got[1]) == collections.Counter(ids)
                assert len(got[0]) == len(got[1])
            # The bound was the byte bound: 2 MiB of rows of about 1 KiB (2,032), below the rows bound (2 x 50
            # shuffled + 128-row steps x (16 prefetched + 2) + a 640-row chunk = 3,044).
            stream = max(daemon.stage.streams.values(), key=lambda s: s.rows_taken)
            assert stream.row_bytes == 8 + PAD * 4
            assert daemon.stage.buffer_limit_rows(stream) == 2 * 2**20 // stream.row_bytes
            assert daemon.stage.rows_needed(stream) < 2 * 2**20 // stream.row_bytes < 2 * 50 + 128 * 18 + 640
        finally:
            for client in ranks:
                client.close()


def test_a_bound_smaller_than_one_step_fails_the_epoch_naming_the_setting(tmp_path):
    _write(tmp_path)
    config = _config(tmp_path, 1)
    with running_daemon(config) as daemon:
        # A step of 64 x 64 rows of 1 KiB is 4 MiB: over 1 MiB.
        ranks = [Client(daemon.endpoint, rank=r, world_size=64, timeout_s=30) for r in range(1)]
        try:
            with pytest.raises(WorkerError, match=r"world_size 64 x batch_size 64.*stream_buffer_mib = 1"):
                list(ranks[0].epoch())
        finally:
            ranks[0].close()
