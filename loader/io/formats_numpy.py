"""The ``.npy`` and ``.npz`` file formats: one instance per row of the first axis.

``.npy``: one slot named ``data``, memory-mapped read-only, plus one slot per
*companion* file: beside ``part-0.npy``, a file ``part-0.label.npy`` is the field
``label`` of the same samples (same number of rows; any number of companions, in
name order after ``data``). So labels and other fields travel with ``.npy`` data
without packing them into columns. A file list drops companions whose main file
is listed (``drop_companions``): ``part-*.npy`` leases ``part-0.npy`` only.

``.npz``: one slot per key, in the archive's order; every key must have the same
number of rows. ``np.load`` cannot memory-map an ``.npz``, so this reader opens
the zip itself: members stored uncompressed (``np.savez``) are memory-mapped in
place, or read whole when smaller than ``SMALL_MEMBER_BYTES`` (a mapping costs
more than reading a few pages: datasets of many small files pay it per file),
at the first read, as a mapping is (opening reads headers alone: the daemon
opens files in its loop to count their rows); compressed members (``np.savez_compressed``) are inflated into memory, one key
at a time, at the first read (only their headers are read at open). Member
headers are parsed once per distinct header (files of one dataset share them).

Rows are read-only views of the file (a batch copies them). Nothing is
unpickled: an object-dtype array is refused with a ``DataError``. Shapes and
dtypes are checked once per file, since every row of an array shares them.
"""

from __future__ import annotations

import bisect
import functools
import io
import lzma
import math
import os
import re
import struct
import threading
import time
import zipfile
import zlib
from collections.abc import Callable
from typing import Any, Literal

import numpy as np

from loader.errors import DataError, ShapeMismatchError
from loader.io.file_reader import FileReader
from loader.io.zip_crc import check_stored_crc

_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature, ..., file name length, extra field length
# numpy parses .npy headers with ast.literal_eval, and on CPython 3.11 (seen here on 3.11.7,
# with open_files threads) AST construction racing in several threads can raise "SystemError:
# AST constructor recursion depth mismatch" (cpython gh-106905). Headers are tiny: parse them
# one at a time.
_HEADER_LOCK = threading.Lock()
_ArraySource = Callable[[], np.ndarray]
# The most entries an .npz's central directory may list (zipfile parses them all at open; see _read_members).
MAX_ARCHIVE_MEMBERS = 10_000
# Uncompressed .npz members below this are read at open instead of memory-mapped.
SMALL_MEMBER_BYTES = 256 * 1024
_NPY_MAGIC = b"\x93NUMPY"
_NPY_VERSIONS = ((1, 0), (2, 0), (3, 0))  # np.save writes 3.0 for dtypes whose field names need UTF-8
# numpy's own limit on a header's length (read_array_header's max_header_size): a longer one is refused.
_MAX_HEADER_BYTES = 10000
# The most bytes a file's compressed .npz members may inflate to, together. They are inflated whole into memory
# (zip members cannot be mapped), in every worker reading the file, with nothing else bounding them: deflate
# shrinks a run of zeros ~1000x, so a 4 MB archive whose headers honestly claim 4 GiB would take 4 GiB of memory.
# Stored members (np.savez) are memory-mapped and need no such bound, which is the way out the error names.
MAX_INFLATED_BYTES = 1 << 30
# What zipfile and its decompressors raise for a hostile or damaged archive, besides BadZipFile: an encrypted
# member (RuntimeError), an unknown method or strong encryption (NotImplementedError), a damaged deflate, LZMA or
# bzip2 stream (zlib.error, LZMAError, OSError). Each escaped as itself, naming neither the file nor the member.
_ZIP_ERRORS = (
    zipfile.BadZipFile,
    ValueError,
    EOFError,
    OSError,
    RuntimeError,
    NotImplementedError,
    zlib.error,
    lzma.LZMAError,
)
_COMPANION = re.compile(r"^(?P<main>.+)\.(?P<field>[A-Za-z_][A-Za-z0-9_-]*)\.npy$")


