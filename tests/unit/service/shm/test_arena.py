"""Shared-memory arenas: allocation, fragmentation, full arenas, gather, tokens, cross-process use."""

from __future__ import annotations

import errno
import os
import time

import numpy as np
import pytest

from loader.runtime import processes
from loader.service.shm import arena as arena_mod
from loader.service.shm import file_rows as F
from loader.service.shm import refs as R
from loader.service.shm.arena import Arena, ArenaError, arena_path, free_runs
from loader.service.shm.cache import ArenaCache
from loader.service.shm.pool import ArenaPool

KIB = 1024
MIB = 1024 * KIB
PIPE_TIMEOUT_S = 20.0
CHILD_JOIN_TIMEOUT_S = 10.0


@pytest.fixture
def pool(tmp_path):
    with ArenaPool(4 * MIB, directory=str(tmp_path)) as p:
        yield p


def _spec(values: np.ndarray) -> dict[int, tuple[str, tuple[int, ...]]]:
    return {0: (values.dtype.str, tuple(values.shape[1:]))}


# -- the allocator ---------------------------------------------------------------


def test_free_runs_first_fit_across_fragments():
    states = np.array([1, 0, 0, 1, 0, 0, 0, 0, 1, 0], dtype=np.uint8)
    assert free_runs(states, 1, 2).tolist() == [1]
    assert free_runs(states, 3, 2).tolist() == [1, 4, 6]
    assert free_runs(states, 4, 2) is None
    assert free_runs(states, 6, 1).tolist() == [1, 2, 4, 5, 6, 7]
    assert free_runs(states, 1, 5) is None


def test_one_row_alloc_takes_the_first_fit_free_runs_would(pool):
    """``alloc(1, run)`` searches the states' bytes (a worker places each row as it comes); it must pick the run
    ``free_runs`` picks, treat any byte but FREE as taken (a peer may write others), and never cross the end."""
    arena = pool.create()
    rng = np.random.default_rng(5)
    n = arena.n_blocks
    for trial in range(300):
        states = rng.choice(np.array([0, 0, 0, 1, 7], np.uint8), size=n)
        run = int(rng.integers(1, 9))
        arena.states[:] = states
        expected = free_runs(states, 1, run)
        got = arena.alloc(1, run)
        if expected is None:
            assert got is None, f"trial {trial}"
            assert np.array_equal(arena.states, states), "a failed allocation takes nothing"
            continue
        assert got is not None and got.tolist() == expected.tolist(), f"trial {trial}"
        start = int(got[0])
        assert arena.states[start : start + run].tolist() == [arena_mod.USED] * run
    arena.states[:] = arena_mod.USED
    arena.states[-2:] = arena_mod.FREE
    assert arena.alloc(1, 3) is None, "two free blocks at the end are no run of three"
    assert arena.alloc(1, 2).tolist() == [n - 2]


def test_alloc_and_free_round_trip(pool):
    arena = pool.create()
    starts = arena.alloc(3, 4)
    assert starts.tolist() == [0, 4, 8]
    assert arena.used_blocks() == 12
    arena.free(starts[1:2], 4)
    assert arena.used_blocks() == 8
    assert arena.alloc(1, 4).tolist() == [4]  # the hole is reused first
    arena.free(np.array([0, 4, 8]), 4)
    assert arena.used_blocks() == 0


def test_fragmentation_needs_contiguous_blocks(pool):
    arena = pool.create()  # 64 blocks of 64 KiB
    singles = arena.alloc(arena.n_blocks, 1)
    arena.free(singles[::2], 1)  # every other block free: half the space, no run of two
    assert arena.alloc(1, 2) is None
    arena.free(singles[1:2], 1)  # blocks 0..2 free now
    assert arena.alloc(1, 3).tolist() == [0]


def test_full_arena_is_signalled_and_all_or_nothing(pool):
    arena = pool.create()
    rows = np.ones((3, 1 * MIB), dtype=np.uint8)  # 16 blocks each; 64 blocks hold 4 rows
    assert R.write_column(arena, rows) is not None
    before = arena.states.copy()
    assert R.write_column(arena, rows) is None  # needs 3 runs, 1 fits: nothing is taken
    assert np.array_equal(arena.states, before)


