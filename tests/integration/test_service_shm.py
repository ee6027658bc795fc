"""The shared-memory fast path end to end: large rows through arenas, exactly once, faults, cleanup."""

from __future__ import annotations

import collections
import glob
import logging
import os
import threading
import time

import numpy as np
import pytest

import loader
from loader import Client
from loader.errors import ServiceUnavailableError
from loader.service.client import client as client_mod
from loader.service.client.client import query_status
from loader.service.daemon import datasets
from loader.service.shm import file_rows as F
from loader.service.shm.arena import RowsNotKeptError
from loader.service.shm.cache import ArenaCache
from tests.helpers import wait_until
from tests.integration.conftest import (
    collect_ids_meanwhile,
    connected_workers,
    kill_leased_worker,
    make_config,
    running_daemon,
)

pytestmark = pytest.mark.integration

ROW_FLOATS = 20_000  # 80 KiB rows: above the reference threshold, two blocks each


def write_large_files(directory, n_files: int, per_file: int) -> list[int]:
    """``f<i>.npy`` of float32 rows whose first value is a unique id; returns the ids."""
    ids = []
    for i in range(n_files):
        rows = np.random.default_rng(i).random((per_file, ROW_FLOATS), dtype=np.float32)
        rows[:, 0] = np.arange(i * 1000, i * 1000 + per_file)
        np.save(directory / f"f{i:03d}.npy", rows)
        ids.extend(range(i * 1000, i * 1000 + per_file))
    return ids


def expected_rows(directory) -> dict[int, np.ndarray]:
    rows = np.concatenate([np.load(p) for p in sorted(glob.glob(str(directory / "*.npy")))])
    return {int(r[0]): r for r in rows}


def batch_ids(batch) -> list[int]:
    return batch["data"][:, 0].astype(int).tolist()


def arena_files(daemon) -> list[str]:
    return glob.glob(os.path.join(daemon.arenas.directory, daemon.arenas.prefix + "-*"))


def through(daemon) -> str:
    """Which reference kind carried the rows: "file" (file rows), "arena", or "inline"."""
    if daemon.stage.refs.files.sources:
        return "file"
    return "arena" if daemon.stage.refs.specs.specs else "inline"


@pytest.mark.parametrize("file_rows", [True, False], ids=["file_rows", "arena"])
@pytest.mark.parametrize("transport", ["zmq", "pipe"])
def test_loader_large_rows_exactly_once_through_arenas_then_unlinked(tmp_path, no_leaks, transport, file_rows):
    ids = write_large_files(tmp_path, 4, 30)
    rows = expected_rows(tmp_path)
    config = make_config(
        tmp_path,
        pipeline={"epochs": 2, "shuffle_buffer": 16, "batch_size": 8},
        workers={"samples_per_message": 8, "transport": transport, "file_rows": file_rows},
    )
    with loader.Loader(config) as local:
        daemon = local._daemon
        got = []
        for batch in local:
            assert batch["data"].dtype == np.float32 and batch["data"].flags.c_contiguous
            for row in batch["data"]:
                assert np.array_equal(row, rows[int(row[0])])
            got.extend(batch_ids(batch))
        assert through(daemon) == ("file" if file_rows else "arena")
        assert arena_files(daemon)
    assert collections.Counter(got) == collections.Counter(ids * 2)
    assert arena_files(daemon) == []


def test_daemon_client_exactly_once_with_a_mapper_and_the_same_data_inline(tmp_path, monkeypatch):
    ids = write_large_files(tmp_path, 3, 40)
    config = make_config(
        tmp_path,
        pipeline={"shuffle_buffer": 20, "batch_size": 8, "mappers": ["tests.helpers:identity_mapper"]},
        workers={"count": 1, "samples_per_message": 8},
    )
    with running_daemon(config) as daemon:
        with Client(daemon.endpoint, timeout_s=10, read_ahead=False) as fast:
            assert fast._arenas is not None
            fast_batches = [b["data"] for b in fast.epoch()]
        assert daemon.stage.refs.specs.specs

        class OtherHost(ArenaCache):  # what a client on another host finds: another token at that path
            def __init__(self, info):
                super().__init__({**info, "token": (b"\x01" * 16).hex()})

        monkeypatch.setattr(client_mod, "ArenaCache", OtherHost)
        with Client(daemon.endpoint, timeout_s=10, read_ahead=False) as inline:
            assert inline._arenas is None
            inline_batches = []
            for batch in inline.epoch():
                assert not any(s.shm for s in daemon.stage.sessions.values())
                inline_batches.append(batch["data"])
        files = arena_files(daemon)
    assert collections.Counter(np.concatenate(fast_batches)[:, 0].astype(int).tolist()) == collections.Counter(ids)
    # One worker and a seeded shuffle: both clients see the same batches, byte for byte.
    assert len(fast_batches) == len(inline_batches)
    assert all(np.array_equal(a, b) for a, b in zip(fast_batches, inline_batches))
    assert files and not any(os.path.exists(f) for f in files)


