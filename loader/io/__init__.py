"""The class-based reader graph (after PaddlePaddle Fluid's C++ readers) and the file-format registry.

::

    open_files([...], shapes, dtypes)          MultiFileReader (prefetching threads)
      -> ShuffleReader(r, buffer_size, seed)   block shuffle
      -> BatchReader(r, batch_size)            stack / concatenate (+ lengths for LoD)
      -> MultiPassReader(r, pass_num)
      -> DoubleBufferReader(r, place)          read ahead on a thread (and onto a device)

Every reader is a ``ReaderBase``: ``read_next()`` -> list of arrays, ``[]`` at the
end; ``has_next()``, ``reinit()``, ``close()``, iteration, ``with``. One file is
read by a ``FileReader`` chosen by ``create_file_reader`` from the registry
(``.recordio``, ``.npy``, ``.npz``, ``text``), or by ``FileReader(path, shapes,
dtypes)`` itself; users add formats with ``register_file_reader`` (from code) or
``register_formats`` (a config table of ``"module:factory"`` strings).
``to_reader``/``from_reader`` bridge to paddle-style readers.
"""

from __future__ import annotations

from loader.io.base import DecoratedReader, ReaderBase
from loader.io.bridge import from_reader, to_reader
from loader.io.decorated import BatchReader, MultiPassReader, ShuffleReader
from loader.io.double_buffer import DoubleBufferReader
from loader.io.file_reader import FileReader
from loader.io.multi_file import MultiFileReader, open_files
from loader.io.registry import (
    create_file_reader,
    register_file_reader,
    register_formats,
    registered_formats,
    unregister_file_reader,
)

__all__ = [
    "ReaderBase",
    "DecoratedReader",
    "FileReader",
    "ShuffleReader",
    "BatchReader",
    "MultiPassReader",
    "DoubleBufferReader",
    "MultiFileReader",
    "open_files",
    "create_file_reader",
    "register_file_reader",
    "register_formats",
    "unregister_file_reader",
    "registered_formats",
    "to_reader",
    "from_reader",
]
