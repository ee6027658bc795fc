"""The datasets one daemon serves: ``[source]``/``[pipeline]`` (named ``"default"``) and ``[datasets.NAME]``.

Every dataset shares the daemon's workers and its coordinator: the coordinator
leases from one list, the datasets' leases one after the other, so an index in it
(a "file index" to the coordinator and the stage) names its dataset
(``DatasetTable.owner``). A lease is one file, or with ``source.files_per_lease``
above 1 a group of small files read as one (``order.lease_groups``), or with
``source.records_per_lease`` above 0 a piece of a large file: consecutive records
read as one file numbered from 0 (``order.lease_pieces``). Each dataset has its own
files, seed, epochs and stream settings (batch size, drop_last, shuffle buffer);
a client reads one dataset (``Client(address, dataset="eval")``).
"""

from __future__ import annotations

import bisect
import functools
import logging
import math
import os
import random
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from loader.config import DEFAULT_DATASET, LoaderConfig
from loader.config.source import SMALL_FILE_BYTES
from loader.errors import ConfigError
from loader.io.survey import header_rows
from loader.service.daemon.streams import StreamSettings
from loader.service.order import Piece, file_order, fingerprint, lease_groups, lease_pieces

log = logging.getLogger("loader.daemon")

# A dataset of at least this many files, of a median size under HINT_FILE_BYTES, read one file per lease
# gets a hint at start-up: a lease round trip then costs about what reading a file does.
HINT_FILES = 512
HINT_FILE_BYTES = 256 << 10
HINT_SAMPLE = 32  # files whose size the hint looks at (evenly spaced: start-up stays cheap)
NOTE_FILES = 4  # files of a lease an error names (``Dataset.lease_note``)
# A dataset of fewer leases than workers gets a hint suggesting ``records_per_lease``: pieces enough for each
# worker to have this many (a slow piece at the end of an epoch then keeps the others idle for less) ...
HINT_PIECES_PER_WORKER = 4
MAX_PIECE_LEASES = 100_000  # leases a dataset's files may be cut into (the lease list lives in the daemon's loop)
HINT_MIN_PIECE_RECORDS = 256  # ... unless a piece would hold fewer records than this (a dataset too small to care)


# Where the start-up hints go (a line each): the daemon logs them; ``loader check`` shows them as its warnings.
Advise = Callable[[str], None]


def _log_advice(line: str) -> None:
    log.info("%s", line)


@dataclass(frozen=True)
class Dataset:
    """One dataset of the daemon: its ``leases`` are indexes ``offset .. offset + len(leases) - 1`` of its list."""

    name: str
    config: LoaderConfig  # the daemon's config with this dataset's source and pipeline
    files: list[str]  # every file, sorted
    offset: int
    seed: int
    leases: list[list[str]]  # the files of each lease, in reading order
    # Per lease, the piece of its file it reads (None: the whole file); empty when no lease is a piece.
    pieces: list[Piece | None] = field(default_factory=list)
    sizes: list[int | None] | None = None  # bytes of each file at start-up (None: not a regular file)

    @property
    def settings(self) -> StreamSettings:
        pipeline = self.config.pipeline
        return StreamSettings(pipeline.batch_size, pipeline.drop_last, pipeline.shuffle_buffer, self.seed)

    def order(self, epoch: int) -> list[int]:
        """File indexes (in the daemon's list) of ``epoch``, in reading order (``order.py``)."""
        shuffle = self.config.pipeline.shuffle_buffer > 0
        return [self.offset + i for i in file_order(len(self.leases), self.seed, epoch, shuffle)]

    def piece(self, file_index: int) -> Piece | None:
        """The piece of its file that lease ``file_index`` (of the daemon's list) reads; None: the whole file."""
        return self.pieces[file_index - self.offset] if self.pieces else None

    def lease_fields(self, file_index: int) -> dict[str, Any]:
        """What a lease of ``file_index`` (of the daemon's list) says of its dataset, its other files, its piece."""
        key = file_index - self.offset
        more = self.leases[key][1:]
        piece = self.piece(file_index)
        seen = self._seen(key)
        return {
            "dataset": self.name,
            "seed": self.seed,
            "file_key": key,
            **({"more": more} if more else {}),
            **({"piece": list(piece)} if piece else {}),
            **({"seen": seen} if seen else {}),
        }

    def _seen(self, key: int) -> list[int | None] | None:
        """The sizes at start-up of lease ``key``'s files (``Lease.seen``), None when none was a regular file."""
        if self.sizes is None:
            return None
        sizes = self.sizes
        seen = [sizes[self._position[path]] for path in self.leases[key]]
        return seen if any(size is not None for size in seen) else None

    @functools.cached_property
    def _position(self) -> dict[str, int]:
        # Each file's index in ``files``, once: a lease's files are looked up by path as each lease is sent.
        return {path: i for i, path in enumerate(self.files)}

    def file_record(self, file_index: int, record: int) -> int:
        """Record ``record`` of lease ``file_index`` as its number in the lease's (first) file."""
        piece = self.piece(file_index)
        return record + piece[0] if piece else record

    def lease_note(self, file_index: int) -> str:
        """For an error the daemon itself finds in a lease of several files (a worker that died, a chunk that
        does not fit), which it names by the lease's first file and the lease's record: what that lease is.
        Only a worker knows where one file of the lease ends, and its own errors name the file. For a piece
        of a file, which records it holds (the daemon names records by their number in the file)."""
        files = self.leases[file_index - self.offset]
        piece = self.piece(file_index)
        if piece:
            first, count = piece
            return (
                f"; the lease was records {first} to {first + count - 1} of {os.path.basename(files[0])} "
                "(source.records_per_lease)"
            )
        if len(files) == 1:
            return ""
        shown = (
            ", ".join(files) if len(files) <= NOTE_FILES else f"{', '.join(files[: NOTE_FILES - 1])}, ..., {files[-1]}"
        )
        return (
            f"; {os.path.basename(files[0])} is the first of {len(files)} small files leased together "
            f"(source.files_per_lease), whose records are numbered on as one file's: {shown}"
        )

    def fingerprint(self) -> dict[str, Any]:
        """What a checkpoint of this dataset must match (``order.fingerprint``)."""
        return dict(self._fingerprint)

    @functools.cached_property
    def _fingerprint(self) -> dict[str, Any]:
        # Once: every client's hello asks for it in the daemon's loop, and digesting the lease list of many
        # files or pieces took seconds (workers take a daemon silent for 5 s for dead).
        position = {path: i for i, path in enumerate(self.files)}
        groups = [[position[path] for path in lease] for lease in self.leases]
        pieces = [(group[0], piece) for group, piece in zip(groups, self.pieces)] if self.pieces else None
        return fingerprint(self.config, self.files, self.seed, groups, sizes=self.sizes, pieces=pieces)

    def describe(self) -> dict[str, Any]:
        """This dataset's part of ``status()``."""
        pipeline = self.config.pipeline
        return {
            "name": self.name,
            "files": len(self.files),
            "leases": len(self.leases),
            "batch_size": pipeline.batch_size,
            "epochs": pipeline.epochs,
            "seed": self.seed,
            "shuffle_buffer": pipeline.shuffle_buffer,
        }


