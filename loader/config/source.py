"""``[source]`` of a service config: ``SourceConfig`` and the expansion of its file list.

Part of ``loader.config`` (import the names from there); the value checks are in
``loader.config.checks``.
"""

from __future__ import annotations

import copy
import errno
import glob
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from loader.config.checks import Check, origin_field, plain_copy, show
from loader.config.globbing import glob_files, unique_files
from loader.config.text_file import read_text_file
from loader.errors import ConfigError
from loader.runtime.imports import import_object

MAX_FILES_PER_LEASE = 1024
# A bound on ``records_per_lease`` far past any file, so every record number a lease names stays in int64.
MAX_RECORDS_PER_LEASE = 1 << 40
# Only files smaller than this are leased together (``files_per_lease``): a larger one is worth a round trip,
# and its rows may go as file rows, which name one file.
SMALL_FILE_BYTES = 1 << 20


@dataclass(frozen=True)
class SourceConfig:
    """What to read: a file list and how to read each file."""

    files: tuple[str, ...] = ()
    list_file: str | None = None
    format: str | None = None
    reader: str | None = None
    provider: str | None = None
    fields: tuple[str, ...] | None = None
    format_options: dict = field(default_factory=dict)
    # Extra file formats: name -> "module:factory" or {factory = "...", suffixes = [...]}.
    formats: dict = field(default_factory=dict)
    # Small files leased together, up to this many per lease (one round trip, one message stream for them
    # all); 1: one file per lease. Files of over SMALL_FILE_BYTES always go alone (``DatasetTable``).
    files_per_lease: int = 1
    # Large files cut into leases of this many consecutive records, so several workers read one file at once;
    # 0: whole files. Only files whose headers give their record count (.npy, .npz) are cut (``DatasetTable``).
    records_per_lease: int = 0
    origin: str = origin_field()

    def __post_init__(self) -> None:
        check = Check(self, "source")
        if isinstance(self.files, str):  # one glob written as a plain string
            check.set("files", (self.files,))
        # An explicitly empty list (the default is an empty tuple) is a mistake worth naming.
        given_empty = isinstance(self.files, list) and not self.files
        check.texts("files")
        check.text("list_file", optional=True)
        check.text("format", optional=True)
        check.spec("reader", self.reader)
        check.spec("provider", self.provider)
        check.texts("fields", optional=True)
        check.integer("files_per_lease", minimum=1, maximum=MAX_FILES_PER_LEASE)
        check.integer("records_per_lease", minimum=0, maximum=MAX_RECORDS_PER_LEASE)
        if not isinstance(self.format_options, Mapping):
            check.fail("format_options", f"must be a table, got {show(self.format_options)}")
        check.set("format_options", plain_copy(dict(self.format_options), "source.format_options", self.origin))
        self._check_formats(check)
        self._check_combinations(check, given_empty)

    def _check_formats(self, check: Check) -> None:
        if not isinstance(self.formats, Mapping):
            check.fail("formats", f"must be a table of format name -> factory, got {show(self.formats)}")
        for name, entry in self.formats.items():
            spec = entry.get("factory") if isinstance(entry, Mapping) else entry
            if not isinstance(spec, str) or ":" not in spec:
                check.fail(f"formats.{name}", f"must be 'module:factory' or a table with factory, got {show(entry)}")
            if isinstance(entry, Mapping):
                unknown = set(entry) - {"factory", "suffixes"}
                if unknown:
                    check.fail(f"formats.{name}", f"has unknown keys {sorted(unknown)}; known: factory, suffixes")
                suffixes = entry.get("suffixes", [])
                if isinstance(suffixes, str) or not all(isinstance(x, str) and x for x in suffixes):
                    check.fail(f"formats.{name}.suffixes", f"must be a list of suffixes, got {show(suffixes)}")
        check.set("formats", plain_copy(dict(self.formats), "source.formats", self.origin))

    def register_formats(self) -> None:
        """Register ``formats`` with ``loader.io`` (in this process; workers call it too)."""
        if self.formats:
            from loader.io.registry import register_formats

            try:
                register_formats(self.formats)
            except (ValueError, TypeError) as exc:
                raise ConfigError(f"source.formats: {exc} ({self.origin})") from exc

    def _check_combinations(self, check: Check, given_empty: bool) -> None:
        if self.files and self.list_file is not None:
            check.fail("files", "and source.list_file are exclusive: give exactly one of them")
        if not self.files and self.list_file is None:
            if given_empty:
                check.fail("files", "is an empty list: give at least one path or glob")
            check.fail("files", "or source.list_file is required: give exactly one of them")
        if self.reader is not None and self.provider is not None:
            check.fail("reader", "and source.provider are exclusive: give at most one of them")
        custom = "reader" if self.reader is not None else "provider" if self.provider is not None else None
        if custom and self.format is not None:
            check.fail("format", f"has no effect with source.{custom}: remove one of them")
        if custom and self.format_options:
            check.fail("format_options", f"has no effect with source.{custom}: remove one of them")
        self._check_lease_shape(check, custom)

    def _check_lease_shape(self, check: Check, custom: str | None) -> None:
        """``records_per_lease`` cuts large files, ``files_per_lease`` joins small ones: one or the other."""
        if not self.records_per_lease:
            return
        if self.files_per_lease > 1:
            check.fail(
                "records_per_lease",
                f"and source.files_per_lease = {self.files_per_lease} are exclusive: cut large files into "
                "leases of records, or join small files into leases, not both",
            )
        if custom:
            check.fail(
                "records_per_lease",
                f"has no effect with source.{custom}, whose files' records are not counted before reading: "
                "remove one of them",
            )

    def expand_files(self) -> list[str]:
        """The files to read: sorted absolute paths, one per real file (``globbing``: no symlink loop is walked).

        Raises ``ConfigError`` naming the pattern that matched nothing, the list
        file that is missing or empty, or the listed file that does not exist.
        (With a ``provider``, listed names that are not files are passed through
        as written: a PyDataProvider2 provider may take any names.)
        """
        found: list[str] = []
        others: list[str] = []  # names a provider takes that are not files
        # Each pattern once (and each listed name): a file named 200,000 times was looked up each time, 28 s.
        if self.list_file is not None:
            for name in self._read_list_file():
                (found if os.path.isfile(name) else others).append(name)
        for pattern in dict.fromkeys(self.files):
            matches = glob_files(pattern)
            if not matches:
                if glob.has_magic(pattern):
                    raise ConfigError(f"source.files pattern {pattern!r} matched no files ({self.origin})")
                if os.path.isdir(os.path.expanduser(pattern)):
                    raise ConfigError(
                        f"source.files: {pattern!r} is a directory, not a file: "
                        f"give a glob such as {os.path.join(pattern, '*')!r} ({self.origin})"
                    )
                if os.path.exists(os.path.expanduser(pattern)):
                    raise ConfigError(f"source.files: {pattern!r} is not a regular file ({self.origin})")
                raise ConfigError(f"source.files: file {pattern!r} does not exist ({self.origin})")
            found.extend(matches)
        # One entry per real file: a symlink, or a file both listed and matched, is read once.
        files = sorted(set(unique_files(found)) | set(others))
        for name in files:
            self._check_name_is_text(name)
        if self.format in (None, "npy"):
            from loader.io.formats_numpy import drop_companions  # read with their main file, never alone

            return drop_companions(files)
        return files

    def _check_name_is_text(self, name: str) -> None:
        """``ConfigError`` for a file name that is not UTF-8 text (its bytes kept as surrogates by ``os``):
        every message of the service carries file names as UTF-8, and such a name failed to encode inside
        the daemon's loop, which stopped it with a traceback and left its clients waiting for their timeout."""
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            raise ConfigError(
                f"source.files: the file name {name!r} is not UTF-8 text (bytes "
                f"{os.fsencode(os.path.basename(name))!r}); rename the file to a UTF-8 name ({self.origin})"
            ) from None

    def _read_list_file(self) -> list[str]:
        path = os.path.expanduser(str(self.list_file))
        try:
            text = read_text_file(path, "source.list_file", "a text file of data files, one a line")
        except ConfigError as exc:
            raise ConfigError(f"{exc} ({self.origin})") from None
        except OSError as exc:
            raise ConfigError(
                f"source.list_file {path!r} cannot be read: {exc.strerror or exc} ({self.origin})"
            ) from exc
        except UnicodeDecodeError as exc:
            raise ConfigError(f"source.list_file {path!r} is not UTF-8 text: {exc} ({self.origin})") from None
        lines = [line.strip() for line in text.split("\n")]  # not splitlines(): \x1c or \u2028 may be in a name
        names = list(dict.fromkeys(line for line in lines if line and not line.startswith("#")))  # each once
        if not names:
            raise ConfigError(f"source.list_file {path!r} lists no files ({self.origin})")
        # Relative entries are relative to the list file, so a dataset directory can move as a whole.
        base = os.path.dirname(os.path.abspath(path))
        paths = [os.path.abspath(os.path.join(base, os.path.expanduser(n))) for n in names]
        if self.provider is not None:
            # A provider may take names that are not files: those pass through as written.
            return [full if os.path.exists(full) else name for name, full in zip(names, paths)]
        for name, full in zip(names, paths):
            if not os.path.isfile(full):
                raise ConfigError(f"source.list_file {path!r} names {name!r}, {_not_a_file(full)} ({self.origin})")
        return paths

    def file_reader_options(self) -> dict[str, Any]:
        """``format_options`` ready for ``loader.io.create_file_reader(path, format, **options)``.

        A ``parser`` given as ``"module:function"`` (the text format's) is imported here.
        """
        options = copy.deepcopy(self.format_options)
        if isinstance(options.get("parser"), str):
            options["parser"] = import_object(options["parser"], what="source.format_options.parser")
        return options

    def resolve_reader(self) -> Any:
        """The ``reader`` function (``function(path) -> reader``), or None."""
        return None if self.reader is None else import_object(self.reader, what="source.reader")

    def resolve_provider(self) -> Any:
        """The ``provider`` object (a PyDataProvider2 provider), or None."""
        return None if self.provider is None else import_object(self.provider, what="source.provider")