# The names in a directory that could be companions (``_COMPANION``), sorted, with the directory's mtime when
# listed: opening a .npy looks its companions up here instead of listing the directory each time, which made
# opening each of n files in one directory cost O(n) (20,000 tiny files: ~15 ms an open, most of an epoch).
_LISTINGS: dict[str, tuple[int, list[str]]] = {}
_LISTINGS_KEPT = 16  # directories remembered (a dataset's files usually lie in a few)
# A listing is kept only when the directory last changed this long before it was taken: a file added in the
# same tick of the directory's mtime clock as the listing leaves the mtime as it was (git's "racy" entries).
_LISTING_SETTLED_NS = 2_000_000_000
_LISTINGS_LOCK = threading.Lock()  # open_files threads open files at once: evicting must not race an insert


def _possible_companions(directory: str) -> list[str]:
    mtime = os.stat(directory).st_mtime_ns
    cached = _LISTINGS.get(directory)
    if cached is not None and cached[0] == mtime:
        return cached[1]
    listed_at = time.time_ns()
    with os.scandir(directory) as entries:
        names = sorted(entry.name for entry in entries if _COMPANION.match(entry.name))
    if listed_at - mtime > _LISTING_SETTLED_NS:
        with _LISTINGS_LOCK:
            if len(_LISTINGS) >= _LISTINGS_KEPT:
                _LISTINGS.pop(next(iter(_LISTINGS)), None)
            _LISTINGS[directory] = (mtime, names)
    return names


def companions(path: str) -> list[tuple[str, str]]:
    """``(field, path)`` of each companion of the ``.npy`` file ``path``, in field order."""
    if not path.endswith(".npy"):
        return []
    stem = path[: -len(".npy")]
    directory, base = os.path.split(stem)
    try:
        names = _possible_companions(directory or os.curdir)
    except OSError:
        return []  # no directory to list: opening the file says why
    prefix = base + "."
    found = []
    for name in names[bisect.bisect_left(names, prefix) :]:
        if not name.startswith(prefix):
            break
        candidate = os.path.join(directory, name)
        match = _COMPANION.match(candidate)
        if match is not None and match["main"] == stem and os.path.isfile(candidate):
            found.append((match["field"], candidate))
    return sorted(found)


def drop_companions(paths: list[str]) -> list[str]:
    """``paths`` without the companions of other listed ``.npy`` files (they are read with them)."""
    listed = set(paths)
    kept = []
    for path in paths:
        match = _COMPANION.match(path)
        if match is None or match["main"] + ".npy" not in listed:
            kept.append(path)
    return kept


CHECK_MAPPED_EVERY = 4096  # rows read one at a time between two checks that the mapped files were not cut short


