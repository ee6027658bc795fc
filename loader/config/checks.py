"""Value checks for ``loader.config``: each raises ``ConfigError`` naming key, value and file."""

from __future__ import annotations

import copy
import dataclasses
import difflib
import math
from collections.abc import Mapping
from typing import Any

from loader.errors import ConfigError
from loader.runtime.imports import is_spec

DEFAULT_ORIGIN = "<dict>"


def origin_field() -> Any:
    """A section's ``origin`` (the file its values came from): for messages only, not compared or serialized."""
    return dataclasses.field(default=DEFAULT_ORIGIN, compare=False, repr=False)


class Check:
    """Checks and normalizes the values of one section, raising ``ConfigError`` with key and origin."""

    def __init__(self, obj: Any, section: str) -> None:
        self.obj, self.section, self.origin = obj, section, obj.origin

    def fail(self, key: str, reason: str) -> None:
        raise ConfigError(f"{self.section}.{key} {reason} ({self.origin})")

    def set(self, key: str, value: Any) -> None:
        object.__setattr__(self.obj, key, value)  # normalizing a frozen dataclass in __post_init__

    def integer(self, key: str, *, minimum: int | None = None, maximum: int | None = None) -> None:
        value = getattr(self.obj, key)
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(key, f"must be an integer, got {show(value)}")
        if minimum is not None and value < minimum:
            self.fail(key, f"must be >= {minimum}, got {value}")
        if minimum is not None and value < minimum:
            self.fail(key, f"must be >= {minimum:g}, got {value:g}")
        if maximum is not None and value > maximum:
            self.fail(key, f"must be <= {maximum}, got {value}")

    def number(
        self, key: str, *, positive: bool = True, minimum: float | None = None, maximum: float | None = None
    ) -> None:
        value = getattr(self.obj, key)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.fail(key, f"must be a number, got {show(value)}")
        if not math.isfinite(value):  # an infinite timeout turns failure detection off
            self.fail(key, f"must be a finite number, got {value}")
        if positive and not value > 0:
            self.fail(key, f"must be > 0, got {value}")
        if minimum is not None and value < minimum:
            self.fail(key, f"must be >= {minimum:g}, got {value:g}")
        if maximum is not None and value > maximum:
            self.fail(key, f"must be <= {maximum:g}, got {value:g}")
        self.set(key, float(value))

    def boolean(self, key: str) -> None:
        value = getattr(self.obj, key)
        if not isinstance(value, bool):
            self.fail(key, f"must be true or false, got {show(value)}")

    def text(self, key: str, *, optional: bool = False, choices: tuple[str, ...] | None = None) -> None:
        value = getattr(self.obj, key)
        if value is None and optional:
            return
        if not isinstance(value, str) or not value:
            self.fail(key, f"must be a non-empty string, got {show(value)}")
        if choices is not None and value not in choices:
            self.fail(key, f"must be one of {', '.join(repr(c) for c in choices)}, got {value!r}")

    def texts(self, key: str, *, optional: bool = False) -> None:
        value = getattr(self.obj, key)
        if value is None and optional:
            return
        if isinstance(value, str) or not isinstance(value, (list, tuple)):
            self.fail(key, f"must be a list of strings, got {show(value)}")
        for item in value:
            if not isinstance(item, str) or not item:
                self.fail(key, f"must be a list of non-empty strings, got item {show(item)}")
        self.set(key, tuple(value))

    def spec(self, key: str, value: Any) -> None:
        if value is not None and not is_spec(value):
            self.fail(key, f"must look like 'module:function', got {show(value)}")


def show(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


def reject_unknown(keys: Any, known: Any, prefix: str, origin: str) -> None:
    """``ConfigError`` naming every key of ``keys`` not in ``known``, each with the closest known one."""
    raise_unknown(unknown_keys(keys, known, prefix), origin)


def unknown_keys(keys: Any, known: Any, prefix: str) -> list[tuple[str, str]]:
    """(``prefix`` + key, a hint: the closest known key, else them all) for each key not in ``known``."""
    known = sorted(known)
    found = []
    for key in keys:
        if key in known:
            continue
        close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.5)
        hint = f"did you mean {prefix}{close[0]}?" if close else f"known keys: {', '.join(prefix + k for k in known)}"
        found.append((f"{prefix}{key}", hint))
    return found


def raise_unknown(found: list[tuple[str, str]], origin: str) -> None:
    """One ``ConfigError`` for all of ``found`` (``unknown_keys``), so two typos need one round, not two."""
    if not found:
        return
    if len(found) == 1:
        ((name, hint),) = found
        what = "key" if "." in name else "section"
        raise ConfigError(f"unknown {what} {name} ({origin}); {hint}")
    listed = "; ".join(f"{name} ({hint})" for name, hint in found)
    raise ConfigError(f"{len(found)} unknown keys ({origin}): {listed}")


PLAIN_TYPES = (str, int, float, bool, type(None))


def plain_copy(value: Any, key: str, origin: str) -> Any:
    """A deep copy of a TOML value that must stay JSON/msgpack-able (no dates, no objects)."""
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise ConfigError(f"{key} keys must be strings, got {show(k)} ({origin})")
            out[k] = plain_copy(v, f"{key}.{k}", origin)
        return out
    if isinstance(value, (list, tuple)):
        return [plain_copy(v, key, origin) for v in value]
    if isinstance(value, PLAIN_TYPES):
        return value
    raise ConfigError(
        f"{key} must hold only strings, numbers, booleans, lists and tables, got {show(value)} ({origin})"
    )


def plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    return copy.deepcopy(value)
