"""One question to a daemon and its answer, outside a client's receiver thread: the handshake's
request, and ``query_status`` (``loader status``, ``Loader``'s readiness checks).

Also why a daemon may not have answered (``no_answer_hint``): the usual causes of silence look
alike from this side, so the error names them; where the connection itself showed more (refused,
a handshake broken off, an HTTP server), ``ConnectJudge`` says that instead, and ends the wait
where waiting cannot help.

A status comes from whatever answers at the address: its socket takes at most ``MAX_STATUS_BYTES``, and
what arrives is checked before anyone prints it (``status_problem``): a map of text keys to plain values,
``MAX_STATUS_DEPTH`` deep and ``MAX_STATUS_VALUES`` values at most.
"""

from __future__ import annotations

import math
import os
import socket
import time
from collections.abc import Callable
from typing import Any

from loader.config.sections import MAX_TIMEOUT_S
from loader.errors import MalformedMessageError, ServiceUnavailableError
from loader.service import protocol as P
from loader.service import transport
from loader.service.transport import Channel
from loader.service.transport.auth import ENV_PEER_KEY, CurveClient

ANSWER_POLL_S = 0.1  # one wait for the answer, between looks at the deadline
# A request unanswered this long calls its ``still_waiting`` once: a client that waits its whole timeout (30 s by
# default) for a daemon that is not there said nothing until then, which looks like a hang in a first hour.
STILL_WAITING_S = 5.0

# The largest answer a status query takes (zmq's MAXMSGSIZE on its socket): zmq reads a bigger one's length
# first and drops the connection without buffering it, so the answer is never seen (a 200 MB one was taken
# whole). A daemon's status is about 100 bytes a worker and 300 a client: 16 MiB is tens of thousands of
# each, far past what one daemon serves, and msgpack's decoding of it stays within a few hundred MB.
MAX_STATUS_BYTES = 16 * 1024 * 1024
# A plain connection made after a status query got no answer, to tell "nothing listens there" (refused at once)
# from a peer that may have sent an answer over that bound (``_size_note``).
PROBE_TIMEOUT_S = 0.5
# How deep a status nests (a daemon's: the status, a list, a row, 3) and how many values it holds in all
# (a daemon's: about 8 a worker and 14 a client). Printing walks it: a peer's answer past either is refused.
MAX_STATUS_DEPTH = 16
MAX_STATUS_VALUES = 1_000_000
_STATUS_SCALARS = (str, int, float, bool, type(None))  # what msgpack gives besides maps and lists: bytes, ext
# A connection whose handshakes have failed this long, where zmq will not dial again (a refused key, a peer
# that is not a daemon's client socket), ends a request's wait (``PeerWatch.handshake_hopeless``).
HANDSHAKE_GIVE_UP_S = 2.0
# Where a user finds the address for clients, said when the one given is not it.
SERVING_LINE = "`loader serve` logs the address for clients as 'serving ... on'"
# Said of an address whose connections are refused, in place of the other causes of silence.
REFUSED_NOTE = (
    ": nothing listens there, its connections are refused (is `loader serve` running, and at that address? "
    f"{SERVING_LINE})"
)


# The three usual causes of silence, which look alike from here: no daemon, another address, and a daemon with
# authentication, which answers no peer without keys (docs/security.md).
NO_ANSWER_HINT = (
    " (is `loader serve` running at that address? A daemon with CURVE keys answers only peers that have theirs: "
    "set LOADER_PEER_KEY and LOADER_DAEMON_PUBLIC_KEY, see docs/security.md)"
)
# ... and for a peer that has keys: the same silence, the other way round.
KEYED_NO_ANSWER_HINT = (
    " (is `loader serve` running at that address? This side has CURVE keys: a daemon that does not list its "
    "public key in service.authorized_keys, or that has no keys itself, gives it no answer; a daemon with keys "
    "logs every key it refuses, see docs/security.md)"
)


def has_keys(keyed: bool | None) -> bool:
    """Whether this peer has CURVE keys: ``keyed``, or when None, whether LOADER_PEER_KEY is set."""
    return bool(os.environ.get(ENV_PEER_KEY)) if keyed is None else keyed


