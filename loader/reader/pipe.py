"""``PipeReader``: read the standard output of a command as text lines or chunks.

Compared with the original (1.x ``paddle.reader.PipeReader``):

* ``command`` may be a string (split as a shell would, with ``shlex.split``; no
  shell runs) or a list of arguments;
* the process starts lazily, once per ``get_line()`` iteration, and is reaped
  on every exit path (exhaustion, ``break``, ``close()``, garbage collection);
  its standard input is ``/dev/null`` and its standard error is inherited;
* text is decoded as UTF-8 with an incremental decoder, so a character split
  across two reads is fine; ``gzip`` decodes every member of a multi-member
  stream;
* a last line without a trailing line break is yielded;
* output that is not valid gzip (for ``file_type="gzip"``) or not UTF-8 raises
  ``DataError`` naming the command and the byte offset;
* a non-zero exit status raises ``WorkerDiedError`` naming the command and the
  code, after all output was yielded;
* a bad ``file_type`` raises ``ValueError`` at construction.
"""

from __future__ import annotations

import codecs
import shlex
import subprocess
import zlib
from collections.abc import Iterator, Sequence

from loader.errors import DataError, WorkerDiedError
from loader.reader._util import as_count
from loader.runtime import processes

FILE_TYPES = ("plain", "gzip")
PROCESS_EXIT_TIMEOUT_S = 10.0  # how long a command may linger after closing its output
PROCESS_KILL_TIMEOUT_S = 2.0


class _GzipStream:
    """Incremental gunzip that continues into the next member of a multi-member stream.

    Bytes that do not inflate set ``error``; ``feed`` still returns the members inflated before them.
    """

    def __init__(self) -> None:
        self._dec = zlib.decompressobj(32 + zlib.MAX_WBITS)  # 32: accept gzip or zlib headers
        self._started = False
        self.error: zlib.error | None = None

    def feed(self, data: bytes) -> bytes:
        out = []
        while data:
            self._started = True
            try:
                out.append(self._dec.decompress(data))
            except zlib.error as exc:
                self.error = exc
                break
            if not self._dec.eof:
                break
            data = self._dec.unused_data
            self._dec = zlib.decompressobj(32 + zlib.MAX_WBITS)
            self._started = False
        return b"".join(out)

    def finish(self) -> bytes:
        if self._started and not self._dec.eof:
            raise DataError("the stream ends in the middle of a gzip member")
        return self._dec.flush()


def _split_command(command: str | Sequence[str]) -> list[str]:
    if isinstance(command, str):
        args = shlex.split(command)
    elif isinstance(command, (list, tuple)) and all(isinstance(a, str) for a in command):
        args = list(command)
    else:
        raise TypeError(f"PipeReader: command must be a string or a list of strings, got {command!r}")
    if not args:
        raise ValueError("PipeReader: command is empty")
    return args


class PipeReader:
    """Run ``command`` and read its output: ``PipeReader("cat data.txt").get_line()``.

    ``bufsize`` is the most bytes taken from the pipe at once; ``file_type`` is
    ``"plain"`` (UTF-8 text) or ``"gzip"`` (gzip-compressed UTF-8 text).
    """

    def __init__(self, command: str | Sequence[str], bufsize: int = 8192, file_type: str = "plain") -> None:
        self.args = _split_command(command)
        self.bufsize = as_count(bufsize, "PipeReader: bufsize")
        if self.bufsize < 1:
            raise ValueError(f"PipeReader: bufsize must be >= 1, got {bufsize}")
        if file_type not in FILE_TYPES:
            raise ValueError(f"PipeReader: file_type {file_type!r} is not allowed; use one of {FILE_TYPES}")
        self.file_type = file_type

    def get_line(self, cut_lines: bool = True, line_break: str = "\n") -> Iterator[str]:
        """Start the command and yield its output.

        ``cut_lines=True``: lines without ``line_break`` (the last one too, when
        it has none). ``cut_lines=False``: decoded text chunks as they arrive.
        """
        if cut_lines and not line_break:
            raise ValueError("PipeReader.get_line: line_break must not be empty")
        chunks = self._decoded_chunks()
        return _cut(chunks, line_break) if cut_lines else chunks

    def _decoded_chunks(self) -> Iterator[str]:
        proc = processes.start_command(self.args)
        finished = False
        try:
            yield from self._decode(proc)
            finished = True
        finally:
            code = _reap(proc, finished)
        if code != 0:
            # Its standard error is this process's own: what it said is on the terminal or in the log already.
            raise WorkerDiedError(f"command {shlex.join(self.args)!r}", code, said="(its standard error says why)")

    def _decode(self, proc: subprocess.Popen) -> Iterator[str]:
        output = _OutputDecoder(shlex.join(self.args), gzipped=self.file_type == "gzip")
        assert proc.stdout is not None
        while True:
            # A blocking read: the consumer waits for the command as for any source.
            raw = proc.stdout.read(self.bufsize)
            if not raw:
                break
            decoded = output.decode(raw)
            if decoded:
                yield decoded
            output.raise_failure()
        tail = output.finish()
        if tail:
            yield tail
        output.raise_failure()


