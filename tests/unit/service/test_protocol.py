"""The wire format: one dataclass per kind, header + raw frames, object columns, and malformed input.

``decode`` must turn anything a peer sends into a message or a ``MalformedMessageError``: the
field tables below say, per kind, what each wire key accepts, and every kind is checked against them
(a missing required field, each wrongly-typed field, extra frames, column rows), plus random and
bit-flipped headers.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import subprocess
import sys
import textwrap

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loader.errors import MalformedMessageError, TransportError, WorkerError
from loader.service import frames as F
from loader.service import protocol as P

# -- what each kind carries --------------------------------------------------------------------------------------
# A field's category says what it accepts; "?" marks an optional one (nil on the wire, or absent, is fine).
COUNT, TEXT, PATH, FLAG, SECONDS, MAPPING, REFS = "count", "text", "path", "flag", "seconds", "mapping", "refs"
ANCHOR = "anchor"
FILES = "files"
PARTS = "parts"
MORE = "more"
PIECE = "piece"
SIZES = "sizes"
READING = "reading"
VERSIONED = {"v": COUNT, "lv": TEXT}
FILE = {"s": COUNT, "f": COUNT, "l": COUNT, "w": TEXT, "t": TEXT}
FIELDS: dict[type[P.Message], dict[str, str]] = {
    P.Hello: {**VERSIONED, "worker": TEXT + "?", "pid": COUNT + "?"},
    P.Welcome: {**VERSIONED, "worker": TEXT, "config": MAPPING, "data": TEXT, "shm": MAPPING + "?"},
    P.LeaseRequest: {},
    P.Lease: {
        "lease": COUNT,
        "s": COUNT,
        "e": COUNT,
        "f": COUNT,
        "path": PATH,
        "ds": TEXT,
        "t": TEXT,
        "start": COUNT,
        "seed": COUNT,
        "fk": COUNT,
        "more": MORE + "?",
        "piece": PIECE + "?",
        "seen": SIZES + "?",
    },
    P.Heartbeat: {"at": READING + "?"},
    P.Cancel: {"lease": COUNT},
    P.Bye: {"reason": TEXT},
    P.Error: {
        **VERSIONED,
        "message": TEXT,
        "refused": TEXT + "?",
        "unknown_session": FLAG,
        "g": COUNT + "?",
        "error": MAPPING + "?",
    },
    P.Chunk: {**FILE, "r": COUNT, "n": COUNT, "sk": TEXT, "refs": REFS + "?"},
    P.FileDone: {**FILE, "sent": COUNT, "skipped": COUNT},
    P.FileError: {**FILE, "error": MAPPING},
    P.ClientHello: {
        **VERSIONED,
        "rank": COUNT,
        "world_size": COUNT,
        "prefetch": COUNT,
        "ds": TEXT,
        "job": TEXT,
        "owner": TEXT + "?",
    },
    P.ClientWelcome: {
        **VERSIONED,
        "session": COUNT,
        "batch_size": COUNT,
        "batch_format": TEXT,
        "files": COUNT,
        "ping_s": SECONDS,
        "shm": MAPPING + "?",
        "batches": COUNT + "?",
        "samples": COUNT + "?",
        "fp": MAPPING + "?",
        "config": PATH + "?",
        "clock": SECONDS + "?",
    },
    P.Epoch: {
        "e": COUNT,
        "g": COUNT,
        "credit": COUNT + "?",
        "ahead": FLAG,
        "shm": FLAG,
        "pos": COUNT,
        "anchor": ANCHOR + "?",
        "pack": COUNT,
    },
    P.Credit: {"n": COUNT, "g": COUNT + "?", "ws": SECONDS + "?"},
    P.Batch: {
        "e": COUNT,
        "g": COUNT + "?",
        "n": COUNT,
        "sk": TEXT,
        "refs": REFS + "?",
        "files": FILES + "?",
        "pos": COUNT,
        "anchor": ANCHOR + "?",
        "parts": PARTS + "?",
        "kept": SECONDS + "?",
    },
    P.End: {"e": COUNT, "g": COUNT + "?", "batches": COUNT, "samples": COUNT},
    P.Ping: {"ws": SECONDS + "?"},
    P.Pong: {"clock": SECONDS + "?"},
    P.Status: {"status": MAPPING + "?"},
}
# The fields a header must carry (everything else has a default).
REQUIRED: dict[type[P.Message], set[str]] = {
    P.Welcome: {"worker", "config", "data"},
    P.Lease: {"lease", "s", "e", "f", "path"},
    P.Cancel: {"lease"},
    P.Chunk: {"s", "f", "l", "w", "n"},
    P.FileDone: {"s", "f", "l", "w", "sent"},
    P.FileError: {"s", "f", "l", "w", "error"},
    P.ClientWelcome: {"session", "batch_size", "batch_format", "files", "ping_s"},
    P.Epoch: {"e", "g"},
    P.Batch: {"e", "n"},
    P.End: {"e"},
}
KINDS = list(FIELDS)
REFS_X = {"x": {0: ["<f4", [4]], 3: ["<i8", [2, 2]]}}
ERROR_DICT = WorkerError("Boom", "bad", "tb", worker="w1", file="/d/f.npy", record=7).to_dict()
# One message of each kind with every field set (optional ones not None), and its columns.
EXAMPLES: dict[type[P.Message], tuple[P.Message, dict[str, np.ndarray]]] = {
    P.Hello: (P.Hello(worker="w1", pid=4242), {}),
    P.Welcome: (
        P.Welcome(
            worker="w1",
            config={"pipeline": {"batch_size": 4}},
            data="tcp://127.0.0.1:5001",
            shm={"arenas": [1, 2], "dir": "/dev/shm"},
        ),
        {},
    ),
    P.LeaseRequest: (P.LeaseRequest(), {}),
    P.Lease: (
        P.Lease(
            lease=7,
            stream=3,
            epoch=2,
            file=11,
            path="/data/part-0011.npy",
            start=40,
            seed=5,
            file_key=3,
            more=["/data/part-0012.npy", "/data/part-0013.npy"],
            piece=[4096, 1024],
            seen=[4096, None, 0],
        ),
        {},
    ),
    P.Heartbeat: (P.Heartbeat(at=[7, 3000]), {}),
    P.Cancel: (P.Cancel(lease=7), {}),
    P.Bye: (P.Bye(reason="stopping"), {}),
    P.Error: (P.Error(message="boom", refused="version", unknown_session=True, gen=5, error=ERROR_DICT), {}),
    P.Chunk: (
        P.Chunk(stream=3, file=11, lease=7, worker="w1", record=40, count=3, sample_kind="dict", refs=REFS_X),
        {
            "x": np.array([[1, 0, 0], [1, 1, 3], [1, 2, 0]], np.int64),
            "y": np.arange(3, dtype=np.float32),
            P.INDEX_COLUMN: np.array([40, 42, 43], np.int64),
            "o": P.object_array([b"a", [1, 2], "z"]),
        },
    ),
    P.FileDone: (P.FileDone(stream=3, file=11, lease=7, worker="w1", sent=100, skipped=2), {}),
    P.FileError: (P.FileError(stream=3, file=11, lease=7, worker="w1", error=ERROR_DICT), {}),
    P.ClientHello: (P.ClientHello(rank=1, world_size=4, prefetch=8, job="train", owner="5f3a9c"), {}),
    P.ClientWelcome: (
        P.ClientWelcome(
            session=9,
            batch_size=32,
            batch_format="stacked",
            files=100,
            ping_s=0.5,
            shm={"arenas": []},
            batches=4,
            samples=130,
            fingerprint={"seed": 5},
            config="/etc/loader/train.toml",
            clock=81234.5,
        ),
        {},
    ),
    P.Epoch: (P.Epoch(epoch=2, gen=6, credit=4, ahead=False, shm=True, position=96, anchor=[1, 4, 17], pack=8), {}),
    P.Credit: (P.Credit(n=3, gen=6, wait_s=0.25), {}),
    P.Batch: (
        P.Batch(
            epoch=2,
            gen=6,
            count=2,
            sample_kind="dict",
            refs={"x": {0: ["<f4", [4]]}},
            files={0: ["/data/f.npy", "data", 4224, -5, 77, 2049]},
            position=64,
            anchor=[0, 0, 0],
            parts=[[1, 63, 0, 0, 0], [1, 64]],
            kept=81294.5,
        ),
        {"x": np.array([[1, 0, 0], [-2, 1, 0]], np.int64), "y": np.array([[1.5, 2.5], [3.5, 4.5]])},
    ),
    P.End: (P.End(epoch=2, gen=6, batches=10, samples=317), {}),
    P.Ping: (P.Ping(wait_s=1.5), {}),
    P.Pong: (P.Pong(clock=81250.25), {}),
    P.Status: (P.Status(status={"workers": [{"id": "w1", "alive": True}], "samples_per_s": 12.5}), {}),
}
# What each category refuses; optional fields accept None as well.
BAD: dict[str, list] = {
    COUNT: [-1, "1", True, False, 1.5, None, [1], {"n": 1}, b"\x01", P.MAX_INT, 2**64 - 1, -(2**63)],
    TEXT: [5, None, True, b"bytes", ["a"], {"a": 1}, "x" * (P.MAX_TEXT + 1)],
    PATH: ["", 5, None, b"/data/f", ["/data/f"], "/" * (P.MAX_PATH + 1)],
    FLAG: [1, 0, "true", None, 1.0, [True]],
    SECONDS: [-0.5, -1, math.nan, math.inf, -math.inf, True, "1", None, [1.0]],
    MAPPING: [[], "x", 5, None, True, b"{}"],
    ANCHOR: [[], [0, 0], [0, 0, 0, 0], [0, -1, 0], [0, 1.5, 0], "000", None, {"w": 0}, [True, 0, 0]],
    PARTS: [
        [],
        [[]],
        [[1]],
        [[1, 2, 3]],
        [[1, 2, 3, 4, 5, 6]],
        [[1, -2]],
        [[1, 2.5]],
        [[True, 2]],
        "parts",
        {"0": [1, 2]},
        [[1, 2]] * (P.MAX_PACK + 1),
        None,
    ],
    REFS: [
        [],
        "x",
        5,
        None,
        {"x": {}},
        {"x": []},
        {"x": {"0": ["<f4", [4]]}},
        {"x": {-1: ["<f4", [4]]}},
        {"x": {True: ["<f4", [4]]}},
        {"x": {0: ["<f4"]}},
        {"x": {0: ("<f4", [4], 1)}},
        {"x": {0: [5, [4]]}},
        {"x": {0: ["<f4", 4]}},
        {"x": {0: ["<f4", [-1]]}},
        {"x": {0: ["<f4", [1.5]]}},
        {"x": {0: ["<f4", [1] * 33]}},
        {5: {0: ["<f4", [4]]}},
        {"x": {0: ["x" * (P.MAX_TEXT + 1), [4]]}},
    ],
    MORE: [[], "/data/f", ["/data/f", ""], ["/data/f", 5], ["/f"] * P.MAX_LEASE_FILES, {"0": "/f"}, [None]],
    PIECE: [[], [0], [0, 0], [-1, 5], [0, 5, 1], [0, 1.5], [True, 1], [0, P.MAX_INT], "0 5", {"0": 5}],
    READING: [[], [1], [1, 2, 3], [-1, 2], [1, -2], [1, 2.5], [True, 1], [1, P.MAX_INT], "1 2", {"0": 1}],
    SIZES: [[], [None] * (P.MAX_LEASE_FILES + 1), [-1], [1.5], [True], [P.MAX_INT], ["1"], [[1, 2]], "1", {"0": 1}],
    FILES: [
        [],
        5,
        {-1: ["/f.npy", "data", 1, 1, 1, 1]},
        {0: ["/f.npy", "data", 1, 1, 1]},
        {0: ["", "data", 1, 1, 1, 1]},
        {0: ["/f.npy", 5, 1, 1, 1, 1]},
        {0: ["/f.npy", "data", 1.5, 1, 1, 1]},
        {0: ["/f.npy", "data", True, 1, 1, 1]},
        {0: ["/f.npy", "data", 1, 1, 1, P.MAX_INT]},
    ],
}


def _bad_values(category: str) -> list:
    base = category.rstrip("?")
    return [v for v in BAD[base] if not (category.endswith("?") and v is None)]


def _wire(message: P.Message, columns=None) -> tuple[dict, list]:
    """(header as a dict, column frames) of ``message``."""
    frames = P.encode(message, columns)
    return msgpack.unpackb(frames[0], strict_map_key=False), frames[1:]


def _frames(head: dict, rest=()) -> list:
    return [msgpack.packb(head, use_bin_type=True), *rest]


def _assert_columns_equal(got, want):
    assert list(got) == list(want)
    for name, values in want.items():
        assert got[name].dtype == values.dtype and got[name].shape == values.shape, name
        if values.dtype == object:
            for a, b in zip(got[name], values):
                np.testing.assert_equal(a, b)
        else:
            np.testing.assert_array_equal(got[name], values)


def _ndarray_ext(dtype, shape, body):
    """The payload of ``loader.runtime.codec``'s ndarray extension."""
    header = msgpack.packb([dtype, shape])
    return len(header).to_bytes(4, "little") + header + body


