"""Small user functions that the shipped configs and benchmarks name as "module:function".

A config can only name importable code, and ``configs/`` is not a package, so
the examples live here: ``configs/text.toml`` uses ``parse_labeled_line``,
``configs/provider.toml`` uses ``labeled_text_provider``, and the service
benchmark's CPU-heavy case uses ``cpu_heavy`` on both sides. Data for them is
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


__all__ = ["parse_labeled_line", "labeled_text_provider", "cpu_heavy"]