def test_filesystem_full_is_a_failed_allocation(pool, monkeypatch):
    arena = pool.create()

    def no_space(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(arena_mod.os, "posix_fallocate", no_space)
    assert arena.alloc(1, 1) is None
    assert arena.used_blocks() == 0


# -- gather ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dtype, shape",
    [
        ("<f4", (3, 64, 128)),
        ("|u1", (300, 300, 3)),
        ("<i8", (9000,)),
        ("<f2", (257, 129)),
        ("|b1", (70000,)),
        ("<c8", (8193,)),
        (">i4", (130, 130)),
    ],
)
def test_gather_returns_identical_fresh_arrays(pool, dtype, shape):
    arena = pool.create()
    rng = np.random.default_rng(7)
    values = (rng.random((3, *shape)) * 100).astype(dtype)
    assert R.eligible(values)
    refs = R.write_column(arena, values)
    out = R.gather(refs, _spec(values), pool.get)
    assert out.dtype == values.dtype and out.shape == values.shape
    assert np.array_equal(out, values)
    assert out.flags.c_contiguous and out.flags.writeable and not np.shares_memory(out, arena.data)
    assert arena.used_blocks() == 0  # gathered rows are freed


def test_gather_of_a_row_spec_its_message_does_not_describe_is_one_arena_error(pool):
    # A client gathers what a daemon's BATCH describes: a reference to an undescribed spec is a bad message
    # (one ``ArenaError`` line), not a ``KeyError: 5`` out of the receiver thread.
    arena = pool.create()
    values = np.ones((2, 20000), np.float32)
    refs = R.write_column(arena, values)
    refs[1, 2] = 5
    for mixed in (refs, refs[1:]):
        with pytest.raises(ArenaError, match="row spec 5"):
            R.gather(mixed, _spec(values), pool.get, free=False)


def test_references_claiming_rows_beyond_their_arena_are_refused_before_any_allocation(pool):
    arena = pool.create()
    values = np.ones((2, 20000), np.float32)
    refs = R.write_column(arena, values)
    huge = {0: ("<f8", (1 << 20, 1 << 20))}  # 8 TiB a row: np.empty would raise MemoryError
    with pytest.raises(ArenaError, match="which holds"):
        R.gather(refs, huge, pool.get, free=False)
    beyond = refs.copy()
    beyond[1, 1] = len(arena.data) // arena.block_bytes  # a block past the arena's end
    with pytest.raises(ArenaError, match="which holds"):
        R.gather(beyond, _spec(values), pool.get, free=False)
    assert np.array_equal(R.gather(refs, _spec(values), pool.get), values)


def test_references_to_overlapping_rows_are_refused_before_any_allocation(pool):
    # A hostile daemon could name one block 100,000 times: a client would copy it into a 6.5 GB batch.
    arena = pool.create()
    values = np.ones((3, 100_000), np.float32)  # 400 KB rows: 7 blocks each
    refs = R.write_column(arena, values)
    allocated = []

    def empty(nbytes):
        allocated.append(nbytes)
        return np.empty(nbytes, np.uint8)

    repeated = refs[[0] * 1000]
    inside = refs.copy()
    inside[2, 1] = inside[1, 1] + 3  # starts inside row 1
    for bad in (repeated, inside):
        with pytest.raises(ArenaError, match="overlapping rows of arena"):
            R.gather(bad, _spec(values), pool.get, free=False, empty=empty)
    assert allocated == []
    wider = {0: ("<f4", (100_000,)), 1: ("<f4", (200_000,))}  # row 0 claimed twice as long: reaches row 1
    mixed = refs[:2].copy()
    mixed[0, 2] = 1
    with pytest.raises(ArenaError, match="overlapping"):
        R.gather(mixed, wider, pool.get, free=False)
    files = np.array([[F.file_id(0), 4, 0], [F.file_id(0), 4, 0]], dtype=np.int64)
    with pytest.raises(ArenaError, match="row of file source 0 twice"):
        R.gather(files, _spec(values), lambda ref_id: object(), free=False)
    assert np.array_equal(R.gather(refs[::-1], _spec(values), pool.get), values)  # disjoint, any order


