"""``DataFeeder``: turn a mini-batch (a list of samples) into one array per input.

::

    feeder = DataFeeder([Field("image", [-1, 1, 28, 28]), Field("label", [-1, 1], "int64")])
    arrays = feeder.feed([([0] * 784, [9]), ([1] * 784, [1])])
    arrays["image"].shape == (2, 1, 28, 28); arrays["label"].shape == (2, 1)

* ``Field(name, shape, dtype, lod_level)`` describes one input. A leading ``-1`` (or
  ``None``) in ``shape`` is the batch dimension; a shape with no leading ``-1`` is taken
  as the shape of one sample (as ``fluid.layers.data`` prepends the batch dimension).
  Other ``-1`` entries are free: they take whatever size the samples have.
* ``lod_level == 0``: the result is a numpy array ``(N,) + sample shape``. Each sample
  is reshaped to the sample shape when its total size matches (flat ``[0] * 784`` fits
  ``(1, 28, 28)``; a scalar fits ``(1,)``).
* ``lod_level == k > 0``: each sample is a ``k``-times nested sequence; the result is a
  ``LoDTensor`` whose ``data`` holds the leaves, ``(total leaves,) + element shape``, and
  whose ``recursive_sequence_lengths()`` has one list of lengths per level.
* Every shape is checked, not only the rank: a sample that does not fit raises
  ``ShapeMismatchError`` (a ``ValueError``) naming the field, the expected and the
  received shape and the sample. A sample with the wrong number of fields raises
  ``ValueError`` with both counts. Values are cast to the field's dtype with numpy
  (float to int truncates, as in the original).
* ``place`` (``"cpu"``, ``"cuda:0"``, ``"torch:cpu"``, ...) is handled by
  ``loader.device.Placer``: on a device the arrays (and ``LoDTensor.data``) become that
  library's tensors.

Differences from the original: ``feed_parallel`` returns a list and checks the number
of mini-batches before converting any (the original raised lazily, at the first
``next()``); same-rank shape mismatches are errors (the original let ``[-1, 3]`` take
rows of length 2).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np

from loader.device import Placer, device_count
from loader.errors import DataError, ShapeMismatchError

_SUPPORTED_KINDS = "biufc"  # bool, signed, unsigned, float, complex


@dataclasses.dataclass(frozen=True)
class Field:
    """One input of a ``DataFeeder``: name, shape (``-1`` for the batch), dtype, lod_level."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    lod_level: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Field name must be a non-empty string, got {self.name!r}")
        try:
            shape = tuple(-1 if d is None else int(d) for d in self.shape)
        except (TypeError, ValueError):
            raise ValueError(f"Field {self.name!r}: shape must be a sequence of ints, got {self.shape!r}") from None
        try:
            dtype = np.dtype(self.dtype)
        except TypeError:
            raise ValueError(f"Field {self.name!r}: unknown dtype {self.dtype!r}") from None
        if dtype.kind not in _SUPPORTED_KINDS:
            raise ValueError(f"Field {self.name!r}: dtype {dtype} is not numeric (bool, int, uint, float, complex)")
        if not isinstance(self.lod_level, int) or self.lod_level < 0:
            raise ValueError(f"Field {self.name!r}: lod_level must be an int >= 0, got {self.lod_level!r}")
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "dtype", dtype.name)

    @property
    def sample_shape(self) -> tuple[int, ...]:
        """The shape of one sample (lod_level 0) or of one sequence element (lod_level > 0)."""
        if self.shape and self.shape[0] < 0:
            return self.shape[1:]
        return self.shape


@dataclasses.dataclass
class LoDTensor:
    """Flat data plus per-level sequence lengths (the length-based LoD of fluid).

    ``data`` is a numpy array (or a device tensor after placement, or a
    ``loader.provider.SparseBatch`` for sparse sequence slots); ``lengths[0]`` has one
    entry per sample, each deeper level one entry per element of the level above.
    """

    data: Any
    lengths: list[list[int]] = dataclasses.field(default_factory=list)

    def recursive_sequence_lengths(self) -> list[list[int]]:
        return [list(level) for level in self.lengths]

    def set_recursive_sequence_lengths(self, lengths: Sequence[Sequence[int]]) -> None:
        self.lengths = [[int(n) for n in level] for level in lengths]

    def lod(self) -> list[list[int]]:
        """Offsets per level: ``[[3, 2, 4]]`` -> ``[[0, 3, 5, 9]]``."""
        return [[0, *itertools.accumulate(level)] for level in self.lengths]

    def start_positions(self) -> list[list[int]]:
        """Offsets per level counted in rows of ``data`` (PyDataProvider2's start positions).

        For two levels this is ``[sequenceStartPositions, subSequenceStartPositions]``.
        """
        offsets = self.lod()
        result = [offsets[-1]] if offsets else []
        for level in reversed(offsets[:-1]):
            inner = result[0]
            result.insert(0, [inner[i] for i in level])
        return result

    def has_valid_recursive_sequence_lengths(self) -> bool:
        rows = len(self.data) if hasattr(self.data, "__len__") else None
        expected = len(self.lengths[0]) if self.lengths else None
        for level in self.lengths:
            if expected is not None and len(level) != expected or any(n < 0 for n in level):
                return False
            expected = sum(level)
        return rows is None or expected is None or expected == rows

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return np.asarray(self.data, dtype=dtype)


