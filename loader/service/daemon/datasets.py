"""The datasets one daemon serves: ``[source]``/``[pipeline]`` (named ``"default"``) and ``[datasets.NAME]``.

Every dataset shares the daemon's workers and its coordinator: the coordinator
leases from one file list, the datasets' files one after the other, so a file
index names its dataset (``DatasetTable.owner``). Each dataset has its own
files, seed, epochs and stream settings (batch size, drop_last, shuffle buffer);
a client reads one dataset (``Client(address, dataset="eval")``).
"""

from __future__ import annotations

import bisect
import random
from dataclasses import dataclass
from typing import Any

from loader.config import DEFAULT_DATASET, LoaderConfig
from loader.errors import ConfigError
from loader.service.daemon.stage import StreamSettings
from loader.service.order import file_order, fingerprint


@dataclass(frozen=True)
class Dataset:
    """One dataset of the daemon: ``files`` are indexes ``offset .. offset + len(files) - 1`` of its file list."""

    name: str
    config: LoaderConfig  # the daemon's config with this dataset's source and pipeline
    files: list[str]
    offset: int
    seed: int

    @property
    def settings(self) -> StreamSettings:
        pipeline = self.config.pipeline
        return StreamSettings(pipeline.batch_size, pipeline.drop_last, pipeline.shuffle_buffer, self.seed)

    def order(self, epoch: int) -> list[int]:
        """File indexes (in the daemon's list) of ``epoch``, in reading order (``order.py``)."""
        shuffle = self.config.pipeline.shuffle_buffer > 0
        return [self.offset + i for i in file_order(len(self.files), self.seed, epoch, shuffle)]

    def lease_fields(self, file_index: int) -> dict[str, Any]:
        """What a lease of file ``file_index`` (of the daemon's list) says of its dataset."""
        return {"dataset": self.name, "seed": self.seed, "file_key": file_index - self.offset}

    def fingerprint(self) -> dict[str, Any]:
        """What a checkpoint of this dataset must match (``order.fingerprint``)."""
        return fingerprint(self.config, self.files, self.seed)

    def describe(self) -> dict[str, Any]:
        """This dataset's part of ``status()``."""
        pipeline = self.config.pipeline
        return {
            "name": self.name,
            "files": len(self.files),
            "batch_size": pipeline.batch_size,
            "epochs": pipeline.epochs,
            "seed": self.seed,
            "shuffle_buffer": pipeline.shuffle_buffer,
        }


class DatasetTable:
    """The daemon's datasets by name, and the one file list they lease from."""

    def __init__(self, config: LoaderConfig) -> None:
        self.by_name: dict[str, Dataset] = {}
        self.files: list[str] = []
        for name in config.dataset_names:
            view = config.dataset(name)
            files = view.source.expand_files()  # ConfigError for no match / empty list
            seed = view.pipeline.seed if view.pipeline.seed is not None else random.SystemRandom().randrange(2**32)
            self.by_name[name] = Dataset(name, view, files, len(self.files), seed)
            self.files.extend(files)
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


__all__ = ["Dataset", "DatasetTable"]
