"""Config values from the command line and the environment, over the file, with where each came from.

Two ways to change a value without editing the file, for schedulers and
container images that share one config::

    loader serve train.toml --set pipeline.batch_size=64 --set workers.count=8
    LOADER_PIPELINE__BATCH_SIZE=64 LOADER_WORKERS__COUNT=8 loader serve train.toml

An environment variable is ``LOADER_`` + section + ``__`` + key, in any case
(``LOADER_SERVICE__METRICS``); a variable without a double underscore is not an
override (``LOADER_ADDRESS`` is the client's daemon address), except
``LOADER_IMPORT_PATH`` for the one value outside the sections. A further
dataset's value is ``datasets.NAME.SECTION.KEY`` (``--set
datasets.eval.pipeline.batch_size=256``, ``LOADER_DATASETS__EVAL__PIPELINE__BATCH_SIZE``). A value is read
as a TOML value (``64``, ``true``, ``"text"``, ``["a:b", "c:d"]``) and taken as
a plain string when it is not one (``tcp://0.0.0.0:5555``). Precedence, lowest
first: default, file, environment, ``--set`` (and ``--bind``/``--workers``).
Relative paths in ``[source]`` are resolved against the config file's directory
wherever they came from, so the file means the same thing in every process.

Every key's source is kept (``LoaderConfig.sources``) and shown by
``loader check``; an error caused by an override names the variable or the flag.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from loader.config.checks import reject_unknown
from loader.errors import ConfigError

ENV_PREFIX = "LOADER_"
ENV_SEPARATOR = "__"
# Values outside any section: ``--set import_path=[...]`` and ``LOADER_IMPORT_PATH`` set them. A further dataset's
# values have a longer key: ``datasets.NAME.SECTION.KEY`` (``LOADER_DATASETS__NAME__SECTION__KEY``).
UNSECTIONED = ("import_path",)
_PLAIN = (str, int, float, bool)
# How deep a value given here may nest arrays and tables (a config's deepest, format_options, is 2 or 3):
# 3,000 levels ran the parser, and this module's checks, out of stack (RecursionError).
MAX_VALUE_DEPTH = 64
# How much of a long --set argument an error repeats.
SHOWN_CHARS = 60


@dataclass(frozen=True)
class Override:
    """One value from outside the file: its dotted key, value, and where it came from (for messages)."""

    key: str  # "pipeline.batch_size"
    value: Any
    source: str  # "--set pipeline.batch_size=64", "environment variable LOADER_PIPELINE__BATCH_SIZE"


class ValueTooDeepError(ConfigError):
    """A value nests arrays or tables more than ``MAX_VALUE_DEPTH`` deep (the caller names where it came from)."""


def parse_value(text: str) -> Any:
    """``text`` as a TOML value (number, boolean, string, array, inline table), else the text itself;
    ``ValueTooDeepError`` when it nests arrays or tables more than ``MAX_VALUE_DEPTH`` deep."""
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except (tomllib.TOMLDecodeError, KeyError):
        return text
    except RecursionError:  # the parser recurses per nested array or table
        raise ValueTooDeepError(_TOO_DEEP) from None
    return value if _plain(value) else text  # a TOML date is not a config value: keep the text


_TOO_DEEP = f"nests arrays or tables too deeply (at most {MAX_VALUE_DEPTH} levels)"


def _plain(value: Any) -> bool:
    """Whether ``value`` holds only strings, numbers and booleans, in lists and tables; walked without
    recursion, ``ValueTooDeepError`` past ``MAX_VALUE_DEPTH`` levels."""
    pending = [(value, 0)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, (list, dict)):
            if depth >= MAX_VALUE_DEPTH:
                raise ValueTooDeepError(_TOO_DEEP)
            pending.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
        elif not isinstance(item, _PLAIN):
            return False
    return True


def _parsed(text: str, source: str) -> Any:
    """``parse_value(text)``; a value nested too deeply is refused naming its ``source``."""
    try:
        return parse_value(text)
    except ValueTooDeepError as exc:
        raise ValueTooDeepError(f"{source} {exc}") from None


def _shown(text: str) -> str:
    return text if len(text) <= SHOWN_CHARS else f"{text[:SHOWN_CHARS]}..."


OVERRIDES_ITEM = "overrides item"  # how a string of load_config(overrides=[...]) is named in errors


def from_assignment(text: str, flag: str = "--set") -> Override:
    """``"section.key=value"`` (a ``--set`` argument) as an ``Override``."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    parts = key.split(".")
    # A --set argument is named as typed; a load_config(overrides=[...]) string as a Python string.
    given = f"{flag} {text}" if flag.startswith("-") else f"{flag} {text!r}"
    if not sep or (len(parts) < 2 and key not in UNSECTIONED) or not all(parts):
        example = f"{flag} pipeline.batch_size=64" if flag.startswith("-") else "'pipeline.batch_size=64'"
        raise ConfigError(f"{flag} {text!r} must look like SECTION.KEY=VALUE, e.g. {example}")
    shown = f"{flag} {_shown(text)}" if flag.startswith("-") else f"{flag} {_shown(text)!r}"
    return Override(key, _parsed(raw.strip(), shown), given)


