"""An image pipeline: JPEG bytes -> random 224x224 crop, random horizontal flip, normalised float32.

The workload most training jobs run, used by the image benchmark (``scripts/bench_images.py``) on
both sides, ours and torch's ``DataLoader``, with the same code. A sample is ``[jpeg, label, ...]``
where ``jpeg`` is the encoded file as a ``uint8`` array (a RecordIO record written as
``[np.frombuffer(data, np.uint8), label]``, or one file read by ``read_image_file``).

In a config::

    [source]
    files = ["images/*.recordio"]            # records [jpeg bytes as uint8, label]
    # or, for files in folders (root/<class>/<name>.jpg):
    # files = ["images/*/*.jpg"]
    # reader = "loader.examples.images:read_image_file"

    [pipeline]
    mappers = ["loader.examples.images:decode_crop_flip"]

``decode_crop_flip`` takes the service's per-sample generator (its ``rng`` parameter), so the crop
and the flip of every sample are the same in every run with a seed, whatever the worker count.

Needs Pillow (``pip install '/path/to/loader[examples]'`` from the checkout), imported on first use.
"""

from __future__ import annotations

import functools
import io
import os
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from loader.errors import MissingDependencyError

CROP = 224
# The usual ImageNet statistics, per channel (RGB), on the 0..255 scale.
MEAN = np.array([0.485, 0.456, 0.406], np.float32) * 255.0
STD = np.array([0.229, 0.224, 0.225], np.float32) * 255.0
_MEAN_CHW = MEAN.reshape(3, 1, 1)
_INV_STD_CHW = (1.0 / STD).reshape(3, 1, 1)


def _pil_image() -> Any:
    try:
        from PIL import Image
    except ImportError:
        raise MissingDependencyError(
            "loader.examples.images needs Pillow: pip install '/path/to/loader[examples]' from the project's checkout (or pip install pillow)"
        ) from None
    return Image


def decode_crop_flip(sample: Any, rng: np.random.Generator) -> list[Any]:
    """``[jpeg, *rest] -> [float32[3, 224, 224], *rest]``: decode, random crop, random flip, normalise.

    The crop's corner is drawn uniformly and the image flipped left-right with probability 1/2,
    both from ``rng``; the pixels become ``(x - MEAN) / STD`` per channel, channels first.
    """
    data, *rest = sample
    image_module = _pil_image()
    image = image_module.open(io.BytesIO(np.ascontiguousarray(data, dtype=np.uint8).data))
    image.load()  # decodes (from memory: there is no file to close)
    if image.mode != "RGB":
        image = image.convert("RGB")  # grey or CMYK JPEGs
    width, height = image.size
    if width < CROP or height < CROP:
        raise ValueError(f"image of {width}x{height} is smaller than the {CROP}x{CROP} crop")
    left = int(rng.integers(0, width - CROP + 1))
    top = int(rng.integers(0, height - CROP + 1))
    image = image.crop((left, top, left + CROP, top + CROP))
    if rng.random() < 0.5:
        image = image.transpose(image_module.Transpose.FLIP_LEFT_RIGHT)
    pixels = np.asarray(image)  # uint8[224, 224, 3]
    out = np.empty((3, CROP, CROP), np.float32)
    np.subtract(pixels.transpose(2, 0, 1), _MEAN_CHW, out=out)
    out *= _INV_STD_CHW
    return [out, *rest]


@functools.lru_cache(maxsize=64)
def _classes(root: str) -> dict[str, int]:
    """The class folders under ``root``, sorted by name, numbered from 0 (an ``ImageFolder`` layout)."""
    return {name: i for i, name in enumerate(sorted(e.name for e in os.scandir(root) if e.is_dir()))}


def image_label(path: str) -> int:
    """The label of ``root/<class>/<file>``: the index of ``<class>`` among the sorted folders of ``root``."""
    folder = os.path.dirname(os.path.abspath(path))
    return _classes(os.path.dirname(folder))[os.path.basename(folder)]


def read_image_file(path: str) -> Callable[[], Iterator[list[np.ndarray]]]:
    """A reader (``[source] reader = ...``) of one image file: one sample ``[bytes as uint8, label]``."""

    def read() -> Iterator[list[np.ndarray]]:
        with open(path, "rb") as fh:
            data = fh.read()
        yield [np.frombuffer(data, np.uint8), np.int64(image_label(path))]

    return read


__all__ = ["decode_crop_flip", "read_image_file", "image_label", "CROP", "MEAN", "STD"]
