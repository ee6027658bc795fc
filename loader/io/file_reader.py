"""``FileReader``: a reader bound to one file, checking every instance it reads.

A format subclass implements ``_open(**options)`` (open the file; called once by
the constructor), ``_read_instance()`` (the next instance as a list of arrays, or
``None`` at the end), ``_rewind()`` and ``_close_file()``; the base class counts
records and checks each instance against the declared shapes and dtypes (see
:mod:`loader.io.slots` for the rule), so every format reports a mismatch the same
way: file, record index, slot and both shapes.

``FileReader(path, shapes, dtypes)`` itself, not subclassed, reads any file whose
format is registered (``loader.io.registry``, chosen by the file's suffix): the
format's reader does the reading and this class the checking. So ``FileReader``,
abstract in Paddle's reader graph, is also usable directly, while
``create_file_reader`` remains the faster way (formats such as ``.npy`` check a
whole file at once and hand out blocks).
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from loader.errors import FormatOptionError, ShapeMismatchError, stepped_past
from loader.io.base import ReaderBase
from loader.io.slots import DtypesArg, LodArg, ShapesArg, SlotChecker, default_slot_names


def _check_options(cls: type[FileReader], path: str, options: dict[str, Any]) -> None:
    """Options the format's ``_open`` does not take, refused in one line naming them and the ones it does
    (``source.format_options = {foo = 1}`` surfaced as "_open() got an unexpected keyword argument")."""
    if not options or cls._open is FileReader._open:
        return  # no options, or FileReader itself: the registered format it opens checks them
    parameters = inspect.signature(cls._open).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return
    # Only what a keyword can fill: a positional-only parameter passed the check and then failed the call.
    by_keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    takes = [name for name, p in parameters.items() if name != "self" and p.kind in by_keyword]
    unknown = sorted(set(options) - set(takes))
    if unknown:
        taken = ", ".join(takes) if takes else "none"
        raise FormatOptionError(
            f"{os.path.basename(path)}: {cls.__name__} takes no option {', '.join(map(repr, unknown))} "
            f"(source.format_options; it takes: {taken})"
        )


class FileReader(ReaderBase):
    """Reads instances from the file at ``path``; ``shapes``/``dtypes`` ``None`` skip the checks.

    ``options`` go to the format's ``_open`` (e.g. ``parser=`` for the text format).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        shapes: ShapesArg,
        dtypes: DtypesArg,
        lod_levels: LodArg = None,
        **options: Any,
    ) -> None:
        super().__init__()
        self.path = os.fspath(path)
        self._checker = SlotChecker(shapes, dtypes, lod_levels)
        self.shapes = self._checker.shapes
        self.dtypes = self._checker.dtypes
        self.lod_levels = self._checker.lod_levels
        self._names: list[str] | None = None
        self._index = 0  # index in the file of the next record
        self._format: ReaderBase | None = None  # the registered reader doing the reading, when used directly
        _check_options(type(self), self.path, options)
        self._open(**options)

    # -- for subclasses -------------------------------------------------------
    def _open(self, **options: Any) -> None:
        """Open the file. The base class, used directly, opens the registered format's reader."""
        if type(self) is not FileReader:
            return  # a format written before _open existed: it opens its file in its own __init__
        from loader.io.registry import create_file_reader  # the registry's formats import this module

        # Given the declared slots too: a format reads by them (a RecordIO record of a whole mini-batch is split
        # into its samples only when shapes are declared). Its instances come normalised, and checking them here
        # again passes them as they are.
        self._format = create_file_reader(
            self.path, shapes=self.shapes, dtypes=self.dtypes, lod_levels=self.lod_levels, **options
        )

    def _read_instance(self) -> list[np.ndarray] | None:
        assert self._format is not None, f"{type(self).__name__} must implement _read_instance"
        try:
            instance = self._format.read_next()
        except ShapeMismatchError as exc:
            # The format checked the declared slots and counted the record it refused: so is it counted here,
            # and a caller reading on names each later record by its own index.
            if getattr(exc, "records_skipped", None) is None:
                stepped_past(exc)
            raise
        if not instance:
            return None
        if self._names is None:
            # Not ``slot_names`` of a FileReader format: where its records carry no names it reads the next record
            # to count them, and that record's failure (the format checks the declared slots) was this read's.
            if isinstance(self._format, FileReader):
                known = self._format.known_slot_names
                self._names = list(known) if known is not None else None
            else:
                self._names = self._format.slot_names
        return instance

    def _rewind(self) -> None:
        assert self._format is not None, f"{type(self).__name__} must implement _rewind"
        self._format.reinit()

    def _close_file(self) -> None:
        if self._format is not None:
            self._format.close()

    def _set_slot_names(self, names: Sequence[str]) -> None:
        self._names = list(names)

    @property
    def known_slot_names(self) -> list[str] | None:
        """The slot names known without reading a record (a format's headers), else None; ``slot_names``
        reads the first record of a format whose records carry the names."""
        return list(self._names) if self._names is not None else None

    # -- ReaderBase -----------------------------------------------------------
    @property
    def slot_names(self) -> list[str]:
        if self._names is None and self._peeked is None and not self._closed:
            # Formats whose records carry names (dict samples) learn them from the
            # first record, which is kept for the next read_next.
            self.has_next()
        if self._names is not None:
            return list(self._names)
        if self._checker.num_slots is not None:
            return default_slot_names(self._checker.num_slots)
        return default_slot_names(len(self._peeked or []))

    @property
    def record_index(self) -> int:
        """Index in the file of the next record ``read_next`` will check."""
        return self._index - (1 if self._peeked else 0)

    def _read_next_impl(self) -> list[np.ndarray]:
        try:
            instance = self._read_instance()
        except Exception as exc:
            lost = getattr(exc, "records_skipped", None)
            if isinstance(lost, int) and lost >= 1:
                self._index += lost  # the format stepped past them: later records keep their own numbers
            raise
        if instance is None:
            return []
        # The record is read whether or not it passes the check: counted first, so a caller that reads on
        # past a refused record gets the next record's own index (every later error named one too few).
        index = self._index
        self._index += 1
        if not instance:
            # An empty list would read as the end of the data: refuse it loudly.
            raise ShapeMismatchError(f"{self.path}: record {index} has no slots")
        return self._checker.check(instance, self.path, index, self._names)

    def _reinit_impl(self) -> None:
        self._index = 0
        self._rewind()

    def _close_impl(self) -> None:
        self._close_file()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.path!r})"


__all__ = ["FileReader"]
