"""Mappers applied to one sample (``SampleMappers``) and batch mappers applied to a block (``BatchMappers``).

A mapper with a parameter named ``rng`` receives a ``numpy.random.Generator``
seeded from (dataset seed, epoch, file key, record). The key is the file's
index in its dataset's list, so the draws a sample sees depend on where it
lies in the data, never on which worker read it, how many workers there are,
the rank split, or whether the epoch was resumed.

A batch mapper takes a block, ``dict field -> array`` with a leading axis of n
rows, and returns such a dict of n rows (any fields). Where a worker cuts its
blocks depends on the lease's start record (a cut or resumed file), message
sizes, row sizes and a timer, so a batch mapper must be row-wise: each output
row a function of its input row alone, as a vectorised per-sample function is.
Then the rows delivered are the same however the blocks were cut, and the
determinism guarantees hold unchanged. For the same reason a batch mapper gets
no generator: per-block draws would depend on the cut (config checks refuse an
``rng`` parameter). docs/internals.md, "Batch mappers", says more.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from loader.errors import BatchMapperError
from loader.runtime.imports import rng_parameter, rng_passing
from loader.service.blocks import block_rows
from loader.service.protocol import INDEX_COLUMN
from workers.sample_rng import RecordGenerators


class SampleMappers:
    """The dataset's mappers, bound to one lease's seed, epoch and file key."""

    def __init__(self, mappers: Sequence[Callable[..., Any]], *, seed: int, epoch: int, file_key: int) -> None:
        self._steps: list[tuple[Callable[..., Any], str]] = []
        for mapper in mappers:
            try:
                how = rng_passing(mapper)
            except ValueError as exc:  # the config check refuses it first; this is a worker's own line
                raise TypeError(f"mapper {getattr(mapper, '__name__', mapper)!r}: {exc}") from None
            self._steps.append((mapper, how))
        self.wants_rng = any(how != "plain" for _, how in self._steps)
        self._generators = RecordGenerators((int(seed), int(epoch), int(file_key)))

    def __bool__(self) -> bool:
        return bool(self._steps)

    def generator(self, record: int) -> np.random.Generator:
        """The generator of record ``record`` of this file (one per sample, shared by its mappers in order):
        ``default_rng((seed, epoch, file_key, record))``, made cheaper (``workers/sample_rng.py``)."""
        return self._generators.generator(record)

    def __call__(self, sample: Any, record: int) -> Any:
        rng = self.generator(record) if self.wants_rng else None
        for mapper, how in self._steps:
            if how == "plain":
                sample = mapper(sample)
            elif how == "keyword":
                sample = mapper(sample, rng=rng)
            else:
                sample = mapper(sample, rng)
        return sample


class BatchMappers:
    """The dataset's batch mappers, each named by its ``"module:function"`` for errors."""

    def __init__(self, specs: Sequence[str], mappers: Sequence[Callable[..., Any]]) -> None:
        self._steps = list(zip(specs, mappers))
        for spec, mapper in self._steps:
            if rng_parameter(mapper) is not None:  # a config check refuses it first; a worker never guesses
                raise BatchMapperError(f"batch mapper {spec!r} takes an rng parameter; batch mappers get none")

    def __bool__(self) -> bool:
        return bool(self._steps)

    def __call__(self, block: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``block`` through every batch mapper in order; ``BatchMapperError`` names the one that failed."""
        rows = block_rows(block)
        for spec, mapper in self._steps:
            try:
                out = mapper(block)
            except Exception as exc:
                raise BatchMapperError(f"batch mapper {spec!r} raised {type(exc).__name__}: {exc}") from exc
            block = _checked(spec, out, rows)
        return block


def _checked(spec: str, out: Any, rows: int) -> dict[str, np.ndarray]:
    """A batch mapper's result as a block of ``rows`` rows, or ``BatchMapperError`` saying what is wrong."""
    if not isinstance(out, Mapping):
        raise BatchMapperError(f"batch mapper {spec!r} returned a {type(out).__name__}, not a dict of arrays")
    if not out:
        raise BatchMapperError(f"batch mapper {spec!r} returned a dict with no fields")
    block: dict[str, np.ndarray] = {}
    for name, values in out.items():
        if not isinstance(name, str) or name == INDEX_COLUMN:
            raise BatchMapperError(
                f"batch mapper {spec!r} returned a field named {name!r}: field names are strings other than "
                f"{INDEX_COLUMN!r}"
            )
        if not isinstance(values, np.ndarray) or values.ndim == 0:
            what = "a 0-d array" if isinstance(values, np.ndarray) else f"a value of type {type(values).__name__}"
            raise BatchMapperError(
                f"batch mapper {spec!r} returned field {name!r} as {what}, "
                f"not a numpy array with a leading axis of {rows} rows"
            )
        if values.shape[0] != rows:
            raise BatchMapperError(
                f"batch mapper {spec!r} returned {values.shape[0]} rows of field {name!r} for a block of {rows}: "
                "it must return one row per row it is given"
            )
        block[name] = values
    return block


__all__ = ["SampleMappers", "BatchMappers"]