def _matches(shape: tuple[int, ...], expected: tuple[int, ...]) -> bool:
    return len(shape) == len(expected) and all(e < 0 or e == d for d, e in zip(shape, expected))


def _reshape_target(shape: tuple[int, ...], expected: tuple[int, ...]) -> tuple[int, ...] | None:
    """The sample shape to reshape to, or None when ``shape`` cannot become ``expected``."""
    if _matches(shape, expected):
        return shape
    free = [i for i, e in enumerate(expected) if e < 0]
    size = math.prod(shape)
    known = math.prod(e for e in expected if e >= 0)
    if not free:
        return expected if size == known else None
    if len(free) == 1 and known and size % known == 0:
        return tuple(size // known if e < 0 else e for e in expected)
    return None


def _describe(shape: tuple[int, ...]) -> str:
    return f"{shape} ({math.prod(shape)} values)"


class _Converter:
    """Builds the array (or LoDTensor) of one field from that field's column of a batch."""

    def __init__(self, field: Field) -> None:
        self.field = field
        self.dtype = np.dtype(field.dtype)
        self.element = field.sample_shape

    def __call__(self, column: Sequence[Any]) -> Any:
        if self.field.lod_level == 0:
            return self._stack(column, None)
        leaves, lengths = self._flatten(column)
        return LoDTensor(self._stack(leaves, lengths), lengths)

    def _flatten(self, column: Sequence[Any]) -> tuple[Any, list[list[int]]]:
        items: Any = column
        lengths: list[list[int]] = []
        for level in range(self.field.lod_level):
            try:
                lengths.append([len(item) for item in items])
            except TypeError:
                bad = next(i for i, item in enumerate(items) if not hasattr(item, "__len__"))
                where = self._where(bad, lengths)
                raise ShapeMismatchError(
                    f"field {self.field.name!r} has lod_level {self.field.lod_level}: {where} should be a sequence "
                    f"nested {self.field.lod_level - level} more level(s), got {type(items[bad]).__name__}"
                ) from None
            last = level == self.field.lod_level - 1
            if last and items and all(isinstance(item, np.ndarray) and item.ndim >= 1 for item in items):
                try:
                    return np.concatenate(items), lengths
                except ValueError:
                    pass  # differing element shapes: the generic path names the culprit
            items = list(itertools.chain.from_iterable(items))
        return items, lengths

    def _stack(self, items: Any, lengths: list[list[int]] | None) -> np.ndarray:
        if isinstance(items, np.ndarray):
            array = items
        else:
            try:
                array = np.asarray(items, dtype=self.dtype)
            except (ValueError, TypeError):
                return self._stack_one_by_one(items, lengths)
        target = _reshape_target(array.shape[1:], self.element) if array.ndim >= 1 else None
        if target is None:
            if len(items) == 0:
                return np.zeros((0, *(max(d, 0) for d in self.element)), dtype=self.dtype)
            return self._stack_one_by_one(items, lengths)
        return array.astype(self.dtype, copy=False).reshape((len(array), *target))

    def _stack_one_by_one(self, items: Sequence[Any], lengths: list[list[int]] | None) -> np.ndarray:
        """Slow path: convert each item alone, so the error names the one that does not fit."""
        rows = []
        for i, item in enumerate(items):
            try:
                row = np.asarray(item, dtype=self.dtype)
            except (ValueError, TypeError) as exc:
                raise DataError(
                    f"field {self.field.name!r}: {self._where(i, lengths)} cannot be converted to "
                    f"{self.dtype} with shape {self.element}: {exc}"
                ) from None
            target = _reshape_target(row.shape, self.element)
            if target is None:
                raise ShapeMismatchError(
                    f"field {self.field.name!r}: expected shape {_describe(self.element)}, "
                    f"received shape {_describe(row.shape)} in {self._where(i, lengths)}"
                )
            rows.append(row.reshape(target))
        try:
            return np.stack(rows)
        except ValueError:
            # Every item fits on its own, but free (-1) dimensions differ between items.
            first = rows[0].shape
            bad = next(i for i, row in enumerate(rows) if row.shape != first)
            raise ShapeMismatchError(
                f"field {self.field.name!r}: expected shape {self.element} with the same free dimensions in "
                f"every sample, received {rows[bad].shape} in {self._where(bad, lengths)} after {first}"
            ) from None

    @staticmethod
    def _where(index: int, lengths: list[list[int]] | None) -> str:
        """'sample i', or for flattened sequence data 'element j of sample i'."""
        if not lengths:
            return f"sample {index}"
        owner = index
        for level in reversed(lengths):
            offsets = np.cumsum(level)
            owner = int(np.searchsorted(offsets, owner, side="right"))
        return f"element {index} of the flattened data (sample {owner})"


def _as_field(entry: Any) -> Field:
    if isinstance(entry, Field):
        return entry
    if hasattr(entry, "name") and hasattr(entry, "shape"):
        return Field(
            entry.name, tuple(entry.shape), str(getattr(entry, "dtype", "float32")), int(getattr(entry, "lod_level", 0))
        )
    raise TypeError(f"feed_list should contain loader.Field objects, got {type(entry).__name__}")


class DataFeeder:
    """Converts mini-batches (lists of samples) into one array per ``Field``."""

    def __init__(self, feed_list: Sequence[Any], place: Any = "cpu") -> None:
        self.fields = [_as_field(entry) for entry in feed_list]
        if not self.fields:
            raise ValueError("DataFeeder needs at least one Field in feed_list")
        names = [f.name for f in self.fields]
        if len(set(names)) != len(names):
            raise ValueError(f"DataFeeder field names must be unique, got {names}")
        self.placer = place if isinstance(place, Placer) else Placer(place)
        self.place = self.placer.place
        self._converters = [_Converter(f) for f in self.fields]
        self._device_placers: dict[int, Placer] = {}

    @property
    def feed_names(self) -> list[str]:
        return [f.name for f in self.fields]

    def feed(self, minibatch: Iterable[Sequence[Any]]) -> dict[str, Any]:
        """One dict ``name -> array | LoDTensor`` for a list of samples."""
        return self._feed_on(minibatch, self.placer)

    def _feed_on(self, minibatch: Iterable[Sequence[Any]], placer: Placer) -> dict[str, Any]:
        samples = minibatch if isinstance(minibatch, (list, tuple)) else list(minibatch)
        count = len(self.fields)
        try:
            sizes = set(map(len, samples))
        except TypeError:
            bad = next(i for i, s in enumerate(samples) if not hasattr(s, "__len__"))
            raise ValueError(
                f"sample {bad} is a {type(samples[bad]).__name__}, expected a list or tuple of {count} fields"
            ) from None
        if sizes - {count}:
            bad = next(i for i, s in enumerate(samples) if len(s) != count)
            raise ValueError(
                f"the number of fields in sample {bad} ({len(samples[bad])}) does not match "
                f"the number of fields of the feeder ({count}: {self.feed_names})"
            )
        columns = list(zip(*samples)) if samples else [() for _ in self.fields]
        out = {f.name: convert(column) for f, convert, column in zip(self.fields, self._converters, columns)}
        return placer.place_now(out)

    def _num_places(self, num_places: int | None) -> int:
        if num_places is not None:
            if isinstance(num_places, bool) or not isinstance(num_places, int) or num_places < 1:
                raise ValueError(f"num_places must be a positive int, got {num_places!r}")
            return num_places
        if self.placer.is_cuda:
            return device_count(self.placer)
        env = os.environ.get("CPU_NUM")
        return int(env) if env and env.isdigit() and int(env) > 0 else (os.cpu_count() or 1)

    def _placer_for(self, index: int) -> Placer:
        if not self.placer.is_cuda:
            return self.placer
        if index not in self._device_placers:
            self._device_placers[index] = Placer(f"{self.placer.library}:cuda:{index}")
        return self._device_placers[index]

    def feed_parallel(self, minibatches: Iterable[Any], num_places: int | None = None) -> list[dict[str, Any]]:
        """One ``feed`` result per place (mini-batch i goes to device i on a CUDA place).

        The number of mini-batches must equal the number of places; this is checked
        before anything is converted.
        """
        batches = list(minibatches)
        count = self._num_places(num_places)
        if len(batches) != count:
            raise ValueError(
                f"feed_parallel takes one mini-batch per place: got {len(batches)} mini-batches for {count} places"
            )
        return [self._feed_on(batch, self._placer_for(i)) for i, batch in enumerate(batches)]

    def decorate_reader(
        self,
        reader: Callable[[], Iterable[Any]],
        multi_devices: bool,
        num_places: int | None = None,
        drop_last: bool = True,
    ) -> Callable[[], Iterator[Any]]:
        """A reader of ``feed`` results (or of ``feed_parallel`` lists with ``multi_devices``).

        With ``multi_devices`` the batches are grouped by the number of places; a last
        group that is too small is dropped when ``drop_last``, else ``ValueError`` is
        raised after every full group was yielded (as the original did).
        """
        if not multi_devices:

            def single() -> Iterator[dict[str, Any]]:
                for batch in reader():
                    yield self.feed(batch)

            return single

        count = self._num_places(num_places)  # resolved now, so a bad value fails at once

        def grouped() -> Iterator[list[dict[str, Any]]]:
            group: list[Any] = []
            for batch in reader():
                group.append(batch)
                if len(group) == count:
                    yield self.feed_parallel(group, count)
                    group = []
            if group and not drop_last:
                raise ValueError(
                    f"{len(group)} mini-batch(es) left over cannot fill {count} places; "
                    "use drop_last=True to drop them (no other strategy is implemented)"
                )

        return grouped


__all__ = ["DataFeeder", "Field", "LoDTensor"]
