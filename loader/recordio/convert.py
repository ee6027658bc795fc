"""Write the samples of a paddle-style reader into RecordIO files."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterable
from typing import Any

from loader.recordio.chunks import DEFAULT_COMPRESSOR, Compressor
from loader.recordio.writer import Writer


def _refuse_feeder(function: str, compressor: Any) -> None:
    """Fluid's ``convert_reader_to_recordio_file(filename, reader_creator, feeder, ...)`` passes a ``DataFeeder``
    where ``compressor`` stands here: refused by name (``Compressor(feeder)`` said only "is not a valid Compressor")."""
    if isinstance(compressor, (Compressor, int)) or not (
        callable(getattr(compressor, "feed", None)) or "feeder" in type(compressor).__name__.lower()
    ):
        return
    raise TypeError(
        f"{function}: got a feeder ({type(compressor).__name__}) where the compressor goes: this function takes no "
        "feeder and no feed_order (Fluid's did); it writes each sample of the reader as one record, so pass the "
        "sample reader (not paddle.batch(...)) and drop the feeder: convert_reader_to_recordio_file(filename, "
        "reader, compressor, max_num_records)"
    )


def _looks_like_batch(sample: Any) -> bool:
    """A list of tuples: what ``paddle.batch`` yields (one batch of samples), not one sample."""
    return isinstance(sample, list) and bool(sample) and all(isinstance(item, tuple) for item in sample)


def _samples(reader_creator: Callable[[], Iterable[Any]], function: str, filename: str) -> Iterable[Any]:
    source = reader_creator()
    try:
        for index, sample in enumerate(source):
            if index == 0 and _looks_like_batch(sample):
                # Fluid's converter took a batch reader (and a feeder); here a batch would be one record, and the
                # daemon would serve batches of batches. Said once, not refused: a sample may be a list of pairs.
                warnings.warn(
                    f"{function}({filename!r}): the reader's first record is a list of {len(sample)} tuples, a batch "
                    "(paddle.batch?): each record is written as that whole batch; pass the sample reader to write "
                    "one record per sample",
                    UserWarning,
                    stacklevel=4,
                )
            yield sample
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
    """Write every sample of a paddle-style reader as one record; return how many.

    ``TypeError`` for a feeder in ``compressor``'s place (Fluid's argument order); a warning when the reader
    gives batches (lists of tuples), each of which would be one record."""
    _refuse_feeder("convert_reader_to_recordio_file", compressor)
    with Writer(filename, compressor, max_num_records) as writer:
        for sample in _samples(reader_creator, "convert_reader_to_recordio_file", os.fspath(filename)):
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
    _refuse_feeder("convert_reader_to_recordio_files", compressor)
    name = os.fspath(filename)
    stem, ext = os.path.splitext(name)
    if ext != ".recordio":
        raise ValueError(f"filename must end with .recordio, got {name!r}")
    if batch_per_file <= 0:
        raise ValueError(f"batch_per_file must be > 0, got {batch_per_file}")
    paths: list[str] = []
    writer: Writer | None = None
    try:
        for sample in _samples(reader_creator, "convert_reader_to_recordio_files", name):
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