def _chunk(count, **fields):
    return P.Chunk(stream=1, file=2, lease=3, worker="w1", count=count, **fields)


def _chunk_head(**fields):
    """A valid Chunk header with ``fields`` added or replaced (to build a bad one by hand)."""
    return {"k": "chunk", "s": 1, "f": 2, "l": 3, "w": "w1", "n": 1, **fields}


# -- the tables match the module ---------------------------------------------------------------------------------
def test_the_tables_cover_every_kind_and_field():
    exported = [getattr(P, name) for name in P.__all__]
    registered = {cls for cls in exported if type(cls) is type and issubclass(cls, P.Message) and cls.KIND}
    assert registered == set(FIELDS) == set(EXAMPLES)
    assert len({cls.KIND for cls in registered}) == len(registered)
    for cls, fields in FIELDS.items():
        keys = [f.metadata["key"] for f in dataclasses.fields(cls)]
        assert sorted(keys) == sorted(fields), cls.__name__
        required = {
            f.metadata["key"]
            for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        }
        assert required == REQUIRED.get(cls, set()), cls.__name__
        assert cls.HAS_COLUMNS == (cls in (P.Chunk, P.Batch)), cls.__name__


# -- round trips ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", KINDS, ids=lambda c: c.__name__)
def test_every_kind_round_trips(cls):
    message, columns = EXAMPLES[cls]
    got, got_columns = P.decode(P.encode(message, columns or None))
    assert type(got) is cls and got == message
    _assert_columns_equal(got_columns, columns)
    head, _ = _wire(message, columns or None)
    assert head["k"] == cls.KIND
    assert not any(value is None for value in head.values())  # None fields stay off the wire


