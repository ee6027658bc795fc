"""The Snappy stream of Paddle's RecordIO chunks: hoxnox/snappystream's ``oSnappyStream``.

Paddle's Fluid writer pushed a Snappy chunk's payload through
``snappy::oSnappyStream`` (hoxnox/snappystream, tag 0.2.8), whose format is the
one of Dain Sundstrom's Java Snappy streams, *not* the official Snappy framing
format (no ``sNaPpY`` stream identifier, no 3-byte chunk lengths)::

    stream = "snappy\\0" block*
    block  = flag:u8 length:u16 big-endian crc:u32 big-endian data[length]

``flag`` is 1 when ``data`` is a raw Snappy block (:mod:`loader.recordio.snappy`)
and 0 when it is the bytes themselves; ``crc`` is the masked CRC32C
(:mod:`loader.recordio.crc32c`) of the *uncompressed* block. The writer cuts
its input into blocks of ``BLOCK_SIZE`` (its default chunk size, 32 KiB) and
stores a block raw when Snappy saves less than 12.5 %.

Reading is stricter than the original's reader, which ignored the checksum and
treated any damage as a quiet end of stream: a bad magic, a cut-off block, a
flag other than 0 or 1, an empty block, a malformed Snappy block or a checksum
mismatch raise ``SnappyError`` naming the block and its byte position in the
payload. A block may decode to at most ``MAX_BLOCK_BYTES`` (64 KiB): twice the
size the writer makes, as big as the 16-bit length lets a raw block be, and
what keeps a damaged length from allocating more. Snappy itself expands at
most about 21 times (a 3-byte copy-2 element writes 64 bytes), so a chunk's
payload cannot inflate much beyond 21 times its stored size.
"""

from __future__ import annotations

import struct

from loader.recordio.crc32c import masked_crc32c
from loader.recordio.snappy import SnappyError, compress, decompress

MAGIC = b"snappy\x00"
BLOCK_HEADER = struct.Struct(">BHI")  # flag, stored length, masked CRC32C of the uncompressed block
STORED, COMPRESSED = 0, 1
BLOCK_SIZE = 1 << 15  # oSnappyStream's default chunk size: Paddle's blocks, and ours
MAX_BLOCK_BYTES = 1 << 16


def encode(payload: bytes | bytearray | memoryview, block_size: int = BLOCK_SIZE) -> bytes:
    """The snappystream form of ``payload``, as ``oSnappyStream`` lays it out."""
    if not 0 < block_size <= 0xFFFF:
        raise ValueError(f"block_size must be in 1..65535 (a 16-bit length), got {block_size}")
    view = memoryview(payload).cast("B")
    parts: list[bytes] = [MAGIC]
    for start in range(0, len(view), block_size):
        block = bytes(view[start : start + block_size])
        packed = compress(block)
        # The original's rule: keep the raw bytes unless Snappy saves at least 12.5 %.
        if len(packed) >= len(block) - len(block) // 8:
            flag, packed = STORED, block
        else:
            flag = COMPRESSED
        parts.append(BLOCK_HEADER.pack(flag, len(packed), masked_crc32c(block)))
        parts.append(packed)
    return b"".join(parts)


def decode(stored: bytes, limit: int | None = None) -> bytes:
    """The payload inside a snappystream; ``SnappyError`` says what is wrong and where, and when the
    payload grows past ``limit`` bytes (checked after each block, of at most ``MAX_BLOCK_BYTES``)."""
    if stored[: len(MAGIC)] != MAGIC:
        raise SnappyError(f"bad stream magic {bytes(stored[: len(MAGIC)])!r} (expected {MAGIC!r})")
    blocks: list[bytes | bytearray] = []
    pos, end, total = len(MAGIC), len(stored), 0
    while pos < end:
        where = f"block {len(blocks)} at payload byte {pos}"
        if pos + BLOCK_HEADER.size > end:
            raise SnappyError(f"{where}: block header cut off ({end - pos} of {BLOCK_HEADER.size} bytes)")
        flag, length, crc = BLOCK_HEADER.unpack_from(stored, pos)
        body = pos + BLOCK_HEADER.size
        pos = body + length
        if pos > end:
            raise SnappyError(f"{where}: block of {length} bytes cut off ({end - body} present)")
        blocks.append(_block(stored, body, pos, flag, crc, where))
        total += len(blocks[-1])
        if limit is not None and total > limit:
            raise SnappyError(f"{where}: the payload grows past {limit} bytes (Scanner(max_payload_bytes=...))")
    return b"".join(blocks)


def _block(stored: bytes, body: int, stop: int, flag: int, crc: int, where: str) -> bytes | bytearray:
    """One block's uncompressed bytes, checked against its masked CRC32C."""
    if stop == body:
        raise SnappyError(f"{where}: empty block (the writer never makes one)")
    if flag == COMPRESSED:
        try:
            block: bytes | bytearray = decompress(stored, body, stop, max_length=MAX_BLOCK_BYTES)
        except SnappyError as exc:
            raise SnappyError(f"{where}: {exc}") from None
    elif flag == STORED:
        block = stored[body:stop]
    else:
        raise SnappyError(f"{where}: bad block type {flag} (expected 0 = stored or 1 = compressed)")
    computed = masked_crc32c(block)
    if computed != crc:
        raise SnappyError(f"{where}: masked CRC32C mismatch (stored 0x{crc:08x}, computed 0x{computed:08x})")
    return block


__all__ = ["MAGIC", "BLOCK_SIZE", "MAX_BLOCK_BYTES", "encode", "decode"]
