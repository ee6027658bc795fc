"""loader: a multiprocessing data-loading service built on the PaddlePaddle reader design.

Public names are imported lazily, so ``import loader`` stays cheap and does not
pull in ZeroMQ (or torch) until a service or device feature is used.
``__all__`` lists every public name (tests/unit/test_package.py keeps it exact).
"""

import importlib as _importlib
import typing as _typing

from loader import errors
from loader.errors import (
    BatchMapperError,
    ClosedError,
    ComposeNotAligned,
    ConfigError,
    CorruptFileError,
    DataError,
    EpochStalledError,
    FormatOptionError,
    LoaderError,
    MalformedMessageError,
    MessageTooLargeError,
    MissingDependencyError,
    ProtocolVersionError,
    ServiceUnavailableError,
    ShapeMismatchError,
    TransportError,
    UnknownFormatError,
    UnsendableSampleError,
    WorkerDiedError,
    WorkerError,
)

# Eager, and from a module of another name: a public submodule named ``batch`` would replace
# this function on ``loader`` as soon as anything imported ``loader.batch``.
from loader.reader.batching import batch

if _typing.TYPE_CHECKING:  # what the lazy names below resolve to, for type checkers
    from loader import config, device, io, provider, reader, recordio, service
    from loader.config import load_config
    from loader.feeder import DataFeeder, Field, LoDTensor
    from loader.runtime import codec
    from loader.service.client.client import Client
    from loader.service.local import Loader

    __version__: str

# The version of the installed distribution (``pip install -e .`` counts); a source tree that was
# never installed has no metadata and says so rather than repeating a number by hand. Looked up on
# first use: importing importlib.metadata and reading the metadata take 20-30 ms, paid otherwise by
# every worker, daemon and client process at start-up for a string only `--version` and one error show.
_VERSION_NOT_INSTALLED = "0+unknown"


def _installed_version() -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version("loader-service")
    except importlib.metadata.PackageNotFoundError:
        return _VERSION_NOT_INSTALLED


# name -> module that defines it
_LAZY = {
    "DataFeeder": "loader.feeder",
    "Field": "loader.feeder",
    "LoDTensor": "loader.feeder",
    "Client": "loader.service.client.client",
    "Loader": "loader.service.local",
    "load_config": "loader.config",
}
# public submodule name -> the module it is (``codec`` lives with the runtime helpers)
_SUBMODULES = {
    "reader": "loader.reader",
    "recordio": "loader.recordio",
    "io": "loader.io",
    "provider": "loader.provider",
    "device": "loader.device",
    "codec": "loader.runtime.codec",
    "config": "loader.config",
    "service": "loader.service",
    "errors": "loader.errors",
}


def __getattr__(name: str) -> _typing.Any:
    if name == "__version__":
        version = _installed_version()
        globals()["__version__"] = version
        return version
    if name in _LAZY:
        value = getattr(_importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        module = _importlib.import_module(_SUBMODULES[name])
        globals()[name] = module
        return module
    raise AttributeError(f"module 'loader' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | set(_SUBMODULES) | {"__version__"})


__all__ = [
    "__version__",
    "batch",
    # classes and functions, imported on first use
    "Client",
    "DataFeeder",
    "Field",
    "LoDTensor",
    "Loader",
    "load_config",
    # submodules, imported on first use
    "codec",
    "config",
    "device",
    "errors",
    "io",
    "provider",
    "reader",
    "recordio",
    "service",
    # the exception tree (loader.errors)
    "LoaderError",
    "ConfigError",
    "FormatOptionError",
    "DataError",
    "CorruptFileError",
    "ShapeMismatchError",
    "UnknownFormatError",
    "BatchMapperError",
    "MessageTooLargeError",
    "UnsendableSampleError",
    "ComposeNotAligned",
    "MissingDependencyError",
    "WorkerError",
    "WorkerDiedError",
    "TransportError",
    "ServiceUnavailableError",
    "EpochStalledError",
    "MalformedMessageError",
    "ProtocolVersionError",
    "ClosedError",
]