@pytest.mark.parametrize("cls", KINDS, ids=lambda c: c.__name__)
def test_every_kind_round_trips_with_only_its_required_fields(cls):
    full, _ = EXAMPLES[cls]
    head, _ = _wire(full)
    minimal = {"k": cls.KIND, **{key: head[key] for key in REQUIRED.get(cls, ())}}
    message, columns = P.decode(_frames(minimal))
    assert columns == {}
    names = {f.metadata["key"]: f.name for f in dataclasses.fields(cls)}
    defaults = cls(**{names[key]: head[key] for key in REQUIRED.get(cls, ())})
    if issubclass(cls, P.Versioned):  # a peer that says no version is an old one
        assert (message.version, message.package) == (1, "unknown")
        defaults = dataclasses.replace(defaults, version=1, package="unknown")
    assert message == defaults
    assert P.decode(P.encode(message)) == (message, {})


def test_round_trip_keeps_dtype_shape_and_values():
    cols = {
        "x": np.arange(12, dtype=np.float32).reshape(3, 4),
        "y": np.array([1, 2, 3], dtype=np.int8),
        "s": np.array(["a", "bb", "ccc"]),
        "empty": np.zeros((3, 0), dtype=np.float64),
    }
    message, out = P.decode(P.encode(_chunk(3), cols))
    assert message == _chunk(3)
    _assert_columns_equal(out, cols)