def from_environ(environ: Mapping[str, str]) -> list[Override]:
    """The ``LOADER_SECTION__KEY`` variables of ``environ``, sorted by name (so the order is stable)."""
    found = []
    for name in sorted(environ):
        if not name.upper().startswith(ENV_PREFIX):
            continue
        if name[len(ENV_PREFIX) :].lower() in UNSECTIONED:
            key = name[len(ENV_PREFIX) :].lower()
            source = f"environment variable {name}"
            found.append(Override(key, _parsed(environ[name], source), source))
            continue
        if ENV_SEPARATOR not in name:
            continue
        parts = name[len(ENV_PREFIX) :].lower().split(ENV_SEPARATOR)
        if len(parts) < 2 or not all(parts):
            raise ConfigError(
                f"environment variable {name} must look like {ENV_PREFIX}SECTION{ENV_SEPARATOR}KEY, "
                f"e.g. {ENV_PREFIX}PIPELINE{ENV_SEPARATOR}BATCH_SIZE"
            )
        source = f"environment variable {name}"
        found.append(Override(".".join(parts), _parsed(environ[name], source), source))
    return found


def collect(
    assignments: Iterable[str | Override] | Mapping[str, Any] = (), environ: Mapping[str, str] | None = None
) -> list[Override]:
    """Every override in the order it applies: environment first, then the command line (which wins).

    ``assignments`` may also be a mapping of dotted keys to values (``{"pipeline.batch_size": 8}``), as a
    Python caller writes them: its keys were taken for ``--set`` arguments without their ``=VALUE``."""
    env = from_environ(os.environ if environ is None else environ)
    if isinstance(assignments, Mapping):
        return env + [from_key(key, value) for key, value in assignments.items()]
    # A Python caller's list (load_config(overrides=[...])): its errors name the list, not a --set flag it never
    # gave (the command line hands its --set arguments over as Overrides, ``cli._load_checked``).
    given = [a if isinstance(a, Override) else from_assignment(a, OVERRIDES_ITEM) for a in assignments]
    return env + given


def from_key(key: Any, value: Any) -> Override:
    """``overrides={"section.key": value}`` of ``load_config`` as an ``Override`` (the value as given)."""
    source = f"overrides[{key!r}]"
    parts = str(key).split(".") if isinstance(key, str) else []
    if (len(parts) < 2 and key not in UNSECTIONED) or not all(parts):
        raise ConfigError(f"{source}: a key must look like SECTION.KEY, e.g. {{'pipeline.batch_size': 64}}")
    return Override(str(key).strip(), value, source)


