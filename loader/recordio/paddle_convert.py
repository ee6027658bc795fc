"""``loader recordio convert SRC DST``: rewrite a PaddlePaddle RecordIO file as this package's records.

Paddle's files (Go or Fluid C++ layout, any compressor) hold pickled samples, serialized
LoDTensors or raw bytes. Converting reads them once with :class:`Scanner` (pickles only with
``allow_pickle``, through the restricted unpickler) and writes each sample encoded by
:mod:`loader.runtime.codec`, so later reads need no opt-in. The conversion streams: one chunk is in
memory at a time, whatever the file's size. It writes ``DST.partial`` and renames it to
``DST`` only when every record was converted, so a failure leaves no half file under ``DST``.
A ``DST`` that is a directory receives ``DST/<SRC's name>``, as ``cp`` does.

A ``LoDTensor`` (from a Fluid record with LoD) has no codec form; it is written as the dict
``{"data": array, "recursive_sequence_lengths": [[...], ...]}``.

``split_batches`` (``--split-batches``) is for files whose records are mini-batches, as Fluid's
``convert_reader_to_recordio_file`` wrote them (a ``DataFeeder``'s tensors, ``(32, 784)`` and
``(32, 1)``): each record is written as its samples, one record per row of its tensors (per
sequence of a ``LoDTensor`` of one LoD level), so the daemon batches samples, not batches.
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from loader.errors import DataError
from loader.lod_tensor import LoDTensor
from loader.recordio.chunks import DEFAULT_COMPRESSOR, Compressor
from loader.recordio.scanner import Scanner
from loader.recordio.tensors import batch_rows
from loader.recordio.writer import Writer

PROGRESS_INTERVAL_S = 0.5  # how often the progress line is redrawn


def _plain(sample: Any) -> Any:
    """``sample`` with every LoDTensor turned into a dict the codec can write."""
    if isinstance(sample, LoDTensor):
        return {"data": sample.numpy(), "recursive_sequence_lengths": sample.recursive_sequence_lengths()}
    if isinstance(sample, tuple):
        return tuple(_plain(item) for item in sample)
    if isinstance(sample, list):
        return [_plain(item) for item in sample]
    return sample


def _batch_samples(src: Any, index: int, record: Any) -> list[tuple[Any, ...]]:
    """The samples of a mini-batch record (``tensors.batch_rows``); ``DataError`` naming it when it is none."""
    if isinstance(record, (list, tuple)) and record:
        try:
            return batch_rows(record)
        except ValueError as exc:
            why = str(exc)
    else:
        why = f"it holds a {type(record).__name__}, not a batch's tensors"
    raise DataError(
        f"{os.fspath(src)}: record {index} is not a mini-batch ({why}); convert without --split-batches to keep "
        "each record as one sample"
    )


def convert_target(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> str:
    """The file a conversion writes: ``dst``, or ``dst/<src's name>`` when ``dst`` is a directory.

    ``FileNotFoundError`` naming the directory when the file's directory does not exist, before anything
    is read (the error used to name ``DST.partial``, a file the user never asked for)."""
    target = os.fspath(dst)
    if os.path.isdir(target):
        target = os.path.join(target, os.path.basename(os.fspath(src)))
    folder = os.path.dirname(target) or "."
    if not os.path.isdir(folder):
        raise FileNotFoundError(errno.ENOENT, f"cannot write {target}: no such directory", folder)
    if os.path.isdir(target):  # DST/<SRC's name> is a directory: the final rename failed naming DST.partial
        raise IsADirectoryError(errno.EISDIR, "cannot write the converted file over a directory", target)
    return target


def convert_paddle_file(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    allow_pickle: bool = False,
    compressor: Compressor | int = DEFAULT_COMPRESSOR,
    max_num_records: int = 1000,
    progress: Callable[[int], None] | None = None,
    split_batches: bool = False,
) -> int:
    """Rewrite ``src`` (a Paddle RecordIO file, or one of ours) as ``dst``; return the number of records written.

    ``progress(records_so_far)`` is called after every record written. ``split_batches``: every record of
    ``src`` is a mini-batch, written as one record per sample (``DataError`` naming the record that is not).
    """
    target = convert_target(src, dst)
    partial = target + ".partial"
    count = 0
    try:
        with Scanner(src, allow_pickle=allow_pickle) as scanner, Writer(partial, compressor, max_num_records) as out:
            for index, sample in enumerate(scanner):
                for row in _batch_samples(src, index, sample) if split_batches else (sample,):
                    out.write(_plain(row))
                    count += 1
                    if progress is not None:
                        progress(count)
        os.replace(partial, target)  # inside: a rename that fails (DST/NAME is a directory) leaves no .partial
    except BaseException:
        if os.path.exists(partial):
            os.remove(partial)
        raise
    return count


class ProgressLine:
    """A one-line progress display on ``stream``, redrawn at most every ``PROGRESS_INTERVAL_S``."""

    def __init__(self, src: str, stream: TextIO) -> None:
        self.src, self.stream = src, stream
        self.size = os.path.getsize(src)
        self.started = self._last = time.monotonic()

    def __call__(self, records: int) -> None:
        now = time.monotonic()
        if now - self._last >= PROGRESS_INTERVAL_S:
            self._last = now
            rate = records / max(now - self.started, 1e-9)
            self.stream.write(f"\rconverting {self.src}: {records:,} records ({rate:,.0f}/s)")
            self.stream.flush()

    def done(self, records: int, dst: str) -> None:
        seconds = time.monotonic() - self.started
        self.stream.write(
            f"\rconverted {self.src} ({self.size:,} bytes) to {dst}: {records:,} records in {seconds:.1f}s\n"
        )
        self.stream.flush()


def cmd_recordio(args: argparse.Namespace, stream: TextIO | None = None) -> int:
    """The ``loader recordio convert SRC DST`` command."""
    out = stream if stream is not None else sys.stderr
    target = convert_target(args.src, args.dst)  # for the last line; the conversion resolves DST itself
    line = ProgressLine(args.src, out)
    # DST as given, not target: resolved twice, a DST/<SRC's name> that is a directory got the file inside it
    # (DST/NAME/NAME), reported as written to DST/NAME.
    count = convert_paddle_file(
        args.src,
        args.dst,
        allow_pickle=args.allow_pickle,
        compressor=Compressor[args.compressor],
        progress=line,
        split_batches=args.split_batches,
    )
    line.done(count, target)
    return 0


def add_command(add: Callable[..., argparse.ArgumentParser]) -> None:
    """Register ``recordio convert`` with the CLI's ``add(name, func, help)``."""
    p = add("recordio", cmd_recordio, "RecordIO tools: convert a PaddlePaddle RecordIO file to this package's records")
    p.add_argument("action", choices=["convert"], help="convert: rewrite SRC (Go or Fluid layout) as DST")
    p.add_argument("src", metavar="SRC", help="a RecordIO file written by PaddlePaddle (or by loader)")
    p.add_argument(
        "dst",
        metavar="DST",
        help="the file to write (replaced when the conversion succeeds), or a directory to write SRC's name into",
    )
    p.add_argument(
        "--allow-pickle",
        action="store_true",
        help="unpickle Paddle's pickled records with the restricted unpickler (numpy arrays, numbers, strings, "
        "bytes, lists, tuples, dicts only)",
    )
    p.add_argument(
        "--split-batches",
        action="store_true",
        help="each record of SRC is a mini-batch (Fluid's convert_reader_to_recordio_file: a DataFeeder's tensors): "
        "write one record per sample, a row of every tensor (a sequence of a one-level LoDTensor)",
    )
    p.add_argument(
        "--compressor",
        choices=["NONE", "ZLIB", "SNAPPY"],
        default=DEFAULT_COMPRESSOR.name,
        help=f"how DST's chunks are compressed (default {DEFAULT_COMPRESSOR.name})",
    )


__all__ = ["convert_paddle_file", "convert_target", "cmd_recordio", "add_command", "ProgressLine"]
