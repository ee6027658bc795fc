"""One instance of a provider over a file list: settings, passes, the shuffle pool, batches."""

from __future__ import annotations

import operator
import random
import threading
from collections.abc import Generator, Iterator
from typing import Any

import numpy as np

from loader.errors import DataError, add_note
from loader.provider.batching import assemble
from loader.provider.check import InvalidSample, check_sample, normalize
from loader.provider.settings import ProviderLike, Settings
from loader.provider.types import CacheType, DataType, SequenceType
from loader.reader._util import forked_pass

# Shuffle granularity when min_pool_size and pool_size are both -1. The original then pooled the whole data
# set before the first batch (PaddlePaddle issue #4030: memory grew with the data); a fixed default keeps memory bounded.
DEFAULT_MIN_POOL_SIZE = 1000
# Files read at once when shuffling: samples are drawn from a random one of them.
DEFAULT_MAX_OPEN_FILES = 8

Where = tuple[str, int]  # (file, index of the sample in it)
Item = tuple[list[Any], int, Where]  # (sample in slot order, its weight toward the batch size, where it was read)
Items = Generator[Item, None, None]  # closed explicitly, so that files and generators are released


class _PassStats:
    __slots__ = ("dropped",)

    def __init__(self) -> None:
        self.dropped = 0