class ArrayFileReader(FileReader):
    """Instances are rows of equally long arrays, one per slot."""

    # (path, (device, inode), size) of each file whose rows are read from a memory mapping of it.
    _mapped: tuple[tuple[str, tuple[int, int], int], ...] = ()

    def _use_arrays(
        self, names: list[str], metas: list[tuple[tuple[int, ...], np.dtype]], sources: list[_ArraySource]
    ) -> None:
        """Check the arrays' names, row counts, shapes and dtypes; ``sources`` load them on first read."""
        if not names:
            raise DataError(f"{self.path}: no arrays in the file")
        for name, (shape, _) in zip(names, metas):
            if len(shape) == 0:
                raise DataError(f"{self.path}: array {name!r} is 0-d; it has no rows to read as instances")
        lengths = {name: shape[0] for name, (shape, _) in zip(names, metas)}
        if len(set(lengths.values())) > 1:
            raise ShapeMismatchError(f"{self.path}: arrays have different numbers of rows: {lengths}")
        self._set_slot_names(names)
        # Check shapes and dtypes once, on zero-memory stand-ins of the real arrays.
        stand_ins = [np.broadcast_to(np.empty((), dtype), shape) for shape, dtype in metas]
        self._checker.check_rows(stand_ins, self.path, names)
        self._sources = sources
        self._arrays: list[np.ndarray] | None = None
        self._length = next(iter(lengths.values()))
        self._row_nbytes = sum(math.prod(shape[1:]) * dtype.itemsize for shape, dtype in metas)
        if self._row_nbytes == 0 and self._length > os.path.getsize(self.path):
            # Nothing ties a count of empty rows to the file's size: 128 bytes claiming 10**12 of them made an
            # epoch of months and a `loader check` that never ended. No real array holds more rows than bytes.
            raise DataError(
                f"{self.path}: its header claims {self._length:,} rows of 0 bytes each in a file of "
                f"{os.path.getsize(self.path):,} bytes; rows that hold nothing are not a dataset"
            )

    @property
    def mapped_files(self) -> list[str]:
        """The files whose rows are read from a memory mapping: the file, and a ``.npy``'s companions."""
        return [path for path, _, _ in self._mapped]

    @property
    def rows(self) -> int:
        """Instances in the file (known from the headers alone)."""
        return int(self._length)

    @property
    def row_nbytes(self) -> int:
        """Bytes of one instance, every slot together (known from the headers alone)."""
        return int(self._row_nbytes)

    def _load(self) -> list[np.ndarray]:
        if self._arrays is None:
            arrays = [np.asarray(source()) for source in self._sources]  # plain ndarray views: fast row indexing
            self._arrays = self._checker.check_rows(arrays, self.path, self._names)
        return self._arrays

    # The row cursor is FileReader's ``_index`` (the next record), which its reinit() zeroes.
    def _read_next_impl(self) -> list[np.ndarray]:
        pos = self._index
        if pos >= self._length:
            return []
        arrays = self._arrays if self._arrays is not None else self._load()
        if pos % CHECK_MAPPED_EVERY == 0:
            self._check_mapped()
        self._index = pos + 1
        return [a[pos, ...] for a in arrays]

    def read_block(self, max_instances: int) -> list[np.ndarray]:
        if self._start_slicing_block(max_instances):
            self._index -= 1  # give the looked-ahead row back
        start = self._index
        if start >= self._length:
            return []
        stop = min(self._length, start + max_instances)
        arrays = self._load()
        self._check_mapped()
        self._index = stop
        return [a[start:stop] for a in arrays]

    def _map(self, path: str) -> None:
        """Remember ``path``'s identity and size: its rows are read from a memory mapping of it."""
        try:
            st = os.stat(path)
        except OSError:
            return
        self._mapped = (*self._mapped, (path, (st.st_dev, st.st_ino), st.st_size))

    def _check_mapped(self) -> None:
        """Refuse to read on when a mapped file was cut short in place (``np.save`` over it while it is read):
        a row past its new end would be a SIGBUS that kills the process, with no error at all. A file replaced
        by another (renamed into place) or deleted is fine: the mapping still holds the old one whole."""
        for path, identity, size in self._mapped:
            try:
                st = os.stat(path)
            except OSError:
                continue
            if (st.st_dev, st.st_ino) == identity and st.st_size < size:
                raise DataError(
                    f"{path}: the file was cut from {size} to {st.st_size} bytes while it was read (written over "
                    "in place?); write a new file and rename it into place instead"
                )

    def _rewind(self) -> None:
        pass  # FileReader.reinit() already set the cursor (_index) to 0

    def _close_file(self) -> None:
        # The mapping itself is released when the last row view handed out is gone.
        self._arrays = None
        self._sources = []


class NpyFileReader(ArrayFileReader):
    """Rows of one ``.npy`` array, memory-mapped: a slot named ``data``, then one per companion file."""

    def _open(self) -> None:  # type: ignore[override] # a format takes only its own options
        self._map(self.path)
        names, arrays = ["data"], [_load_npy(self.path)]
        for field, path in companions(self.path):
            if field == "data":
                raise DataError(f"{path}: a companion may not be named 'data' (the field of {self.path})")
            names.append(field)
            self._map(path)
            arrays.append(_load_npy(path))
        self._use_arrays(names, [(a.shape, a.dtype) for a in arrays], [functools.partial(_same, a) for a in arrays])


