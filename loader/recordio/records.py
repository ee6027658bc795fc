"""What one record of a RecordIO file holds, and how it becomes a sample.

A record is tried as, in order:

1. a sample encoded by :mod:`loader.runtime.codec` (msgpack): what this package writes, always in
   the FLUID layout (so a file of the Go layout skips this step: there a short raw record
   such as ``b"2"`` would otherwise read as the msgpack int 50);
2. a Python pickle, what PaddlePaddle's Python readers wrote (``pickle.dumps(sample)``):
   never unpickled unless the caller opted in (``allow_pickle=True``), and then only by the
   restricted unpickler of :mod:`loader.recordio.safe_pickle`; otherwise ``PickledRecordError``
   names the file, the record and the two ways to opt in;
3. in a file of the FLUID layout, serialized LoDTensors, what Fluid's ``recordio_writer`` wrote
   (:mod:`loader.recordio.tensors`): a tuple of arrays / ``LoDTensor``s;
4. in a file of the Go layout, raw bytes (the Go ``recordio`` package stored any bytes; its
   Python binding returned them as they were), given back as ``bytes``.

Anything else is damage: ``CorruptFileError`` names the file, the chunk and the record. The
checks do not overlap: a pickle or a tensor record is never valid msgpack (a pickle starts
with an opcode that msgpack reads as one small int followed by extra bytes), and the pickle
and tensor parsers only read, they run nothing.
"""

from __future__ import annotations

from typing import Any

from loader.errors import DataError
from loader.recordio import safe_pickle, tensors
from loader.recordio.chunks import Layout, chunk_error
from loader.runtime import codec


class PickledRecordError(DataError):
    """A record is a pickle and the caller did not opt in to the restricted unpickler."""


def opt_in_hint(name: str) -> str:
    # Said wherever the file is read: the daemon, `loader check` and loader.io take no allow_pickle, so the
    # conversion comes first and the argument is named with the two calls that take it.
    return (
        f"it is not unpickled unless you opt in: convert the file once, loader recordio convert {name} OUT "
        "--allow-pickle, or read it with loader.reader.creator.recordio(..., allow_pickle=True) or "
        f"recordio.Scanner(..., allow_pickle=True) (a restricted unpickler that admits only {safe_pickle.ADMITTED})"
    )


def decode_record(
    raw: bytes | memoryview, *, name: str, chunk_offset: int, index: int, layout: Layout, allow_pickle: bool
) -> Any:
    """The sample held by record ``index`` (0-based in the file) of the chunk at ``chunk_offset``."""
    ours: Exception | None = None
    if layout is Layout.FLUID:
        try:
            return codec.unpack(raw)
        except Exception as exc:  # file bytes are untrusted; any failure means "not ours"
            ours = exc
    if safe_pickle.is_pickle(raw):
        if not allow_pickle:
            raise PickledRecordError(
                f"RecordIO file {name}: record {index} (chunk at byte offset {chunk_offset}) is a Python pickle, "
                f"as PaddlePaddle wrote them; {opt_in_hint(name)}"
            )
        try:
            return safe_pickle.loads(raw)
        except DataError as exc:
            where = f"RecordIO file {name}: record {index} (chunk at byte offset {chunk_offset})"
            raise type(exc)(f"{where}: {exc}") from None
    if layout is Layout.GO:
        return bytes(raw)
    try:
        return tensors.decode(raw)
    except tensors.NotTensors:
        pass
    # Some msgpack errors have no message (FormatError()): name the error's type, so the reason is never "()".
    why = str(ours) or type(ours).__name__
    raise chunk_error(name, chunk_offset, f"record {index} cannot be decoded ({why})") from ours


__all__ = ["PickledRecordError", "decode_record", "opt_in_hint"]
