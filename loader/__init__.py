"""loader: a multiprocessing data-loading service built on the PaddlePaddle reader design.

Public names are imported lazily, so ``import loader`` stays cheap and does not
pull in ZeroMQ (or torch) until a service or device feature is used.
"""

from __future__ import annotations

import importlib
from typing import Any

from loader import errors
from loader.errors import (
    ClosedError,
    ComposeNotAligned,
    ConfigError,
    CorruptFileError,
    DataError,
    LoaderError,
    ProtocolVersionError,
    ServiceUnavailableError,
    ShapeMismatchError,
    TransportError,
    UnknownFormatError,
    WorkerDiedError,
    WorkerError,
)

# Eager, and from a private module: a public submodule named ``batch`` would replace
# this function on ``loader`` as soon as anything imported ``loader.batch``.
from loader.reader.batching import batch

__version__ = "0.1.0"

# name -> module that defines it
_LAZY = {
    "DataFeeder": "loader.feeder",
    "Field": "loader.feeder",
    "LoDTensor": "loader.feeder",
    "Client": "loader.service.client.client",
    "Loader": "loader.service.local",
    "load_config": "loader.config",
}
_SUBMODULES = {"reader", "recordio", "io", "provider", "device", "codec", "config", "service", "errors"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        module = importlib.import_module(f"loader.{name}")
        globals()[name] = module
        return module
    raise AttributeError(f"module 'loader' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | _SUBMODULES)


__all__ = [
    "__version__",
    "batch",
    "reader",
    "recordio",
    "io",
    "provider",
    "DataFeeder",
    "Field",
    "LoDTensor",
    "Client",
    "Loader",
    *errors.__all__,
]
