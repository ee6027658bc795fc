"""Records of Fluid's ``recordio_writer``: a list of serialized LoDTensors (no pickle).

``fluid.recordio_writer.convert_reader_to_recordio_file`` fed each batch through a
``DataFeeder`` and wrote the tensors as one record (``framework::WriteToRecordIO``)::

    record    = count:u32 lod_tensor[count]
    lod_tensor = version:u32 (0)  lod_levels:u64  (bytes:u64 offsets:u64[bytes / 8])[lod_levels]  tensor
    tensor    = version:u32 (0)  desc_size:i32  TensorDesc[desc_size]  data[numel * itemsize]
    TensorDesc (protobuf) = data_type (field 1, varint)  dims (field 2, int64, repeated or packed)

all little-endian. :func:`decode` gives a tuple with one item per tensor: a numpy array, or a
``LoDTensor`` (offset LoD turned into lengths) when the tensor has a LoD. It is strict (every
length checked, every byte used), so other bytes are not mistaken for tensors;
:func:`encode` writes the same layout.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from loader.lod_tensor import LoDTensor

# proto::VarType::Type -> numpy (BF16 has no numpy dtype and is refused).
_VAR_TYPES = {
    0: "bool",
    1: "int16",
    2: "int32",
    3: "int64",
    4: "float16",
    5: "float32",
    6: "float64",
    19: "uint64",
    20: "uint8",
    21: "int8",
    23: "complex64",
    24: "complex128",
}
_TYPE_OF = {np.dtype(name): code for code, name in _VAR_TYPES.items() if code != 19}
_U32, _U64, _I32 = struct.Struct("<I"), struct.Struct("<Q"), struct.Struct("<i")
MAX_TENSORS = 1 << 16  # a record with more tensors than this is not one of Fluid's


class NotTensors(ValueError):
    """The bytes are not a record of serialized LoDTensors (says where they stop fitting)."""


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, size: int) -> bytes:
        if size < 0 or self.pos + size > len(self.data):
            raise NotTensors(f"needs {size} bytes at {self.pos}, {len(self.data) - self.pos} left")
        chunk = self.data[self.pos : self.pos + size]
        self.pos += size
        return chunk

    def unpack(self, fmt: struct.Struct) -> int:
        return int(fmt.unpack(self.take(fmt.size))[0])


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise NotTensors("bad varint in TensorDesc")
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        pos += 1
        shift += 7
        if not byte & 0x80:
            return value, pos


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _desc(data: bytes) -> tuple[np.dtype, list[int]]:
    pos, code, dims = 0, None, []
    while pos < len(data):
        key, pos = _varint(data, pos)
        if key == 0x08:
            code, pos = _varint(data, pos)
        elif key == 0x10:
            value, pos = _varint(data, pos)
            dims.append(_signed(value))
        elif key == 0x12:  # packed dims
            length, pos = _varint(data, pos)
            stop = pos + length
            while pos < stop:
                value, pos = _varint(data, pos)
                dims.append(_signed(value))
        else:
            raise NotTensors(f"unexpected TensorDesc field key {key}")
    if code not in _VAR_TYPES or any(d < 0 for d in dims):
        raise NotTensors(f"TensorDesc with data type {code} and dims {dims}")
    return np.dtype(_VAR_TYPES[code]), dims


def _tensor(reader: _Reader) -> Any:
    if reader.unpack(_U32) != 0:
        raise NotTensors("LoDTensor version is not 0")
    lod = []
    for _ in range(reader.unpack(_U64)):
        size = reader.unpack(_U64)
        if size % 8:
            raise NotTensors("LoD level size is not a multiple of 8")
        lod.append(list(struct.unpack(f"<{size // 8}Q", reader.take(size))))
    if reader.unpack(_U32) != 0:
        raise NotTensors("Tensor version is not 0")
    dtype, dims = _desc(reader.take(reader.unpack(_I32)))
    count = math.prod(dims)  # exact: a damaged dims list must fail the length check, not overflow
    data = reader.take(count * dtype.itemsize)
    try:
        array = np.frombuffer(data, dtype=dtype).reshape(dims).copy()
    except ValueError as exc:  # dims numpy cannot hold with no data at all: more than 64, or (0, 2**62)
        raise NotTensors(f"TensorDesc dims {dims[:8]}{'...' if len(dims) > 8 else ''}: {exc}") from None
    if not lod:
        return array
    tensor = LoDTensor(array)
    try:
        tensor.set_lod(lod)
    except ValueError as exc:
        raise NotTensors(str(exc)) from None
    return tensor


def decode(data: bytes | bytearray | memoryview) -> tuple[Any, ...]:
    """The tensors of one record; :class:`NotTensors` when the bytes are not such a record."""
    reader = _Reader(bytes(data))
    count = reader.unpack(_U32)
    if not 0 < count <= MAX_TENSORS:
        raise NotTensors(f"tensor count {count}")
    tensors = tuple(_tensor(reader) for _ in range(count))
    if reader.pos != len(reader.data):
        raise NotTensors(f"{len(reader.data) - reader.pos} bytes left over")
    return tensors


def _encode_varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def encode(tensors: Sequence[Any]) -> bytes:
    """One record holding ``tensors`` (numpy arrays or ``LoDTensor``s) in Fluid's layout."""
    parts = [_U32.pack(len(tensors))]
    for item in tensors:
        lod = item.lod() if isinstance(item, LoDTensor) else []
        array = np.ascontiguousarray(np.asarray(item))
        parts.append(_U32.pack(0) + _U64.pack(len(lod)))
        for level in lod:
            parts.append(_U64.pack(8 * len(level)) + struct.pack(f"<{len(level)}Q", *level))
        desc = b"\x08" + _encode_varint(_TYPE_OF[array.dtype])
        desc += b"".join(b"\x10" + _encode_varint(d) for d in array.shape)
        parts.append(_U32.pack(0) + _I32.pack(len(desc)) + desc + array.tobytes())
    return b"".join(parts)


def batch_rows(tensors: Sequence[Any]) -> list[tuple[Any, ...]]:
    """The samples of a record that holds one mini-batch (what Fluid's ``convert_reader_to_recordio_file`` wrote:
    a ``DataFeeder``'s tensors, e.g. ``(32, 784)`` and ``(32, 1)``): sample ``k`` is row ``k`` of every array, and
    sequence ``k`` of every ``LoDTensor`` of one LoD level. ``ValueError`` saying why when it is no such batch
    (a scalar, deeper LoD, tensors of different batch sizes)."""
    counts: list[int] = []
    columns: list[list[Any]] = []
    for i, item in enumerate(tensors):
        if isinstance(item, LoDTensor):
            lengths = item.recursive_sequence_lengths()
            if len(lengths) != 1:
                raise ValueError(f"tensor {i} has {len(lengths)} LoD levels; only one level splits into sequences")
            data = item.numpy()
            ends = np.cumsum(lengths[0]).tolist()
            columns.append([data[end - size : end] for end, size in zip(ends, lengths[0])])
        else:
            array = np.asarray(item)
            if array.ndim == 0:
                raise ValueError(f"tensor {i} is a scalar, with no batch axis")
            columns.append(list(array))
        counts.append(len(columns[-1]))
    if not counts:
        raise ValueError("the record holds no tensors")
    if len(set(counts)) > 1:
        raise ValueError(f"its tensors hold {counts} rows or sequences; a batch's tensors hold one per sample each")
    return list(zip(*columns))


__all__ = ["NotTensors", "batch_rows", "decode", "encode"]