def no_answer_hint(keyed: bool | None = None) -> str:
    """Why a daemon may not have answered, for a peer with CURVE keys or without (None: LOADER_PEER_KEY says)."""
    return KEYED_NO_ANSWER_HINT if has_keys(keyed) else NO_ANSWER_HINT


def handshake_note(broken: str, keyed: bool) -> str:
    """Said of an address where something accepted connections but the handshake failed (``PeerWatch``)."""
    if broken == transport.HANDSHAKE_MECHANISM:
        which = (
            "this client has CURVE keys and the peer there has none (unset LOADER_PEER_KEY, or give the daemon keys)"
            if keyed
            else "the peer there has CURVE keys and this client has none (set LOADER_PEER_KEY and "
            "LOADER_DAEMON_PUBLIC_KEY)"
        )
        return f": a ZeroMQ peer listens there but refused the handshake: {which}; see docs/security.md"
    if broken == transport.HANDSHAKE_AUTH:
        return (
            ": the daemon there refused this client's CURVE public key (it is not in its service.authorized_keys; "
            "the daemon logs each key it refuses); see docs/security.md"
        )
    if broken == transport.HANDSHAKE_SLOW:
        return (
            ": something listens there and takes connections, but each handshake was dropped unfinished after "
            "seconds: a daemon too busy to finish one in time (see its log)?"
        )
    keys = ", or LOADER_DAEMON_PUBLIC_KEY is not that daemon's public key (docs/security.md)" if keyed else ""
    return (
        ": something listens there but broke off the handshake: it is not a loader daemon's address for clients "
        f"(a daemon's metrics port or worker data socket? another program?){keys}; {SERVING_LINE}"
    )


HTTP_NOTE = (
    ": an HTTP server answers there (a loader daemon's metrics port? its address for clients is another); "
    f"{SERVING_LINE}"
)


class ConnectJudge:
    """What a watched connection's handshake events say of its address: whether a request should stop waiting
    (``hopeless``), and what its error says (``unanswered``, ``reason``). Without a watch (a channel that is
    no zmq socket) it says only the usual causes of silence.

    Handshakes dropped unfinished after seconds are a daemon too busy to finish one in its 5 s, which the next
    may pass, or a server of another protocol that times out a client that says nothing it understands: the
    daemon's own metrics port does so after 5 s. Such an address is asked once, as HTTP, to tell them apart."""

    def __init__(self, watch: transport.PeerWatch | None, address: str, keyed: bool | None, timeout_s: float) -> None:
        self._watch, self._address, self._keyed, self._timeout_s = watch, address, keyed, timeout_s
        self._http: bool | None = None  # asked once handshakes are dropped slowly

    def hopeless(self) -> bool:
        if self._watch is None:
            return False
        now = time.monotonic()
        if self._http is None and self._watch.handshake_broken(now) == transport.HANDSHAKE_SLOW:
            self._http = answers_http(self._address)
        return bool(self._http) or self._watch.handshake_hopeless(now, min(HANDSHAKE_GIVE_UP_S, self._timeout_s))

    def note(self) -> str:
        """Said of the address, else "": nothing listens there, an HTTP server does, or the handshake failed."""
        if self._watch is None:
            return ""
        now = time.monotonic()
        if self._watch.refusing(now):
            return REFUSED_NOTE
        if self._http:
            return HTTP_NOTE
        broken = self._watch.handshake_broken(now)
        return "" if broken is None else handshake_note(broken, has_keys(self._keyed))

    def reason(self) -> str:
        """``note()``, else the usual causes of silence (``no_answer_hint``)."""
        return self.note() or no_answer_hint(self._keyed)

    def unanswered(self, timed_out: bool) -> str:
        """What follows "no loader daemon answered at ADDRESS": how long it waited, or, where the wait ended
        before its timeout (``hopeless``), that the handshake failed; then ``reason()``."""
        waited = f"within {self._timeout_s:g}s" if timed_out else "(the handshake failed)"
        return f" {waited}{self.reason()}"


def answers_http(address: str) -> bool:
    """Whether an HTTP server answers a request line at ``address`` (``tcp://`` only, probed as
    ``_nothing_listens`` probes)."""
    if not address.startswith("tcp://"):
        return False
    try:
        with _probe(address) as probe:
            probe.sendall(b"GET / HTTP/1.0\r\n\r\n")
            return probe.recv(5) == b"HTTP/"
    except (OSError, ValueError):
        return False


