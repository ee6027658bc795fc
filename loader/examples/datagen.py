"""Synthetic datasets for the demo, the benchmarks and the example configs.

``loader gen-data DIR --format npy|recordio --files N --samples M`` calls
``generate``. Values are a pure function of (seed, file index, sample index),
so two runs with the same arguments write identical files.

Layouts, ``part-XXXXX.<format>`` per file:

* ``npy``: ``part-XXXXX.npy`` = ``float32[M, dim]`` features (slot ``data``) and
  its companion ``part-XXXXX.label.npy`` = ``int64[M]`` labels (slot ``label``);
  the built-in reader memory-maps both.
* ``npz``: uncompressed (``np.savez``) with ``x`` = ``float32[M, dim]`` and
  ``label`` = ``int64[M]``; the built-in reader memory-maps both (two slots).
* ``recordio``: each record a ``[float32[dim], int64]`` sample (two slots).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator

import numpy as np

FORMATS = ("npy", "npz", "recordio")
DEFAULT_DIM = 64
LABEL_CLASSES = 10
_PART = re.compile(r"part-\d{5,}\.(?:npy|label\.npy|npz|recordio)")  # ``file_name``'s files and npy companions


def file_name(index: int, fmt: str) -> str:
    return f"part-{index:05d}.{fmt}"


def file_arrays(index: int, samples: int, dim: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Features and labels of file ``index`` (deterministic in seed and index).

    A label is the class whose direction (one fixed random projection per seed, shared by every
    file) the features point along most, so a model can learn it: the demo's loss falls.
    """
    rng = np.random.default_rng([seed, index])
    features = rng.standard_normal((samples, dim), dtype=np.float32)
    directions = np.random.default_rng([seed, 2**31]).standard_normal((dim, LABEL_CLASSES), dtype=np.float32)
    labels = np.argmax(features @ directions, axis=1).astype(np.int64)
    return features, labels


def generate(
    directory: str,
    *,
    format: str = "npy",  # matches the CLI option and config key
    files: int = 4,
    samples: int = 1024,
    dim: int = DEFAULT_DIM,
    seed: int = 0,
) -> list[str]:
    """Write ``files`` files of ``samples`` samples each into ``directory``; returns their paths."""
    if format not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {format!r}")
    if files < 1 or samples < 1 or dim < 1:
        raise ValueError(f"files, samples and dim must be >= 1, got {files}, {samples}, {dim}")
    os.makedirs(directory, exist_ok=True)
    paths = []
    for index in range(files):
        path = os.path.join(directory, file_name(index, format))
        features, labels = file_arrays(index, samples, dim, seed)
        if format == "npy":
            np.save(path, features)
            np.save(path[: -len(".npy")] + ".label.npy", labels)  # a companion: the field "label"
        elif format == "npz":
            np.savez(path, x=features, label=labels)  # stored, not deflated: memory-mappable
        else:
            _write_recordio(path, features, labels)
        paths.append(path)
    return paths


def earlier_parts(directory: str, written: list[str]) -> list[str]:
    """The files of ``directory`` named as ``generate`` names its files (``part-XXXXX.npy``, its ``.label.npy``
    companion, ``.npz``, ``.recordio``) other than those ``written`` (``generate``'s paths) wrote: left by an
    earlier run of more files or another format, they are read by a glob that matches them too. Sorted names;
    never removed here (they may be the user's)."""
    ours = {os.path.basename(path) for path in written}
    ours |= {name[: -len(".npy")] + ".label.npy" for name in ours if name.endswith(".npy")}
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return sorted(name for name in names if _PART.fullmatch(name) and name not in ours)


def _write_recordio(path: str, features: np.ndarray, labels: np.ndarray) -> None:
    # Imported here: recordio is only needed for this format.
    from loader import recordio

    with recordio.Writer(path) as writer:
        for record in _records(features, labels):
            writer.write(record)  # the writer encodes with loader.runtime.codec


def _records(features: np.ndarray, labels: np.ndarray) -> Iterator[list]:
    for row, label in zip(features, labels):
        yield [row, label]


def write_text(path: str, *, samples: int = 100, dim: int = 4, seed: int = 0) -> str:
    """A text file for the "text" format: ``label<TAB>f1 f2 ...`` per line (its directory made if need be)."""
    features, labels = file_arrays(0, samples, dim, seed)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        for row, label in zip(features, labels):
            fh.write(f"{label}\t{' '.join(f'{v:.6g}' for v in row)}\n")
    return path


__all__ = ["generate", "earlier_parts", "write_text", "file_arrays", "FORMATS"]
