"""The wire format: one frozen dataclass per message kind, encoded as a msgpack header plus array frames.

Frame 0 is a msgpack map with ``"k"`` (the kind) and the message's fields under
short wire keys; the keys are spelled here and nowhere else. Frames 1.. are the
columns of a ``Chunk`` or ``Batch`` (``frames.py``). ``decode`` checks every
field's presence, type and range before any handler sees the message, and
raises ``MalformedMessageError`` otherwise; nothing is ever unpickled.

Who sends what (W worker, D daemon, K client):

* control, on the daemon's well-known endpoint: ``Hello`` W->D, ``Welcome`` D->W,
  ``LeaseRequest`` W->D, ``Lease`` D->W, ``Heartbeat`` both ways, ``Cancel`` D->W,
  ``Bye`` both ways, ``Error`` D->W/K.
* data, worker -> daemon, ordered per worker: ``Chunk`` (samples of one file,
  first record and count, plus an ``INDEX_COLUMN`` when records were skipped),
  ``FileDone``, ``FileError``.
* clients, on the well-known endpoint: ``ClientHello`` K->D, ``ClientWelcome`` D->K,
  ``Epoch``, ``Credit``, ``Ping`` K->D; ``Batch``, ``End``, ``Pong`` D->K; ``Status``
  both ways (empty request, the daemon's answer); ``Bye`` K->D.

A column named in ``refs`` (``{name: {spec id: [dtype, row shape]}}``) is a
reference column: an int64 ``(n, 3)`` array of ``[arena, first block, spec id]``
per row whose bytes lie in a shared-memory arena (``loader.service.shm.refs``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import msgpack

from loader.errors import MalformedMessageError
from loader.service.frames import Columns, Frame, buffer_of, column_frames, object_array, read_columns

# Every hello and welcome carries it; a peer of another version is refused with one line saying both.
# Bump it on any change a peer of the old version would misread. Peers from before the check sent none: 1.
# 3: packed batches (``Epoch.pack``, ``Batch.parts``) and file rows (``Batch.files``, negative reference ids).
# 4: leases of several small files (``Lease.more``): a worker of 3 would read only the first.
# 5: leases of a piece of a file (``Lease.piece``): a worker of 4 would read the whole file, once per piece.
PROTOCOL_VERSION = 5
# A client pings its daemon at least this often (more often when workers.heartbeat_interval_s is shorter).
CLIENT_PING_S = 0.5
# Name of the optional per-sample record index column of a Chunk.
INDEX_COLUMN = "__idx__"
# Bounds of what a peer may claim: ids and counts fit in int64, text stays short.
MAX_INT = 2**62
# Epochs and resume positions (and their anchors) a client may ask for are below this, so that every number the
# daemon counts on from them stays below MAX_INT: no dataset has 2**60 samples, no training 2**60 epochs.
MAX_PLACE = 2**60
MAX_TEXT = 4096
MAX_PATH = 65536
MAX_LEASE_FILES = 4096  # files one lease may name (``Lease.more``; ``source.files_per_lease`` stays below it)
# Ranks of one job. Each costs the daemon a share of every global step and a padding block at the end of an
# epoch: 4 million ranks from one hostile hello froze the loop for 13 s and took 1.4 GiB.
MAX_WORLD_SIZE = 65536
# How a worker's goodbye starts when it could not read what the daemon sent (a daemon's bug, or a value of the
# dataset's that the daemon let through): the daemon counts it against the file of the lease, which would else
# be leased again to each replacement without end.
UNREADABLE_FROM_DAEMON = "a malformed message from the daemon"

Check = Callable[[Any], bool]
_MISSING: Any = dataclasses.MISSING


def _count(value: Any) -> bool:
    return type(value) is int and 0 <= value < MAX_INT


def _positive(value: Any) -> bool:
    return type(value) is int and 0 < value < MAX_INT


def _text(value: Any) -> bool:
    return isinstance(value, str) and len(value) <= MAX_TEXT


def _path(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value) <= MAX_PATH


def _flag(value: Any) -> bool:
    return isinstance(value, bool)


def _seconds(value: Any) -> bool:
    return type(value) in (int, float) and math.isfinite(value) and value >= 0


def _mapping(value: Any) -> bool:
    return isinstance(value, dict)


def _refs(value: Any) -> bool:
    """``{column: {spec id: [dtype, row shape]}}``."""
    if not isinstance(value, dict):
        return False
    for name, specs in value.items():
        if not isinstance(name, str) or not isinstance(specs, dict) or not specs:
            return False
        for spec_id, spec in specs.items():
            if not (
                _count(spec_id)
                and isinstance(spec, list)
                and len(spec) == 2
                and _text(spec[0])
                and isinstance(spec[1], list)
                and len(spec[1]) <= 32
                and all(_count(n) for n in spec[1])
            ):
                return False
    return True


def _file_sources(value: Any) -> bool:
    """``{source id: [path, member, size, mtime_ns, inode, device]}`` (``shm.file_rows.Layout.describe``)."""
    if not isinstance(value, dict):
        return False
    for source, described in value.items():
        if not (_count(source) and isinstance(described, list) and len(described) == 6):
            return False
        if not (_path(described[0]) and _text(described[1])):
            return False
        if not all(type(v) is int and -MAX_INT < v < MAX_INT for v in described[2:]):  # mtime may be < 0
            return False
    return True


def _anchor(value: Any) -> bool:
    """``[window, order index, record]``: where the input of a shuffle window begins (``service/order.py``)."""
    return isinstance(value, list) and len(value) == 3 and all(_count(v) for v in value)


MAX_PACK = 64  # most batches one BATCH message carries (``Epoch.pack``, ``Batch.parts``)


def _parts(value: Any) -> bool:
    """``[[count, position, window, order index, record] or [count, position], ...]``: the batches of one
    message, in order (``Batch.parts``)."""
    return (
        isinstance(value, list)
        and 0 < len(value) <= MAX_PACK
        and all(isinstance(p, list) and len(p) in (2, 5) and all(_count(v) for v in p) for p in value)
    )


def _more_paths(value: Any) -> bool:
    """The files a lease names after its first (``Lease.more``): a bounded list of paths."""
    return isinstance(value, list) and 0 < len(value) < MAX_LEASE_FILES and all(_path(v) for v in value)


def _sizes(value: Any) -> bool:
    """Per file of a lease, its bytes when the daemon started, or None (``Lease.seen``)."""
    return (
        isinstance(value, list)
        and 0 < len(value) <= MAX_LEASE_FILES
        and all(size is None or _count(size) for size in value)
    )


def _reading_place(value: Any) -> bool:
    """``[lease, record]``: where a worker's reading stands (``Heartbeat.at``)."""
    return isinstance(value, list) and len(value) == 2 and _count(value[0]) and _count(value[1])


