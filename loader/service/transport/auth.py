"""CURVE keys as plain data: the daemon's (``CurveServer``), a peer's (``CurveClient``), and a worker's dial.

zmq's CURVE gives each socket a long-term key pair; a daemon with keys admits
only peers whose public key it lists, and every byte between them is
encrypted. This module only reads and carries keys (z85 bytes, as zmq's
certificate files hold them); the sockets that use them are made in
``sockets.py``, the one module that imports zmq. See ``docs/security.md``.

Peers find their keys in the config (``service.peer_key`` and
``service.daemon_public_key``) or, for a ``Client`` made by hand, in the
environment: ``LOADER_PEER_KEY`` (this peer's secret key file) and
``LOADER_DAEMON_PUBLIC_KEY`` (the daemon's public key file).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from loader.errors import ConfigError

ENV_PEER_KEY = "LOADER_PEER_KEY"
ENV_DAEMON_PUBLIC_KEY = "LOADER_DAEMON_PUBLIC_KEY"


@dataclass(frozen=True)
class CurveClient:
    """A peer's keys: the daemon's public key, and the peer's own pair."""

    server_public: bytes
    public: bytes
    secret: bytes = field(repr=False)


@dataclass(frozen=True)
class CurveServer:
    """The daemon's key pair and the public keys it admits."""

    public: bytes
    secret: bytes = field(repr=False)
    allowed: frozenset[bytes] = frozenset()

    def admitting(self, *publics: bytes) -> CurveServer:
        return CurveServer(self.public, self.secret, self.allowed | frozenset(publics))


@dataclass(frozen=True)
class Dial:
    """Where a worker connects, with its keys (the daemon's own workers get a key pair made for them)."""

    address: str
    curve: CurveClient | None = None

    def __str__(self) -> str:
        return self.address


def _secret(path: str) -> tuple[bytes, bytes]:
    from loader.service.transport.sockets import load_key_file  # the zmq side

    public, secret = load_key_file(path)
    if secret is None:
        raise ConfigError(f"CURVE key file {path} holds no secret key (give the .key_secret file)")
    return public, secret


def peer_keys(peer_key: str | None, daemon_public_key: str | None, what: str = "service") -> CurveClient | None:
    """A peer's keys from its key files (both or neither), or None."""
    if not peer_key and not daemon_public_key:
        return None
    if not peer_key or not daemon_public_key:
        raise ConfigError(
            f"{what}: CURVE needs both the peer's secret key file and the daemon's public key file, got only one"
        )
    from loader.service.transport.sockets import load_key_file

    public, secret = _secret(peer_key)
    server_public, _ = load_key_file(daemon_public_key)
    return CurveClient(server_public, public, secret)


def peer_from_env() -> CurveClient | None:
    """A peer's keys named by ``LOADER_PEER_KEY`` and ``LOADER_DAEMON_PUBLIC_KEY``, or None."""
    return peer_keys(os.environ.get(ENV_PEER_KEY), os.environ.get(ENV_DAEMON_PUBLIC_KEY), "environment")


def peer_for(given: str | None) -> CurveClient | None:
    """The keys of a peer that names its daemon by ``given``: when that is a config file, its
    ``service.peer_key``/``service.daemon_public_key``, each missing one from its environment
    variable; otherwise None (the socket then takes the environment's, ``peer_from_env``).

    A Client or ``loader status`` given the daemon's own config reads its address from it; the
    keys beside that address belong with it (they were read from the environment only).
    """
    if not given or given.startswith(("tcp://", "ipc://", "inproc://")) or not os.path.isfile(given):
        return None
    from loader.config import load_config

    service = load_config(given).service
    keys = peer_keys(
        service.peer_key or os.environ.get(ENV_PEER_KEY) or None,
        service.daemon_public_key or os.environ.get(ENV_DAEMON_PUBLIC_KEY) or None,
        f"{given}: service.peer_key (or {ENV_PEER_KEY}) and service.daemon_public_key (or {ENV_DAEMON_PUBLIC_KEY})",
    )
    if keys is None and service.daemon_key:
        # Its daemon answers only peers with keys: without any, this side waited its whole timeout for an answer
        # that could not come, then guessed that the daemon listened elsewhere.
        raise ConfigError(
            f"{given} sets service.daemon_key, so its daemon answers only peers with CURVE keys, and this side has "
            f"none: set service.peer_key and service.daemon_public_key there, or {ENV_PEER_KEY} and "
            f"{ENV_DAEMON_PUBLIC_KEY} (`loader keys DIR` makes them; docs/security.md)"
        )
    return keys


def server_keys(daemon_key: str, authorized_keys: str) -> CurveServer:
    """The daemon's keys: its secret key file and a directory of admitted public keys (``*.key``)."""
    from loader.service.transport.sockets import load_public_keys

    # Each failure starts with its key, so the daemon can say where that key's value came from.
    try:
        public, secret = _secret(daemon_key)
    except ConfigError as exc:
        raise ConfigError(f"service.daemon_key: {exc}") from None
    try:
        allowed = load_public_keys(authorized_keys)
    except ConfigError as exc:
        raise ConfigError(f"service.authorized_keys: {exc}") from None
    return CurveServer(public, secret, allowed)


__all__ = [
    "CurveClient",
    "CurveServer",
    "Dial",
    "peer_keys",
    "peer_from_env",
    "peer_for",
    "server_keys",
    "ENV_PEER_KEY",
    "ENV_DAEMON_PUBLIC_KEY",
]
