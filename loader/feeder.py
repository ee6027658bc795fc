"""``DataFeeder``: turn a mini-batch (a list of samples) into one tensor per input.

::

    feeder = DataFeeder([Field("image", [-1, 1, 28, 28]), Field("label", [-1, 1], "int64")])
    result = feeder.feed([([0] * 784, [9]), ([1] * 784, [1])])
    result["image"].shape() == [2, 1, 28, 28]; numpy.array(result["label"]).shape == (2, 1)

* ``DataFeeder(feed_list, place="cpu", program=None, *, return_arrays=False)``, as fluid's.
  ``feed_list`` entries are ``Field``s, variable-like objects (``name``, ``shape``,
  ``dtype``, ``lod_level``: a fluid ``Variable`` fits) or names. A name is looked up in
  ``program`` (anything whose ``global_block().var(name)`` gives such a variable, or a
  mapping/sequence of Fields) or, without a program, among the ``Field``s declared in
  this process (the latest of that name), as fluid looked in its default program. A
  variable without ``lod_level`` (Paddle 3's PIR ``Value``) is fed as Paddle 3 fed it
  (``Field(..., flatten=True)``): all scalars of the batch, reshaped to its shape.
* ``Field(name, shape, dtype, lod_level)`` describes one input. A leading ``-1`` (or
  ``None``) in ``shape`` is the batch dimension; a shape with no leading ``-1`` is taken
  as the shape of one sample (as ``fluid.layers.data`` prepends the batch dimension).
  Other ``-1`` entries are free: they take whatever size the samples have.
* ``feed`` returns ``{name: LoDTensor}`` for every field, like fluid: read it with
  ``t.shape()`` (a list), ``t.lod()``, ``t.recursive_sequence_lengths()``,
  ``numpy.array(t)``, ``t.dtype`` (see :mod:`loader.lod_tensor`).
* Plain arrays in one step: ``DataFeeder(..., return_arrays=True)`` makes ``feed``,
  ``feed_parallel`` and ``decorate_reader`` give the array itself (numpy, or the torch /
  cupy tensor of ``place``) for ``lod_level == 0`` fields, and a ``LoDTensor`` only for
  sequences; ``t.data`` / ``t.numpy()`` unwrap a single result.
* ``lod_level == 0``: the data is ``(N,) + sample shape``. Each sample is reshaped to the
  sample shape when its total size matches (flat ``[0] * 784`` fits ``(1, 28, 28)``; a
  scalar fits ``(1,)``); ``recursive_sequence_lengths() == []``.
* ``lod_level == k > 0``: each sample is a ``k``-times nested sequence; the data holds the
  leaves, ``(total leaves,) + element shape``, and ``recursive_sequence_lengths()`` has
  one list of lengths per level.
* Every shape is checked, not only the rank: a sample that does not fit raises
  ``ShapeMismatchError`` (a ``ValueError``) naming the field, the expected and the
  received shape and the sample. A sample with the wrong number of fields raises
  ``ValueError`` with both counts. Values are cast to the field's dtype with numpy
  (float to int truncates, as in the original).
* ``place`` (``"cpu"``, ``"cuda:0"``, ``"torch:cpu"``, a torch device, or fluid's
  ``CPUPlace()`` / ``CUDAPlace(i)``, recognised by class name) is handled by
  ``loader.device.Placer``: on a device the data become that library's tensors.

Differences from the original: ``feed_parallel`` returns a list and checks the number
of mini-batches before converting any (the original raised lazily, at the first
``next()``); same-rank shape mismatches are errors (the original let ``[-1, 3]`` take
rows of length 2).

``Field`` and the per-field conversion live in :mod:`loader.fields`, ``LoDTensor`` in
:mod:`loader.lod_tensor` (the provider's batches use it too); both are importable
from here and from ``loader``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from loader.device import Placer, device_count, place_name
from loader.fields import Field, FieldConverter, as_field, declared_field, program_field
from loader.lod_tensor import LoDTensor

log = logging.getLogger(__name__)
_CPU_NUM_WARNED = False  # the CPU_NUM warning is given once a process, as Paddle's


def resolve_field(entry: Any, program: Any) -> Field:
    """One ``feed_list`` entry as a ``Field``: a name is looked up in ``program`` or the declared Fields."""
    if isinstance(entry, str):
        return program_field(program, entry) if program is not None else declared_field(entry)
    return as_field(entry)


def _check_feed_list(feed_list: Any) -> None:
    """Refuse one entry given where a list of them is due: a Field is not iterable, and a name would be
    iterated letter by letter."""
    if isinstance(feed_list, (str, bytes)) or (hasattr(feed_list, "name") and hasattr(feed_list, "shape")):
        name = getattr(feed_list, "name", feed_list)
        entry = repr(name) if isinstance(feed_list, (str, bytes)) else name  # [image] for a Field, ['image'] for a name
        raise TypeError(
            f"DataFeeder: feed_list must be a list of Fields, variables or names, got a "
            f"{type(feed_list).__name__} ({name!r}): write [{entry}]"
        )
    if not isinstance(feed_list, Iterable):
        raise TypeError(
            f"DataFeeder: feed_list must be a list of Fields, variables or names, got {type(feed_list).__name__}"
        )


class DataFeeder:
    """Converts mini-batches (lists of samples) into one ``LoDTensor`` (or array) per ``Field``."""

    def __init__(
        self, feed_list: Sequence[Any], place: Any = "cpu", program: Any = None, *, return_arrays: bool = False
    ) -> None:
        _check_feed_list(feed_list)
        self.fields = [resolve_field(entry, program) for entry in feed_list]
        self.return_arrays = bool(return_arrays)
        if not self.fields:
            raise ValueError("DataFeeder needs at least one Field in feed_list")
        names = [f.name for f in self.fields]
        if len(set(names)) != len(names):
            raise ValueError(f"DataFeeder field names must be unique, got {names}")
        self.placer = place if isinstance(place, Placer) else Placer(place_name(place))
        self.place = self.placer.place
        self._converters = [FieldConverter(f) for f in self.fields]
        self._device_placers: dict[int, Placer] = {}

    @property
    def feed_names(self) -> list[str]:
        return [f.name for f in self.fields]

    def feed(self, minibatch: Iterable[Sequence[Any]]) -> dict[str, Any]:
        """One dict ``name -> LoDTensor`` (with ``return_arrays``: array for lod_level 0) for a list of samples."""
        return self._feed_on(minibatch, self.placer)

    def _wrap(self, value: Any) -> Any:
        if isinstance(value, LoDTensor) or self.return_arrays:
            return value
        return LoDTensor(value, [])

    def _feed_on(self, minibatch: Iterable[Sequence[Any]], placer: Placer) -> dict[str, Any]:
        samples = minibatch if isinstance(minibatch, (list, tuple)) else list(minibatch)
        count = len(self.fields)
        # One sample handed over as the mini-batch has as many entries as the feeder has fields: say so, since
        # the error about its "samples" (its fields) would not.
        hint = "; feed takes a mini-batch, a list of samples: [sample] for one" if len(samples) == count else ""
        try:
            sizes = set(map(len, samples))
        except TypeError:
            bad = next(i for i, s in enumerate(samples) if not hasattr(s, "__len__"))
            raise ValueError(
                f"sample {bad} is a {type(samples[bad]).__name__}, expected a list or tuple of {count} fields{hint}"
            ) from None
        if sizes - {count}:
            bad = next(i for i, s in enumerate(samples) if len(s) != count)
            raise ValueError(
                f"the number of fields in sample {bad} ({len(samples[bad])}) does not match "
                f"the number of fields of the feeder ({count}: {self.feed_names}){hint}"
            )
        mapping = next((i for i, s in enumerate(samples) if isinstance(s, Mapping)), None)
        if mapping is not None:
            # zip() would read a dict by its keys and feed those.
            raise ValueError(
                f"sample {mapping} is a {type(samples[mapping]).__name__}: give each sample as a tuple of its "
                f"fields in feed_list order {self.feed_names}"
            )
        columns = list(zip(*samples)) if samples else [() for _ in self.fields]
        parts = zip(self.fields, self._converters, columns)
        out = {f.name: self._wrap(convert(column)) for f, convert, column in parts}
        return placer.place_now(out)

    def _num_places(self, num_places: int | None) -> int:
        if num_places is not None:
            if isinstance(num_places, bool) or not isinstance(num_places, int) or num_places < 1:
                raise ValueError(f"num_places must be a positive int, got {num_places!r}")
            return num_places
        if self.placer.is_cuda:
            return device_count(self.placer)
        env = os.environ.get("CPU_NUM")
        if env and env.isdigit() and int(env) > 0:
            return int(env)
        # Paddle's cpu_places(): one place when CPU_NUM is unset (with a warning). The core count grouped a
        # short epoch's batches into groups it then dropped: 3 batches on a 4-core host fed nothing.
        global _CPU_NUM_WARNED
        if not _CPU_NUM_WARNED:
            _CPU_NUM_WARNED = True
            log.warning(
                "CPU_NUM is %s: feeding one CPU place, as Paddle does; set CPU_NUM=N (or pass num_places) for N",
                "not set" if env is None else f"{env!r}, not a positive whole number",
            )
        return 1

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


__all__ = ["DataFeeder", "Field", "LoDTensor", "place_name", "resolve_field"]
