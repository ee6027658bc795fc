"""The one exception tree of ``loader``.

Every error the package raises on purpose is a ``LoaderError``. Errors are
translated once, at the boundary where they are first seen (a socket, a child
process, a data file), and carry the endpoint, worker, file or record that a
person needs to act on them.

::

    LoaderError
    ├── ConfigError            (also ValueError)  a config file, key or value is wrong
    ├── DataError              (also ValueError)  input data is malformed
    │   ├── CorruptFileError                      a data file fails its checksum or framing
    │   ├── ShapeMismatchError                    a sample does not fit its declared slot
    │   └── UnknownFormatError                    no file reader is registered for a file
    ├── ComposeNotAligned      (also ValueError)  compose() saw readers of different lengths
    ├── MissingDependencyError (also ImportError) an optional package (torch) is not installed
    ├── WorkerError                               an exception raised in a thread, child
    │   │                                         process or worker, carried across with its
    │   │                                         type name, message and traceback text
    │   └── WorkerDiedError                       a child process died without a word
    ├── TransportError                            the socket or pipe failed
    │   ├── ServiceUnavailableError               the daemon is unreachable or went away
    │   │   └── EpochStalledError                 an epoch made no progress though the daemon answers
    │   ├── ProtocolVersionError                  the peer runs another loader protocol version
    │   └── MalformedMessageError                 a peer sent a message that breaks the protocol
    └── ClosedError                               used after close()

End of data is ``StopIteration``, never an error.
"""

from __future__ import annotations

import sys
import traceback as _traceback
from collections.abc import Mapping
from typing import Any


class LoaderError(Exception):
    """Base of every error this package raises on purpose."""


class ConfigError(LoaderError, ValueError):
    """A config file, key or value is wrong: the message names file, key and reason."""


class FormatOptionError(ConfigError, TypeError):
    """A file format was given an option it does not take (a TypeError too, as a wrong keyword is)."""


class DataError(LoaderError, ValueError):
    """Input data is malformed: the message names what, where and why."""


class CorruptFileError(DataError):
    """A data file fails a checksum, a magic number or its framing."""


class ShapeMismatchError(DataError):
    """A sample does not match the shape or dtype declared for its slot."""


class UnknownFormatError(DataError):
    """No file reader is registered for a file's format."""


class MessageTooLargeError(DataError):
    """A worker's message for a sample (or a chunk of samples) exceeds what the daemon accepts
    (``service.max_message_mib``)."""


class UnsendableSampleError(DataError):
    """A sample (or a chunk of samples) holds a value that messages cannot carry (a set, an object array,
    a structured dtype, an integer past 64 bits): named by its file and record."""


class BatchMapperError(DataError):
    """A batch mapper raised, or returned something other than a block of the rows it was given."""


class ComposeNotAligned(LoaderError, ValueError):
    """``reader.compose`` found that its readers yield different numbers of items."""


class MissingDependencyError(LoaderError, ImportError):
    """A feature needs an optional package that is not installed; the message says what to install."""


class TransportError(LoaderError):
    """A socket or pipe failed; the message names the endpoint."""


class ServiceUnavailableError(TransportError):
    """The loader daemon did not answer in time, or stopped."""


class EpochStalledError(ServiceUnavailableError):
    """An epoch made no progress for its timeout although the daemon answers: the client's own
    ``progress_timeout_s`` without a batch, or the daemon's stall timeout, which it reports to the client."""


class ProtocolVersionError(TransportError):
    """The peer speaks another protocol version; the message names both versions."""


class MalformedMessageError(TransportError):
    """A message that breaks the wire protocol: unknown kind, missing or ill-typed field, bad frame."""


class ClosedError(LoaderError):
    """An object was used after ``close()``, or an epoch's iterator after a later ``epoch()`` call ended it."""


