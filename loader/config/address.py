"""Where ``loader status`` finds a daemon: an address, ``host:port``, a config file, or nothing.

``tcp://HOST:PORT`` and ``ipc://PATH`` are used as they are; ``HOST:PORT`` (or
``:PORT``) means ``tcp://HOST:PORT``; a path to a TOML file means that config's
``service.bind`` (a wildcard host, ``*`` or ``0.0.0.0``, is asked on loopback);
nothing means the default bind, ``tcp://127.0.0.1:5555``.
"""

from __future__ import annotations

import os
import re

from loader.config.sections import DEFAULT_BIND, load_config
from loader.errors import ConfigError

_HOST_PORT = re.compile(r"^(?P<host>\[[0-9A-Fa-f:.]+\]|[^:/\s\[\]]*):(?P<port>\d+)$")
_WILDCARD = re.compile(r"^tcp://(\*|0\.0\.0\.0|\[::\]):")


_CONFIG_LIKE = (".tom", ".tml", ".toml", ".cfg", ".conf", ".ini", ".yaml", ".yml", ".json")


def daemon_address(given: str | None) -> str:
    """The address to reach the daemon that ``given`` names (see the module docstring)."""
    if given is None or given == "":
        return DEFAULT_BIND
    if given.startswith(("tcp://", "ipc://")):
        return given
    if os.path.isfile(given) or given.endswith(".toml"):
        bind = load_config(given).service.bind
        if bind.endswith(":*"):
            raise ConfigError(f"{given} binds any free port ({bind}): give the address the daemon logged instead")
        return _WILDCARD.sub("tcp://127.0.0.1:", bind)
    match = _HOST_PORT.match(given)
    if match is None:
        # A misspelled config path ("configs/npy.tom") read only as a bad address.
        path_like = "://" not in given and (os.sep in given or given.lower().endswith(_CONFIG_LIKE))
        missing = f" ({given} is no file here either)" if path_like else ""
        raise ConfigError(
            f"{given!r} is not a daemon address: give tcp://HOST:PORT, HOST:PORT, ipc://PATH or a config file{missing}"
        )
    return f"tcp://{match['host'] or '127.0.0.1'}:{match['port']}"


def address_origin(given: str | None) -> str:
    """Where ``daemon_address(given)`` took the address from, as a clause to append to "no daemon answered"
    when ``given`` is a config file ("" otherwise): its ``service.bind`` is where a daemon of that config
    listens unless ``--bind``, ``--set service.bind`` or a port ``*`` put it elsewhere."""
    if not given or given.startswith(("tcp://", "ipc://")) or not os.path.isfile(given):
        return ""
    try:
        config = load_config(given)
    except ConfigError:  # pragma: no cover - daemon_address read it a moment ago
        return ""
    source = config.sources.get("service.bind", "default")
    how = "the default" if source == "default" else f"from {source}"
    return (
        f"; {_WILDCARD.sub('tcp://127.0.0.1:', config.service.bind)} is service.bind of {given} ({how}): "
        "a daemon started with --bind, --set service.bind or a port * listens elsewhere; "
        "`loader serve --address-file PATH` writes its address: `loader status $(cat PATH)`, "
        "or LOADER_ADDRESS=$(cat PATH) for `loader status` or a Client given no address"
    )


# The most of a daemon's config path a note shows: the path comes from the daemon (or whatever answers there).
MAX_SHOWN_PATH = 256


def another_config(given: str | None, serving: object) -> str | None:
    """The config file a daemon says it serves (``serving``, from its status or its welcome), fit for one line,
    when this side named the daemon by a config file, ``given``, and it is another; None when ``given`` is no
    file (an address), when it is the same file, or when ``serving`` is no absolute path (an in-memory config;
    or a peer's value: text with NUL, not text)."""
    if not given or not os.path.isfile(given):
        return None
    if not isinstance(serving, str) or "\0" in serving or not os.path.isabs(serving):
        return None
    try:
        if os.path.realpath(serving) == os.path.realpath(given):
            return None
    except (OSError, ValueError):
        return None
    shown = "".join(c if c.isprintable() else "?" for c in serving[:MAX_SHOWN_PATH])
    return shown + ("..." if len(serving) > MAX_SHOWN_PATH else "")


__all__ = ["daemon_address", "address_origin", "another_config"]