def _same(array: np.ndarray) -> np.ndarray:
    return array


def _small_member(
    path: str,
    stored: tuple[str, int, int, int],
    header_len: int,
    nbytes: int,
    dtype: np.dtype,
    shape: tuple[int, ...],
    order: Literal["F", "C"],
) -> np.ndarray:
    """A small stored member's array, read (a mapping costs more than its bytes) once they matched the CRC-32.

    Read whole when the member is no more than its array (and a little): its CRC from the same bytes. One that
    claims more (bytes after its array) has its data read alone, summed apart."""
    name, payload, size, _ = stored
    whole = size <= header_len + nbytes + 4096
    with open(path, "rb") as raw:
        raw.seek(payload if whole else payload + header_len)
        data = raw.read(size if whole else nbytes)
        if whole:
            check_stored_crc(path, raw.fileno(), *stored, data=data)
            data = data[header_len : header_len + nbytes]
        if len(data) != nbytes:
            raise DataError(f"{path}: member {name!r}: {len(data)} of its {nbytes} bytes are in the file")
        if not whole:
            check_stored_crc(path, raw.fileno(), *stored)
    return np.frombuffer(data, dtype=dtype).reshape(shape, order=order)  # read-only, like a mapping


NPY_MAGIC = b"\x93NUMPY"


def _load_npy(path: str) -> np.ndarray:
    with open(path, "rb") as fh:  # a missing or unreadable file raises its OSError, as np.load did
        start = fh.read(len(NPY_MAGIC) + 6)  # magic, version, and a header length of 2 or 4 bytes
    # np.load takes any file without the magic string for a pickle, and its advice (allow_pickle) is not ours.
    if not start:
        raise DataError(f"{path}: not a readable .npy array (the file is empty)")
    if not start.startswith(NPY_MAGIC):
        raise DataError(f"{path}: not a readable .npy array (it does not start with the .npy magic string)")
    length = _header_length(start[len(NPY_MAGIC) :])
    if length is not None and length > _MAX_HEADER_BYTES:
        # np.load reads a header of any claimed length before its own limit applies: 4 GiB raised MemoryError.
        raise DataError(f"{path}: not a readable .npy array (a header of {length} bytes; at most {_MAX_HEADER_BYTES})")
    try:
        with _HEADER_LOCK:
            return np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, EOFError, OverflowError) as exc:  # object arrays, bad or cut headers, negative dimensions
        reason = str(exc)
        if "allow_pickle" in reason:
            reason = "it holds Python objects (an object array), which loader never unpickles"
        raise DataError(f"{path}: not a readable .npy array ({reason})") from exc


def _header_length(after_magic: bytes) -> int | None:
    """The header length a .npy file's version and length fields claim; None when they are cut or unknown."""
    if len(after_magic) < 2 or (after_magic[0], after_magic[1]) not in _NPY_VERSIONS:
        return None
    length_format = "<H" if after_magic[0] == 1 else "<I"
    field = after_magic[2 : 2 + struct.calcsize(length_format)]
    return struct.unpack(length_format, field)[0] if len(field) == struct.calcsize(length_format) else None