def test_arrays_are_raw_frames_not_packed():
    big = np.ones((256, 1024), dtype=np.float32)
    frames = P.encode(P.Batch(epoch=0, count=256), {"x": big})
    assert len(frames) == 2 and memoryview(frames[1]).nbytes == big.nbytes
    assert len(frames[0]) < 100


def test_non_contiguous_arrays_are_sent_contiguous():
    base = np.arange(20).reshape(4, 5)
    _, out = P.decode(P.encode(_chunk(4), {"x": base[:, ::2]}))
    np.testing.assert_array_equal(out["x"], base[:, ::2])


def test_object_column_round_trip_without_pickle():
    ragged = P.object_array([np.arange(3), np.arange(5), "text"])
    assert P.object_array is F.object_array
    _, out = P.decode(P.encode(_chunk(3), {"seq": ragged}))
    assert out["seq"].dtype == object and len(out["seq"]) == 3
    np.testing.assert_array_equal(out["seq"][1], np.arange(5))
    assert out["seq"][2] == "text"


def test_error_dicts_travel_in_messages():
    err = WorkerError("Boom", "bad", "tb", worker="w1", file="/d/f.npy", record=7)
    message, _ = P.decode(P.encode(P.FileError(stream=0, file=0, lease=0, worker="w1", error=err.to_dict())))
    back = WorkerError.from_dict(message.error)
    assert (back.type_name, back.file, back.record, back.worker) == ("Boom", "/d/f.npy", 7, "w1")