def query_status(address: str, timeout_s: float = 5.0, curve: CurveClient | None = None) -> dict[str, Any]:
    """The daemon's ``status()`` dict; ``ServiceUnavailableError`` when it does not answer, or answers
    with something that is not a loader daemon's status (``status_problem``).

    ``curve``: this peer's keys for a daemon with CURVE on (default: from the environment).
    """
    # zmq's poll takes integer milliseconds: inf (or 1e300) raised OverflowError from inside the socket.
    if not (math.isfinite(timeout_s) and timeout_s <= MAX_TIMEOUT_S):
        raise ValueError(f"a status query's timeout_s must be at most {MAX_TIMEOUT_S:g} seconds, got {timeout_s!r}")
    channel = _status_channel(address, curve)
    judge = ConnectJudge(channel.watch_peer(connecting=True), address, True if curve is not None else None, timeout_s)
    started = time.monotonic()
    try:
        answer = request(channel, P.encode(P.Status()), (P.Status,), timeout_s, address, hopeless=judge.hopeless)
        said, noted = judge.unanswered(time.monotonic() - started >= timeout_s), bool(judge.note())
    finally:
        channel.close()
    if not isinstance(answer, P.Status):
        size = "" if noted else _size_note(address)  # the connection named a cause: no answer was dropped
        raise ServiceUnavailableError(f"no loader daemon answered at {address}{said}{size}")
    status = answer.status or {}
    problem = status_problem(status)
    if problem:
        raise ServiceUnavailableError(f"the peer at {address} did not answer with a loader daemon's status: {problem}")
    return dict(status)


def _size_note(address: str) -> str:
    """For a status query that got no answer: zmq drops an answer over ``MAX_STATUS_BYTES`` without a word, so
    from here it is silence like the others, and the error says so. Not where nothing listens at ``address``:
    then no answer came at all, and the clause only sends the reader looking for a peer that is not there."""
    if _nothing_listens(address):
        return ""
    megabytes = MAX_STATUS_BYTES // (1024 * 1024)
    return f"; an answer of more than {megabytes} MiB is dropped unread: no loader daemon's status is that large"


def _nothing_listens(address: str) -> bool:
    """Whether a plain connection to ``address`` is refused: a TCP port no process listens on, an ``ipc://`` path
    with no socket. False where one connects or the probe cannot tell (a timeout, a host name other than
    ``localhost``, an abstract socket or another scheme): a name is not looked up, since a lookup has no timeout
    of its own and a broken resolver holds it for many seconds after the query's own timeout ran out."""
    scheme, _, rest = address.partition("://")
    try:
        if scheme == "tcp":
            _probe(address).close()
        elif scheme == "ipc" and not rest.startswith("@"):
            with socket.socket(socket.AF_UNIX) as probe:
                probe.settimeout(PROBE_TIMEOUT_S)
                probe.connect(rest)
    except (ConnectionRefusedError, FileNotFoundError):
        return True
    except (OSError, ValueError):  # unreachable, slow, unresolved or not HOST:PORT: it may listen
        return False
    return False


def _probe(address: str) -> socket.socket:
    """A plain TCP connection to a ``tcp://HOST:PORT`` address, its timeout ``PROBE_TIMEOUT_S``; a host name
    other than ``localhost`` raises ``gaierror`` instead of being looked up (``_nothing_listens`` says why)."""
    host, _, port = address.partition("://")[2].rpartition(":")
    host = host.strip("[]")
    if host != "localhost":
        socket.getaddrinfo(host, int(port), flags=socket.AI_NUMERICHOST)  # gaierror for a name
    probe = socket.create_connection((host, int(port)), timeout=PROBE_TIMEOUT_S)
    probe.settimeout(PROBE_TIMEOUT_S)
    return probe


def _status_channel(address: str, curve: CurveClient | None) -> transport.ZmqChannel:
    """The DEALER of a status query, ``MAX_STATUS_BYTES`` its bound (set before it connects), watched."""
    return transport.dealer(address, curve=curve, max_message_bytes=MAX_STATUS_BYTES, watched=True)