class DatasetTable:
    """The daemon's datasets by name, and the one list of leases they lease from.

    ``advise`` takes each hint on how the files are leased (``records_per_lease``, ``files_per_lease``); by
    default they are logged, as ``loader serve`` shows them."""

    def __init__(self, config: LoaderConfig, advise: Advise = _log_advice) -> None:
        self.by_name: dict[str, Dataset] = {}
        # Per lease, its first file: what the coordinator leases and messages name (``Dataset.leases`` has all).
        self.files: list[str] = []
        for name in config.dataset_names:
            view = config.dataset(name)
            files = view.expand_files()  # ConfigError for no match / empty list, naming where the value came from
            seed = view.pipeline.seed if view.pipeline.seed is not None else random.SystemRandom().randrange(2**32)
            sizes = [_size(path) for path in files]  # once: the fingerprint, the lease groups and the leases
            leases, pieces = _leases(name, files, sizes, view, seed, advise)
            self.by_name[name] = Dataset(name, view, files, len(self.files), seed, leases, pieces, sizes)
            self.files.extend(group[0] for group in leases)
        self._offsets = [d.offset for d in self.by_name.values()]
        self._names = list(self.by_name)

    @property
    def default(self) -> Dataset:
        return self.by_name[DEFAULT_DATASET]

    def get(self, name: str) -> Dataset:
        dataset = self.by_name.get(name)
        if dataset is None:
            known = ", ".join(repr(n) for n in self.by_name)
            raise ConfigError(f"this daemon serves no dataset named {name!r} (it serves {known})")
        return dataset

    def owner(self, file_index: int) -> Dataset:
        """The dataset that file ``file_index`` of the daemon's list belongs to."""
        return self.by_name[self._names[bisect.bisect_right(self._offsets, file_index) - 1]]

    def lease_note(self, file_index: int) -> str:
        """``Dataset.lease_note`` of the dataset ``file_index`` belongs to ("" for an index of no dataset)."""
        return self.owner(file_index).lease_note(file_index) if 0 <= file_index < len(self.files) else ""

    def file_record(self, file_index: int, record: int) -> int:
        """``Dataset.file_record`` of the dataset ``file_index`` belongs to (``record`` for an index of none)."""
        return self.owner(file_index).file_record(file_index, record) if 0 <= file_index < len(self.files) else record


