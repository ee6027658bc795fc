"""A worker's ``FileJob`` run on its own, for unit tests: the frames it would send."""

from __future__ import annotations

from typing import Any

from loader.config import LoaderConfig
from loader.service import protocol as P
from workers.arena_writer import ArenaWriter
from workers.file_job import FileJob


def run_file_job(lease: P.Lease, config: LoaderConfig, arena: ArenaWriter | None = None) -> list[list[Any]]:
    """Run ``lease`` with the config's mappers and batch mappers and ``arena``; every message's frames."""
    sent: list[list[Any]] = []
    job = FileJob(
        lease,
        config=config,
        worker_id="w",
        mappers=lambda: config.pipeline.resolve_mappers("mappers"),
        batch_mappers=lambda: config.pipeline.resolve_mappers("batch_mappers"),
        arena=lambda: arena,
        send_data=sent.append,
        check=lambda: None,
    )
    job.run()
    return sent