class NpzFileReader(ArrayFileReader):
    """Rows of the arrays of one ``.npz`` archive: one slot per key."""

    def _open(self) -> None:  # type: ignore[override] # a format takes only its own options
        names: list[str] = []
        metas: list[Any] = []
        sources: list[_ArraySource] = []
        self._inflated_bytes = 0  # what the compressed members will take in memory, from their headers
        with open(self.path, "rb") as raw:  # a missing or unreadable file raises its OSError, as for .npy
            self._read_members(raw, names, metas, sources)
        self._use_arrays(names, metas, sources)

    def _read_members(self, raw: Any, names: list[str], metas: list[Any], sources: list[_ArraySource]) -> None:
        try:
            listed = _members_listed(raw)
            if listed is not None and listed > MAX_ARCHIVE_MEMBERS:
                # zipfile parses every entry of the central directory when it opens an archive, and the daemon opens
                # .npz files in its loop to count their rows: 300,000 entries took 2.2 s, a few million would
                # silence it past its workers' patience. An .npz holds one member a field.
                raise DataError(
                    f"{self.path}: the archive lists {listed:,} members, more than {MAX_ARCHIVE_MEMBERS:,} "
                    "(an .npz holds one array a field)"
                )
            with zipfile.ZipFile(raw) as archive:
                for info in archive.infolist():
                    if not info.filename.endswith(".npy"):
                        continue
                    if info.filename[: -len(".npy")] in names:
                        # Two fields of one name: a batch (a dict by field) kept the last and dropped the other.
                        raise DataError(
                            f"{self.path}: the archive holds two members named {info.filename!r}, so two fields "
                            f"named {info.filename[: -len('.npy')]!r}; write it again with each key once"
                        )
                    meta, source = self._member(raw, archive, info)
                    names.append(info.filename[: -len(".npy")])
                    metas.append(meta)
                    sources.append(source)
        except DataError:
            raise  # says what it is already
        except _ZIP_ERRORS as exc:
            raise DataError(f"{self.path}: not a readable .npz archive ({exc})") from exc

    def _member(
        self, raw: Any, archive: zipfile.ZipFile, info: zipfile.ZipInfo
    ) -> tuple[Any, Callable[[], np.ndarray]]:
        with archive.open(info) as member:
            header = _read_header_bytes(member, info.filename)
        shape, fortran, dtype = _parse_header(header)
        header_len = len(header)
        if dtype.hasobject:
            raise ValueError(f"member {info.filename!r} holds Python objects, which are never unpickled")
        if any(d < 0 for d in shape):
            raise ValueError(f"member {info.filename!r}: its header claims the shape {shape}")
        # For every member, stored or compressed: file_size is its size uncompressed, known without inflating, so
        # a header claiming more rows than the member holds fails here, not at the first read (or as a MemoryError).
        if info.file_size < header_len + math.prod(shape) * dtype.itemsize:
            raise ValueError(f"member {info.filename!r} holds fewer bytes than its header's {shape} {dtype}")
        path, name = self.path, info.filename
        if info.compress_type == zipfile.ZIP_STORED and int(np.prod(shape)) > 0:
            raw.seek(info.header_offset)
            signature, name_len, extra_len = _LOCAL_HEADER.unpack(raw.read(_LOCAL_HEADER.size))
            if signature != b"PK\x03\x04":
                raise ValueError(f"member {info.filename!r}: bad local header")
            payload = info.header_offset + _LOCAL_HEADER.size + name_len + extra_len  # the member's bytes
            offset = payload + header_len
            order: Literal["F", "C"] = "F" if fortran else "C"
            nbytes = math.prod(shape) * dtype.itemsize  # Python ints: a hostile shape cannot overflow
            stored = (name, payload, info.compress_size, info.CRC)  # what check_stored_crc compares
            present = os.fstat(raw.fileno()).st_size - offset
            if present < nbytes:  # else np.memmap refused it at the first read, naming neither file nor member
                raise ValueError(f"member {info.filename!r}: {max(0, present)} of its {nbytes} bytes are in the file")
            if nbytes < SMALL_MEMBER_BYTES:
                # Read at the first read, as a mapping is, not here: the daemon opens files in its loop to count
                # their rows, and 10,000 such members (2.4 GiB) read and summed at open silenced it for 9 s.
                small = functools.partial(_small_member, path, stored, header_len, nbytes, dtype, shape, order)
                return (shape, dtype), small
            if not self._mapped:
                self._map(path)
            # The CRC is checked at the first read, not here: the daemon opens files to count their rows only.
            return (shape, dtype), functools.partial(_mapped_member, path, stored, dtype, offset, shape, order)
        self._inflated_bytes += math.prod(shape) * dtype.itemsize
        if self._inflated_bytes > MAX_INFLATED_BYTES:
            raise DataError(
                f"{path}: member {name!r} is compressed, and the file's compressed members would be inflated "
                f"into memory whole, {self._inflated_bytes} bytes, over the limit of {MAX_INFLATED_BYTES} "
                "(formats_numpy.MAX_INFLATED_BYTES, per worker); store the arrays uncompressed (np.savez, not "
                "np.savez_compressed), which are memory-mapped instead, or split them into smaller files"
            )
        return (shape, dtype), lambda: _inflate(path, name)