def apply(data: Mapping[str, Any], overrides: Iterable[Override], sections: Iterable[str]) -> dict[str, Any]:
    """A copy of the parsed file ``data`` with every override set (later ones win); unknown sections refused."""
    out: dict[str, Any] = {
        name: dict(values) if isinstance(values, Mapping) else values for name, values in data.items()
    }
    known = set(sections)
    for override in overrides:
        path = override.key.split(".")
        reject_unknown([path[0]], known, "", override.source)
        table = out
        for i, part in enumerate(path[:-1]):
            node = table.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(
                    f"{'.'.join(path[: i + 1])} is not a table, cannot set {override.key} ({override.source})"
                )
            table[part] = node = dict(node)
            table = node
        table[path[-1]] = override.value
    return out


def sources(
    final: Mapping[str, Any], data: Mapping[str, Any], overrides: Iterable[Override], origin: str
) -> dict[str, str]:
    """``{dotted key: where its value came from}`` for every key of ``final`` (a config's ``to_dict()``)."""
    out: dict[str, str] = {}
    for dotted, path, _value in leaves(final):
        given: Any = data
        for part in path:
            given = given.get(part) if isinstance(given, Mapping) else None
        out[dotted] = origin if given is not None else "default"
    for override in overrides:
        out[override.key] = override.source
    return out


def leaves(final: Mapping[str, Any]) -> list[tuple[str, tuple[str, ...], Any]]:
    """(dotted key, path in the file's tables, value) of every setting of a ``to_dict()``: keys of the
    sections, top-level keys such as ``import_path``, and ``datasets.NAME.SECTION.KEY``."""
    out: list[tuple[str, tuple[str, ...], Any]] = []
    for top, value in final.items():
        if top == "datasets" and isinstance(value, Mapping):
            for name, sections in value.items():
                for section, values in sections.items():
                    out.extend(
                        (f"datasets.{name}.{section}.{key}", ("datasets", name, section, key), v)
                        for key, v in values.items()
                    )
        elif isinstance(value, Mapping):
            out.extend((f"{top}.{key}", (top, key), v) for key, v in value.items())
        else:
            out.append((top, (top,), value))
    return out


def culprits(message: str, overrides: Iterable[Override]) -> list[str]:
    """The sources of the overrides whose key an error message names (the last of each key: it won)."""
    last = {o.key: o.source for o in overrides}
    return [source for key, source in last.items() if any(name in message for name in _names_in_errors(key))]


def _names_in_errors(key: str) -> list[str]:
    """How an error message may name the value ``key`` sets: a further dataset's checks say
    ``datasets.NAME: section.key ...``, ``unknown key datasets.NAME.SECTION`` for a table it made up, or
    ``datasets.NAME must be a table ...`` for a dataset that has none."""
    parts = key.split(".")
    if parts[0] != "datasets" or len(parts) < 3:
        return [key]
    return [
        key,
        f"datasets.{parts[1]}: {'.'.join(parts[2:])}",
        f"datasets.{parts[1]} must be",
        *(f"unknown key {'.'.join(parts[:n])}" for n in range(3, len(parts))),
    ]


def format_sources(config: Any) -> list[str]:
    """``loader check``'s table: every key, its value, and where it came from."""
    rows = [
        (dotted, repr(value), config.sources.get(dotted, "default"))
        for dotted, _path, value in leaves(config.to_dict())
    ]
    width = [max(len(row[i]) for row in rows) for i in range(2)]
    return [f"  {key:<{width[0]}}  {value:<{width[1]}}  {source}" for key, value, source in rows]


__all__ = [
    "Override",
    "from_key",
    "ValueTooDeepError",
    "MAX_VALUE_DEPTH",
    "parse_value",
    "from_assignment",
    "from_environ",
    "collect",
    "apply",
    "sources",
    "leaves",
    "culprits",
    "format_sources",
]