def _piece(value: Any) -> bool:
    """``[first record, records]``: the records of its file a lease reads (``Lease.piece``), at least one."""
    return isinstance(value, list) and len(value) == 2 and _count(value[0]) and _positive(value[1])


def _optional(check: Check) -> Check:
    return lambda value: value is None or check(value)


def wire(key: str, check: Check, default: Any = _MISSING, *, absent: Any = _MISSING) -> Any:
    """A message field sent under ``key``; ``absent`` is what a header without the key means."""
    metadata = {"key": key, "check": check, "absent": absent}
    return field(default=default, metadata=metadata)


def _package_version() -> str:
    from loader import __version__  # at call time: loader/__init__ may still be importing this module

    return __version__


@dataclass(frozen=True, kw_only=True)
class Message:
    """Base of every message; ``KIND`` is its ``"k"`` on the wire."""

    KIND: ClassVar[str] = ""
    HAS_COLUMNS: ClassVar[bool] = False
    _SCHEMA: ClassVar[tuple[tuple[str, str, Check, Any, Any], ...]] = ()


@dataclass(frozen=True, kw_only=True)
class Versioned(Message):
    """A hello or welcome: it says which protocol and package version its sender speaks."""

    version: int = wire("v", _count, PROTOCOL_VERSION, absent=1)
    package: str = field(default_factory=_package_version, metadata={"key": "lv", "check": _text, "absent": "unknown"})


_KINDS: dict[str, type[Message]] = {}


