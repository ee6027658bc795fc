"""The reader toolkit of the PaddlePaddle reader design.

A *reader* is a zero-argument callable returning a fresh iterable of samples; a
*reader creator* returns a reader (``loader.reader.creator``); a *decorator*
takes reader(s) and returns a reader. ``loader.batch`` turns a reader into a
batch reader.

::

    from loader import reader
    from loader.reader import creator

    r = reader.shuffle(creator.text_file("train.txt"), buf_size=512, seed=1)
    r = reader.xmap_readers(parse, r, process_num=4, buffer_size=64, order=True)

``loader.reader.decorator`` is the same module under paddle's name
(``paddle.reader.decorator``).

Where this differs from the original ``paddle.reader`` (each function's
docstring has the details):

* failures travel: an exception in a source, a mapper or a child process
  reaches the consumer (threads: the original exception object; processes:
  ``WorkerError``; a silent child death: ``WorkerDiedError``) instead of hanging;
* abandoning an iteration (``break``, ``close()``, GC) stops its threads,
  processes and files;
* ``compose`` detects misalignment with a private marker (``None`` samples are
  fine) and rejects unknown keyword arguments; ``chain`` calls each source when
  it is reached; ``firstn`` pulls no extra item; ``Fake`` keeps no state shared
  between the readers it makes (``fake``, paddle 2.x's function, is here too);
  ``shuffle`` takes a ``seed`` (without one it uses the ``random`` module, as
  the original did);
* ``multiprocess_reader`` keeps sample types (``loader.runtime.codec``, not JSON; a
  sample the codec cannot encode is pickled between the user's own processes),
  accepts ``None`` samples, does not let a stalled reader block the others, and
  raises a child's error as ``MultiprocessReaderError`` (a ``WorkerError`` and a
  ``ValueError``, as the original's);
* ``PipeReader`` splits commands like a shell, starts lazily, yields the last
  unterminated line, decodes UTF-8 across reads and every gzip member, and
  reports a failed command;
* sizes and counts must be integers (integral floats are accepted).
"""

from __future__ import annotations

from loader.errors import ComposeNotAligned
from loader.reader import (
    creator,
    decorator,  # paddle's module name, an alias of decorators
)
from loader.reader.decorators import Fake, buffered, cache, chain, compose, fake, firstn, map_readers, shuffle
from loader.reader.multiprocess import MultiprocessReaderError, multiprocess_reader
from loader.reader.pipe import PipeReader
from loader.reader.xmap import xmap_readers

# Everything the original ``paddle.reader`` exported, plus creator (a test keeps this equal to
# decorators.__all__ and these three).
__all__ = [
    "map_readers",
    "buffered",
    "compose",
    "chain",
    "shuffle",
    "firstn",
    "xmap_readers",
    "multiprocess_reader",
    "cache",
    "Fake",
    "fake",
    "PipeReader",
    "ComposeNotAligned",
    "MultiprocessReaderError",
    "creator",
    "decorator",
]
