"""Batch mappers end to end: every sample once, mapped, in one batch sequence whatever the workers, and on resume.

Like test_order_and_resume.py, every check compares whole batch sequences.
"""

from __future__ import annotations

import collections
from typing import Any

import numpy as np
import pytest

import loader
from tests.integration.conftest import make_config, running_daemon, write_id_files
from tests.integration.test_order_and_resume import SIZES, clients

pytestmark = pytest.mark.integration

Rows = list[list[tuple[int, int]]]  # batches of (id, code) rows


@pytest.fixture(scope="module")
def data(tmp_path_factory: Any) -> tuple[Any, list[int]]:
    directory = tmp_path_factory.mktemp("batch-mapper-data")
    return directory, write_id_files(directory, len(SIZES), SIZES)


def config(directory: Any, mappers: list[str], *, workers: int) -> Any:
    return make_config(
        directory,
        pipeline={
            "batch_size": 8,
            "shuffle_buffer": 50,
            "seed": 11,
            "mappers": mappers,
            "batch_mappers": ["tests.helpers:id_and_code_block"],
        },
        workers={"count": workers, "samples_per_message": 16},
    )


def rows_of(batch: dict[str, Any]) -> list[tuple[int, int]]:
    return list(zip(np.asarray(batch["data"]).tolist(), np.asarray(batch["code"]).tolist()))


# No per-sample mappers: the fast block path feeds the batch mapper; with one: the chunks it builds do.
@pytest.mark.parametrize("mappers", [[], ["tests.helpers:identity_mapper"]], ids=["blocks", "after-mappers"])
def test_batch_mappers_keep_one_batch_sequence_across_workers_and_resume(data: Any, mappers: list[str]) -> None:
    directory, ids = data
    with loader.Loader(config(directory, mappers, workers=1)) as one:
        reference: Rows = [rows_of(b) for b in one.epoch(0)]
    every = [row for batch in reference for row in batch]
    assert collections.Counter(i for i, _ in every) == collections.Counter(ids), "every sample once"
    assert all(code == 3 * i + 1 for i, code in every), "each with its mapped value"
    with running_daemon(config(directory, mappers, workers=3)) as daemon, clients(daemon.endpoint, 1) as [client]:
        assert [rows_of(b) for b in client.epoch(0)] == reference, "3 workers: the same batches"

    cut = len(reference) // 2 + 3
    with loader.Loader(config(directory, mappers, workers=2)) as first:
        head = []
        for batch in first.epoch(0):
            head.append(rows_of(batch))
            if len(head) == cut:
                break
        state = first.state_dict()
    assert state["fingerprint"]["batch_mappers"], "the checkpoint names the batch mappers"
    with running_daemon(config(directory, mappers, workers=3)) as daemon, clients(daemon.endpoint, 1) as [client]:
        client.load_state_dict(state)
        tail = [rows_of(b) for b in client.epoch()]
    assert head + tail == reference, "resumed mid-epoch: the rest of the same sequence"