def _kind(kind: str, *, columns: bool = False) -> Callable[[type], type]:
    def register(cls: type[Message]) -> type[Message]:
        cls.KIND, cls.HAS_COLUMNS = kind, columns
        cls._SCHEMA = tuple(
            (
                f.name,
                f.metadata["key"],
                f.metadata["check"],
                f.default
                if f.default is not _MISSING
                else (f.default_factory if f.default_factory is not _MISSING else _MISSING),
                f.metadata["absent"],
            )
            for f in dataclasses.fields(cls)
        )
        _KINDS[kind] = cls
        return cls

    return register


# -- control: workers and the daemon ---------------------------------------------------------------------------
@_kind("hello")
@dataclass(frozen=True, kw_only=True)
class Hello(Versioned):
    """A worker introduces itself (again after the daemon forgot it)."""

    worker: str | None = wire("worker", _optional(_text), None)
    pid: int | None = wire("pid", _optional(_count), None)


@_kind("welcome")
@dataclass(frozen=True, kw_only=True)
class Welcome(Versioned):
    """The daemon admits a worker: its id, the config, where to send data, its arena."""

    worker: str = wire("worker", _text)
    config: dict[str, Any] = wire("config", _mapping)
    data: str = wire("data", _text)
    shm: dict[str, Any] | None = wire("shm", _optional(_mapping), None)


@_kind("lease_req")
@dataclass(frozen=True, kw_only=True)
class LeaseRequest(Message):
    """A worker is ready for a file."""


@_kind("lease")
@dataclass(frozen=True, kw_only=True)
class Lease(Message):
    """Read file ``file`` (at ``path``) of ``stream``'s epoch ``epoch``; echo ``token`` in every data message."""

    lease: int = wire("lease", _count)
    stream: int = wire("s", _count)
    epoch: int = wire("e", _count)
    file: int = wire("f", _count)
    path: str = wire("path", _path)
    dataset: str = wire("ds", _text, "default")  # whose source and pipeline read the file
    token: str = wire("t", _text, "")
    start: int = wire("start", _count, 0)  # the first record to read (a resumed or re-leased file)
    seed: int = wire("seed", _count, 0)  # the dataset's seed: mappers' generators come from it
    file_key: int = wire("fk", _count, 0)  # the file's index in its dataset's list (mappers' generators)
    # A lease of several small files (``source.files_per_lease``): the files after ``path``, read after it in
    # this order as one file whose records are numbered on from one file to the next.
    more: list[str] | None = wire("more", _optional(_more_paths), None)
    # A lease of a piece of a large file (``source.records_per_lease``): ``[first, count]``, its records
    # ``first .. first + count - 1``, read as one file whose records are numbered from 0 (``start`` too).
    piece: list[int] | None = wire("piece", _optional(_piece), None)
    # Per file of ``paths``, its bytes when the daemon started (None: not a regular file then): a file of another
    # size is refused by the worker, since the epoch's length, pieces and checkpoints describe the old one.
    seen: list[int | None] | None = wire("seen", _optional(_sizes), None)

    @property
    def paths(self) -> list[str]:
        """Every file of the lease, in reading order."""
        return [self.path, *(self.more or ())]


@_kind("hb")
@dataclass(frozen=True, kw_only=True)
class Heartbeat(Message):
    """I am alive (worker to daemon), and the answer (so a worker notices a dead daemon).

    A worker's says where its reading stands, ``[lease, record]`` (the record it is reading or mapping, numbered
    in the lease): the daemon names it when it stops the worker as hung, since no data came to tell it."""

    at: list[int] | None = wire("at", _optional(_reading_place), None)


@_kind("cancel")
@dataclass(frozen=True, kw_only=True)
class Cancel(Message):
    """Stop reading the file of ``lease``: its stream is gone."""

    lease: int = wire("lease", _count)


@_kind("bye")
@dataclass(frozen=True, kw_only=True)
class Bye(Message):
    """The sender is leaving (a worker, a client) or stopping (the daemon). A worker that could not read a
    message of the daemon's gives a reason that starts with ``UNREADABLE_FROM_DAEMON``."""

    reason: str = wire("reason", _text, "")


