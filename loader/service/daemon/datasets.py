"""The datasets one daemon serves: ``[source]``/``[pipeline]`` (named ``"default"``) and ``[datasets.NAME]``.

Every dataset shares the daemon's workers and its coordinator: the coordinator
leases from one list, the datasets' leases one after the other, so an index in it
(a "file index" to the coordinator and the stage) names its dataset
(``DatasetTable.owner``). A lease is one file, or with ``source.files_per_lease``
above 1 a group of small files read as one (``order.lease_groups``). Each dataset has its own
files, seed, epochs and stream settings (batch size, drop_last, shuffle buffer);
a client reads one dataset (``Client(address, dataset="eval")``).
"""

from __future__ import annotations

import bisect
import logging
import os
import random
import stat
from dataclasses import dataclass
from typing import Any

from loader.config import DEFAULT_DATASET, LoaderConfig
from loader.config.source import SMALL_FILE_BYTES
from loader.errors import ConfigError
from loader.service.daemon.stage import StreamSettings
from loader.service.order import file_order, fingerprint, lease_groups

log = logging.getLogger("loader.daemon")

# A dataset of at least this many files, of a median size under HINT_FILE_BYTES, read one file per lease
# gets a hint at start-up: a lease round trip then costs about what reading a file does.
HINT_FILES = 512
HINT_FILE_BYTES = 256 << 10
HINT_SAMPLE = 32  # files whose size the hint looks at (evenly spaced: start-up stays cheap)
NOTE_FILES = 4  # files of a lease an error names (``Dataset.lease_note``)


@dataclass(frozen=True)
class Dataset:
    """One dataset of the daemon: its ``leases`` are indexes ``offset .. offset + len(leases) - 1`` of its list."""

    name: str
    config: LoaderConfig  # the daemon's config with this dataset's source and pipeline
    files: list[str]  # every file, sorted
    offset: int
    seed: int
    leases: list[list[str]]  # the files of each lease, in reading order
    sizes: list[int | None] | None = None  # bytes of each file at start-up (None: not a regular file)

    @property
    def settings(self) -> StreamSettings:
        pipeline = self.config.pipeline
        return StreamSettings(pipeline.batch_size, pipeline.drop_last, pipeline.shuffle_buffer, self.seed)

    def order(self, epoch: int) -> list[int]:
        """File indexes (in the daemon's list) of ``epoch``, in reading order (``order.py``)."""
        shuffle = self.config.pipeline.shuffle_buffer > 0
        return [self.offset + i for i in file_order(len(self.leases), self.seed, epoch, shuffle)]

    def lease_fields(self, file_index: int) -> dict[str, Any]:
        """What a lease of ``file_index`` (of the daemon's list) says of its dataset and of its other files."""
        key = file_index - self.offset
        more = self.leases[key][1:]
        return {"dataset": self.name, "seed": self.seed, "file_key": key, **({"more": more} if more else {})}

    def lease_note(self, file_index: int) -> str:
        """For an error the daemon itself finds in a lease of several files (a worker that died, a chunk that
        does not fit), which it names by the lease's first file and the lease's record: what that lease is.
        Only a worker knows where one file of the lease ends, and its own errors name the file."""
        files = self.leases[file_index - self.offset]
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
        position = {path: i for i, path in enumerate(self.files)}
        return fingerprint(
            self.config,
            self.files,
            self.seed,
            [[position[path] for path in lease] for lease in self.leases],
            self.sizes,
        )

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
    """The daemon's datasets by name, and the one list of leases they lease from."""

    def __init__(self, config: LoaderConfig) -> None:
        self.by_name: dict[str, Dataset] = {}
        # Per lease, its first file: what the coordinator leases and messages name (``Dataset.leases`` has all).
        self.files: list[str] = []
        for name in config.dataset_names:
            view = config.dataset(name)
            files = view.expand_files()  # ConfigError for no match / empty list, naming where the value came from
            seed = view.pipeline.seed if view.pipeline.seed is not None else random.SystemRandom().randrange(2**32)
            sizes = [_size(path) for path in files]  # once: the fingerprint and the lease groups use them
            leases = _leases(name, files, sizes, view, seed)
            self.by_name[name] = Dataset(name, view, files, len(self.files), seed, leases, sizes)
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


def _leases(name: str, files: list[str], sizes: list[int | None], config: LoaderConfig, seed: int) -> list[list[str]]:
    """``files`` grouped into leases as ``source.files_per_lease`` says (``sizes``: their bytes)."""
    per_lease = config.source.files_per_lease
    if per_lease <= 1:
        _hint_small_files(name, files)
        return [[path] for path in files]
    shuffle = config.pipeline.shuffle_buffer > 0
    groups = lease_groups(sizes, per_lease, SMALL_FILE_BYTES, seed, shuffle)
    return [[files[i] for i in group] for group in groups]


def _hint_small_files(name: str, files: list[str]) -> None:
    """Log once that many small files would be read faster several to a lease (``files_per_lease``)."""
    if len(files) < HINT_FILES:
        return
    step = len(files) // HINT_SAMPLE
    sizes = sorted(size for size in (_size(files[i * step]) for i in range(HINT_SAMPLE)) if size is not None)
    if len(sizes) < HINT_SAMPLE // 2 or sizes[len(sizes) // 2] >= HINT_FILE_BYTES:
        return
    median = sizes[len(sizes) // 2]
    log.info(
        "dataset %r: %d files of about %s, one lease each: source.files_per_lease = 64 would read "
        "them several to a lease, a round trip per 64 files instead of one per file",
        name,
        len(files),
        f"{median >> 10} KiB" if median >= 1 << 10 else f"{median} bytes",  # not "about 0 KiB"
    )


def _size(path: str) -> int | None:
    """Bytes of ``path``; None for a name that is not a regular file (a provider's name): it goes alone."""
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_size if stat.S_ISREG(found.st_mode) else None


__all__ = ["Dataset", "DatasetTable"]