class WorkerError(LoaderError):
    """An exception raised somewhere else (thread, child process, worker), carried here.

    ``type_name``, ``message`` and ``remote_traceback`` describe the original
    exception; ``worker``, ``file`` and ``record`` say where it happened when known.

    ``str()`` is one line for the loader's own data errors (``data_error``: a ``DataError`` such as a
    file that does not read, a record that does not fit its batch, a file changed while read, that
    passed through no code of the user's), whose message already names what, where and why: their
    traceback is the loader's insides. For anything
    else (an exception of a mapper, a reader or a provider of the user's) it goes on with the original
    traceback, which points at the user's line. ``remote_traceback`` holds it either way.
    """

    def __init__(
        self,
        type_name: str,
        message: str,
        remote_traceback: str = "",
        *,
        worker: str | None = None,
        file: str | None = None,
        record: int | None = None,
        data_error: bool = False,
    ) -> None:
        self.type_name = type_name
        self.message = message
        self.remote_traceback = remote_traceback
        self.worker = worker
        self.file = file
        self.record = record
        self.data_error = data_error
        super().__init__(self._summary())

    def _summary(self) -> str:
        where = []
        if self.worker is not None:
            where.append(f"worker {self.worker}")
        # Not where a reader's message names it first. A peer's error dict may hold any type in either: the
        # check must not raise (a list in "file" raised TypeError in the daemon's loop, and the epoch hung).
        named = isinstance(self.file, str) and isinstance(self.message, str) and self.file in self.message
        if self.file is not None and not named:
            where.append(f"file {self.file}")
        if self.record is not None:
            where.append(f"record {self.record}")
        text = f"{self.type_name}: {self.message}"
        if where:
            text += f" (in {', '.join(where)})"
        return text

    def __str__(self) -> str:
        if self.remote_traceback and not self.data_error:
            return f"{self._summary()}\n--- original traceback ---\n{self.remote_traceback.rstrip()}"
        return self._summary()

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyword-only fields would be lost by the default exception pickling.
        return (_rebuild_worker_error, (type(self), self.to_dict()))

    def to_dict(self) -> dict[str, Any]:
        """A plain dict (msgpack-able) describing this error."""
        return {
            "type": self.type_name,
            "message": self.message,
            "traceback": self.remote_traceback,
            "worker": self.worker,
            "file": self.file,
            "record": self.record,
            "data_error": self.data_error,
        }

    @classmethod
    def from_dict(cls, info: Mapping[str, Any]) -> WorkerError:
        return cls(
            str(info.get("type", "Exception")),
            str(info.get("message", "")),
            str(info.get("traceback", "")),
            worker=info.get("worker"),
            file=info.get("file"),
            record=info.get("record"),
            data_error=info.get("data_error") is True,  # absent from a peer of an older version
        )

    @classmethod
    def from_exception(
        cls,
        exc: BaseException,
        *,
        worker: str | None = None,
        file: str | None = None,
        record: int | None = None,
    ) -> WorkerError:
        """Describe ``exc`` (raised here) so it can travel to another thread or process."""
        if isinstance(exc, WorkerError):
            # Already carried once: keep the original description, add what is new.
            return cls(
                exc.type_name,
                exc.message,
                exc.remote_traceback,
                worker=exc.worker if exc.worker is not None else worker,
                file=exc.file if exc.file is not None else file,
                record=exc.record if exc.record is not None else record,
                data_error=exc.data_error,
            )
        text = "".join(_traceback.format_exception(type(exc), exc, exc.__traceback__))
        return cls(
            type(exc).__name__,
            str(exc) + _hint(exc),
            text,
            worker=worker,
            file=file,
            record=record,
            data_error=_loader_data_error(exc),
        )


def _loader_data_error(exc: BaseException) -> bool:
    """Whether ``exc`` is one of the loader's own data errors, whose message says all a person needs: a
    ``DataError`` raised and passed on by the loader's code alone. Not a batch mapper's failure (the cause it
    carries points at the user's line), nor a ``DataError`` that went through a user's code (a reader raising
    its own subclass, ``DataFeeder.feed`` called from a user's reader): its traceback is the user's way there."""
    if not isinstance(exc, DataError) or isinstance(exc, BatchMapperError):
        return False
    packages, stdlib, installed = _code_dirs()
    for frame, _ in list(_traceback.walk_tb(exc.__traceback__))[1:]:  # below the frame that caught it
        name = frame.f_code.co_filename
        if name.startswith(packages):
            continue
        # The standard library's directory holds site-packages in a conda, a Docker python: image or a plain
        # pyenv Python, and a user's installed reader lives there.
        if not name.startswith(stdlib) or name.startswith(installed):
            return False
    return True


