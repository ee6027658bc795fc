"""Turn ``"module:attribute"`` strings from a config into Python objects.

Configs name user code (a reader, a provider, mappers, a text parser) by
string, so that a config is plain data that can cross a process or host
boundary; each process resolves the names itself, lazily, when it needs them.
"""

from __future__ import annotations

import importlib
import re
from typing import Any

from loader.errors import ConfigError

# "package.module:attribute" or "package.module:Class.attribute"
SPEC_PATTERN = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")


def is_spec(text: object) -> bool:
    """True when ``text`` looks like ``"module:attribute"``."""
    return isinstance(text, str) and SPEC_PATTERN.match(text) is not None


def import_object(spec: str, *, what: str = "object") -> Any:
    """Import ``"module:attribute"`` and return the attribute.

    ``what`` names the config key in error messages (``"source.reader"``).
    Raises ``ConfigError`` when the spec is malformed, the module cannot be
    imported, or the attribute is missing.
    """
    if not is_spec(spec):
        raise ConfigError(f"{what} must look like 'module:function', got {spec!r}")
    module_name, _, attr_path = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # an ImportError, or user code failing at import time
        raise ConfigError(
            f"{what}: cannot import module {module_name!r} for {spec!r}: {type(exc).__name__}: {exc}"
        ) from exc
    obj: Any = module
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(
                f"{what}: module {module_name!r} has no attribute {attr_path!r} (from {spec!r})"
            ) from None
    return obj


__all__ = ["import_object", "is_spec", "SPEC_PATTERN"]