# Every wire schema (each kind's keys) a protocol version has had. A change to the schema needs a new
# version: a peer of the old one would misread the new messages (an old client takes a packed BATCH for
# one batch, an old daemon refuses a worker's file rows as forged) instead of refusing it in one line.
# A version may have several schemas when a later one only adds a key older peers ignore (decode skips keys
# it does not know): 4 then ``Ping.wait_s``, which a daemon of the first 4 reads as a plain ping; 5 then
# ``Lease.seen``, which a worker of the first 5 ignores (it reads the file as it finds it, as before), and
# ``Heartbeat.at``, which a daemon of the first 5 ignores (its hang errors name no record, as before), and
# ``ClientWelcome.config``, which a client of the first 5 ignores (it cannot tell another config's daemon), and
# ``ClientWelcome.clock`` with ``Batch.kept``, which a client of the first 5 ignores (it copies a batch's rows
# whenever it reads it, as before) and a daemon of the first 5 never sends (a client then checks nothing), and
# ``ClientHello.owner``, which a daemon of the first 5 ignores (it lets any hello take a rank, as before) and a
# client of the first 5 never sends (its rank is then taken only from a quiet client), and ``Pong.clock``, which a
# client of the first 5 ignores.
SCHEMA_OF_VERSION = {
    2: ("08569ee2d0ba2c2c",),
    3: ("eab8ef5e470bcbc9",),
    4: ("4e3c87399b323b09", "e422ebcfbae7ec7c"),
    5: (
        "2dd09cd992105c38",
        "fa7374bb4ef526a5",
        "ffa5e3ecf6153182",
        "985d97a31f54befe",
        "810d419c65389447",
        "da662a8690161f5d",
        "2bbfda2aeac76131",
    ),
}


def _schema_digest() -> str:
    keys = sorted(f"{kind}:{key}" for kind, cls in P._KINDS.items() for _, key, *_ in cls._SCHEMA)
    return hashlib.sha256("\n".join(keys).encode()).hexdigest()[:16]


def test_the_wire_schema_changes_only_with_the_protocol_version():
    assert _schema_digest() in SCHEMA_OF_VERSION.get(P.PROTOCOL_VERSION, ()), (
        f"the wire schema is now {_schema_digest()}: bump PROTOCOL_VERSION and record it here"
    )


def test_versioned_messages_and_mismatch_lines():
    import loader

    hello = P.Hello(worker="w1")
    assert (hello.version, hello.package) == (P.PROTOCOL_VERSION, loader.__version__)
    head, _ = _wire(hello)
    assert head == {"k": "hello", "worker": "w1", "v": P.PROTOCOL_VERSION, "lv": loader.__version__}
    assert P.version_mismatch(hello, "worker w1") is None
    old, _ = P.decode(_frames({"k": "hello", "worker": "w0"}))  # peers from before the check spoke version 1
    assert (old.version, old.package) == (1, "unknown")
    line = P.version_mismatch(old, "an old peer")  # version 1 knew no lease start, seed or anchor
    assert line is not None and line.startswith("an old peer speaks loader protocol 1 (loader unknown)")
    for cls in (P.Hello, P.ClientHello, P.Error):
        line = P.version_mismatch(cls(version=7, package="3.0"), "worker w2")
        assert line is not None and "\n" not in line
        assert line.startswith("worker w2 speaks loader protocol 7 (loader 3.0)")
        assert f"this side speaks {P.PROTOCOL_VERSION} (loader {loader.__version__})" in line
    welcome, _ = EXAMPLES[P.Welcome]
    assert P.version_mismatch(P.decode(P.encode(dataclasses.replace(welcome, version=7)))[0], "x") is not None