@_kind("error")
@dataclass(frozen=True, kw_only=True)
class Error(Versioned):
    """The daemon refuses or fails a request; ``unknown_session`` asks the peer to say hello again."""

    message: str = wire("message", _text, "")
    refused: str | None = wire("refused", _optional(_text), None)
    unknown_session: bool = wire("unknown_session", _flag, False)
    gen: int | None = wire("g", _optional(_count), None)
    error: dict[str, Any] | None = wire("error", _optional(_mapping), None)


# -- data: workers to the daemon ------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class FileMessage(Message):
    """Anything a worker says about one leased file; ``token`` is its lease's (the daemon checks it)."""

    stream: int = wire("s", _count)
    file: int = wire("f", _count)
    lease: int = wire("l", _count)
    worker: str = wire("w", _text)
    token: str = wire("t", _text, "")


@_kind("chunk", columns=True)
@dataclass(frozen=True, kw_only=True)
class Chunk(FileMessage):
    """``count`` samples of a file from record ``record`` on (an ``INDEX_COLUMN`` lists them when some were skipped)."""

    record: int = wire("r", _count, 0)
    count: int = wire("n", _count)
    sample_kind: str = wire("sk", _text, "tuple")
    refs: dict[str, Any] | None = wire("refs", _optional(_refs), None)


@_kind("done")
@dataclass(frozen=True, kw_only=True)
class FileDone(FileMessage):
    """The file is read: ``sent`` records went out in chunks, ``skipped`` were skipped."""

    sent: int = wire("sent", _count)
    skipped: int = wire("skipped", _count, 0)


@_kind("ferror")
@dataclass(frozen=True, kw_only=True)
class FileError(FileMessage):
    """Reading the file failed: ``error`` is ``WorkerError.to_dict()`` naming file and record."""

    error: dict[str, Any] = wire("error", _mapping)


# -- clients ------------------------------------------------------------------------------------------------------
@_kind("chello")
@dataclass(frozen=True, kw_only=True)
class ClientHello(Versioned):
    """A client asks for a session as rank ``rank`` of ``world_size``, with ``prefetch`` batches of credit."""

    rank: int = wire("rank", _count, 0)
    world_size: int = wire("world_size", _count, 1)
    prefetch: int = wire("prefetch", _count, 4)
    dataset: str = wire("ds", _text, "default")
    job: str = wire("job", _text, "default")  # ranks of one job (same name, world_size > 1) share one stream
    # A random value of the client's process: a live client's rank is taken only by a hello of the same
    # process (a dataloader made anew, a notebook cell run again), or once that client is quiet.
    owner: str | None = wire("owner", _optional(_text), None)


@_kind("cwelcome")
@dataclass(frozen=True, kw_only=True)
class ClientWelcome(Versioned):
    """The daemon opens the session and says how it batches."""

    session: int = wire("session", _count)
    batch_size: int = wire("batch_size", _positive)
    batch_format: str = wire("batch_format", _text)
    files: int = wire("files", _count)
    ping_s: float = wire("ping_s", _seconds)
    shm: dict[str, Any] | None = wire("shm", _optional(_mapping), None)
    # Batches in each epoch of this session, where the daemon could count them from file headers.
    batches: int | None = wire("batches", _optional(_count), None)
    samples: int | None = wire("samples", _optional(_count), None)  # samples of an epoch, where counted
    # What a checkpoint's state must match (``service/order.py``: files, seed, batch size, shuffle, ...).
    fingerprint: dict[str, Any] | None = wire("fp", _optional(_mapping), None)
    # The config file the daemon serves (absolute), so a client given a config can tell it reached another
    # config's daemon (as `loader status CONFIG` does). A client of the first 5 ignores it.
    config: str | None = wire("config", _optional(_path), None)
    # The daemon's ``time.monotonic()`` as it sent this: what a client of its host sets its clock by, to tell
    # whether it copied a batch's arena rows while they were still kept (``Batch.kept``).
    clock: float | None = wire("clock", _optional(_seconds), None)


