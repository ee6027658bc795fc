"""The ``@provider`` decorator, the provider object it makes, and the settings object."""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from loader.provider.session import DEFAULT_MAX_OPEN_FILES, BatchReader, ProviderSession
from loader.provider.settings import Settings
from loader.provider.types import CacheType, InputType
from loader.runtime.imports import import_object

_TRUE_WORDS = (1, "1", "t", "true", "on")
_FALSE_WORDS = (0, "0", "f", "false", "off")

logger = logging.getLogger("loader.provider")


def normalize_should_shuffle(value: Any) -> bool | None:
    """bool and None are kept; 1/'t'/'true'/'on' -> True, 0/'f'/'false'/'off' -> False, else None."""
    if value is None or isinstance(value, bool):
        return value
    word = value.lower() if isinstance(value, str) else value
    if word in _TRUE_WORDS:
        return True
    if word in _FALSE_WORDS:
        return False
    logger.warning(
        "Could not recognize should_shuffle (%s), using the default (shuffle when training). "
        "Set should_shuffle to a bool or one of %s",
        value,
        list(_TRUE_WORDS + _FALSE_WORDS),
    )
    return None


def read_file_list(file_list: str | os.PathLike[str] | Iterable[str]) -> list[str]:
    """A list of data file names: the list itself, or the lines of a ``train.list`` file."""
    if isinstance(file_list, (str, os.PathLike)):
        with open(file_list, encoding="utf-8") as fh:
            return [line.strip() for line in fh if line.strip()]
    files = [os.fspath(f) for f in file_list]
    if not all(isinstance(f, str) for f in files):
        raise TypeError("file_list must be a path to a list file or a list of file names")
    return files


class DataProvider:
    """What ``@provider`` turns ``process(settings, filename)`` into.

    Calling it calls ``process``; ``reader``/``batch_reader``/``open`` run it over a
    file list. It pickles by reference (module and name), so a worker process can
    receive it when it is defined at module level.
    """

    # Copied from ``process`` by functools.update_wrapper.
    __name__: str
    __qualname__: str

    def __init__(self, process: Callable[[Any, str], Iterable[Any]], options: Mapping[str, Any]) -> None:
        functools.update_wrapper(self, process)
        self.process = process
        self.options = dict(options)

    def __call__(self, settings: Any, filename: str) -> Iterable[Any]:
        return self.process(settings, filename)

    def __reduce__(self) -> tuple[Any, ...]:
        return (import_object, (f"{self.__module__}:{self.__qualname__}",))

    def __repr__(self) -> str:
        return f"<provider {self.__module__}.{self.__qualname__}>"

    def open(self, file_list: Any, is_train: bool = True, seed: int | None = None, **kwargs: Any) -> ProviderSession:
        """Set up one instance over ``file_list``: settings, ``init_hook``, slot order."""
        return ProviderSession(self, self._settings(read_file_list(file_list), is_train, kwargs), seed)

    def reader(self, file_list: Any, is_train: bool = True, **kwargs: Any) -> ProviderSession:
        """A paddle sample reader: each call is one pass yielding tuples in slot order."""
        return self.open(file_list, is_train, **kwargs)

    def batch_reader(
        self, file_list: Any, batch_size: int, is_train: bool = True, drop_last: bool = False, **kwargs: Any
    ) -> BatchReader:
        """A zero-argument callable; each call is one pass yielding batch dicts."""
        return BatchReader(self.open(file_list, is_train, **kwargs), batch_size, drop_last)

    def _settings(self, files: list[str], is_train: bool, kwargs: dict[str, Any]) -> Settings:
        opts = self.options
        should_shuffle = normalize_should_shuffle(opts["should_shuffle"])
        settings = Settings(
            user_kwargs=kwargs,
            input_types=opts["input_types"],
            logger=logger,
            is_train=bool(is_train),
            file_list=files,
            should_shuffle=bool(is_train) if should_shuffle is None else should_shuffle,
            pool_size=int(opts["pool_size"]),
            min_pool_size=int(opts["min_pool_size"]),
            can_over_batch_size=bool(opts["can_over_batch_size"]),
            calc_batch_size=opts["calc_batch_size"],
            cache=CacheType(opts["cache"]),
            check=bool(opts["check"]),
            check_fail_continue=bool(opts["check_fail_continue"]),
            max_open_files=int(opts["max_open_files"]),
        )
        if opts["init_hook"] is not None:
            opts["init_hook"](settings, file_list=files, is_train=bool(is_train), **kwargs)
        _resolve_slots(settings, kwargs.get("input_order"), self.__name__)
        return settings


