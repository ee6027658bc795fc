"""The file-format registry: format name -> factory, file suffix -> format name.

A factory is called as ``factory(path, shapes=..., dtypes=..., lod_levels=...,
**options)`` and returns a ``ReaderBase`` over that one file. It can be given as
a callable or as a ``"package.module:function"`` string (handy in config files),
imported on first use. Built-in formats are registered that way too, so
importing ``loader.io`` imports none of them.

Lookup by file name takes the longest registered suffix the name ends with
(case-insensitive), so ``.tar.gz`` beats ``.gz``. The registry is shared by all
threads of the process and guarded by a lock.
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from loader.errors import UnknownFormatError
from loader.io.base import ReaderBase
from loader.io.slots import DtypesArg, LodArg, ShapesArg

Factory = Callable[..., ReaderBase]

_lock = threading.Lock()
_factories: dict[str, Factory | str] = {}
_suffixes: dict[str, str] = {}  # suffix (lower case, with dot) -> format name


def register_file_reader(
    format_name: str,
    factory: Factory | str,
    suffixes: Iterable[str] | None = None,
) -> None:
    """Register (or replace) a file format.

    ``suffixes`` defaults to ``["." + format_name]``; pass ``[]`` for a format
    chosen only by name (``create_file_reader(path, format=...)``).
    """
    if not format_name or not isinstance(format_name, str):
        raise ValueError(f"format name must be a non-empty str, got {format_name!r}")
    if isinstance(factory, str):
        if factory.count(":") != 1 or not all(factory.split(":")):
            raise ValueError(f"factory string must look like 'package.module:function', got {factory!r}")
    elif not callable(factory):
        raise TypeError(f"factory must be callable or a 'module:function' string, got {type(factory).__name__}")
    wanted = [f".{format_name}"] if suffixes is None else list(suffixes)
    normalised = []
    for suffix in wanted:
        if not isinstance(suffix, str) or not suffix:
            raise ValueError(f"suffixes must be non-empty strings, got {suffix!r}")
        normalised.append((suffix if suffix.startswith(".") else "." + suffix).lower())
    with _lock:
        for suffix in [s for s, name in _suffixes.items() if name == format_name]:
            del _suffixes[suffix]
        _factories[format_name] = factory
        for suffix in normalised:
            _suffixes[suffix] = format_name


def register_formats(table: Mapping[str, Any]) -> list[str]:
    """Register the formats of a config table; return their names.

    Each entry is ``name = "package.module:factory"`` (suffix ``.name``) or
    ``name = {factory = "...", suffixes = [".a", ".b"]}``, e.g. a ``[formats]``
    table of a TOML file. Factories are imported on first use, so a worker
    host that never reads such a file needs no import.
    """
    names = []
    for name, entry in table.items():
        if isinstance(entry, Mapping):
            unknown = set(entry) - {"factory", "suffixes"}
            if unknown or "factory" not in entry:
                raise ValueError(f"format {name!r}: expected keys factory (and suffixes), got {sorted(entry)}")
            register_file_reader(name, entry["factory"], entry.get("suffixes"))
        else:
            register_file_reader(name, entry)
        names.append(name)
    return names


def unregister_file_reader(format_name: str) -> None:
    """Remove a format and its suffixes (no error if it is not registered)."""
    with _lock:
        _factories.pop(format_name, None)
        for suffix in [s for s, name in _suffixes.items() if name == format_name]:
            del _suffixes[suffix]


def registered_formats() -> dict[str, list[str]]:
    """Format name -> its suffixes, for messages and introspection."""
    with _lock:
        table: dict[str, list[str]] = {name: [] for name in _factories}
        for suffix, name in _suffixes.items():
            table[name].append(suffix)
    return table


def format_for(path: str | os.PathLike[str]) -> str:
    """The format name registered for ``path``'s suffix, or ``UnknownFormatError``."""
    base = os.path.basename(os.fspath(path)).lower()
    with _lock:
        matches = [s for s in _suffixes if base.endswith(s)]
        if matches:
            return _suffixes[max(matches, key=len)]
    raise UnknownFormatError(f"no file reader is registered for {os.fspath(path)!r}; {_describe()}")


def _describe() -> str:
    formats = registered_formats()
    listed = ", ".join(f"{name} ({' '.join(sorted(sfx)) or 'by name only'})" for name, sfx in sorted(formats.items()))
    return f"registered formats: {listed or 'none'}"


def _resolve(format_name: str) -> Factory:
    with _lock:
        factory = _factories.get(format_name)
    if factory is None:
        raise UnknownFormatError(f"unknown file format {format_name!r}; {_describe()}")
    if isinstance(factory, str):
        module_name, attr = factory.split(":")
        try:
            resolved = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise UnknownFormatError(f"format {format_name!r}: cannot load factory {factory!r} ({exc})") from exc
        with _lock:
            if _factories.get(format_name) == factory:  # unless re-registered meanwhile
                _factories[format_name] = resolved
        factory = resolved
    return factory


def reader_factory(format: str | None, path: str | os.PathLike[str]) -> Factory:
    """The factory ``create_file_reader`` would call for ``path`` (``UnknownFormatError`` for none), not called."""
    return _resolve(format if format is not None else format_for(path))


def create_file_reader(
    path: str | os.PathLike[str],
    format: str | None = None,  # the documented name
    shapes: ShapesArg = None,
    dtypes: DtypesArg = None,
    lod_levels: LodArg = None,
    **options: Any,
) -> ReaderBase:
    """A reader over the one file at ``path``, chosen by ``format`` or by the file's suffix."""
    factory = reader_factory(format, path)
    reader = factory(os.fspath(path), shapes=shapes, dtypes=dtypes, lod_levels=lod_levels, **options)
    if not isinstance(reader, ReaderBase):
        raise TypeError(
            f"file reader factory for {os.fspath(path)!r} returned {type(reader).__name__}, not a ReaderBase"
        )
    return reader


def _register_builtins() -> None:
    register_file_reader("recordio", "loader.io.formats_recordio:RecordIOFileReader", [".recordio"])
    register_file_reader("npy", "loader.io.formats_numpy:NpyFileReader", [".npy"])
    register_file_reader("npz", "loader.io.formats_numpy:NpzFileReader", [".npz"])
    register_file_reader("text", "loader.io.formats_text:TextFileReader", [".txt"])


_register_builtins()

__all__ = [
    "register_file_reader",
    "register_formats",
    "unregister_file_reader",
    "registered_formats",
    "create_file_reader",
    "reader_factory",
    "format_for",
]