@_kind("epoch")
@dataclass(frozen=True, kw_only=True)
class Epoch(Message):
    """Start epoch ``epoch`` as request ``gen`` with ``credit`` batches; ``shm``: the client maps arenas."""

    epoch: int = wire("e", _count)
    gen: int = wire("g", _count)
    credit: int | None = wire("credit", _optional(_count), None)
    ahead: bool = wire("ahead", _flag, True)
    shm: bool = wire("shm", _flag, False)
    # Resume: start at global sample ``position`` of the epoch, reading from ``anchor`` (a checkpoint's).
    position: int = wire("pos", _count, 0)
    anchor: list[int] | None = wire("anchor", _optional(_anchor), None)
    # The most batches the client takes in one BATCH message (``Batch.parts``); 1 for a client that
    # does not say, so each message is one batch as before.
    pack: int = wire("pack", _count, 1)


@_kind("credit")
@dataclass(frozen=True, kw_only=True)
class Credit(Message):
    """The consumer took ``n`` BATCH messages of request ``gen`` (every batch in them): send as many more."""

    n: int = wire("n", _count, 1)
    gen: int | None = wire("g", _optional(_count), None)
    # Seconds the consumer has waited for batches since the client started (a running total).
    wait_s: float | None = wire("ws", _optional(_seconds), None)


@_kind("batch", columns=True)
@dataclass(frozen=True, kw_only=True)
class Batch(Message):
    """One batch of ``count`` samples for request ``gen``; or, with ``parts``, several consecutive batches
    of this rank whose rows are stacked in one set of columns (a client that asked with ``Epoch.pack``)."""

    epoch: int = wire("e", _count)
    gen: int | None = wire("g", _optional(_count), None)
    count: int = wire("n", _count)
    sample_kind: str = wire("sk", _text, "tuple")
    refs: dict[str, Any] | None = wire("refs", _optional(_refs), None)
    # The files that reference columns' file rows name (``shm.file_rows``), by source id.
    files: dict[int, Any] | None = wire("files", _optional(_file_sources), None)
    # The global sample position after this batch's step, and where its shuffle window's input begins:
    # what ``Client.state_dict()`` saves once the consumer has taken this batch.
    position: int = wire("pos", _count, 0)
    anchor: list[int] | None = wire("anchor", _optional(_anchor), None)
    # Per batch, in order: ``[count, position]`` plus its anchor's three numbers when it has one. The
    # counts add up to ``count``; ``position`` and ``anchor`` above are the last batch's.
    parts: list[list[int]] | None = wire("parts", _optional(_parts), None)
    # With ``refs``: until when (the daemon's ``time.monotonic()``) their arena rows stay reserved for this
    # client without its credit; a client that copies them later may copy rows given to others since.
    kept: float | None = wire("kept", _optional(_seconds), None)


@_kind("end")
@dataclass(frozen=True, kw_only=True)
class End(Message):
    """Request ``gen`` (epoch ``epoch``) is complete."""

    epoch: int = wire("e", _count)
    gen: int | None = wire("g", _optional(_count), None)
    batches: int = wire("batches", _count, 0)
    samples: int = wire("samples", _count, 0)


@_kind("ping")
@dataclass(frozen=True, kw_only=True)
class Ping(Message):
    """A client is alive; ``wait_s`` as in ``Credit`` (the wait after its last credit reaches the metric too)."""

    wait_s: float | None = wire("ws", _optional(_seconds), None)


@_kind("pong")
@dataclass(frozen=True, kw_only=True)
class Pong(Message):
    """The daemon is alive."""

    # The daemon's ``time.monotonic()`` as it answered: what a client sets its clock by, as by the welcome's.
    clock: float | None = wire("clock", _optional(_seconds), None)


@_kind("status")
@dataclass(frozen=True, kw_only=True)
class Status(Message):
    """A request for the daemon's status (empty), and its answer."""

    status: dict[str, Any] | None = wire("status", _optional(_mapping), None)


# -- encoding -----------------------------------------------------------------------------------------------------
def encode(message: Message, columns: Mapping[str, Any] | None = None) -> list[Frame]:
    """Frames for one message: the header, then one frame per column (``Chunk`` and ``Batch`` only)."""
    head: dict[str, Any] = {"k": message.KIND}
    for name, key, _check, _default, _absent in message._SCHEMA:
        value = getattr(message, name)
        if value is not None:
            head[key] = value
    frames: list[Frame] = [b""]
    if columns:
        head["cols"], column_data = column_frames(columns)
        frames.extend(column_data)
    frames[0] = msgpack.packb(head, use_bin_type=True)
    return frames