@pytest.mark.parametrize("pins", [True, False], ids=["pinning_device", "cpu"])
def test_a_client_gathers_big_rows_into_host_buffers_on_a_pinning_device_else_its_own(tmp_path, monkeypatch, pins):
    # On a torch CUDA device the client gathers big rows into Placer.host_buffer (page-locked memory that stage
    # sends on as it lies) instead of its reusable mappings; elsewhere into those mappings. No CUDA here: the
    # placer says it pins. Batches of 64 rows of 80 KB (5 MB) are above the mappings' 4 MiB minimum.
    from loader.device import Placer
    from loader.service.client.buffers import BatchBuffers

    ids = write_large_files(tmp_path, 3, 64)
    given: list[np.ndarray] = []
    mapped: list[int] = []
    real_empty = BatchBuffers.empty

    def host_buffer(self, nbytes):
        given.append(np.empty(nbytes, dtype=np.uint8))
        return given[-1]

    def spied_empty(self, nbytes):
        mapped.append(nbytes)
        return real_empty(self, nbytes)

    monkeypatch.setattr(Placer, "gathers_pinned", property(lambda self: pins))
    monkeypatch.setattr(Placer, "host_buffer", host_buffer)
    monkeypatch.setattr(BatchBuffers, "empty", spied_empty)
    config = make_config(tmp_path, pipeline={"batch_size": 64}, workers={"count": 1, "samples_per_message": 64})
    rows = expected_rows(tmp_path)
    with running_daemon(config) as daemon, Client(daemon.endpoint, timeout_s=10, read_ahead=False) as client:
        batches = list(client.epoch())
    assert sorted(i for b in batches for i in batch_ids(b)) == sorted(ids)
    for batch in batches:
        assert all(np.array_equal(row, rows[int(row[0])]) for row in batch["data"])
    assert max(b["data"].nbytes for b in batches) > 4 * 2**20
    if pins:
        assert given and not mapped
        assert all(any(np.shares_memory(b["data"], buffer) for buffer in given) for b in batches)
    else:
        assert mapped and not given


def test_killed_worker_mid_epoch_with_arenas_is_exactly_once(tmp_path):
    ids = write_large_files(tmp_path, 4, 60)
    rows = expected_rows(tmp_path)
    config = make_config(
        tmp_path,
        pipeline={"mappers": ["tests.helpers:slow_sample_2ms"], "batch_size": 8},
        workers={"samples_per_message": 8},
    )
    with running_daemon(config) as daemon:
        assert wait_until(lambda: connected_workers(daemon.endpoint) == 2, timeout_s=20)
        with Client(daemon.endpoint, timeout_s=10) as client:
            got, killed = [], None
            for i, batch in enumerate(client.epoch()):
                for row in batch["data"]:
                    assert np.array_equal(row, rows[int(row[0])])
                got.extend(batch_ids(batch))
                if i == 3:
                    killed = kill_leased_worker(query_status(daemon.endpoint))
            assert killed is not None
            assert collections.Counter(got) == collections.Counter(ids)
            assert query_status(daemon.endpoint)["worker_restarts"] >= 1
            assert wait_until(lambda: connected_workers(daemon.endpoint) == 2, timeout_s=20)
            # The dead worker's arena is retired, and unlinked once none of its rows is in use.
            assert wait_until(lambda: len(daemon.arenas.arenas) == 2, timeout_s=10)
            second = [i for batch in client.epoch() for i in batch_ids(batch)]
            assert collections.Counter(second) == collections.Counter(ids)
        files = arena_files(daemon)
    assert len(files) == 3 and not any(os.path.exists(f) for f in files)  # two arenas and the probe


