"""The wire format of the service: a small msgpack header plus raw buffer frames.

A message is a list of frames. Frame 0 is a msgpack map with at least ``"k"``
(the kind); frames 1.. are raw array buffers, described in the header under
``"cols"`` as ``[name, dtype_str, shape]`` in frame order. Arrays are received
with ``np.frombuffer`` (no copy); nothing is ever unpickled. A column whose
values do not stack into one fixed-dtype array (ragged shapes, mixed types)
travels as dtype ``"|O"`` with its frame holding ``loader.runtime.codec.pack(values)``.
A column named in the header's ``"refs"`` map (``{name: {spec id: [dtype,
row shape]}}``) is a reference column: an int64 ``(n, 3)`` frame of ``[arena,
first block, spec id]`` per row whose bytes lie in a shared-memory arena
(``loader.service.shm.refs``); the receiver resolves it, never this module.

Message kinds (direction in brackets; W worker, C coordinator, S stage, K client):

* control, on the well-known ROUTER endpoint:
  ``HELLO`` [W->C], ``WELCOME`` [C->W: worker settings, data endpoint],
  ``LEASE_REQ`` [W->C], ``LEASE`` [C->W], ``HEARTBEAT`` [both ways],
  ``CANCEL`` [C->W], ``BYE`` [both ways], ``ERROR`` [C->W or C->K with
  ``"unknown_session"``: the daemon does not know the peer, which says HELLO again].
* data, worker PUSH -> stage PULL (ordered per worker): ``CHUNK`` (columnar
  samples tagged stream, file, first record and count, and per-sample record
  indexes in the ``INDEX_COLUMN`` column when records were skipped),
  ``FILE_DONE`` (records sent and skipped), ``FILE_ERROR``
  (``WorkerError.to_dict()`` naming file and record).
* client, on the same ROUTER endpoint: ``CLIENT_HELLO`` [K->S: rank,
  world_size], ``CLIENT_WELCOME`` [S->K], ``EPOCH`` [K->S: start an epoch share,
  with initial credits], ``CREDIT`` [K->S], ``BATCH`` [S->K], ``END`` [S->K],
  ``ERROR`` [S->K], ``PING``/``PONG``, ``STATUS`` [K->S, and the answer S->K],
  ``BYE`` [K->S].
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import msgpack
import numpy as np

from loader.runtime import codec
from loader.errors import TransportError

# Every HELLO, CLIENT_HELLO, WELCOME and CLIENT_WELCOME carries it as "v" (with the package version
# as "lv"); a peer that speaks another version is refused with one line saying both. Bump it on any
# change a peer of the old version would misread. Peers from before the check sent no "v": that was 1.
PROTOCOL_VERSION = 1
VERSION_KEY = "v"

# control plane
HELLO = "hello"
WELCOME = "welcome"
LEASE_REQ = "lease_req"
LEASE = "lease"
HEARTBEAT = "hb"
CANCEL = "cancel"
BYE = "bye"
ERROR = "error"
# data plane
CHUNK = "chunk"
FILE_DONE = "done"
FILE_ERROR = "ferror"
# clients
CLIENT_HELLO = "chello"
CLIENT_WELCOME = "cwelcome"
EPOCH = "epoch"
CREDIT = "credit"
BATCH = "batch"
END = "end"
PING = "ping"
PONG = "pong"
STATUS = "status"

OBJECT_DTYPE = "|O"
# Header key naming the reference columns of a CHUNK or BATCH and their row specs.
REFS = "refs"
# Header key of the shared-memory arena info in WELCOME / CLIENT_WELCOME, and a client's answer in EPOCH.
SHM = "shm"
# Name of the optional per-sample record index column in a CHUNK.
INDEX_COLUMN = "__idx__"

Frame = Any  # bytes, memoryview, numpy array or zmq.Frame: anything with the buffer protocol
Columns = dict[str, np.ndarray]


def versioned(header: Mapping[str, Any]) -> dict[str, Any]:
    """``header`` with this side's protocol and package versions (for hellos and welcomes)."""
    from loader import __version__  # at call time: loader/__init__ may still be importing this module

    return {**header, VERSION_KEY: PROTOCOL_VERSION, "lv": __version__}