class ProviderSession:
    """A provider opened on a file list (the original's ``DataProvider`` instance).

    Calling it starts a pass and yields samples as tuples in slot order (a paddle
    reader). ``batches(batch_size)`` yields batch dicts. ``iter_file(name)`` yields
    the normalized, checked samples of one file, in file order.
    """

    def __init__(self, provider: ProviderLike, settings: Settings, seed: int | None) -> None:
        self.provider = provider
        self.settings = settings
        self.seed = seed
        self.slot_names: list[str] = settings.slot_names
        self.input_types = settings.slot_types
        self.shuffle = settings.should_shuffle
        self.last_pass_dropped = 0
        self._epoch = 0
        self._lock = threading.Lock()
        self._cache: list[Item] | None = None
        self._cache_filling = False

    # -- the reader protocol -------------------------------------------------------------

    def __call__(self) -> Iterator[tuple[Any, ...]]:
        for sample, _weight, _where in self.items():
            yield tuple(sample)

    def batches(self, batch_size: int, drop_last: bool = False) -> Iterator[dict[str, Any]]:
        """One pass as batch dicts; a batch is full when its weights reach ``batch_size``."""
        can_over = self.settings.can_over_batch_size
        batch: list[list[Any]] = []
        origins: list[Where] = []
        size = 0
        for sample, weight, where in self.items():
            if not can_over and batch and size + weight > batch_size:
                yield self._assemble(batch, origins)
                batch, origins, size = [], [], 0
            batch.append(sample)
            origins.append(where)
            size += weight
            if size >= batch_size:
                yield self._assemble(batch, origins)
                batch, origins, size = [], [], 0
        if batch and not (drop_last and size < batch_size):
            yield self._assemble(batch, origins)

    def iter_file(self, filename: str) -> Iterator[list[Any]]:
        """The checked samples of one file, in order (what a service worker runs).

        A dense vector slot comes as a float32 array of ``dim`` values, as ``batches()`` gives it: a provider
        that yields Python floats would otherwise make float64 batches through the service only."""
        stats = _PassStats()
        dense = [
            (i, t.dim)
            for i, t in enumerate(self.input_types)
            if t.type == DataType.Dense and t.seq_type == SequenceType.NO_SEQUENCE
        ]
        try:
            for sample, _weight, _where in self._file_items(filename, stats):
                for i, dim in dense:
                    value = np.asarray(sample[i], dtype=np.float32)
                    sample[i] = value.reshape(dim) if value.ndim != 1 and value.size == dim else value
                yield sample
        finally:
            self._report(stats, f"file {filename}")

    # -- one pass ------------------------------------------------------------------------

    def items(self) -> Items:
        """One pass as (sample, weight) pairs, shuffled when the provider shuffles."""
        with self._lock:
            epoch = self._epoch
            self._epoch += 1
            cached = self._cache
            # Only one pass at a time fills the cache; a pass started meanwhile just reads.
            filling = self.settings.cache == CacheType.CACHE_PASS_IN_MEM and cached is None and not self._cache_filling
            self._cache_filling = self._cache_filling or filling
        # In a multiprocess_reader child the session is a fresh copy every pass: forked_pass() counts the passes
        # the parent made, so pass k of the merged reader shuffles as the k-th call (as loader.shuffle does).
        seeded_pass = epoch + forked_pass()
        rng = random.Random(f"{self.seed}:{seeded_pass}") if self.seed is not None else random.Random()
        if cached is not None:
            yield from self._from_cache(cached, rng)
            return
        stats = _PassStats()
        collected: list[Item] | None = [] if filling else None
        stream = self._files(rng, stats)
        if self.shuffle:
            stream = self._pool(stream, rng)
        try:
            for item in stream:
                if collected is not None:
                    collected.append(item)
                yield item
            if collected is not None:
                self._cache = collected
        finally:
            stream.close()
            if filling:
                with self._lock:
                    self._cache_filling = False
            self.last_pass_dropped = stats.dropped
            self._report(stats, f"pass {epoch}")

    def _from_cache(self, cached: list[Item], rng: random.Random) -> Iterator[Item]:
        if not self.shuffle:
            yield from cached
            return
        order = list(range(len(cached)))
        rng.shuffle(order)
        for i in order:
            yield cached[i]

    def _files(self, rng: random.Random, stats: _PassStats) -> Items:
        """Samples of every file: in order, or interleaved from a few open files when shuffling."""
        files = list(self.settings.file_list)
        if not self.shuffle:
            for filename in files:
                yield from self._file_items(filename, stats)
            return
        rng.shuffle(files)
        limit = max(1, self.settings.max_open_files)
        active: list[Items] = []
        upcoming = iter(files)
        try:
            while True:
                while len(active) < limit:
                    upcoming_name = next(upcoming, None)
                    if upcoming_name is None:
                        break
                    active.append(self._file_items(upcoming_name, stats))
                if not active:
                    return
                pick = rng.randrange(len(active))
                try:
                    item = next(active[pick])
                except StopIteration:
                    # Swap-remove: the finished file's generator is released at once.
                    active[pick] = active[-1]
                    active.pop()
                    continue
                yield item
        finally:
            for generator in active:
                generator.close()

    def _pool(self, stream: Items, rng: random.Random) -> Items:
        """Random draws from a pool refilled to the shuffle granularity before each draw."""
        pool_size, min_pool_size = self.settings.pool_size, self.settings.min_pool_size
        if min_pool_size > 0:
            target = min(min_pool_size, pool_size) if pool_size > 0 else min_pool_size
        else:
            # -1 meant "as much as the pool holds" (the original's min(pool_size, min_pool_size)): pool_size when
            # the user bounded the pool, the fixed default only when nothing bounds it (issue #4030).
            target = pool_size if pool_size > 0 else DEFAULT_MIN_POOL_SIZE
        pool: list[Item] = []
        held = 0  # weights, counting a weight-0 sample as 1 so the pool stays bounded
        exhausted = False
        try:
            while True:
                while not exhausted and held < target:
                    item = next(stream, None)
                    if item is None:
                        exhausted = True
                        break
                    pool.append(item)
                    held += max(1, item[1])
                if not pool:
                    return
                pick = rng.randrange(len(pool))
                pool[pick], pool[-1] = pool[-1], pool[pick]
                item = pool.pop()
                held -= max(1, item[1])
                yield item
        finally:
            stream.close()

    def _file_items(self, filename: str, stats: _PassStats) -> Items:
        """Run ``process`` on one file: normalize, check and weigh each sample."""
        settings = self.settings
        source = self.provider.process(settings, filename)
        try:
            generator = iter(source)
        except TypeError:
            # A process that returns instead of yielding (a forgotten ``yield``) would fail here with
            # "'NoneType' object is not iterable", naming neither the provider nor the file.
            raise TypeError(
                f"provider {self.provider.__name__}: process(settings, {filename!r}) returned "
                f"{type(source).__name__}, not an iterable of samples (write it as a generator that yields them)"
            ) from None
        try:
            for index, raw in _noted(generator, filename):
                try:
                    sample = normalize(raw, self.slot_names, settings.dict_mode)
                    if settings.check:
                        check_sample(sample, self.input_types, self.slot_names)
                except InvalidSample as exc:
                    where = f"{filename}: sample {index}" + (f": slot {exc.slot!r}" if exc.slot else "")
                    if settings.check and settings.check_fail_continue:
                        stats.dropped += 1
                        settings.logger.debug("dropped invalid sample: %s: %s", where, exc.reason)
                        continue
                    raise DataError(f"{where}: {exc.reason}") from None
                yield sample, self._weight(sample, filename, index), (filename, index)
        finally:
            close = getattr(generator, "close", None)
            if close is not None:
                close()

    def _assemble(self, batch: list[list[Any]], origins: list[Where]) -> dict[str, Any]:
        """``assemble`` the batch; a sample that does not fit its slot is named by its file and index, as
        ``check=True`` names it (without check, the error named the slot only, in a batch of shuffled files)."""
        try:
            return assemble(batch, self.input_types, self.slot_names)
        except DataError as exc:
            error = exc
        for sample, (filename, index) in zip(batch, origins):  # the first sample that fails alone
            try:
                assemble([sample], self.input_types, self.slot_names)
            except DataError as alone:
                raise DataError(f"{filename}: sample {index}: {alone}") from None
        files = sorted({filename for filename, _ in origins})
        named = ", ".join(files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
        raise DataError(f"a batch of {len(batch)} samples of {named}: {error}") from None

    def _weight(self, sample: list[Any], filename: str, index: int) -> int:
        calc = self.settings.calc_batch_size
        if calc is None:
            return 1
        try:
            weight = calc(sample)
        except Exception as exc:
            # The user's own error keeps its type; the note says which sample it was weighing.
            add_note(exc, f"(in calc_batch_size, weighing sample {index} of {filename!r})")
            raise
        # numpy integers are accepted (operator.index), bools and floats are not.
        if isinstance(weight, bool) or not hasattr(weight, "__index__") or operator.index(weight) < 0:
            raise DataError(f"{filename}: sample {index}: calc_batch_size returned {weight!r}, not an int >= 0")
        return operator.index(weight)

    def _report(self, stats: _PassStats, where: str) -> None:
        if stats.dropped:
            self.settings.logger.warning(
                "%s: dropped %d sample(s) that did not fit input_types (%s)",
                self.provider.__name__,
                stats.dropped,
                where,
            )


class BatchReader:
    """A zero-argument callable yielding one pass of batch dicts per call."""

    def __init__(self, session: ProviderSession, batch_size: int, drop_last: bool) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        self.session, self.batch_size, self.drop_last = session, batch_size, drop_last

    @property
    def settings(self) -> Settings:
        return self.session.settings

    def __call__(self) -> Iterator[dict[str, Any]]:
        return self.session.batches(self.batch_size, self.drop_last)


def _noted(generator: Iterator[Any], filename: str) -> Iterator[tuple[int, Any]]:
    """``enumerate(generator)``, where an exception from ``process`` gets a note naming the file and the
    sample it was making (the original's traceback named neither)."""
    index = 0
    while True:
        try:
            raw = next(generator)
        except StopIteration:
            return
        except Exception as exc:
            add_note(exc, f"(in process(settings, {filename!r}), making sample {index})")
            raise
        yield index, raw
        index += 1


__all__ = ["ProviderSession", "BatchReader", "DEFAULT_MIN_POOL_SIZE", "DEFAULT_MAX_OPEN_FILES"]