def _members_listed(raw: Any) -> int | None:
    """The number of entries an archive's end record says its central directory lists (ZIP64's too), read from
    the end of the file without parsing the entries; None where the record is not found (zipfile then says why)."""
    end_record = getattr(zipfile, "_EndRecData", None)  # zipfile's own reader of that record, private but long-lived
    if end_record is None:
        return None
    found = end_record(raw)
    raw.seek(0)
    return int(found[zipfile._ECD_ENTRIES_TOTAL]) if found else None  # type: ignore[attr-defined]


def _mapped_member(
    path: str,
    stored: tuple[str, int, int, int],
    dtype: np.dtype,
    offset: int,
    shape: tuple[int, ...],
    order: Literal["F", "C"],
) -> np.ndarray:
    """A stored member's array, memory-mapped once its bytes matched the archive's CRC-32 (once per process)."""
    with open(path, "rb") as fh:
        check_stored_crc(path, fh.fileno(), *stored)
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape, order=order)


def _read_header_bytes(member: Any, name: str) -> bytes:
    """A member's .npy magic, version, header length and header, as bytes (the key of ``_parse_header``)."""
    prefix = member.read(len(_NPY_MAGIC) + 2)
    if len(prefix) < len(_NPY_MAGIC) + 2 or not prefix.startswith(_NPY_MAGIC):
        raise ValueError(f"member {name!r}: not a .npy array (no magic string)")
    version = (prefix[-2], prefix[-1])
    if version not in _NPY_VERSIONS:
        raise ValueError(f"member {name!r}: unsupported .npy format version {version}")
    length_format = "<H" if version == (1, 0) else "<I"
    length_bytes = member.read(struct.calcsize(length_format))
    if len(length_bytes) != struct.calcsize(length_format):
        raise ValueError(f"member {name!r}: its .npy header is cut short")
    (length,) = struct.unpack(length_format, length_bytes)
    if length > _MAX_HEADER_BYTES:
        raise ValueError(f"member {name!r}: a .npy header of {length} bytes (at most {_MAX_HEADER_BYTES})")
    header = member.read(length)
    if len(header) != length:
        raise ValueError(f"member {name!r}: its .npy header is cut short")
    return prefix + length_bytes + header


@functools.lru_cache(maxsize=64)
def _parse_header(header: bytes) -> tuple[tuple[int, ...], bool, np.dtype]:
    """(shape, fortran order, dtype) of a .npy header; numpy parses it, once per distinct header."""
    fh = io.BytesIO(header)
    version = np.lib.format.read_magic(fh)
    with _HEADER_LOCK:
        if version == (1, 0):
            return np.lib.format.read_array_header_1_0(fh)
        # 3.0 is 2.0 with a UTF-8 header (for field names beyond latin-1, of structured dtypes, which are refused).
        return np.lib.format.read_array_header_2_0(fh)


def _inflate(path: str, member: str) -> np.ndarray:
    try:
        with zipfile.ZipFile(path) as archive, archive.open(member) as fh:
            return np.lib.format.read_array(fh, allow_pickle=False)
    except _ZIP_ERRORS as exc:  # a damaged member
        raise DataError(f"{path}: member {member!r} of the .npz archive does not read ({exc})") from exc


__all__ = ["NpyFileReader", "NpzFileReader", "companions", "drop_companions"]