def absolute_paths(values: dict[str, Any], base_dir: str | None) -> dict[str, Any]:
    """``files`` and ``list_file`` of a ``[source]`` table made absolute against ``base_dir`` (cwd when None)."""
    base = os.path.abspath(base_dir) if base_dir is not None else os.getcwd()

    def absolute(path: Any) -> Any:
        if not isinstance(path, str) or not path:
            return path  # left for the section's own type check
        path = os.path.expanduser(path)
        return path if os.path.isabs(path) else os.path.normpath(os.path.join(base, path))

    files = values.get("files")
    if isinstance(files, str):
        values["files"] = absolute(files)
    elif isinstance(files, (list, tuple)):
        values["files"] = [absolute(p) for p in files]
    if values.get("list_file") is not None:
        values["list_file"] = absolute(values["list_file"])
    return values


def _not_a_file(path: str) -> str:
    """Why ``path`` is not a data file, for the list file's error: "does not exist" sent users looking for a
    missing file where a directory, a FIFO or a symlink loop stood."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "which is a symbolic link that loops"
        if os.path.islink(path):
            return "which is a symbolic link to nothing"
        return "which does not exist"
    if stat.S_ISDIR(mode):
        return "which is a directory, not a file"
    return "which is not a regular file (a FIFO, a socket or a device)"


__all__ = ["SourceConfig", "absolute_paths"]
