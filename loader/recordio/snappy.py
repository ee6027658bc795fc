"""The raw Snappy block format in pure Python: decoding, and a simple greedy encoder.

A block is a little-endian base-128 varint holding the uncompressed length,
then elements, each starting with a tag byte whose low two bits give its kind:

=========  ==========================================================================
kind       meaning
=========  ==========================================================================
0 literal  ``tag >> 2`` is length-1 for lengths 1..60; 60..63 say that the length-1
           follows in 1..4 little-endian bytes. Then the literal bytes.
1 copy-1   length ``4 + (tag >> 2 & 7)`` (4..11), offset ``(tag >> 5) << 8 | next byte``
           (0..2047)
2 copy-2   length ``1 + (tag >> 2)`` (1..64), offset in the next 2 bytes, little-endian
3 copy-4   length ``1 + (tag >> 2)`` (1..64), offset in the next 4 bytes, little-endian
=========  ==========================================================================

A copy repeats ``length`` bytes starting ``offset`` bytes back in the output;
``offset < length`` is legal and repeats the last ``offset`` bytes as a pattern.
Offset 0, an offset reaching before the start of the output, output past the
declared length, or a declared length that the elements do not fill are errors.

Every problem raises ``SnappyError`` with the byte position in the block; the
decoder checks bounds itself so nothing lower-level (``IndexError``) escapes.
``decompress`` refuses a declared length over ``max_length`` before allocating:
a damaged varint cannot make it allocate gigabytes.
"""

from __future__ import annotations

import numpy as np

from loader.recordio import native


class SnappyError(ValueError):
    """A Snappy block or stream is malformed; the message says what and where."""


