"""Optional C codecs for RecordIO: cramjam's Snappy and google-crc32c, used when installed.

``pip install '/path/to/loader[snappy]'`` from the checkout (or the two packages by name) brings them; without them
the pure-Python codecs in ``snappy`` and ``crc32c`` do the same work, only slower. Both paths
give the same bytes: the tests compare them on the same inputs.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any


def _optional(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _snappy_module() -> Any:
    cramjam = _optional("cramjam")
    return getattr(cramjam, "snappy", None) if cramjam is not None else None


def _crc_module() -> ModuleType | None:
    module = _optional("google_crc32c")
    # The package falls back to pure Python without its C extension: ours is as fast, keep it.
    if module is None or getattr(module, "implementation", "c") != "c":
        return None
    return module


SNAPPY = _snappy_module()
CRC32C = _crc_module()


def describe() -> str:
    """Which backend each codec uses, for ``loader check`` and the benchmark's report."""
    snappy = "cramjam" if SNAPPY is not None else "pure Python"
    crc = "google-crc32c" if CRC32C is not None else "pure Python (numpy)"
    return f"snappy: {snappy}; crc32c: {crc}"


__all__ = ["SNAPPY", "CRC32C", "describe"]
