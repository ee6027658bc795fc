"""Mappers applied to one sample, each given a generator of its own when it asks for one.

A mapper with a parameter named ``rng`` receives a ``numpy.random.Generator``
seeded from (dataset seed, epoch, file key, record). The key is the file's
index in its dataset's list, so the draws a sample sees depend on where it
lies in the data, never on which worker read it, how many workers there are,
the rank split, or whether the epoch was resumed.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


def _rng_parameter(mapper: Callable[..., Any]) -> inspect.Parameter | None:
    try:
        parameters = inspect.signature(mapper).parameters
    except (TypeError, ValueError):  # builtins and C functions without a signature take no rng
        return None
    return parameters.get("rng")


class SampleMappers:
    """The dataset's mappers, bound to one lease's seed, epoch and file key."""

    def __init__(self, mappers: Sequence[Callable[..., Any]], *, seed: int, epoch: int, file_key: int) -> None:
        self._steps: list[tuple[Callable[..., Any], str]] = []
        for mapper in mappers:
            parameter = _rng_parameter(mapper)
            if parameter is None:
                how = "plain"
            elif parameter.kind is inspect.Parameter.POSITIONAL_ONLY:
                how = "positional"
            else:
                how = "keyword"
            self._steps.append((mapper, how))
        self.wants_rng = any(how != "plain" for _, how in self._steps)
        self._key = (int(seed), int(epoch), int(file_key))

    def __bool__(self) -> bool:
        return bool(self._steps)

    def generator(self, record: int) -> np.random.Generator:
        """The generator of record ``record`` of this file (one per sample, shared by its mappers in order)."""
        return np.random.default_rng((*self._key, int(record)))

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


__all__ = ["SampleMappers"]
