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
    """Incremental gunzip that continues into the next member of a multi-member stream."""

    def __init__(self) -> None:
        self._dec = zlib.decompressobj(32 + zlib.MAX_WBITS)  # 32: accept gzip or zlib headers
        self._started = False

    def feed(self, data: bytes) -> bytes:
        out = []
        while data:
            self._started = True
            out.append(self._dec.decompress(data))
            if not self._dec.eof:
                break
            data = self._dec.unused_data
            self._dec = zlib.decompressobj(32 + zlib.MAX_WBITS)
            self._started = False
        return b"".join(out)

    def finish(self) -> bytes:
        if self._started and not self._dec.eof:
            raise DataError("gzip stream from the command ends in the middle of a member")
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
        self.bufsize = as_count(bufsize)
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
        text = codecs.getincrementaldecoder("utf-8")()
        gz = _GzipStream() if self.file_type == "gzip" else None
        assert proc.stdout is not None
        while True:
            # A blocking read: the consumer waits for the command as for any source.
            raw = proc.stdout.read(self.bufsize)
            if not raw:
                break
            decoded = text.decode(gz.feed(raw) if gz else raw)
            if decoded:
                yield decoded
        tail = text.decode(gz.finish() if gz else b"", final=True)
        if tail:
            yield tail


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