def status_problem(status: Any) -> str | None:
    """Why ``status`` is not a loader daemon's status, or None: a map of text keys whose values are text,
    numbers, booleans, None, lists and maps of the same, ``MAX_STATUS_DEPTH`` deep and ``MAX_STATUS_VALUES``
    values at most. Walked without recursion, stopping at the first problem."""
    if type(status) is not dict:
        return f"a {type(status).__name__}, not a map"
    pending: list[tuple[Any, int]] = [(status, 1)]
    counted = 0
    while pending:
        value, depth = pending.pop()
        if depth > MAX_STATUS_DEPTH:
            return f"maps and lists nested more than {MAX_STATUS_DEPTH} deep"
        if type(value) is dict:
            for key in value:
                if type(key) is not str:
                    return f"a key that is not text ({_shown(key)})"
            children = list(value.values())
        else:
            children = value
        counted += len(children)
        if counted > MAX_STATUS_VALUES:
            return f"more than {MAX_STATUS_VALUES} values"
        for child in children:
            if type(child) is dict or type(child) is list:
                pending.append((child, depth + 1))
            elif type(child) not in _STATUS_SCALARS:
                return f"a value that is not text, a number, a boolean, None, a list or a map ({_shown(child)})"
    return None


def _shown(value: Any, chars: int = 40) -> str:
    """A peer's key or value, short, for one line (``repr`` escapes control characters); of a kind with a
    ``repr`` of its own (an ext type), only its kind: a ``repr`` of 16 MiB is not made to be cut."""
    name = type(value).__name__
    if isinstance(value, (str, bytes)):
        return f"{name} {value[:chars]!r}{'...' if len(value) > chars else ''}"
    if isinstance(value, (int, float, bool, type(None))):
        return f"{name} {value!r}"
    return name


def request(
    channel: Channel,
    frames: list[Any],
    answers: tuple[type[P.Message], ...],
    timeout_s: float,
    address: str,
    still_waiting: Callable[[float], None] | None = None,
    hopeless: Callable[[], bool] | None = None,
) -> P.Message | None:
    """Send ``frames`` and wait for a message of one of the ``answers`` types (others are skipped);
    the message, or None when none came within ``timeout_s``. ``still_waiting(seconds waited)`` is called
    once when no answer came within ``STILL_WAITING_S`` (and the timeout is longer): the request is not sent
    again, so a late answer still pairs with it. ``hopeless()``, asked every poll, ends the wait early with None.

    The send, too, is waited for within ``timeout_s``, a poll at a time: a socket with no connection to send on
    (a peer that broke off the handshake, whom zmq does not dial again) held it, and ``still_waiting`` with it,
    for the whole timeout, and it ended in "did not accept a message" instead of the reason."""
    started = time.monotonic()
    deadline = started + timeout_s
    sent = False
    while True:
        now = time.monotonic()
        left = deadline - now
        if left <= 0 or (hopeless is not None and hopeless()):
            return None
        if still_waiting is not None and now - started >= STILL_WAITING_S:
            still_waiting(now - started)
            still_waiting = None
        if not sent:
            sent = channel.try_send(frames, timeout_s=min(ANSWER_POLL_S, left))
            continue
        got = channel.recv(min(ANSWER_POLL_S, left))
        if got is not None:
            try:
                message, _ = P.decode(got)
            except MalformedMessageError as exc:
                raise ServiceUnavailableError(
                    f"{address} answered with something that is not a loader daemon's message ({exc})"
                ) from None
            if isinstance(message, answers):
                return message


__all__ = [
    "ConnectJudge",
    "answers_http",
    "handshake_note",
    "has_keys",
    "HANDSHAKE_GIVE_UP_S",
    "HTTP_NOTE",
    "REFUSED_NOTE",
    "SERVING_LINE",
    "query_status",
    "status_problem",
    "request",
    "STILL_WAITING_S",
    "no_answer_hint",
    "NO_ANSWER_HINT",
    "KEYED_NO_ANSWER_HINT",
    "MAX_STATUS_BYTES",
    "MAX_STATUS_DEPTH",
    "MAX_STATUS_VALUES",
]