def test_gather_in_shuffled_order_and_mixed_specs(pool):
    arena = pool.create()
    specs = R.Specs()
    a = np.arange(4 * 20000, dtype=np.float32).reshape(4, 20000)
    b = np.arange(2 * 17000, dtype=np.int64).reshape(2, 17000)
    refs_a = R.write_column(arena, a, specs.intern(a.dtype.str, a.shape[1:]))
    refs_b = R.write_column(arena, b, specs.intern(b.dtype.str, b.shape[1:]))
    order = np.array([3, 0, 2])
    out = R.gather(refs_a[order], specs.specs, pool.get)
    assert np.array_equal(out, a[order])
    mixed = R.gather(np.concatenate([refs_a[1:2], refs_b]), specs.specs, pool.get)
    assert mixed.dtype == object and len(mixed) == 3
    assert np.array_equal(mixed[0], a[1]) and np.array_equal(mixed[2], b[1])
    R.free_refs(refs_a[[1]], specs.specs, pool.get)  # row 1 was gathered twice over; freeing again is harmless
    assert arena.used_blocks() == 0


def test_small_and_object_columns_are_not_eligible():
    assert not R.eligible(np.zeros((4, 100), np.float32))
    assert not R.eligible(np.empty(3, dtype=object))
    assert not R.eligible(np.zeros((0, 1 << 20), np.uint8))


def test_specs_adopt_renumbers_peer_specs():
    ours = R.Specs()
    ours.intern("<f4", (2,))
    refs = np.array([[5, 0, 0], [5, 16, 0]], dtype=np.int64)
    adopted = ours.adopt(refs, {0: ["<i8", [3, 4]]})
    assert adopted[:, 2].tolist() == [1, 1] and ours.specs[1] == ("<i8", (3, 4))
    assert ours.describe(adopted) == {1: ["<i8", [3, 4]]}
    with pytest.raises(ArenaError):
        ours.adopt(refs, {1: ["<i8", [3, 4]]})
    with pytest.raises(ArenaError):
        R.parse_specs({0: ["|O", [1]]})


@pytest.mark.parametrize(
    "spec",
    [
        ["|u1", [2**61 + 1, 8]],  # a product that wraps around in int64 to 8 bytes
        ["|u1", [2**32, 2**32]],  # ... or to 0
        ["(2,)<f8", [4]],  # a subarray dtype: numpy refuses the view later with a raw ValueError
        ["<i4,<f4", [3]],  # records
        ["<f4", [-1]],
        ["<f4", [1] * 40],
        ["|u1", [0, 2**40, 2**40]],  # no bytes, but numpy refuses the shape ("cannot reshape")
    ],
)
def test_a_spec_whose_rows_cannot_be_real_is_refused_in_one_line(spec):
    with pytest.raises(ArenaError, match="a reference column claims"):
        R.parse_specs({0: spec})


# -- who may map what ---------------------------------------------------------------------


def test_token_mismatch_and_missing_files_are_refused(pool):
    arena = pool.create()
    with pytest.raises(ArenaError, match="another token"):
        Arena.open(arena.path, arena.arena_id, b"x" * 16)
    with pytest.raises(ArenaError, match="cannot open"):
        Arena.open(arena.path + "-nope", arena.arena_id, pool.token)
    assert ArenaCache(pool.describe()).probe()
    assert not ArenaCache({**pool.describe(), "token": (b"y" * 16).hex()}).probe()
    assert not ArenaCache({**pool.describe(), "dir": "/nonexistent-loader-dir"}).probe()


def test_reader_cache_maps_once_and_evicts_idle(pool):
    arena = pool.create()
    cache = ArenaCache(pool.describe())
    try:
        first = cache.get(arena.arena_id)
        assert cache.get(arena.arena_id) is first
        cache.evict_idle(time.monotonic() + 3600)
        assert first.closed and not arena.closed
    finally:
        cache.close()


def test_pool_close_unlinks_everything(tmp_path):
    pool = ArenaPool(1 * MIB, directory=str(tmp_path))
    pool.create(), pool.create()
    assert len(os.listdir(tmp_path)) == 3  # two arenas and the probe
    pool.close()
    pool.close()
    assert os.listdir(tmp_path) == []