class _OutputDecoder:
    """A command's output bytes -> text (gunzipped first for ``file_type="gzip"``).

    Output that does not decode is a ``DataError`` naming the command and the byte
    offset: zlib's and the codec's own errors name neither (and a ``zlib.error`` is
    not even a ``ValueError``), so a long pipeline failed with no hint of which
    command's output was bad, or where. The text before the damage is still given
    (then :meth:`raise_failure` raises), as ``text_file`` gives every line before
    a bad one.
    """

    def __init__(self, command: str, gzipped: bool) -> None:
        self._command = command
        self._text = codecs.getincrementaldecoder("utf-8")()
        self._gz = _GzipStream() if gzipped else None
        self._read = 0  # bytes of output taken from the command
        self._text_bytes = 0  # bytes handed to the UTF-8 decoder (after gunzip)
        self._failure: DataError | None = None

    def decode(self, raw: bytes) -> str:
        self._read += len(raw)
        return self._utf8(self._gunzip(raw), final=False)

    def finish(self) -> str:
        return self._utf8(self._gunzip(None), final=True)

    def raise_failure(self) -> None:
        """Raise the error found by the last call, once the text before it was given."""
        if self._failure is not None:
            raise self._failure

    def _gunzip(self, raw: bytes | None) -> bytes:
        if self._gz is None:
            return raw or b""
        try:
            data = self._gz.finish() if raw is None else self._gz.feed(raw)
        except DataError as exc:
            self._failure = self._not_gzip(exc)
            return b""
        if self._gz.error is not None:
            self._failure = self._not_gzip(self._gz.error)  # after the text of the members before it
        return data

    def _not_gzip(self, why: Exception) -> DataError:
        return DataError(
            f"PipeReader: the output of command {self._command!r} is not valid gzip "
            f"(in its first {self._read} bytes: {why})"
        )

    def _utf8(self, data: bytes, final: bool) -> str:
        pending = len(self._text.getstate()[0])  # bytes of a character started in the last call
        try:
            return self._text.decode(data, final=final)
        except UnicodeDecodeError as exc:
            offset = self._text_bytes - pending + exc.start
            where = "of its gunzipped output" if self._gz is not None else "of its output"
            self._failure = DataError(  # replaces a gzip error: this byte came before it
                f"PipeReader: the output of command {self._command!r} is not UTF-8 text "
                f"(byte {exc.object[exc.start]:#04x} at offset {offset} {where}: {exc.reason})"
            )
            return bytes(exc.object[: exc.start]).decode("utf-8")  # the good text before it
        finally:
            self._text_bytes += len(data)


def _reap(proc: subprocess.Popen, finished: bool) -> int | None:
    """Wait for (or, when abandoned, stop) the command; return its exit status."""
    assert proc.stdout is not None
    proc.stdout.close()
    if not finished and proc.poll() is None:
        proc.terminate()
    try:
        return proc.wait(timeout=PROCESS_EXIT_TIMEOUT_S if finished else PROCESS_KILL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait(timeout=PROCESS_KILL_TIMEOUT_S)


def _cut(chunks: Iterator[str], line_break: str) -> Iterator[str]:
    # The unfinished line is kept in pieces and joined once it ends: ``rest + chunk`` on every chunk made
    # a line of n chunks cost n**2 (a 16 MiB line took 13 s). Only the new chunk, and the few characters
    # before it that a line break could straddle, are searched.
    pieces: list[str] = []
    overlap = len(line_break) - 1
    tail = ""  # the last ``overlap`` characters of the unfinished line
    try:
        for chunk in chunks:
            if line_break not in tail + chunk:
                pieces.append(chunk)
                tail = (tail + chunk)[-overlap:] if overlap else ""
                continue
            lines = ("".join(pieces) + chunk).split(line_break)
            pieces = [lines.pop()]
            tail = pieces[0][-overlap:] if overlap else ""
            yield from lines
        rest = "".join(pieces)
        if rest:
            yield rest
    finally:
        chunks.close()  # type: ignore[attr-defined]  # reap the command now, not at GC


__all__ = ["PipeReader", "FILE_TYPES"]
