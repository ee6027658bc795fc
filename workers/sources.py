"""Opening one leased file as samples or as blocks, the way the config says.

Three ways to read a file, in the order the config is checked:

* ``source.provider``: a PyDataProvider2 provider, via ``loader.provider``
  (what ``iter_file_samples`` does, keeping the session for its slot names,
  which name the fields unless ``source.fields`` does);
* ``source.reader``: ``function(path)`` returning a paddle-style reader (a
  zero-argument callable returning an iterable of samples);
* otherwise the ``loader.io`` file reader for the file's format.

A ``loader.io`` reader with no mappers is read in blocks (``read_block``): each
block is already columnar, so a worker does no per-sample Python work at all.

A lease of several small files (``source.files_per_lease``) is a ``GroupSource``:
its files' samples one file after the other, numbered on as one file's records.
A lease of a piece of a large file (``source.records_per_lease``) is a
``PieceSource``: that piece's records, numbered from 0 as one file's records.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from loader.errors import ConfigError
from loader.io.slots import default_slot_names
from loader.io.survey import field_count_text, names_known, refuse_shuffled_names
from loader.service.blocks import block_rows
from loader.service.shm.file_layout import FileChangedError
from workers.file_pin import FilePin, changed_since_start, first_change

log = logging.getLogger("loader.worker")

SKIP_BLOCK_ROWS = 1 << 20  # rows per read while skipping to a piece's first record (views: nothing is copied)


def _reader_samples(name: str, make: Any, path: str) -> Any:
    """The samples of ``path`` by ``source.reader``: ``make(path)`` is a reader, which returns them."""
    reader = make(path)
    if not callable(reader):
        # A function that yields the samples itself (or returns a list of them) failed with "'generator' object is
        # not callable", saying nothing of what source.reader is to return.
        raise TypeError(
            f"source.reader {name!r} returned a {type(reader).__name__}, not a reader: function(path) returns a "
            "zero-argument callable that returns the samples (def make(path): def read(): yield ...; return read)"
        )
    samples = reader()
    if not hasattr(samples, "__iter__"):
        raise TypeError(
            f"source.reader {name!r}: the reader it returned gave a {type(samples).__name__}, not an iterable of "
            "samples (write it as a generator that yields them)"
        )
    return samples


# A provider's sessions in this worker process, one per dataset source: ``init_hook`` runs once per
# dataset (as Paddle ran it once per provider instance), not at every lease.
_sessions: dict[tuple[Any, ...], Any] = {}


def _provider_session(source: Any, process: Any, is_train: bool, path: str) -> Any:
    """The ``ProviderSession`` of ``source.provider`` for this dataset, opened at its first lease in this process
    over the dataset's whole file list (``file_list`` of ``init_hook`` and ``settings``), with ``is_train`` from
    ``pipeline.is_train``, and kept: ``init_hook`` runs once per worker process and dataset. Where the list
    cannot be expanded on this host (a ``list_file`` or glob only the daemon's host sees), the session is opened
    on the leased file alone, with a warning, and kept too: a hook that loads a vocabulary would else load it at
    every lease; not after an ``OSError``, which may pass. Expanding the list costs a few stat calls a file (about 2.6 s for 100,000 files on a local
    disk), once per worker process and dataset."""
    key = (source.provider, source.files, source.list_file, is_train)
    session = _sessions.get(key)
    if session is not None:
        return session
    try:
        files = source.expand_files()
    except (ConfigError, OSError) as exc:
        log.warning(
            "source.provider %s: init_hook gets file_list=[%r] only%s: the dataset's file list cannot be read on "
            "this host (%s)",
            source.provider,
            path,
            ", in this worker" if isinstance(exc, ConfigError) else ", for this lease (tried again at the next)",
            exc,
        )
        # Kept where the list is not there for this host (a ConfigError: a list file only the daemon's host has);
        # an OSError may pass (EMFILE, a network filesystem's blip), and a worker would else keep one file's list
        # for its life while the others have the whole.
        session = process.open([path], is_train=is_train)
        if isinstance(exc, ConfigError):
            _sessions[key] = session
        return session
    session = process.open(files, is_train=is_train)
    _sessions[key] = session
    return session


class FileSource:
    """One file of the dataset, opened for one lease."""

    def __init__(self, config: Any, path: str) -> None:
        self.path = path
        # Pinned before the reader opens it: a write between the two is caught, never missed.
        self._pins = [FilePin(path)]
        self.source = config.source
        self.fields = list(self.source.fields) if self.source.fields else None
        self._batch_mapped = bool(config.pipeline.batch_mappers)
        self._reader: Any = None
        self._samples: Any = None
        self._names_pending = False  # source.fields still to be checked against names the first record gives
        self._names_later = False  # no source.fields, and a damaged first record: names from the first good one
        self._failed_first: Exception | None = None  # that first record's failure, for the first read to raise
        if self.source.provider is not None:
            process = self.source.resolve_provider()
            if not callable(getattr(process, "open", None)):
                raise TypeError(f"source.provider {self.source.provider!r} is not a @loader.provider.provider function")
            session = _provider_session(self.source, process, bool(config.pipeline.is_train), path)
            self.fields = self.fields or list(session.slot_names)
            self._samples = session.iter_file(path)
        elif self.source.reader is not None:
            self._samples = _reader_samples(self.source.reader, self.source.resolve_reader(), path)
        else:
            self._reader = _open_file_reader(path, self.source)
            if self.fields is None:
                self.fields = names_known(self._reader) or self._first_record_names()
            else:
                known = names_known(self._reader)
                refuse_shuffled_names(path, self.fields, known)
                # A format whose records carry the names (RecordIO dicts) learns them at its first record, which
                # is not read here (a damaged one would fail the whole file): checked after that read instead.
                self._names_pending = not known
            # A .npy's companions (NAME.FIELD.npy) are its samples' other fields: a write to one is a write to them.
            self._pins += [FilePin(other) for other in getattr(self._reader, "mapped_files", ()) if other != path]

    def _first_record_names(self) -> list[str] | None:
        """The slot names a format learns from its first record (RecordIO, text lines), read for them here. A
        damaged first record is not a file that cannot be opened: its failure is raised at the first read,
        where ``on_error`` applies to it alone (under "skip" the records after it were lost with it), and the
        names come from the first record that reads."""
        try:
            return list(self._reader.slot_names)
        except Exception as exc:
            self._failed_first = exc
            self._names_later = True
            return None

    def _raise_failed_first(self) -> None:
        failure, self._failed_first = self._failed_first, None
        if failure is not None:
            raise failure

    @property
    def can_read_blocks(self) -> bool:
        return self._reader is not None

    @property
    def row_bytes(self) -> int | None:
        """Bytes of one record when the reader knows them before reading (``.npy``/``.npz`` headers)."""
        nbytes = getattr(self._reader, "row_nbytes", None)
        return nbytes if isinstance(nbytes, int) and nbytes > 0 else None

    @property
    def reads_array_file(self) -> bool:
        """Whether blocks are rows of the file's own arrays under their own names: the built-in .npy/.npz
        reader, no renaming fields (what ``shm.file_rows`` references may name)."""
        from loader.io.formats_numpy import NpyFileReader, NpzFileReader

        return (
            isinstance(self._reader, (NpyFileReader, NpzFileReader))
            and not self.source.fields
            and self.path.lower().endswith((".npy", ".npz"))
        )

    def locate(self, record: int) -> tuple[str, int | None]:
        """The file a record came from, and its number there (``GroupSource.locate``, ``PieceSource.locate``)."""
        return self.path, record

    def changed(self) -> tuple[str, str] | None:
        """The file, and why, when it was written since it was opened (``FilePin``); else None."""
        return first_change(self._pins)

    def samples(self) -> Iterator[Any]:
        """Samples one by one (tuples of slot arrays for file readers)."""
        if self._reader is None:
            return iter(self._samples)
        return _reader_instances(self._reader, self._after_read, self._raise_failed_first)

    def skip(self, count: int) -> int:
        """Read past up to ``count`` records in blocks of the reader's own (views of a mapped file are never
        copied, as ``read_block``'s contiguous copies may be); the records passed, fewer at the end of the file."""
        passed = 0
        failure = self._failed_first
        if count > 0 and failure is not None:
            # A damaged first record that the format stepped past is passed like any other; one it could not
            # step past, or past more records than asked (a first chunk lost), leaves the rest unreadable here.
            self._failed_first = None
            lost = getattr(failure, "records_skipped", None)
            if not isinstance(lost, int) or not 1 <= lost <= count:
                raise failure
            passed = lost
        while passed < count:
            arrays = self._reader.read_block(min(count - passed, SKIP_BLOCK_ROWS))
            if not arrays:
                break
            passed += len(arrays[0])
        return passed

    def read_block(self, max_rows: int) -> dict[str, np.ndarray] | None:
        """Up to ``max_rows`` samples as columns, or None at the end of the file."""
        self._raise_failed_first()
        arrays = self._reader.read_block(max_rows)
        if not arrays:
            return None
        self._after_read(len(arrays))
        if self.fields and len(self.fields) != len(arrays):
            if not self._batch_mapped:  # the batch would name the slots "0", "1", ... (loader check refuses it too)
                own = names_known(self._reader) or [str(i) for i in range(len(arrays))]
                raise ValueError(
                    field_count_text(self.path, self.fields, own) + ": name each of them, in order, or leave "
                    "source.fields out"
                )
            names = [str(i) for i in range(len(arrays))]  # batch mappers may name them (loader check warns)
        else:
            names = self.fields or [str(i) for i in range(len(arrays))]
        return {name: np.ascontiguousarray(a) for name, a in zip(names, arrays)}

    def _after_read(self, slots: int) -> None:
        """After a record of ``slots`` slots was read: refuse ``source.fields`` that name the file's own slots out
        of place, once its first record told them (until it passes, every read refuses: renaming by position
        would swap the slots' data silently); or, after a damaged first record, name the slots as the first
        good one does: its keys, else ``slot0``, ``slot1``... Not ``slot_names``, which reads a record ahead
        when the records carry no names: a damaged one there failed the read of the good one before it."""
        if self._names_pending:
            refuse_shuffled_names(self.path, self.fields or [], names_known(self._reader))
            self._names_pending = False
        if self._names_later:
            self.fields = names_known(self._reader) or default_slot_names(slots)
            self._names_later = False

    def close(self) -> None:
        close = getattr(self._reader, "close", None) or getattr(self._samples, "close", None)
        if close is not None:
            close()


class PieceSource:
    """Records ``first .. first + count - 1`` of one file (``source.records_per_lease``) read as a file of
    ``count`` records, numbered from 0; ``locate`` gives a record's number in the file.

    Only files whose headers give their record count are cut into pieces (``.npy``, ``.npz``), so the
    reader is a built-in one, which reads in blocks and skips to ``first`` without copying a row.
    """

    def __init__(self, config: Any, path: str, first: int, count: int) -> None:
        self.path, self.first = path, first
        self._file = FileSource(config, path)
        self.fields = self._file.fields
        self._left = count  # records of the piece not read yet
        try:
            passed = self._file.skip(first)
            if passed < first:
                raise EOFError(f"{path} has {passed} records, fewer than the {first} before this lease's piece")
        except BaseException:
            self._file.close()
            raise

    @property
    def can_read_blocks(self) -> bool:
        return self._file.can_read_blocks

    @property
    def row_bytes(self) -> int | None:
        return self._file.row_bytes

    @property
    def reads_array_file(self) -> bool:
        return self._file.reads_array_file

    def locate(self, record: int) -> tuple[str, int | None]:
        return self.path, self.first + record

    def changed(self) -> tuple[str, str] | None:
        return self._file.changed()

    def samples(self) -> Iterator[Any]:
        return _piece_samples(self, self._file.samples())

    def read_block(self, max_rows: int) -> dict[str, np.ndarray] | None:
        """Up to ``max_rows`` records of the piece as columns, or None after its last record."""
        if self._left <= 0:
            return None
        try:
            block = self._file.read_block(min(max_rows, self._left))
        except Exception as exc:
            # Records a reader stepped past (as _piece_samples counts them) were the piece's too.
            lost = getattr(exc, "records_skipped", None)
            if isinstance(lost, int) and lost >= 1:
                self._left -= lost
            raise
        if block is not None:
            self._left -= block_rows(block)
        return block

    def close(self) -> None:
        self._file.close()


class _piece_samples:
    """A ``PieceSource``'s samples. Not a generator, for the reason ``_reader_instances`` is not one."""

    def __init__(self, piece: PieceSource, samples: Iterator[Any]) -> None:
        self._piece, self._samples = piece, samples

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        piece = self._piece
        if piece._left <= 0:
            raise StopIteration
        try:
            sample = next(self._samples)
        except StopIteration:
            raise
        except Exception as exc:
            # A reader that stepped past damage says how many records it lost; those were the piece's too.
            lost = getattr(exc, "records_skipped", None)
            piece._left -= lost if isinstance(lost, int) and lost >= 1 else 1
            raise
        piece._left -= 1
        return sample


class _reader_instances:
    """A reader's instances as tuples. Not a generator: after a failed read the caller may go on
    with the next record when the reader stepped past the damage (a generator would be finished)."""

    def __init__(self, reader: Any, after_read: Callable[[int], None], before_first: Callable[[], None]) -> None:
        self._reader = reader
        self._after_read = after_read  # FileSource._after_read
        self._before_first: Callable[[], None] | None = before_first  # raises a damaged first record's failure

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return self

    def __next__(self) -> tuple[Any, ...]:
        if self._before_first is not None:
            before_first, self._before_first = self._before_first, None
            before_first()
        instance = self._reader.read_next()
        if not instance:
            raise StopIteration
        self._after_read(len(instance))
        return tuple(instance)


class GroupSource:
    """The files of one lease read as one file: their samples in order, record numbers running on.

    A file that cannot be opened, or whose reader raises, counts as one record and the next file
    goes on: the exception it raised carries ``records_skipped = 1``, the way a reader that
    stepped past damage says so (``FileJob`` then skips or reports it, and reads on). The
    numbering is therefore the same on every read of the group while the files read the same,
    which a lease that starts past record 0 (a cut or re-leased group) relies on.

    Read either sample by sample (``samples``) or in blocks (``read_block``, when every file has a
    built-in reader): a block spans files only while their columns match.
    """

    row_bytes = None
    reads_array_file = False

    def __init__(self, config: Any, paths: list[str], seen: list[int | None] | None = None) -> None:
        self.config, self.paths = config, list(paths)
        self._seen = seen  # each file's size when the daemon started (``Lease.seen``), checked again as it opens
        # ``source.fields``, then the fields of the file last closed; those of the file being read are its own.
        self._fields: list[str] | None = list(config.source.fields) if config.source.fields else None
        # Blocks need the built-in file readers (``FileSource.can_read_blocks``) for every file.
        self.can_read_blocks = config.source.provider is None and config.source.reader is None
        self.record = 0  # the group's record number of the next record read
        self._firsts: list[int] = []  # the record each file opened so far began at
        self._unopened: set[int] = set()  # files (by position) that could not be opened: no record of theirs
        self._current: FileSource | None = None
        self._samples: Iterator[Any] | None = None
        self._held: dict[str, np.ndarray] | BaseException | None = None  # for the next read_block (see there)
        self._unchecked: list[FileSource] = []  # files read since the last changed(): the one open, those closed since

    @property
    def path(self) -> str:
        return self.paths[max(0, len(self._firsts) - 1)]

    @property
    def fields(self) -> list[str] | None:
        """The fields of the file being read (``source.fields``, or its reader's; known only after its first
        good record when the first was damaged), as one file per lease names them: archives may list their
        members in another order."""
        return self._current.fields if self._current is not None else self._fields

    @property
    def files_begun(self) -> int:
        """Files of the group begun so far, opened or not: it changes as a sample of the next file is read."""
        return len(self._firsts)

    def locate(self, record: int) -> tuple[str, int | None]:
        """The file a record of the group came from, and its record number in that file (None: the file
        could not be opened)."""
        k = bisect.bisect_right(self._firsts, record) - 1
        if k < 0:
            return self.paths[0], record
        return self.paths[k], None if k in self._unopened else record - self._firsts[k]

    def changed(self) -> tuple[str, str] | None:
        """A file of the group read from since the last call that was written since it was opened, and why. A
        file closed before that call was checked after its last read, so only the open one stays to check."""
        for source in self._unchecked:
            found = source.changed()
            if found is not None:
                return found
        self._unchecked = [self._current] if self._current is not None else []
        return None

    def samples(self) -> Iterator[Any]:
        return _group_samples(self)

    def next_sample(self) -> Any:
        """The next sample of the group; StopIteration after the last file."""
        while True:
            if self._samples is None:
                if not self._open_next():
                    raise StopIteration
                assert self._current is not None
                self._samples = self._current.samples()
            try:
                sample = self._guarded(next, self._samples)
            except StopIteration:
                self._samples = None
                continue
            self.record += 1
            return sample

    def read_block(self, max_rows: int) -> dict[str, np.ndarray] | None:
        """Up to ``max_rows`` records as columns, from as many files as it takes (one chunk for many small
        files); None after the last file. A failure after some rows is raised at the next call, so the
        rows before it are sent and its record number is where the caller stands."""
        parts: list[dict[str, np.ndarray]] = []
        rows = 0
        held, self._held = self._held, None
        if isinstance(held, BaseException):
            raise held
        if held is not None:
            parts, rows = [held], block_rows(held)
        while rows < max_rows:
            try:
                block = self._file_block(max_rows - rows)
            except Exception as exc:
                if not parts:
                    raise
                self._held = exc
                break
            if block is None:
                break
            if parts and not _same_columns(parts[0], block):  # files of another layout: the next chunk
                self._held = block
                break
            parts.append(block)
            rows += block_rows(block)
        if len(parts) <= 1:
            return parts[0] if parts else None
        return {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}

    def _file_block(self, max_rows: int) -> dict[str, np.ndarray] | None:
        """Up to ``max_rows`` records of one file; None after the last file."""
        while True:
            if self._current is None and not self._open_next():
                return None
            assert self._current is not None
            block = self._guarded(self._current.read_block, max_rows)
            if block is None:
                self.close()
                continue
            self.record += block_rows(block)
            return block

    def _guarded(self, read: Any, arg: Any) -> Any:
        """``read(arg)`` on the open file; a failure that lost the rest of the file counts one record and
        closes the file, so the next read goes on with the next file."""
        try:
            return read(arg)
        except StopIteration:
            raise
        except Exception as exc:
            lost = getattr(exc, "records_skipped", None)
            if isinstance(lost, int) and lost >= 1:  # the reader stepped past damage: this file goes on
                self.record += lost
            else:
                self.record += 1
                self.close()
                exc.records_skipped = 1  # type: ignore[attr-defined]
            raise

    def _open_next(self) -> bool:
        """Open the next file (it begins at ``self.record``); False after the last file. A file that cannot
        be opened raises, counted as one record (``records_skipped = 1``)."""
        self.close()
        if len(self._firsts) == len(self.paths):
            return False
        position = len(self._firsts)
        self._firsts.append(self.record)
        try:
            # Checked for the whole group as the lease began; a file opened later may have changed since.
            why = changed_since_start(self.paths[position], self._seen[position]) if self._seen else None
            if why is not None:
                raise FileChangedError(why)
            self._current = FileSource(self.config, self.paths[position])
            self._unchecked.append(self._current)
        except Exception as exc:
            self._unopened.add(position)
            self.record += 1
            exc.records_skipped = 1  # type: ignore[attr-defined]
            raise
        return True

    def close(self) -> None:
        current, self._current, self._samples = self._current, None, None
        if current is not None:
            self._fields = current.fields
            current.close()


Source = FileSource | GroupSource | PieceSource  # what a lease is read from (``FileJob._open``)


def _same_columns(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    """Whether two blocks' columns can be concatenated: the same names, dtypes and row shapes."""
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and a[k].shape[1:] == b[k].shape[1:] for k in a)


class _group_samples:
    """A ``GroupSource``'s samples. Not a generator, for the reason ``_reader_instances`` is not one."""

    def __init__(self, group: GroupSource) -> None:
        self._group = group

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        return self._group.next_sample()


def _open_file_reader(path: str, source: Any) -> Any:
    from loader.io import create_file_reader

    # User formats from the config's [source.formats] table must exist in this
    # process too (registering again is cheap and replaces the same entry).
    source.register_formats()
    # file_reader_options() imports a "module:function" text parser; passing the raw
    # options would hand the reader a string where it needs a callable.
    return create_file_reader(path, format=source.format, **source.file_reader_options())


__all__ = ["FileSource", "GroupSource", "PieceSource", "Source"]