@pytest.mark.parametrize("mappers", [[], ["tests.helpers:identity_mapper"]], ids=["blocks", "mapped"])
def test_small_arenas_mix_references_and_inline_rows_exactly_once(tmp_path, mappers):
    # 2 MiB arenas hold one chunk of 8 rows of 80 KiB at a time (16 blocks of 32): the others go inline. Mapped,
    # each row goes into the arena as its sample is made, and a chunk that finds no room for some row sends
    # them all inline, giving the rows placed back.
    ids = write_large_files(tmp_path, 4, 48)
    rows = expected_rows(tmp_path)
    config = make_config(
        tmp_path,
        pipeline={"shuffle_buffer": 12, "batch_size": 8, "mappers": mappers},
        workers={"samples_per_message": 8, "shm_arena_mib": 2},
    )
    with running_daemon(config) as daemon:
        with Client(daemon.endpoint, timeout_s=10, prefetch=2) as client:
            for _ in range(2):
                got = []
                for batch in client.epoch():
                    for row in batch["data"]:
                        assert np.array_equal(row, rows[int(row[0])])
                    got.extend(batch_ids(batch))
                assert collections.Counter(got) == collections.Counter(ids)
        assert daemon.stage.refs.specs.specs
        # Every row went back once its batch was taken: none stays marked by a chunk that went inline.
        arenas = list(daemon.arenas.arenas.values())
        assert arenas and wait_until(lambda: sum(a.used_blocks() for a in arenas) == 0, timeout_s=10)


def test_a_full_dev_shm_is_said_once_by_the_daemon_and_the_rows_still_arrive(tmp_path, monkeypatch, caplog):
    # Arenas of 2 MiB take one chunk at a time: the others come inline. With the filesystem under them full
    # (a container's 64 MiB /dev/shm, as statvfs would say), the daemon says why, once.
    ids = write_large_files(tmp_path, 4, 48)
    config = make_config(
        tmp_path,
        pipeline={"batch_size": 8, "mappers": ["tests.helpers:identity_mapper"]},
        workers={"samples_per_message": 8, "shm_arena_mib": 2},
    )
    full = os.statvfs_result((4096, 4096, 16384, 10, 10, 0, 0, 0, 0, 255))  # 64 MiB, 40 KiB free
    monkeypatch.setattr(os, "statvfs", lambda path: full)
    with caplog.at_level(logging.WARNING, logger="loader.daemon"):
        with running_daemon(config) as daemon, Client(daemon.endpoint, timeout_s=10) as client:
            got = [i for _ in range(2) for batch in client.epoch() for i in batch_ids(batch)]
    assert collections.Counter(got) == collections.Counter(ids * 2)
    said = [r.getMessage() for r in caplog.records if "shared memory is full" in r.getMessage()]
    assert len(said) == 1, said
    assert "has 0 MiB free of 64 MiB" in said[0] and "--shm-size" in said[0]


def test_the_shm_warning_counts_the_most_workers_an_autoscaling_daemon_runs(tmp_path):
    write_large_files(tmp_path, 1, 4)
    config = make_config(tmp_path, workers={"count": 2, "min": 1, "max": 8, "shm_arena_mib": 4})
    with running_daemon(config) as daemon:
        assert daemon._shm_room is not None and daemon._shm_room.workers == 8


def test_fast_path_off_sends_everything_inline(tmp_path):
    ids = write_large_files(tmp_path, 2, 20)
    config = make_config(
        tmp_path, pipeline={"batch_size": 8}, workers={"count": 1, "samples_per_message": 8, "shm_arena_mib": 0}
    )
    with running_daemon(config) as daemon:
        assert daemon.arenas is None
        with Client(daemon.endpoint, timeout_s=10) as client:
            got = [i for batch in client.epoch() for i in batch_ids(batch)]
        assert not daemon.stage.refs.specs.specs
    assert sorted(got) == sorted(ids)


def test_config_shm_arena_mib_zero_turns_the_fast_path_off(tmp_path):
    ids = write_large_files(tmp_path, 2, 10)
    config = make_config(
        tmp_path, pipeline={"batch_size": 4}, workers={"count": 1, "samples_per_message": 4, "shm_arena_mib": 0}
    )
    with running_daemon(config) as daemon:
        assert daemon.arenas is None
        with Client(daemon.endpoint, timeout_s=10) as client:
            got = [i for batch in client.epoch() for i in batch_ids(batch)]
    assert sorted(got) == sorted(ids)