# -- malformed input ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "frames",
    [
        [],
        [b"\xc1"],
        [b""],
        [msgpack.packb([1, 2])],
        [msgpack.packb("chunk")],
        [_frames(_chunk_head(n=4, cols=[["x", "<f4", [4]]]))[0]],  # a column without its frame
        _frames(_chunk_head(n=4, cols=[["x", "<f4", [4]]]), [b"123"]),  # too few bytes
        _frames(_chunk_head(n=1, cols=[["x", "|O", [1]]]), [b"\xc1"]),  # object frame that does not unpack
        _frames(_chunk_head(n=1, cols=[["x", "|O", [1]]]), [msgpack.packb(5)]),  # ... or is not a list
        _frames(_chunk_head(n=1, cols=[["x", "O", [1]]]), [b"12345678"]),  # an array frame claiming dtype object
        _frames(_chunk_head(n=1, cols=[["x", "no-such-dtype", [1]]]), [b"12345678"]),
        _frames(_chunk_head(n=1, cols=[["x", "<f4", [1]], ["x", "<f4", [1]]]), [b"1234", b"1234"]),  # twice
        _frames(_chunk_head(n=1, cols=[["x", "<f4", [1], "extra"]]), [b"1234"]),
        _frames(_chunk_head(n=1, cols=[["x", "<f4", [-1]]]), [b"1234"]),
        _frames(_chunk_head(n=1, cols=[["x", "<f4", [1] * 33]]), [b"1234"]),
        _frames(_chunk_head(n=1, cols=[[5, "<f4", [1]]]), [b"1234"]),
        _frames(_chunk_head(n=1, cols="x"), [b"1234"]),
        _frames(_chunk_head(n=1, cols=[["x", "<f4", [1]]]), [b"1234", b"1234"]),  # a frame too many
    ],
)
def test_malformed_messages_raise_malformed_message_error(frames):
    with pytest.raises(MalformedMessageError):
        P.decode(frames)
    assert issubclass(MalformedMessageError, TransportError)


@pytest.mark.parametrize(
    "head, frames",
    [
        # numpy refuses these in ways other than TypeError: np.zeros on a huge dimension, a zero itemsize,
        # and dtype strings numpy parses as Python (a SyntaxError).
        (_chunk_head(n=0, cols=[["x", "<f4", [0, 2**63]]]), [b""]),
        (_chunk_head(n=0, cols=[["x", "<f4", [0, 2**64 - 1]]]), [b""]),
        (_chunk_head(n=2, cols=[["x", "V0", [2]]]), [b""]),
        (_chunk_head(n=1, cols=[["x", "i4,(", [1]]]), [b"1234"]),
        # the same inside an object column (loader.runtime.codec's ndarray and scalar extensions)
        (
            _chunk_head(n=1, cols=[["x", "|O", [1]]]),
            [msgpack.packb([msgpack.ExtType(1, _ndarray_ext("i4,(", [1], b"1234"))])],
        ),
        (
            _chunk_head(n=1, cols=[["x", "|O", [1]]]),
            [msgpack.packb([msgpack.ExtType(3, msgpack.packb(["i4,(", b"1234"]))])],
        ),
    ],
    ids=[
        "zero-rows-huge-dim",
        "zero-rows-dim-over-uint64",
        "zero-itemsize",
        "dtype-syntax-error",
        "object-ndarray-dtype-syntax-error",
        "object-scalar-dtype-syntax-error",
    ],
)
def test_columns_numpy_refuses_raise_malformed_message_error(head, frames):
    with pytest.raises(MalformedMessageError):
        P.decode(_frames(head, frames))


@pytest.mark.parametrize(
    "kind", ["nope", "", "CHUNK", b"chunk", 5, None, True, 1.5, ["chunk"], {"k": "chunk"}, (1, 2)], ids=repr
)
def test_unknown_kind(kind):
    with pytest.raises(MalformedMessageError, match="unknown message kind"):
        P.decode(_frames({"k": kind, "s": 1}))


def test_missing_kind():
    with pytest.raises(MalformedMessageError, match="unknown message kind"):
        P.decode(_frames({"s": 1, "f": 2}))


MISSING_CASES = [(cls, key) for cls in KINDS for key in sorted(REQUIRED.get(cls, ()))]


@pytest.mark.parametrize("cls, key", MISSING_CASES, ids=[f"{c.__name__}-{k}" for c, k in MISSING_CASES])
def test_a_missing_required_field_is_malformed(cls, key):
    message, columns = EXAMPLES[cls]
    head, rest = _wire(message, columns or None)
    del head[key]
    with pytest.raises(MalformedMessageError, match=f"{cls.KIND} message: .* is missing"):
        P.decode(_frames(head, rest))


OPTIONAL_CASES = [(cls, key) for cls in KINDS for key in sorted(set(FIELDS[cls]) - REQUIRED.get(cls, set()))]


@pytest.mark.parametrize("cls, key", OPTIONAL_CASES, ids=[f"{c.__name__}-{k}" for c, k in OPTIONAL_CASES])
def test_a_missing_optional_field_takes_its_default(cls, key):
    message, columns = EXAMPLES[cls]
    head, rest = _wire(message, columns or None)
    del head[key]
    got, _ = P.decode(_frames(head, rest))
    name = next(f for f in dataclasses.fields(cls) if f.metadata["key"] == key)
    want = {"v": 1, "lv": "unknown"}.get(key, name.default)  # versions: what an old peer (which sent none) spoke
    assert getattr(got, name.name) == want


