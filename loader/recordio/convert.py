"""Write the samples of a paddle-style reader into RecordIO files."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

from loader.recordio.chunks import DEFAULT_COMPRESSOR, Compressor
from loader.recordio.writer import Writer


def _samples(reader_creator: Callable[[], Iterable[Any]]) -> Iterable[Any]:
    source = reader_creator()
    try:
        yield from source
    finally:
        close = getattr(source, "close", None)
        if close is not None:
            close()  # a failed write must not leave the reader's files or threads open


def convert_reader_to_recordio_file(
    filename: str | os.PathLike[str],
    reader_creator: Callable[[], Iterable[Any]],
    compressor: Compressor | int = DEFAULT_COMPRESSOR,
    max_num_records: int = 1000,
) -> int:
    """Write every sample of a paddle-style reader as one record; return how many."""
    with Writer(filename, compressor, max_num_records) as writer:
        for sample in _samples(reader_creator):
            writer.write(sample)
        return writer.num_records


def convert_reader_to_recordio_files(
    filename: str | os.PathLike[str],
    batch_per_file: int,
    reader_creator: Callable[[], Iterable[Any]],
    compressor: Compressor | int = DEFAULT_COMPRESSOR,
    max_num_records: int = 1000,
) -> list[str]:
    """Split a reader's samples over files of ``batch_per_file`` records each.

    Files are named ``<stem>-00000.recordio``, ``<stem>-00001.recordio``, ... (the
    number counts files). Every sample is written exactly once: each file gets
    ``batch_per_file`` records and the last one the remainder (the original gave
    the first file one extra and dropped the tail). A reader with no samples
    writes no file. Returns the paths written, in order.
    """
    name = os.fspath(filename)
    stem, ext = os.path.splitext(name)
    if ext != ".recordio":
        raise ValueError(f"filename must end with .recordio, got {name!r}")
    if batch_per_file <= 0:
        raise ValueError(f"batch_per_file must be > 0, got {batch_per_file}")
    paths: list[str] = []
    writer: Writer | None = None
    try:
        for sample in _samples(reader_creator):
            if writer is None or writer.num_records >= batch_per_file:
                if writer is not None:
                    writer.close()
                paths.append(f"{stem}-{len(paths):05d}.recordio")
                writer = Writer(paths[-1], compressor, max_num_records)
            writer.write(sample)
    finally:
        if writer is not None:
            writer.close()
    return paths


__all__ = ["convert_reader_to_recordio_file", "convert_reader_to_recordio_files"]