@pytest.mark.parametrize("file_rows", [True, False], ids=["file_rows", "arena"])
def test_killed_worker_without_mappers_is_exactly_once(tmp_path, file_rows):
    # No mapper: rows read by the block fast path, as file rows or through the arena.
    ids = write_large_files(tmp_path, 8, 40)
    rows = expected_rows(tmp_path)
    config = make_config(
        tmp_path,
        pipeline={"batch_size": 8, "shuffle_buffer": 16},
        workers={"samples_per_message": 8, "file_rows": file_rows},
    )
    with running_daemon(config) as daemon:
        assert wait_until(lambda: connected_workers(daemon.endpoint) == 2, timeout_s=20)
        with Client(daemon.endpoint, timeout_s=10, prefetch=1) as client:
            got, killed = [], None
            for batch in client.epoch():
                for row in batch["data"]:
                    assert np.array_equal(row, rows[int(row[0])])
                got.extend(batch_ids(batch))
                if killed is None:
                    status = query_status(daemon.endpoint)
                    if any(w["leases"] and w["alive"] for w in status["workers"]):
                        killed = kill_leased_worker(status)
            assert killed is not None
            assert collections.Counter(got) == collections.Counter(ids)
            second = [i for batch in client.epoch() for i in batch_ids(batch)]
            assert collections.Counter(second) == collections.Counter(ids)
        assert through(daemon) == ("file" if file_rows else "arena")


def test_file_rows_reach_a_client_on_another_host_copied_by_the_daemon(tmp_path, monkeypatch):
    ids = write_large_files(tmp_path, 3, 24)
    rows = expected_rows(tmp_path)
    config = make_config(tmp_path, pipeline={"batch_size": 8, "shuffle_buffer": 8}, workers={"samples_per_message": 8})

    class OtherHost(ArenaCache):  # another token at that path: the client cannot map arenas, nor read our files
        def __init__(self, info):
            super().__init__({**info, "token": (b"\x01" * 16).hex()})

    with running_daemon(config) as daemon:
        with Client(daemon.endpoint, timeout_s=10) as near:
            near_batches = [b["data"] for b in near.epoch()]
        monkeypatch.setattr(client_mod, "ArenaCache", OtherHost)
        with Client(daemon.endpoint, timeout_s=10) as far:
            assert far._arenas is None
            far_batches = [b["data"] for b in far.epoch()]
        assert through(daemon) == "file"
    for batches in (near_batches, far_batches):
        got = [int(r[0]) for b in batches for r in b]
        assert collections.Counter(got) == collections.Counter(ids)
        assert all(np.array_equal(r, rows[int(r[0])]) for b in batches for r in b)
    assert all(np.array_equal(a, b) for a, b in zip(near_batches, far_batches))


