"""PyDataProvider2: describe how to read *one* file, get shuffled batches of many.

::

    from loader.provider import provider, dense_vector, integer_value

    @provider(input_types={"pixel": dense_vector(784), "label": integer_value(10)})
    def process(settings, filename):
        with open(filename) as fh:
            for line in fh:
                label, pixels = line.split(";")
                yield {"pixel": [float(x) for x in pixels.split()], "label": int(label)}

    for batch in process.batch_reader("train.list", batch_size=128, seed=1)():
        batch["pixel"]   # (N, 784) float32
        batch["label"]   # (N,) int64

Using a provider
----------------
* ``process.reader(file_list, is_train=True, seed=None, **kwargs)``: a paddle sample
  reader (zero-argument callable; each call is one pass) yielding tuples in slot order.
* ``process.batch_reader(file_list, batch_size, is_train=True, drop_last=False, seed=None,
  **kwargs)``: each call is one pass yielding batch dicts (below).
* ``process.open(file_list, ...)`` returns the ``ProviderSession`` both are built on
  (``settings``, ``slot_names``, ``batches()``, ``iter_file()``).
* ``iter_file_samples(process, filename, is_train=True, **kwargs)``: the samples of one
  file, in file order, normalized to lists in slot order and checked as the provider
  asks (``check``/``check_fail_continue``); no shuffling. The service's workers use it.

``file_list`` is a list of names or the path of a ``train.list`` file (one name per
line, blank lines skipped). ``kwargs`` become attributes of ``settings`` (and go to
``init_hook``); ``input_order`` (a list of names) orders dict slots or names list slots.
``seed`` makes shuffling reproducible: pass ``e`` of a reader uses ``Random(f"{seed}:{e}")``;
without a seed each pass draws fresh randomness.

Slot names: the keys of a dict ``input_types`` (ordered by ``input_order`` when given),
else ``input_order``, else ``"slot0"``, ``"slot1"``, ... With one slot, each yielded item
*is* that slot's value (as in the original).

Batch structure (``dict`` slot name -> value)
---------------------------------------------
* ``dense_vector(dim)``: ``np.ndarray (N, dim) float32``.
* ``integer_value(range)``: ``np.ndarray (N,) int64``.
* ``sparse_binary_vector(dim)`` / ``sparse_float_vector(dim)``: ``SparseBatch`` in CSR
  form: ``indices (nnz,) int64``, ``values (nnz,) float32`` (ones when binary),
  ``offsets (N+1,) int64``, ``dim``.
* ``*_sequence``: ``loader.LoDTensor`` (as ``DataFeeder`` makes for ``lod_level=1``):
  ``data`` is the flat per-timestep column (one of the three forms above, with one row
  per timestep), ``recursive_sequence_lengths() == [[timesteps of each sample]]``.
* ``*_sub_sequence``: ``LoDTensor`` with two levels, ``[[sub-sequences of each sample],
  [timesteps of each sub-sequence]]``. ``start_positions()`` gives the original's
  ``sequenceStartPositions`` / ``subSequenceStartPositions``.

Memory
------
Without shuffling, files are read one after another. With shuffling, the file order is
shuffled and samples are drawn from a random one of at most ``max_open_files`` (8) open
files, into a pool refilled to ``min_pool_size`` samples (capped by ``pool_size``; when -1,
``pool_size`` samples, or 1000 when ``pool_size`` is -1 too) from which each next sample
is drawn at random. So at most the pool and
the open files are in memory; the original kept one generator per file and, by
default, pooled the whole data set. ``CACHE_PASS_IN_MEM`` keeps every sample of the
first complete pass (that is what it is for) and serves later passes from it.

Weights: ``calc_batch_size(sample)`` (an int >= 0, default 1) is what a sample counts
toward ``batch_size`` and toward the pool sizes. A batch ends when its weight reaches
``batch_size``; with ``can_over_batch_size=False`` a sample that would push it over
starts the next batch instead (a single sample heavier than ``batch_size`` is a batch
of its own).

Checks (``check=True``): slot count; no ``None``; dense: a list/tuple/array of ``dim``
finite numbers (ints and numpy arrays are accepted, unlike the original); integer: an
int in ``[0, range)``; sparse: unique int ids in ``[0, dim)`` (and finite float
values); sequences: lists at each nesting level. A bad sample raises ``DataError``
naming the file, the sample (0-based index in its file), the slot and the problem;
with ``check_fail_continue`` it is dropped and counted, and the count is logged (warning
on ``settings.logger``, ``"loader.provider"``) at the end of the pass. Without
``check``, the slot count and dict-vs-list shape are still enforced, and a batch refuses
sparse column ids that are not ints in ``[0, dim)`` (they would make a broken CSR batch); a
sample that a batch cannot take raises ``DataError`` naming its file and index too.
"""

from __future__ import annotations

from loader.provider.batching import SparseBatch
from loader.provider.core import (
    DataProvider,
    Settings,
    iter_file_samples,
    normalize_should_shuffle,
    provider,
    read_file_list,
)
from loader.provider.session import DEFAULT_MAX_OPEN_FILES, DEFAULT_MIN_POOL_SIZE, BatchReader, ProviderSession
from loader.provider.types import *  # noqa: F403 - the type helpers are this package's vocabulary
from loader.provider.types import __all__ as _type_names

__all__ = [
    "provider",
    "DataProvider",
    "ProviderSession",
    "BatchReader",
    "Settings",
    "SparseBatch",
    "iter_file_samples",
    "normalize_should_shuffle",
    "read_file_list",
    "DEFAULT_MIN_POOL_SIZE",
    "DEFAULT_MAX_OPEN_FILES",
    *_type_names,
]
