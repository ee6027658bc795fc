"""Samples to bytes and back with msgpack, keeping Python and numpy types.

Used wherever a sample leaves the process or lands in a file (RecordIO records,
``multiprocess_reader`` pipes). It never pickles: decoding a hostile byte string
can fail, but it cannot run code.

Types kept exactly: ``None``, ``bool``, ``int``, ``float``, ``str``, ``bytes``,
``list``, ``tuple``, ``dict`` (any msgpack-able keys, ints included), numpy
arrays of any non-object dtype (dtype, shape and raw bytes) and numpy scalars.
Anything else raises ``TypeError`` naming the type, except ``bytearray`` and
``memoryview``, which msgpack writes as ``bytes`` (``pack(exact=True)`` refuses a
``bytearray``).
"""

from __future__ import annotations

import threading
from typing import Any

import msgpack
import numpy as np

KEPT_TYPES = "None, bool, int, float, str, bytes, lists, tuples, dicts, numpy arrays and scalars"
_EXT_NDARRAY = 1
_EXT_TUPLE = 2
_EXT_NPSCALAR = 3
# Tuples inside tuples each cost a nested msgpack decoder on the C stack: a few hundred levels of
# hostile input would overflow it (a crash, not an exception), so nesting is capped well below that.
MAX_TUPLE_NESTING = 32
_nesting = threading.local()  # tuples being encoded around the current one, per thread


def _default(obj: Any) -> Any:
    return _encode_ext(obj, _packer)


def _default_exact(obj: Any) -> Any:
    # A subclass would arrive as its base: a namedtuple as a tuple, a masked array without its mask.
    if isinstance(obj, (tuple, np.ndarray)) and type(obj) not in (tuple, np.ndarray):
        raise TypeError(
            f"cannot encode a {type(obj).__name__} as it is (a subclass of {type(obj).__mro__[1].__name__})"
        )
    # The payload names the dtype by ``dtype.str``, which drops a structured dtype's field names
    # ('|V12'): such an array (or np.void record) would arrive as raw void bytes.
    if isinstance(obj, (np.ndarray, np.generic)) and not _dtype_round_trips(obj.dtype):
        raise TypeError(f"cannot encode a numpy {type(obj).__name__} of dtype {obj.dtype} as it is")
    return _encode_ext(obj, _exact_packer)


def _dtype_round_trips(dtype: np.dtype) -> bool:
    try:
        return bool(np.dtype(dtype.str) == dtype)
    except TypeError:
        return False


def _encode_ext(obj: Any, packer: Any) -> Any:
    if isinstance(obj, np.ndarray):
        if obj.dtype.hasobject:
            raise TypeError("cannot encode a numpy array of dtype object; convert it to a fixed dtype")
        header = msgpack.packb([obj.dtype.str, list(obj.shape)], use_bin_type=True)
        # ext payload: header length (4 bytes) + header + raw C-order bytes
        raw = np.ascontiguousarray(obj).tobytes()
        return msgpack.ExtType(_EXT_NDARRAY, len(header).to_bytes(4, "little") + header + raw)
    if isinstance(obj, tuple):
        # Refused here at the depth the decoder refuses (MAX_TUPLE_NESTING): what is written can be read back,
        # and multiprocess_reader sends such a sample another way instead of failing in the parent.
        depth = getattr(_nesting, "depth", 0)
        if depth >= MAX_TUPLE_NESTING:
            raise TypeError(f"cannot encode tuples nested deeper than {MAX_TUPLE_NESTING}")
        _nesting.depth = depth + 1
        try:
            return msgpack.ExtType(_EXT_TUPLE, packer().pack(list(obj)))
        finally:
            _nesting.depth = depth
    if isinstance(obj, np.generic):
        if obj.dtype.hasobject:
            raise TypeError("cannot encode a numpy object scalar")
        return msgpack.ExtType(_EXT_NPSCALAR, msgpack.packb([obj.dtype.str, obj.tobytes()], use_bin_type=True))
    raise TypeError(f"cannot encode a sample part of type {type(obj).__name__}")


