"""A worker's ``FileJob`` run on its own, for unit tests: the frames it would send."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from loader.config import LoaderConfig
from loader.service import protocol as P
from workers.arena_writer import ArenaWriter
from workers.file_job import FileJob


def run_file_job(
    lease: P.Lease,
    config: LoaderConfig,
    arena: ArenaWriter | None = None,
    check: Callable[[], None] = lambda: None,
    copied: bool = False,
) -> list[list[Any]]:
    """Run ``lease`` with the config's mappers and batch mappers and ``arena``; every message's frames (``copied``:
    as bytes taken when sent, as a transport takes them, where a ``.npy`` block's frames are views of its mapping).
    ``check`` is called before each read, as the worker's cancel check is."""
    sent: list[list[Any]] = []

    def send(frames: list[Any]) -> None:
        sent.append([bytes(frame) for frame in frames] if copied else frames)

    job = FileJob(
        lease,
        config=config,
        worker_id="w",
        mappers=lambda: config.pipeline.resolve_mappers("mappers"),
        batch_mappers=lambda: config.pipeline.resolve_mappers("batch_mappers"),
        arena=lambda: arena,
        send_data=send,
        check=check,
    )
    job.run()
    return sent