def _open_deleted(directory) -> list[str]:
    """Files under ``directory`` this process holds open although they were deleted."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(directory)) and target.endswith(" (deleted)"):
            out.append(target)
    return out


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_the_daemon_closes_files_it_read_rows_of_once_unused(tmp_path, monkeypatch):
    # The daemon reads file rows itself for a client on another host (and for padded repeats). Files
    # it opened for that must not stay open for good: a dataset rewritten beside a long-lived daemon
    # would keep every old file's space held on disk.
    monkeypatch.setattr(F, "OPEN_FILE_IDLE_S", 0.3)
    write_large_files(tmp_path, 3, 16)
    config = make_config(tmp_path, pipeline={"batch_size": 8}, workers={"samples_per_message": 8})

    class OtherHost(ArenaCache):  # another token at that path: the daemon reads the rows for this client
        def __init__(self, info):
            super().__init__({**info, "token": (b"\x01" * 16).hex()})

    monkeypatch.setattr(client_mod, "ArenaCache", OtherHost)
    with running_daemon(config) as daemon:
        with Client(daemon.endpoint, timeout_s=10) as far:
            assert len(list(far.epoch())) == 6
        assert through(daemon) == "file"
        for path in glob.glob(str(tmp_path / "*.npy")):
            os.unlink(path)
        assert wait_until(lambda: not _open_deleted(tmp_path), timeout_s=5.0), _open_deleted(tmp_path)


def test_a_file_changed_under_its_file_rows_fails_with_one_clear_error(tmp_path):
    write_large_files(tmp_path, 1, 64)
    config = make_config(tmp_path, pipeline={"batch_size": 8}, workers={"count": 1, "samples_per_message": 8})
    with running_daemon(config) as daemon:
        with Client(daemon.endpoint, timeout_s=10, prefetch=1, read_ahead=False) as client:
            batches = client.epoch()
            next(batches)
            # Rewritten in place (same inode, new size and mtime) while later rows are in flight.
            path = tmp_path / "f000.npy"
            before = os.stat(path)
            with open(path, "ab") as fh:
                fh.write(b"\0" * 4096)
            with pytest.raises(Exception, match="changed"):
                for _ in batches:
                    pass
            # Like a worker's error, it ends that epoch only: the next one is refused by the worker that opens
            # the file, as changed since the daemon started, and once the file is back the client reads it.
            with pytest.raises(Exception, match="changed since the daemon started"):
                list(client.epoch(1))
            os.truncate(path, before.st_size)
            os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
            assert len(list(client.epoch(2))) == 8


def test_a_file_replaced_before_the_padded_repeat_of_its_rows_fails_that_epoch_not_the_daemon(tmp_path, monkeypatch):
    # Under on_error = "skip" the housekeeping skips a file whose workers hang; that ended this epoch's input, and
    # its last step, short of world_size rows, was padded with a repeat of f000's file row, copied there. f000
    # was replaced meanwhile: the copy raised out of the loop ("the daemon failed: FileRowsError") and the
    # daemon stopped serving every client.
    write_large_files(tmp_path, 2, 1)
    # The FIFO below hangs the workers only if they open it: with no start-up size, f001 is not refused before that as a
    # file changed since start-up (test_service_untidy tests that refusal).
    size = datasets._size
    monkeypatch.setattr(datasets, "_size", lambda path: None if path.endswith("f001.npy") else size(path))
    config = make_config(
        tmp_path, pipeline={"on_error": "skip", "batch_size": 1}, workers={"count": 2, "progress_timeout_s": 1.0}
    )
    with running_daemon(config) as daemon:
        with Client(daemon.endpoint, rank=0, world_size=2, job="j", timeout_s=30, read_ahead=False) as client:
            os.remove(tmp_path / "f001.npy")
            os.mkfifo(tmp_path / "f001.npy")  # opening it waits for a writer: every worker leased it hangs
            read = collect_ids_meanwhile(client.epoch())  # the epoch is asked for at its first batch
            assert wait_until(lambda: query_status(daemon.endpoint)["clients"][0]["epoch_files_done"] == 1, 20)
            write_large_files(tmp_path, 1, 1)  # f000 rewritten: the stage's file row of it names another file
            with pytest.raises(Exception, match="changed") as failed:
                read()
            assert not isinstance(failed.value, loader.ServiceUnavailableError), failed.value
            assert not daemon._closed and query_status(daemon.endpoint)["clients"]


def test_stored_npz_members_go_as_file_rows_and_compressed_ones_through_the_arena(tmp_path):
    ids = []
    for i in range(3):
        x = np.random.default_rng(i).random((20, ROW_FLOATS), dtype=np.float32)
        x[:, 0] = np.arange(20) + 100 * i
        np.savez(tmp_path / f"f{i}.npz", x=x, label=np.arange(20) + 100 * i)  # stored: memory-mapped
        ids += list(range(100 * i, 100 * i + 20))
    inflated = np.full((6, ROW_FLOATS), 7, np.float32)
    np.savez_compressed(tmp_path / "f9.npz", x=inflated, label=np.arange(900, 906))  # inflated in memory
    ids += list(range(900, 906))
    config = make_config(
        tmp_path,
        source={"files": [str(tmp_path / "*.npz")]},
        pipeline={"batch_size": 8, "shuffle_buffer": 8},
        workers={"samples_per_message": 8},
    )
    with loader.Loader(config) as local:
        got = []
        for batch in local:
            for row, label in zip(batch["x"], batch["label"]):
                assert row[0] == (7 if label >= 900 else label)
            got.extend(batch["label"].tolist())
        refs = local._daemon.stage.refs
        assert {layout.member for layout in refs.files.sources.values()} == {"x"}
        assert {os.path.basename(layout.path) for layout in refs.files.sources.values()} == {
            "f0.npz",
            "f1.npz",
            "f2.npz",
        }
    assert collections.Counter(got) == collections.Counter(ids)


def test_auto_prefetch_reads_more_big_batches_ahead_after_the_first_epoch(tmp_path, monkeypatch):
    # 80 KiB rows, batch 8: 640 KiB messages. With a 4 MiB budget "auto" reads 6 ahead from epoch 1 on
    # (the first epoch, sizes unknown, reads DEFAULT_PREFETCH); the stage's buffer follows the credit.
    monkeypatch.setattr(client_mod, "AUTO_PREFETCH_BYTES", 4 * 1024 * 1024)
    # 12 batches an epoch, more than the 6 read ahead: the stream is still the session's when the test looks
    # (with 6, the daemon could send the whole epoch first and drop it: a flaky None).
    ids = write_large_files(tmp_path, 2, 48)
    config = make_config(tmp_path, pipeline={"batch_size": 8}, workers={"count": 1, "samples_per_message": 8})
    with running_daemon(config) as daemon:
        with (
            Client(daemon.endpoint, timeout_s=10) as auto,
            Client(daemon.endpoint, timeout_s=10, prefetch=2, job="b") as fixed,
        ):
            assert auto.epoch_prefetch() == client_mod.DEFAULT_PREFETCH
            first = [batch_ids(b) for b in auto.epoch()]
            assert auto.epoch_prefetch() == 6  # 4 MiB // 625 KiB
            second = auto.epoch()
            seen = [batch_ids(next(second))]
            stream = daemon.stage.sessions[next(iter(daemon.stage.sessions))].current
            assert stream is not None and stream.prefetch == auto.epoch_prefetch()
            seen += [batch_ids(b) for b in second]
            for _ in range(2):
                assert sorted(sum((batch_ids(b) for b in fixed.epoch()), [])) == sorted(ids)
            assert fixed.epoch_prefetch() == 2
    assert sorted(sum(first, [])) == sorted(ids) == sorted(sum(seen, []))


@pytest.mark.parametrize("keep_s", [30.0, 2.0], ids=["kept_through_the_stall", "reclaimed_during_it"])
def test_a_client_stalled_past_its_drop_never_gives_rows_written_for_another_client(tmp_path, keep_s):
    # A client stopped (Ctrl-Z, a debugger, a VM pause) past the heartbeat timeout was dropped, and the rows of
    # the batches on their way to it freed at once; workers wrote another client's rows there, and the stopped
    # client, woken, copied those into its batches as its own. Here its receiver stalls before its first copy
    # (no pings meanwhile) until the daemon has dropped it and another client has read a whole epoch.
    write_large_files(tmp_path, 3, 40)
    other = tmp_path / "other"
    other.mkdir()
    for i, path in enumerate(sorted(tmp_path.glob("*.npy"))):
        rows = np.load(path)
        rows[:, 0] += 100_000
        np.save(other / f"g{i}.npy", rows)
    rows = expected_rows(tmp_path)
    config = make_config(
        tmp_path,
        pipeline={"batch_size": 4, "shuffle_buffer": 0},
        workers={"file_rows": False, "samples_per_message": 4, "heartbeat_timeout_s": 1.0},
        service={"reclaim_after_s": keep_s},
        datasets={"other": {"source": {"files": [str(other / "*.npy")]}, "pipeline": {"batch_size": 4}}},
    )
    stalled_now, go_on = threading.Event(), threading.Event()
    got: list[np.ndarray] = []
    failed: list[BaseException] = []
    with running_daemon(config) as daemon:
        with Client(daemon.endpoint, timeout_s=30, prefetch=8) as stalled:
            gather = stalled._gather

            def stall_first(*args):
                if not stalled_now.is_set():
                    stalled_now.set()
                    go_on.wait(30)
                return gather(*args)

            def read_stalled():
                try:
                    got.extend(batch["data"] for batch in stalled.epoch())
                except BaseException as exc:
                    failed.append(exc)

            stalled._gather = stall_first
            consumer = threading.Thread(target=read_stalled)
            consumer.start()
            try:
                assert stalled_now.wait(20)
                started = time.monotonic()
                wait_until(lambda: not daemon.stage.sessions, timeout_s=20)  # dropped, silent past 1 s
                with Client(daemon.endpoint, dataset="other", timeout_s=20) as reader:  # written where it can be
                    assert len([i for b in reader.epoch() for i in batch_ids(b)]) == 120
                if keep_s < 30:  # past what was kept
                    time.sleep(max(0.0, keep_s + 0.5 - (time.monotonic() - started)))
            finally:
                go_on.set()
                consumer.join(30)
    assert not consumer.is_alive() and len(failed) == 1
    for batch in got:
        for row in batch:
            assert np.array_equal(row, rows[int(row[0])])  # its own rows, whole: none of the other client's
    if keep_s < 30:
        assert isinstance(failed[0], RowsNotKeptError) and "service.reclaim_after_s" in str(failed[0]) and not got
    else:
        assert isinstance(failed[0], ServiceUnavailableError) and got