BAD_CASES = [
    (cls, key, value) for cls in KINDS for key, category in FIELDS[cls].items() for value in _bad_values(category)
]


@pytest.mark.parametrize(
    "cls, key, value", BAD_CASES, ids=[f"{c.__name__}-{k}-{repr(v)[:40]}" for c, k, v in BAD_CASES]
)
def test_a_wrongly_typed_field_is_malformed(cls, key, value):
    message, columns = EXAMPLES[cls]
    head, rest = _wire(message, columns or None)
    head[key] = value
    with pytest.raises(MalformedMessageError, match=f"{cls.KIND} message: bad "):
        P.decode(_frames(head, rest))


NIL_CASES = [(cls, key) for cls in KINDS for key, category in FIELDS[cls].items() if category.endswith("?")]


@pytest.mark.parametrize("cls, key", NIL_CASES, ids=[f"{c.__name__}-{k}" for c, k in NIL_CASES])
def test_an_optional_field_may_be_nil(cls, key):
    message, columns = EXAMPLES[cls]
    head, rest = _wire(message, columns or None)
    head[key] = None
    got, _ = P.decode(_frames(head, rest))
    name = next(f.name for f in dataclasses.fields(cls) if f.metadata["key"] == key)
    assert getattr(got, name) is None


def test_limits_are_inclusive_where_they_should_be():
    assert P.decode(_frames(_chunk_head(s=P.MAX_INT - 1, n=0)))[0].stream == P.MAX_INT - 1
    assert P.decode(_frames({"k": "bye", "reason": "x" * P.MAX_TEXT}))[0].reason == "x" * P.MAX_TEXT
    lease = {"k": "lease", "lease": 0, "s": 0, "e": 0, "f": 0, "path": "/" * P.MAX_PATH}
    assert P.decode(_frames(lease))[0].path == "/" * P.MAX_PATH
    welcome = {"k": "cwelcome", "session": 0, "batch_size": 1, "batch_format": "stacked", "files": 0}
    assert P.decode(_frames({**welcome, "ping_s": 0}))[0].ping_s == 0
    assert P.decode(_frames({**welcome, "ping_s": 2.5}))[0].ping_s == 2.5
    with pytest.raises(MalformedMessageError, match="bad batch_size"):  # a client would divide by it
        P.decode(_frames({**welcome, "ping_s": 1, "batch_size": 0}))


@pytest.mark.parametrize("cls", [P.Chunk, P.Batch], ids=lambda c: c.__name__)
@pytest.mark.parametrize(
    "columns",
    [
        {"x": np.arange(4)},  # one row too many
        {"x": np.arange(2)},  # one too few
        {"x": np.arange(3), "y": np.zeros((2, 5))},  # one column of several
        {"x": P.object_array([b"a", b"b"])},  # an object column
        {"x": np.zeros((0, 3))},
        {"x": np.array(5)},  # 0-d: no rows at all
    ],
    ids=["more", "fewer", "second-column", "object", "empty", "0-d"],
)
def test_columns_must_have_count_rows(cls, columns):
    message = _chunk(3) if cls is P.Chunk else P.Batch(epoch=0, count=3)
    with pytest.raises(MalformedMessageError, match="does not have 3 rows"):
        P.decode(P.encode(message, columns))


@pytest.mark.parametrize("cls", [c for c in KINDS if not c.HAS_COLUMNS], ids=lambda c: c.__name__)
def test_extra_frames_on_a_message_without_columns_are_malformed(cls):
    message, _ = EXAMPLES[cls]
    frames = P.encode(message)
    assert len(frames) == 1
    with pytest.raises(MalformedMessageError, match="unexpected frames"):
        P.decode([*frames, b"extra"])
    with pytest.raises(MalformedMessageError, match="unexpected frames"):
        P.decode(P.encode(message, {"x": np.arange(3)}))  # columns it cannot carry