def _resolve_slots(settings: Settings, input_order: Sequence[str] | None, name: str) -> None:
    """Fix slot names and types from ``settings.input_types`` (dict or list) and ``input_order``."""
    types = settings.input_types
    if types is None:
        raise ValueError(
            f"provider {name}: input_types must be set (in @provider, or by init_hook as settings.input_types "
            "or settings.slots)"
        )
    if isinstance(types, InputType):
        types = [types]
    if isinstance(types, Mapping):
        names = list(input_order) if input_order is not None else list(types)
        missing = [n for n in names if n not in types]
        if missing:
            raise ValueError(f"provider {name}: input_order names {missing} not in input_types {list(types)}")
        slot_types = [types[n] for n in names]
    else:
        slot_types = list(types)
        names = list(input_order) if input_order is not None else [f"slot{i}" for i in range(len(slot_types))]
        if len(names) != len(slot_types):
            raise ValueError(f"provider {name}: input_order has {len(names)} names for {len(slot_types)} input_types")
    bad = [t for t in slot_types if not isinstance(t, InputType)]
    if bad or not slot_types:
        raise ValueError(f"provider {name}: input_types must be InputType objects (dense_vector(...) ...), got {bad}")
    if len(set(names)) != len(names):
        raise ValueError(f"provider {name}: slot names must be unique, got {names}")
    settings.slot_names, settings.slot_types = names, slot_types
    settings.dict_mode = isinstance(types, Mapping)


def provider(
    input_types: Any = None,
    should_shuffle: Any = None,
    pool_size: int = -1,
    min_pool_size: int = -1,
    can_over_batch_size: bool = True,
    calc_batch_size: Callable[[Any], int] | None = None,
    cache: CacheType = CacheType.NO_CACHE,
    check: bool = False,
    check_fail_continue: bool = False,
    init_hook: Callable[..., None] | None = None,
    **kwargs: Any,
) -> Callable[[Callable[[Any, str], Iterable[Any]]], DataProvider]:
    """Decorate ``process(settings, filename)`` (a generator of samples) into a ``DataProvider``.

    Extra keyword: ``max_open_files`` (default 8), how many files are read at once when
    shuffling. ``slots`` is the deprecated spelling of ``input_types``.
    """
    if _is_bare_decoration(input_types):
        # `@provider` without its parentheses: Python hands over the function itself, and the "decorated"
        # result would be a plain function that has no reader().
        raise TypeError(
            f"@provider needs its arguments: write @provider(input_types=[...]) above "
            f"{getattr(input_types, '__name__', input_types)!r}, not a bare @provider"
        )
    if "slots" in kwargs:
        logger.warning("provider(slots=...) is deprecated, use input_types")
        slots = kwargs.pop("slots")
        input_types = slots if input_types is None else input_types
    max_open_files = kwargs.pop("max_open_files", DEFAULT_MAX_OPEN_FILES)
    if kwargs:
        raise TypeError(f"provider() got unexpected keyword arguments {sorted(kwargs)}")
    # Checked here, when the module defining the provider is imported, rather than at the first pass, where
    # int() or a call would fail naming no option.
    pool_size = _option_int("pool_size", pool_size)
    min_pool_size = _option_int("min_pool_size", min_pool_size)
    max_open_files = _option_int("max_open_files", max_open_files)
    if calc_batch_size is not None and not callable(calc_batch_size):
        raise TypeError(f"provider: calc_batch_size must be a function of a sample, or None, got {calc_batch_size!r}")
    if init_hook is not None and not callable(init_hook):
        raise TypeError(f"provider: init_hook must be a function, or None, got {init_hook!r}")
    options = {
        "input_types": input_types,
        # Normalised (and warned about) per instance, like the original constructor.
        "should_shuffle": should_shuffle,
        "pool_size": pool_size,
        "min_pool_size": min_pool_size,
        "can_over_batch_size": can_over_batch_size,
        "calc_batch_size": calc_batch_size,
        "cache": CacheType(cache),
        "check": check,
        "check_fail_continue": check_fail_continue,
        "init_hook": init_hook,
        "max_open_files": max_open_files,
    }

    def decorate(process: Callable[[Any, str], Iterable[Any]]) -> DataProvider:
        return DataProvider(process, options)

    return decorate


def _is_bare_decoration(input_types: Any) -> bool:
    """Whether ``provider`` was given the decorated function itself (``@provider`` without parentheses)."""
    return callable(input_types) and not isinstance(input_types, (InputType, Mapping, Sequence))


def _option_int(name: str, value: Any) -> int:
    """An integer option of ``provider``, converted as the session converts it (``int()``)."""
    try:
        return int(value)
    except (TypeError, ValueError):
        raise TypeError(f"provider: {name} must be an integer, got {value!r}") from None


def iter_file_samples(
    process: DataProvider, filename: str, is_train: bool = True, **kwargs: Any
) -> Iterator[list[Any]]:
    """The checked samples of one file as lists in slot order (for the service's workers).

    Runs ``init_hook`` with ``file_list=[filename]``; to read many files with one
    set-up, use ``process.open(file_list, ...).iter_file(filename)`` instead.
    """
    if not isinstance(process, DataProvider):
        raise TypeError(f"iter_file_samples needs a @provider function, got {type(process).__name__}")
    session = process.open([filename], is_train, **kwargs)
    return session.iter_file(filename)


__all__ = [
    "provider",
    "DataProvider",
    "Settings",
    "iter_file_samples",
    "normalize_should_shuffle",
    "read_file_list",
]