def _read_varint(src: bytes, pos: int, end: int) -> tuple[int, int]:
    """``(value, position after it)`` of the uint32 varint at ``src[pos]``."""
    value, shift = 0, 0
    while True:
        if pos >= end:
            raise SnappyError("the length varint is cut off")
        byte = src[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            break
        shift += 7
        if shift >= 35:
            raise SnappyError("the length varint is longer than 5 bytes")
    if value > 0xFFFFFFFF:
        raise SnappyError(f"the length varint {value} does not fit 32 bits")
    return value, pos


def decompress(src: bytes, start: int = 0, end: int | None = None, *, max_length: int) -> bytes | bytearray:
    """Decode the raw Snappy block ``src[start:end]``; positions in errors count from ``start``.

    With cramjam installed (``native.SNAPPY``) its C decoder does the work; a block it refuses is
    decoded again here, so the error names the exact position either way.
    """
    end = len(src) if end is None else end
    size, pos = _read_varint(src, start, end)
    if size > max_length:  # checked before either decoder allocates
        raise SnappyError(f"declared length {size} exceeds the limit of {max_length} bytes")
    if native.SNAPPY is not None:
        try:
            out = native.SNAPPY.decompress_raw(memoryview(src)[start:end])
        except Exception:  # cramjam says little about where: the pure decoder below says exactly
            pass
        else:
            data = bytes(out)
            if len(data) == size:
                return data
    return decompress_python(src, start, end, max_length=max_length)


def decompress_python(src: bytes, start: int = 0, end: int | None = None, *, max_length: int) -> bytearray:
    """``decompress`` in pure Python (the fallback, and the reference the tests hold cramjam to)."""
    end = len(src) if end is None else end
    size, pos = _read_varint(src, start, end)
    if size > max_length:
        raise SnappyError(f"declared length {size} exceeds the limit of {max_length} bytes")
    out = bytearray()
    done = 0  # == len(out); the checks keep it <= size, so memory stays bounded
    from_bytes = int.from_bytes
    # One loop with everything inline, cheap checks only: a function call per
    # element would cost more than the work of most elements. When a check fails,
    # the _*_problem helpers work out the exact message.
    while pos < end:
        tag = src[pos]
        kind = tag & 3
        if kind == 0:
            length = (tag >> 2) + 1
            body = pos + 1
            if length > 60:
                body += length - 60
                length = from_bytes(src[pos + 1 : body], "little") + 1
            stop = body + length
            if stop > end or done + length > size:
                raise SnappyError(_literal_problem(pos - start, body, stop, end, size))
            out += src[body:stop]
            done += length
            pos = stop
            continue
        if kind == 2:
            length = (tag >> 2) + 1
            offset = src[pos + 1] | (src[pos + 2] << 8) if pos + 2 < end else -1
            pos += 3
        elif kind == 1:
            length = ((tag >> 2) & 7) + 4
            offset = ((tag >> 5) << 8) | src[pos + 1] if pos + 1 < end else -1
            pos += 2
        else:
            length = (tag >> 2) + 1
            offset = from_bytes(src[pos + 1 : pos + 5], "little") if pos + 4 < end else -1
            pos += 5
        if not 0 < offset <= done or done + length > size:
            raise SnappyError(_copy_problem(kind, pos - _ELEMENT_BYTES[kind] - start, offset, length, done, size))
        if offset >= length:
            base = done - offset
            out += out[base : base + length]
        else:  # overlapping: the last `offset` bytes repeat as a pattern
            out += (out[done - offset :] * (length // offset + 1))[:length]
        done += length
    if done != size:
        raise SnappyError(f"the elements decode to {done} bytes, the declared length is {size}")
    return out


_ELEMENT_BYTES = (0, 2, 3, 5)  # tag and offset bytes of a copy, by kind
_KIND_NAMES = ("literal", "copy-1", "copy-2", "copy-4")


def _literal_problem(at: int, body: int, stop: int, end: int, size: int) -> str:
    if body > end:
        return f"literal length at byte {at} is cut off"
    if stop > end:
        return f"literal of {stop - body} bytes at byte {at} runs past the end of the block"
    return f"literal of {stop - body} bytes at byte {at} writes past the declared length {size}"


def _copy_problem(kind: int, at: int, offset: int, length: int, done: int, size: int) -> str:
    name = _KIND_NAMES[kind]
    if offset < 0:
        return f"{name} at byte {at} is cut off"
    if offset == 0:
        return f"{name} at byte {at} has offset 0"
    if offset > done:
        return f"{name} at byte {at} copies from {offset} bytes back with only {done} decoded (before the start)"
    return f"{name} of {length} bytes at byte {at} writes past the declared length {size}"


# -- encoding -------------------------------------------------------------------

MIN_MATCH = 4  # matches are found through 4-byte sequences
MAX_COPY2_OFFSET = 0xFFFF
SKIP_SHIFT = 5  # after every 2**SKIP_SHIFT misses in a row, step one byte further


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _words(data: bytes) -> list[int]:
    """The little-endian 4-byte word at every position that has one."""
    b = np.frombuffer(data, dtype=np.uint8).astype(np.uint32)
    return (b[:-3] | (b[1:-2] << 8) | (b[2:-1] << 16) | (b[3:] << 24)).tolist()


def _common_length(data: bytes, words: list[int], a: int, b: int, end: int) -> int:
    """How many bytes ``data[a:]`` and ``data[b:]`` share (a < b), not running past ``end``."""
    # Most matches are short: compare 4-byte words first, and only a match that
    # passes 16 bytes goes on to 32-byte slice comparisons.
    n, last = 0, end - b - MIN_MATCH  # a word starts at b + n while n <= last
    while n <= last and words[a + n] == words[b + n]:
        n += 4
        if n == 16:
            return n + _long_common_length(data, a + n, b + n, end)
    limit = end - b
    while n < limit and data[a + n] == data[b + n]:  # at most 3 bytes
        n += 1
    return n


def _long_common_length(data: bytes, a: int, b: int, end: int) -> int:
    limit = end - b
    n = 0
    while n + 32 <= limit and data[a + n : a + n + 32] == data[b + n : b + n + 32]:
        n += 32
    for step in (16, 8, 4, 2, 1):  # the first difference is within the next 32 bytes
        if n + step <= limit and data[a + n : a + n + step] == data[b + n : b + n + step]:
            n += step
    return n


def _emit_literal(out: bytearray, data: bytes, start: int, stop: int) -> None:
    n = stop - start - 1
    if n < 60:
        out.append(n << 2)
    else:
        width = (n.bit_length() + 7) // 8
        out.append((59 + width) << 2)
        out += n.to_bytes(width, "little")
    out += data[start:stop]


def _emit_copy(out: bytearray, offset: int, length: int) -> None:
    while length >= 68:  # 64 at a time, leaving at least 4 for a final copy
        out += bytes((63 << 2 | 2, offset & 0xFF, offset >> 8))
        length -= 64
    if length > 64:
        out += bytes((59 << 2 | 2, offset & 0xFF, offset >> 8))
        length -= 60
    if length <= 11 and offset < 2048:
        out += bytes(((offset >> 8) << 5 | (length - 4) << 2 | 1, offset & 0xFF))
    else:
        out += bytes(((length - 1) << 2 | 2, offset & 0xFF, offset >> 8))


def compress(data: bytes) -> bytes:
    """A raw Snappy block holding ``data`` (cramjam's encoder when installed, else ``compress_python``)."""
    if native.SNAPPY is not None:
        return bytes(native.SNAPPY.compress_raw(bytes(data)))
    return compress_python(data)


def compress_python(data: bytes) -> bytes:
    """A raw Snappy block holding ``data``: greedy matches of 4+ bytes through a hash table.

    Literals, copy-1 and copy-2 elements only. Runs of misses make it step
    faster, so incompressible data costs little. Not google/snappy's bytes,
    but any Snappy decoder reads it.
    """
    size = len(data)
    out = bytearray(_varint(size))
    literal = 0  # start of the bytes not yet emitted
    if size >= MIN_MATCH + 1:
        words = _words(data)
        table: dict[int, int] = {}  # 4-byte word -> its latest position
        pos, misses, last = 0, 0, size - MIN_MATCH
        while pos <= last:
            word = words[pos]
            candidate = table.get(word, -1)
            table[word] = pos
            if candidate < 0 or pos - candidate > MAX_COPY2_OFFSET:
                misses += 1
                pos += 1 + (misses >> SKIP_SHIFT)
                continue
            length = MIN_MATCH + _common_length(data, words, candidate + MIN_MATCH, pos + MIN_MATCH, size)
            if literal < pos:
                _emit_literal(out, data, literal, pos)
            _emit_copy(out, pos - candidate, length)
            pos += length
            literal, misses = pos, 0
    if literal < size:
        _emit_literal(out, data, literal, size)
    return bytes(out)


__all__ = ["SnappyError", "compress", "decompress"]