def test_a_deeply_nested_object_column_is_refused_not_a_crash():
    # loader.runtime.codec unpacks a tuple extension by recursing into msgpack's C unpacker, whose context
    # lives on the C stack: a few hundred nested tuples (a few KiB from any peer) must not crash the process.
    # Run in a child so that a crash fails this test instead of killing the whole test run.
    script = textwrap.dedent("""
        import msgpack
        from loader.errors import MalformedMessageError
        from loader.service import protocol as P
        head = {"k": "chunk", "s": 1, "f": 2, "l": 3, "w": "w1", "n": 1, "cols": [["x", "|O", [1]]]}
        inner = msgpack.packb([])
        for _ in range(1000):
            inner = msgpack.packb([msgpack.ExtType(2, inner)])
        try:
            P.decode([msgpack.packb(head), inner])
            print("decoded")
        except MalformedMessageError:
            print("malformed")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"the decoding process died ({done.returncode}): {done.stderr[-500:]}"
    assert done.stdout.strip() in ("decoded", "malformed")


# -- whatever a peer sends: a message or MalformedMessageError ------------------------------------------------------
WIRE_KEYS = sorted({key for fields in FIELDS.values() for key in fields} | {"k", "cols"})
texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)  # what msgpack can encode
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=True, allow_infinity=True)
    | texts
    | st.binary(max_size=12)
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts | st.integers(-3, 40), inner, max_size=4),
    max_leaves=12,
)
small_counts = st.integers(min_value=-2, max_value=6)
column_descriptions = st.lists(
    st.lists(st.one_of(st.sampled_from(["x", "y", P.INDEX_COLUMN]), values), min_size=3, max_size=3).map(list)
    | st.tuples(
        st.sampled_from(["x", "y", "x"]),
        st.sampled_from(["<f4", "<i8", "|u1", "|O", "O", "<U3", "V0", "V4", "bogus", "f4,i4"]),
        st.lists(small_counts | st.integers(0, 2**64 - 1), max_size=3),
    ).map(list),
    max_size=3,
)
kinds = st.sampled_from([cls.KIND for cls in KINDS]) | values
wire_values = {key: values | small_counts for key in WIRE_KEYS if key not in ("k", "cols")}
headers = st.fixed_dictionaries({"k": kinds}, optional={**wire_values, "cols": column_descriptions | values})
frame_bodies = st.lists(
    st.binary(max_size=40) | st.builds(lambda n: np.arange(n, dtype=np.float32).tobytes(), st.integers(0, 6)),
    max_size=3,
)


def _decodes_or_is_malformed(frames):
    try:
        message, columns = P.decode(frames)
    except MalformedMessageError:
        return
    assert isinstance(message, P.Message) and isinstance(columns, dict)
    if message.HAS_COLUMNS:
        assert all(len(values) == message.count for values in columns.values())
    else:
        assert columns == {}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(head=headers, rest=frame_bodies)
def test_random_headers_decode_or_are_malformed(head, rest):
    _decodes_or_is_malformed(_frames(head, rest))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cls=st.sampled_from(KINDS), data=st.data())
def test_bit_flipped_messages_decode_or_are_malformed(cls, data):
    message, columns = EXAMPLES[cls]
    frames = [bytearray(memoryview(frame)) for frame in P.encode(message, columns or None)]
    for _ in range(data.draw(st.integers(1, 8), label="flips")):
        which = data.draw(st.integers(0, len(frames) - 1), label="frame")
        if frames[which]:
            bit = data.draw(st.integers(0, 8 * len(frames[which]) - 1), label="bit")
            frames[which][bit // 8] ^= 1 << (bit % 8)
    if data.draw(st.booleans(), label="truncate"):
        which = data.draw(st.integers(0, len(frames) - 1), label="truncated frame")
        del frames[which][data.draw(st.integers(0, len(frames[which])), label="at") :]
    _decodes_or_is_malformed([bytes(frame) for frame in frames])


def test_credit_carries_the_clients_wait_time():
    from loader.errors import MalformedMessageError as Malformed

    assert P.decode(P.encode(P.Credit(n=1, gen=2, wait_s=1.25)))[0] == P.Credit(n=1, gen=2, wait_s=1.25)
    assert P.decode(P.encode(P.Credit(n=1)))[0].wait_s is None  # an older client sends none
    for bad in (-1.0, float("nan"), float("inf"), "1"):
        frames = [msgpack.packb({"k": "credit", "n": 1, "ws": bad})]
        with pytest.raises(Malformed):
            P.decode(frames)


def test_keys_a_side_does_not_know_are_skipped_so_an_added_optional_key_needs_no_new_version():
    # Why Ping.wait_s kept protocol 4: a daemon of the first 4 reads a new client's ping as a plain one.
    assert P.decode([msgpack.packb({"k": "ping", "later": [1, 2]})])[0] == P.Ping()
    assert P.decode([msgpack.packb({"k": "credit", "n": 2, "later": "x"})])[0] == P.Credit(n=2)