def _dtype(text: Any) -> np.dtype:
    """The dtype a payload names; ``ValueError`` for anything numpy cannot parse or that holds objects."""
    try:
        dtype = np.dtype(text)
    except Exception as exc:  # numpy raises TypeError, ValueError, even SyntaxError for odd strings
        raise ValueError(f"unknown dtype {str(text)[:40]!r}") from exc
    if dtype.hasobject:
        raise ValueError("an encoded value claims dtype object, which is never written")
    return dtype


def _ext_hook_at(depth: int) -> Any:
    def hook(code: int, data: bytes) -> Any:
        if code == _EXT_NDARRAY:
            header_len = int.from_bytes(data[:4], "little")
            dtype_str, shape = msgpack.unpackb(data[4 : 4 + header_len], raw=False)
            dtype = _dtype(dtype_str)
            body = memoryview(data)[4 + header_len :]
            # bytearray makes the array writable (one copy, as np.array would make).
            return np.frombuffer(bytearray(body), dtype=dtype).reshape(shape)
        if code == _EXT_TUPLE:
            if depth >= MAX_TUPLE_NESTING:
                raise ValueError(f"tuples nested deeper than {MAX_TUPLE_NESTING}")
            return tuple(_unpack(data, depth + 1))
        if code == _EXT_NPSCALAR:
            dtype_str, raw = msgpack.unpackb(data, raw=False)
            return np.frombuffer(raw, dtype=_dtype(dtype_str))[0]
        raise ValueError(f"unknown msgpack extension type {code}")

    return hook


def _packer() -> msgpack.Packer:
    # strict_types routes tuples and numpy scalars (subclasses of float/int) to _default.
    return msgpack.Packer(default=_default, use_bin_type=True, strict_types=True)


def _exact_packer() -> msgpack.Packer:
    return msgpack.Packer(default=_default_exact, use_bin_type=True, strict_types=True)


def pack(sample: Any, exact: bool = False) -> bytes:
    """Encode one sample (or any nest of supported types) as bytes. ``exact``: refuse (``TypeError``) what
    would arrive as another type: a subclass of tuple or ndarray (as its base class), a ``bytearray`` (as
    ``bytes``), msgpack's own ``ExtType`` and ``Timestamp`` (``multiprocess_reader`` then sends it another
    way). A ``memoryview`` still arrives as ``bytes``: a view cannot cross processes, nor be pickled."""
    if exact:
        _refuse_lossy(sample, 0)
        return _exact_packer().pack(sample)
    return _packer().pack(sample)


# msgpack packs these natively (no ``default`` hook is asked), but they come back as another type.
_LOSSY_TYPES = (bytearray, msgpack.ExtType, msgpack.Timestamp)
_LEAF_TYPES = frozenset({type(None), bool, int, float, str, bytes, np.ndarray})
_MAX_WALK_DEPTH = 512  # msgpack refuses deeper nests itself


def _refuse_lossy(obj: Any, depth: int) -> None:
    kind = type(obj)
    if kind in _LEAF_TYPES or depth > _MAX_WALK_DEPTH:
        return
    if kind in _LOSSY_TYPES:
        raise TypeError(f"a {kind.__name__} would arrive as another type")
    if kind is list or kind is tuple:
        for item in obj:
            if type(item) not in _LEAF_TYPES:
                _refuse_lossy(item, depth + 1)
    elif kind is dict:
        for key, value in obj.items():
            _refuse_lossy(key, depth + 1)
            _refuse_lossy(value, depth + 1)


def unpack(data: bytes | bytearray | memoryview) -> Any:
    """Decode bytes made by :func:`pack`. Malformed input raises ``ValueError``."""
    try:
        return _unpack(data, 0)
    except ValueError:
        raise
    except Exception as exc:  # hostile bytes can make msgpack or numpy raise almost anything
        raise ValueError(f"malformed encoded sample: {type(exc).__name__}: {exc}") from exc


def _unpack(data: bytes | bytearray | memoryview, depth: int) -> Any:
    return msgpack.unpackb(data, ext_hook=_ext_hook_at(depth), raw=False, strict_map_key=False, use_list=True)


__all__ = ["pack", "unpack"]