def test_retired_arena_waits_for_references(pool):
    arena = pool.create()
    arena.alloc(1, 1)  # a block its (now dead) writer never sent: garbage once retired
    pool.retire(arena.arena_id, now=0.0)
    assert pool.collect(held={arena.arena_id}, now=10.0) == []  # the stage still holds a reference
    assert os.path.exists(arena.path)
    assert pool.collect(held=set(), now=1.0) == []  # too young: chunks of its writer may still be queued
    assert os.path.exists(arena.path)
    assert pool.collect(held=set(), now=10.0) == [arena.arena_id]
    assert not os.path.exists(arena.path)
    assert arena.arena_id not in pool.arenas


def test_default_directory_falls_back_without_dev_shm(monkeypatch, tmp_path):
    monkeypatch.setattr(arena_mod, "SHM_DIR", str(tmp_path / "missing"))
    assert arena_mod.shm_directory() == arena_mod.tempfile.gettempdir()


# -- two processes -------------------------------------------------------------------


def _writer(info: dict, arena_id: int, count: int, conn) -> None:
    """Child: write ``count`` rows (seeded by index) into the arena, waiting for space as the parent frees."""
    arena = Arena.open(arena_path(info["dir"], info["prefix"], arena_id), arena_id, bytes.fromhex(info["token"]))
    try:
        for index in range(count):
            row = np.random.default_rng(index).integers(0, 255, (1, 200 * KIB), dtype=np.uint8)
            deadline = time.monotonic() + PIPE_TIMEOUT_S
            while (refs := R.write_column(arena, row)) is None:
                if time.monotonic() > deadline:
                    raise TimeoutError("the reader never freed space")
                time.sleep(0.0005)
            conn.send_bytes(refs.tobytes())
    finally:
        conn.close()
        arena.close()


def test_concurrent_writer_and_freer_in_two_processes(pool):
    arena = pool.create()  # 64 blocks: 16 rows of 4 blocks fit, so the writer must reuse freed space
    count = 200
    reader_end, writer_end = processes.context("spawn").Pipe(duplex=False)
    proc = processes.start_process(_writer, (pool.describe(), arena.arena_id, count, writer_end), name="arena-writer")
    writer_end.close()
    try:
        spec = {0: ("|u1", (200 * KIB,))}
        for index in range(count):
            assert reader_end.poll(PIPE_TIMEOUT_S), f"no row {index} from the writer"
            refs = np.frombuffer(reader_end.recv_bytes(), dtype=np.int64).reshape(-1, 3)
            if index % 3 == 0:
                time.sleep(0.001)  # let the writer run into a full arena now and then
            out = R.gather(refs, spec, pool.get)
            expected = np.random.default_rng(index).integers(0, 255, (1, 200 * KIB), dtype=np.uint8)
            assert np.array_equal(out, expected), f"row {index} differs"
    finally:
        reader_end.close()
        code = processes.stop_process(proc, join_timeout_s=CHILD_JOIN_TIMEOUT_S)
    assert code == 0
    assert arena.used_blocks() == 0


def test_an_arena_path_that_is_no_regular_file_is_refused_at_once_not_opened_blocking(tmp_path):
    # The path comes from a daemon's welcome: a FIFO there blocked the client's open until a writer came, a
    # link was followed wherever it led, and a device would have been mapped.
    token = b"\x01" * 16
    fifo = tmp_path / "x-1"
    os.mkfifo(fifo)
    (tmp_path / "real").write_bytes(b"\0" * 8192)
    os.symlink(tmp_path / "real", tmp_path / "x-2")
    for path, why in ((fifo, "is not a regular file"), (tmp_path / "x-2", "cannot open arena")):
        started = time.monotonic()
        with pytest.raises(ArenaError, match=why):
            Arena.open(str(path), 1, token)
        assert time.monotonic() - started < 2.0


@pytest.mark.parametrize("prefix", ["../elsewhere", "a/b", "", ".."])
def test_an_arena_prefix_that_is_no_file_name_is_refused(tmp_path, prefix):
    with pytest.raises(ValueError, match="is not a file name"):
        ArenaCache({"dir": str(tmp_path), "prefix": prefix, "token": "00" * 16})