def decode(frames: Sequence[Frame]) -> tuple[Message, Columns]:
    """(message, columns); ``MalformedMessageError`` naming what is wrong when any field or frame is."""
    message, head = decode_head(frames)
    return message, decode_columns(message, head, frames)


def decode_head(frames: Sequence[Frame]) -> tuple[Message, dict[Any, Any]]:
    """(message, its header) from frame 0 alone, every field checked; its columns are left for
    ``decode_columns``. A receiver that checks who may send the message first decodes no column of a
    message it refuses: an object column can cost many times its bytes (a 64 MiB frame of small integers
    took 1.1 GiB and 8 s to decode)."""
    if not frames:
        raise MalformedMessageError("empty message")
    try:
        head = msgpack.unpackb(buffer_of(frames[0]), raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types
        raise MalformedMessageError(f"malformed message header: {exc}") from exc
    if not isinstance(head, dict):
        raise MalformedMessageError("malformed message header: not a map")
    kind = head.get("k")
    cls = _KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise MalformedMessageError(f"unknown message kind {str(head.get('k'))[:40]!r}")
    values: dict[str, Any] = {}
    for name, key, check, default, absent in cls._SCHEMA:
        if key in head:
            value = head[key]
            if not check(value):
                raise MalformedMessageError(f"{cls.KIND} message: bad {name} {str(value)[:60]!r}")
            values[name] = value
        elif absent is not _MISSING:
            values[name] = absent
        elif default is _MISSING:
            raise MalformedMessageError(f"{cls.KIND} message: {name} is missing")
    return cls(**values), head


def decode_columns(message: Message, head: dict[Any, Any], frames: Sequence[Frame]) -> Columns:
    """The columns of a message ``decode_head`` gave (with its ``head``); ``MalformedMessageError`` when
    a frame disagrees with its description, or a message of a kind without columns carries frames."""
    cls = type(message)
    columns: Columns = {}
    if cls.HAS_COLUMNS:
        columns = read_columns(head.get("cols", []), frames[1:])
        count = message.count  # type: ignore[attr-defined]
        for column, array in columns.items():
            if array.ndim == 0 or array.shape[0] != count:
                raise MalformedMessageError(f"{cls.KIND} message: column {column!r} does not have {count} rows")
    elif len(frames) > 1:
        raise MalformedMessageError(f"{cls.KIND} message carries {len(frames) - 1} unexpected frames")
    return columns


def printable(text: str) -> str:
    """``text`` a peer chose, fit for one log line: each character ``str.isprintable`` refuses (newlines,
    terminal escapes) becomes ``?``, so a name cannot forge log lines of its own."""
    return text if text.isprintable() else "".join(c if c.isprintable() else "?" for c in text)


def version_mismatch(message: Versioned, peer: str) -> str | None:
    """None when ``message`` speaks this protocol version, else one line saying why not."""
    if message.version == PROTOCOL_VERSION:
        return None
    return (
        f"{peer} speaks loader protocol {message.version} (loader {printable(message.package[:64])}), this side speaks "
        f"{PROTOCOL_VERSION} (loader {_package_version()}): run the same loader version on both sides"
    )


__all__ = [
    "PROTOCOL_VERSION",
    "INDEX_COLUMN",
    "UNREADABLE_FROM_DAEMON",
    "Message",
    "Versioned",
    "Hello",
    "Welcome",
    "LeaseRequest",
    "Lease",
    "Heartbeat",
    "Cancel",
    "Bye",
    "Error",
    "FileMessage",
    "Chunk",
    "FileDone",
    "FileError",
    "ClientHello",
    "ClientWelcome",
    "Epoch",
    "Credit",
    "Batch",
    "End",
    "Ping",
    "Pong",
    "Status",
    "encode",
    "decode",
    "decode_head",
    "decode_columns",
    "version_mismatch",
    "printable",
    "object_array",
    "Columns",
    "Frame",
]