def _leases(
    name: str, files: list[str], sizes: list[int | None], config: LoaderConfig, seed: int, advise: Advise
) -> tuple[list[list[str]], list[Piece | None]]:
    """``files`` cut or grouped into leases as ``source.records_per_lease`` or ``files_per_lease`` says (the
    files' headers read here, once; ``sizes``: their bytes): the files of each lease, and each lease's piece
    (empty: none). Hints on a better setting go to ``advise``."""
    source = config.source
    if source.records_per_lease > 0:
        counts = [_records(source, path) for path in files]
        _note_uncounted(name, files, counts, advise)
        _refuse_too_many_pieces(name, counts, source.records_per_lease)
        cut = lease_pieces(counts, source.records_per_lease)
        return [[files[i]] for i, _ in cut], [piece for _, piece in cut]
    if source.files_per_lease > 1:
        shuffle = config.pipeline.shuffle_buffer > 0
        groups = lease_groups(sizes, source.files_per_lease, SMALL_FILE_BYTES, seed, shuffle)
        return [[files[i] for i in group] for group in groups], []
    _hint_small_files(name, files, advise)
    _hint_large_files(name, files, config, advise)
    return [[path] for path in files], []


def _refuse_too_many_pieces(name: str, counts: list[int | None], per_lease: int) -> None:
    """A ``records_per_lease`` that would cut the files into more than MAX_PIECE_LEASES leases, refused in one
    line with the smallest value that would not (2 million pieces took 1.2 GB and seconds of the daemon's loop)."""

    def leases_of(per: int) -> int:
        return sum(1 if c is None or c <= per else -(-c // per) for c in counts)

    leases = leases_of(per_lease)
    if leases <= MAX_PIECE_LEASES:
        return
    low, high = per_lease + 1, max(c for c in counts if c is not None)  # at ``high`` every file is one lease
    while low < high:  # the fewest records a lease that fit: leases_of only falls as ``per`` grows
        middle = (low + high) // 2
        low, high = (low, middle) if leases_of(middle) <= MAX_PIECE_LEASES else (middle + 1, high)
    needed = low
    raise ConfigError(
        f"dataset {name!r}: source.records_per_lease = {per_lease} cuts its files into {leases:,} leases, more than "
        f"{MAX_PIECE_LEASES:,}: give at least {needed:,}"
    )


def _records(source: Any, path: str) -> int | None:
    """Records of ``path`` from its headers (``survey.header_rows``); None where they do not say."""
    try:
        return header_rows(source, path)
    except Exception:  # leased whole: the worker that opens it reports why, naming it
        return None


def _note_uncounted(name: str, files: list[str], counts: list[int | None], advise: Advise) -> None:
    """Say once that files whose headers give no record count are leased whole despite ``records_per_lease``."""
    uncounted = [path for path, count in zip(files, counts) if count is None]
    if uncounted:
        advise(
            f"dataset {name!r}: {len(uncounted)} of {len(files)} files ({os.path.basename(uncounted[0])} first) "
            "give no record count in their headers: leased whole (source.records_per_lease cuts .npy and .npz files)"
        )


def _hint_large_files(name: str, files: list[str], config: LoaderConfig, advise: Advise) -> None:
    """Say once that a dataset of fewer files than workers would keep more of them busy cut into pieces of
    records (``records_per_lease``); only where the files' headers count their records (few files: cheap)."""
    workers = max(config.workers.count, config.workers.max)
    if len(files) >= workers:
        return
    counts = [_records(config.source, path) for path in files]
    if any(count is None for count in counts):
        return
    records = sum(count or 0 for count in counts)
    suggested = math.ceil(records / (HINT_PIECES_PER_WORKER * workers))
    # Pieces read ahead of the head one wait in the reorder window: each worker's should fit its share.
    record_bytes = sum(_size(path) or 0 for path in files) / max(1, records)
    window = config.service.reorder_window_mib << 20
    suggested = min(suggested, int(window / (workers * max(1.0, record_bytes))))
    if suggested < HINT_MIN_PIECE_RECORDS:
        return
    advise(
        f"dataset {name!r}: {len(files)} file(s) for {workers} workers, one lease each, so at most {len(files)} "
        f"read at once: source.records_per_lease = {suggested} would cut them into pieces that every worker reads"
    )


def _hint_small_files(name: str, files: list[str], advise: Advise) -> None:
    """Say once that many small files would be read faster several to a lease (``files_per_lease``)."""
    if len(files) < HINT_FILES:
        return
    step = len(files) // HINT_SAMPLE
    sizes = sorted(size for size in (_size(files[i * step]) for i in range(HINT_SAMPLE)) if size is not None)
    if len(sizes) < HINT_SAMPLE // 2 or sizes[len(sizes) // 2] >= HINT_FILE_BYTES:
        return
    median = sizes[len(sizes) // 2]
    about = f"{median >> 10} KiB" if median >= 1 << 10 else f"{median} bytes"  # not "about 0 KiB"
    advise(
        f"dataset {name!r}: {len(files)} files of about {about}, one lease each: source.files_per_lease = 64 "
        "would read them several to a lease, a round trip per 64 files instead of one per file"
    )


def _size(path: str) -> int | None:
    """Bytes of ``path``; None for a name that is not a regular file (a provider's name): it goes alone, and no
    worker checks it (``Lease.seen``)."""
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_size if stat.S_ISREG(found.st_mode) else None


__all__ = ["Dataset", "DatasetTable"]