_CODE_DIRS: tuple[tuple[str, ...], str, tuple[str, ...]] | None = None


def _code_dirs() -> tuple[tuple[str, ...], str, tuple[str, ...]]:
    """Where code lives, as ``_loader_data_error`` tells the loader's from the user's: the loader's packages
    (``loader/``, ``workers/`` beside it), the standard library's directory (threads, processes), and the
    installed packages' directories (which may lie inside the standard library's)."""
    global _CODE_DIRS
    if _CODE_DIRS is None:
        import os
        import site
        import sysconfig

        package = os.path.dirname(os.path.abspath(__file__))
        paths = sysconfig.get_paths()
        sites = [
            paths.get("purelib", ""),
            paths.get("platlib", ""),
            *getattr(site, "getsitepackages", list)(),
            os.path.join(paths["stdlib"], "site-packages"),  # a base interpreter's, seen from a venv
            os.path.join(paths["stdlib"], "dist-packages"),  # Debian's
        ]
        _CODE_DIRS = (
            (os.path.join(package, ""), os.path.join(os.path.dirname(package), "workers", "")),
            os.path.join(paths["stdlib"], ""),
            tuple(os.path.join(directory, "") for directory in sites if directory),
        )
    return _CODE_DIRS


def _hint(exc: BaseException) -> str:
    """What to do about an exception that user code often meets for a reason of ours, or ``""``."""
    if isinstance(exc, ValueError) and "read-only" in str(exc):  # numpy: "assignment destination is read-only"
        return (
            " (arrays read from .npy/.npz files are read-only views of the file: make a new array, x = x / 255, "
            "or copy before changing one in place, x = x.copy())"
        )
    return ""


class WorkerDiedError(WorkerError):
    """A child process or worker exited without reporting why; ``exitcode`` says how."""

    def __init__(
        self, who: str, exitcode: int | None, *, said: str = "without reporting an error", **where: Any
    ) -> None:
        self.who = who
        self.exitcode = exitcode
        self.said = said  # what it told (a command's standard error is its own: "see its standard error")
        if exitcode is not None and exitcode < 0:
            how = f"killed by signal {-exitcode}"
        else:
            how = f"exited with code {exitcode}"
        super().__init__("WorkerDiedError", f"{who} {how} {said}", "", **where)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_died, (self.who, self.exitcode, self.worker, self.file, self.record, self.said))


def stepped_past(exc: BaseException, records: int = 1) -> BaseException:
    """Mark ``exc`` as raised by a reader that already stepped past the ``records`` bad records it is about
    (``exc.records_skipped``, which readers of a file under ``on_error = "skip"`` read on after); ``exc``."""
    exc.records_skipped = records  # type: ignore[attr-defined]
    return exc


def add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)`` (PEP 678); on Python 3.10, which lacks it, the same ``__notes__`` list."""
    if sys.version_info >= (3, 11):
        exc.add_note(note)
    else:  # pragma: no cover - Python 3.10: the notes are kept, the traceback does not show them
        notes = getattr(exc, "__notes__", None)
        if not isinstance(notes, list):
            notes = []
            exc.__notes__ = notes  # type: ignore[attr-defined]
        notes.append(note)


def _rebuild_died(
    who: str, exitcode: int | None, worker: Any, file: Any, record: Any, said: str = "without reporting an error"
) -> WorkerDiedError:
    return WorkerDiedError(who, exitcode, said=said, worker=worker, file=file, record=record)


def _rebuild_worker_error(cls: type[WorkerError], info: Mapping[str, Any]) -> WorkerError:
    return cls.from_dict(info)


__all__ = [
    "LoaderError",
    "ConfigError",
    "FormatOptionError",
    "DataError",
    "CorruptFileError",
    "ShapeMismatchError",
    "UnknownFormatError",
    "BatchMapperError",
    "MessageTooLargeError",
    "UnsendableSampleError",
    "ComposeNotAligned",
    "MissingDependencyError",
    "WorkerError",
    "WorkerDiedError",
    "TransportError",
    "ServiceUnavailableError",
    "EpochStalledError",
    "ProtocolVersionError",
    "MalformedMessageError",
    "ClosedError",
]
