"""Per-record generators, equal to ``numpy.random.default_rng((seed, epoch, file_key, record))`` but cheaper.

A worker gives every sample its own generator, so that the draws a sample sees depend on where it
lies in the data and nothing else (``workers/mapping.py``). ``default_rng`` of a tuple builds a
``SeedSequence``, which hashes the key word by word in Python-level loops: 13 us on a warm core and
about 30 us in a worker, where a JPEG decode between two calls has evicted its code and data. For
a decoded image (0.66 ms) that is 4% of the work; for a light mapper, more.

``SeedSequence``'s hash is fixed arithmetic on 32-bit words with constants that do not depend on
the data, so here it runs once for 256 consecutive records as numpy operations on columns (0.1 us
a record), and each record's ``PCG64`` is seeded from its row (1.6 us in all). The generator is
the same one ``default_rng`` would give: the same state, the same draws, the same ``spawn()``
children (those come from a real ``SeedSequence`` built when asked). Its ``bit_generator.seed_seq``
is a ``RecordSeed`` with the ``SeedSequence`` attributes users read (``entropy``, ``spawn_key``,
``pool_size``, ``n_children_spawned``, ``state``), not a ``SeedSequence`` instance.

The first use checks the shortcut against numpy's own ``SeedSequence``; should a numpy release
ever hash differently, every generator comes from ``default_rng`` again (slower, never different).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.random.bit_generator import ISpawnableSeedSequence

# numpy's SeedSequence (numpy/random/bit_generator.pyx): a pool of 4 32-bit words, two hash chains
# (INIT_A/MULT_A while mixing entropy in, INIT_B/MULT_B while drawing state out), and a mixing step.
_POOL = 4
_INIT_A, _MULT_A = 0x43B0D7E5, 0x931E8875
_INIT_B, _MULT_B = 0x8B51F9DD, 0x58F38DED
_MIX_L, _MIX_R = 0xCA01F9DD, 0x4973F715
_SHIFT = np.uint32(16)
_MASK = 0xFFFFFFFF
_STATE_WORDS = 8  # PCG64 asks for 4 uint64: 8 uint32 words
# Records hashed together. Workers read records in order, so one block serves 256 samples.
BLOCK_RECORDS = 256
_MAX_RECORD = _MASK  # a record of more than one 32-bit word changes the layout: default_rng then


def _words(value: int) -> list[int]:
    """The 32-bit words SeedSequence makes of a non-negative int (least significant first; 0 is [0])."""
    if value == 0:
        return [0]
    words = []
    while value:
        words.append(value & _MASK)
        value >>= 32
    return words


def _chain(init: int, mult: int, count: int) -> list[np.uint32]:
    """The hash constants of one chain: init, init*mult, init*mult**2, ... (mod 2**32)."""
    out, value = [], init
    for _ in range(count):
        out.append(np.uint32(value))
        value = (value * mult) & _MASK
    return out


def _mix(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    result = np.uint32(_MIX_L) * x - np.uint32(_MIX_R) * y
    result ^= result >> _SHIFT
    return result


def pcg64_states(prefix: tuple[int, ...], records: np.ndarray) -> np.ndarray:
    """``SeedSequence((*prefix, r)).generate_state(4, np.uint64)`` for every ``r`` of ``records`` (each below
    2**32, ``prefix`` non-negative): an array of shape ``(len(records), 4)``, uint64."""
    columns = [np.full(records.shape, word, np.uint32) for value in prefix for word in _words(int(value))]
    columns.append(records.astype(np.uint32))
    entropy_words = len(columns)
    while len(columns) < _POOL:  # a short key: the pool's other words hash zeros
        columns.append(np.zeros(records.shape, np.uint32))
    # How many times the mixing chain steps: one per pool word, one per ordered pair of pool words, one
    # per (extra entropy word, pool word); each step uses a constant and the next one.
    steps = _POOL + _POOL * (_POOL - 1) + max(0, entropy_words - _POOL) * _POOL
    hash_a = _chain(_INIT_A, _MULT_A, steps + 1)
    step = 0

    def hashmix(value: np.ndarray) -> np.ndarray:
        nonlocal step
        value = (value ^ hash_a[step]) * hash_a[step + 1]
        step += 1
        value ^= value >> _SHIFT
        return value

    with np.errstate(over="ignore"):  # the hash wraps mod 2**32 on purpose
        pool = [hashmix(columns[i]) for i in range(_POOL)]
        for source in range(_POOL):
            for target in range(_POOL):
                if source != target:
                    pool[target] = _mix(pool[target], hashmix(pool[source]))
        for source in range(_POOL, len(columns)):
            for target in range(_POOL):
                pool[target] = _mix(pool[target], hashmix(columns[source]))
        hash_b = _chain(_INIT_B, _MULT_B, _STATE_WORDS + 1)
        state = np.empty((*records.shape, _STATE_WORDS), np.uint32)
        for i in range(_STATE_WORDS):
            value = (pool[i % _POOL] ^ hash_b[i]) * hash_b[i + 1]
            value ^= value >> _SHIFT
            state[..., i] = value
    # SeedSequence views its uint32 words as uint64 in the machine's order; so does this.
    return state.view(np.uint64)


class RecordSeed(ISpawnableSeedSequence):
    """The seed sequence of one record's generator: its PCG64 state precomputed; anything else (other state
    sizes, ``spawn``) from a real ``SeedSequence`` of the same key, built on first use."""

    __slots__ = ("_key", "_state", "_real")

    def __init__(self, key: tuple[int, ...], state: np.ndarray) -> None:
        self._key = key
        self._state = state
        self._real: np.random.SeedSequence | None = None

    @property
    def real(self) -> np.random.SeedSequence:
        if self._real is None:
            self._real = np.random.SeedSequence(self._key)
        return self._real

    def generate_state(self, n_words: int, dtype: Any = np.uint32) -> np.ndarray:
        if n_words == 4 and np.dtype(dtype) == np.uint64:
            return self._state.copy()
        return self.real.generate_state(n_words, dtype)

    def spawn(self, n_children: int) -> list[np.random.SeedSequence]:
        return self.real.spawn(n_children)

    @property
    def entropy(self) -> Any:
        return self.real.entropy

    @property
    def spawn_key(self) -> tuple[int, ...]:
        return tuple(self.real.spawn_key)

    @property
    def pool_size(self) -> int:
        return int(self.real.pool_size)

    @property
    def n_children_spawned(self) -> int:
        return int(self.real.n_children_spawned)

    @property
    def state(self) -> dict[str, Any]:
        return dict(self.real.state)

    def __reduce__(self) -> Any:  # a pickled generator carries its seed sequence: as a plain one
        return self.real.__reduce__()

    def __repr__(self) -> str:
        return f"RecordSeed({self._key!r})"


_shortcut_ok: bool | None = None  # checked once per process against numpy's SeedSequence


def _shortcut_works() -> bool:
    global _shortcut_ok
    if _shortcut_ok is None:
        keys = [(0, 0, 0), (7, 3, 2**40 + 5), (2**70 + 1, 1, 0)]
        records = np.array([0, 1, 255, _MAX_RECORD], np.int64)
        _shortcut_ok = all(
            np.array_equal(
                pcg64_states(key, records),
                np.stack([np.random.SeedSequence((*key, int(r))).generate_state(4, np.uint64) for r in records]),
            )
            for key in keys
        )
    return _shortcut_ok


class RecordGenerators:
    """``generator(record)``: ``default_rng((*prefix, record))``, hashed a block of records at a time."""

    def __init__(self, prefix: tuple[int, ...]) -> None:
        self._prefix = tuple(int(v) for v in prefix)
        self._fast = all(v >= 0 for v in self._prefix) and _shortcut_works()
        self._block = -1
        self._states = np.empty((0, 4), np.uint64)

    def generator(self, record: int) -> np.random.Generator:
        key = (*self._prefix, int(record))
        if not self._fast or not 0 <= record <= _MAX_RECORD:
            return np.random.default_rng(key)
        block, row = divmod(int(record), BLOCK_RECORDS)
        if block != self._block:
            first = block * BLOCK_RECORDS
            records = np.arange(first, min(first + BLOCK_RECORDS, _MAX_RECORD + 1), dtype=np.int64)
            self._states, self._block = pcg64_states(self._prefix, records), block
        seed: Any = RecordSeed(key, self._states[row])  # numpy takes any ISeedSequence; its stubs name one class
        return np.random.Generator(np.random.PCG64(seed))


__all__ = ["RecordGenerators", "RecordSeed", "pcg64_states", "BLOCK_RECORDS"]
