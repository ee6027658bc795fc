"""Small user functions that the shipped configs and benchmarks name as "module:function".

A config can only name importable code, and ``configs/`` is not a package, so
the examples live here: ``configs/text.toml`` uses ``parse_labeled_line``,
``configs/provider.toml`` uses ``labeled_text_provider``, and the service
benchmark's CPU-heavy case uses ``cpu_heavy`` on both sides (and ``cpu_heavy_batch``,
its vectorised form, as a batch mapper on ours in the batch-mapper case). Data for them is
written by ``loader.examples.datagen`` (``write_text``; ``loader gen-data``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from loader.provider import dense_vector, integer_value, provider

TEXT_DIM = 4  # features per line in the text examples (loader.examples.datagen.write_text's default)
HEAVY_ROUNDS = 150  # ~0.3 ms of numpy work per sample on one core (the spec asks "a few hundred us")
_HEAVY_WEIGHTS = np.random.default_rng(1234).standard_normal((64, 64)).astype(np.float32) / 8.0


def parse_labeled_line(line: str) -> dict[str, Any] | None:
    """``"label<TAB>f1 f2 ..."`` -> ``{"x": float32[n], "label": int64}``; blank and ``#`` lines skipped."""
    if not line.strip() or line.lstrip().startswith("#"):
        return None
    label, _, features = line.partition("\t")
    return {"x": np.array(features.split(), dtype=np.float32), "label": np.int64(label)}


@provider(input_types={"x": dense_vector(TEXT_DIM), "label": integer_value(10)})
def labeled_text_provider(settings: Any, filename: str) -> Iterator[dict[str, Any]]:
    """A PyDataProvider2 provider over the same text files as ``parse_labeled_line``."""
    with open(filename, encoding="utf-8") as fh:
        for line in fh:
            sample = parse_labeled_line(line.rstrip("\n"))
            if sample is not None:
                yield {"x": sample["x"], "label": int(sample["label"])}


def cpu_heavy(sample: Any) -> Any:
    """A deterministic, CPU-bound per-sample mapper: ``[x, *rest] -> [f(x), *rest]``.

    ``x`` is a 64-float vector (``loader gen-data``'s default dim). The work is
    a chain of small matrix-vector products, so it holds the GIL like typical
    Python/numpy augmentation code and scales only with processes.
    """
    x, *rest = sample
    v = np.array(x, dtype=np.float32)  # a plain ndarray copy: no memmap subclass overhead per op
    for _ in range(HEAVY_ROUNDS):
        v = np.tanh(_HEAVY_WEIGHTS @ v)
    return [v, *rest]


def cpu_heavy_batch(block: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``cpu_heavy`` as a batch mapper (``pipeline.batch_mappers``): the first field, float32 of n rows of
    64, becomes what ``cpu_heavy`` makes of each row, bit for bit; the other fields pass through.

    One stacked matrix-vector product per round for the whole block: numpy runs the same kernel
    per row as ``cpu_heavy``'s ``W @ v``, so the rows are equal, not merely close. (``V @ W.T``,
    one matrix-matrix product, is about twice as fast again but sums in another order: the last
    bits differ.) Row-wise, as a batch mapper must be.
    """
    first, *rest = block
    v = np.array(block[first], dtype=np.float32)[:, :, None]  # (n, 64, 1): a stack of column vectors
    for _ in range(HEAVY_ROUNDS):
        v = np.tanh(np.matmul(_HEAVY_WEIGHTS, v))
    return {first: v[:, :, 0], **{name: block[name] for name in rest}}


__all__ = ["parse_labeled_line", "labeled_text_provider", "cpu_heavy", "cpu_heavy_batch"]