def version_mismatch(head: Mapping[str, Any], peer: str) -> str | None:
    """None when ``head`` (a hello or welcome) speaks this protocol version, else one line saying why not."""
    theirs = head.get(VERSION_KEY, 1)
    if theirs == PROTOCOL_VERSION:
        return None
    from loader import __version__

    return (f"{peer} speaks loader protocol {theirs} (loader {head.get('lv', 'unknown')}), this side speaks "
            f"{PROTOCOL_VERSION} (loader {__version__}): run the same loader version on both sides")


def _buffer(frame: Frame) -> memoryview:
    # zmq.Frame exposes its memory as .buffer; everything else supports the buffer protocol.
    buf = getattr(frame, "buffer", None)
    return buf if buf is not None else memoryview(frame)


def encode(kind: str, header: Mapping[str, Any] | None = None, columns: Mapping[str, Any] | None = None) -> list[Frame]:
    """Frames for one message: header (with ``"k"`` and ``"cols"``) and array buffers."""
    head = dict(header or {})
    head["k"] = kind
    frames: list[Frame] = [b""]
    if columns:
        described = []
        for name, values in columns.items():
            dtype, shape, frame = _column_frame(values)
            described.append([name, dtype, shape])
            frames.append(frame)
        head["cols"] = described
    frames[0] = msgpack.packb(head, use_bin_type=True)
    return frames


def _column_frame(values: Any) -> tuple[str, list[int], Frame]:
    if isinstance(values, np.ndarray) and not values.dtype.hasobject:
        array = np.ascontiguousarray(values)
        # A zero-size or 0-d array still needs a valid buffer; reshape(-1) keeps it cheap.
        return array.dtype.str, list(array.shape), array.reshape(-1).view(np.uint8) if array.size else b""
    items = list(values)
    return OBJECT_DTYPE, [len(items)], codec.pack(items)


def decode(frames: Sequence[Frame]) -> tuple[dict[str, Any], Columns]:
    """(header, columns) of a message; raises ``TransportError`` when malformed."""
    if not frames:
        raise TransportError("empty message")
    try:
        head = msgpack.unpackb(_buffer(frames[0]), raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types
        raise TransportError(f"malformed message header: {exc}") from exc
    if not isinstance(head, dict) or "k" not in head:
        raise TransportError("malformed message header: no kind")
    columns: Columns = {}
    described = head.pop("cols", None) or []
    if len(described) != len(frames) - 1:
        raise TransportError(f"message {head['k']!r} describes {len(described)} arrays but has {len(frames) - 1}")
    for (name, dtype_str, shape), frame in zip(described, frames[1:]):
        columns[name] = _column_array(dtype_str, shape, frame)
    return head, columns


def _column_array(dtype_str: str, shape: list[int], frame: Frame) -> np.ndarray:
    if dtype_str == OBJECT_DTYPE:
        try:
            items = codec.unpack(_buffer(frame))
        except ValueError as exc:
            raise TransportError(f"malformed object column: {exc}") from exc
        return object_array(items)
    dtype = np.dtype(dtype_str)
    if dtype.hasobject:
        raise TransportError("an array frame claims dtype object")
    buf = _buffer(frame)
    count = int(np.prod(shape)) if shape else 1
    if count * dtype.itemsize != buf.nbytes:
        raise TransportError(f"array frame has {buf.nbytes} bytes, expected {count * dtype.itemsize}")
    if count == 0:
        return np.zeros(shape, dtype=dtype)
    return np.frombuffer(buf, dtype=dtype).reshape(shape)


def object_array(items: Sequence[Any]) -> np.ndarray:
    """A 1-d object array holding ``items`` as they are (never broadcasting nested arrays)."""
    out = np.empty(len(items), dtype=object)
    for i, item in enumerate(items):
        out[i] = item
    return out


__all__ = [
    "PROTOCOL_VERSION",
    "versioned",
    "version_mismatch",
    "encode",
    "decode",
    "object_array",
    "OBJECT_DTYPE",
    "INDEX_COLUMN",
    "REFS",
    "SHM",
]
