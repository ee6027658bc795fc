"""Untidy data and resources: bad files, bad configs and big files never kill or hang the daemon.

Each scenario keeps a legitimate client reading exact epochs around the fault, so a fault that
"only" corrupts another stream or leaks a buffer shows up as a wrong multiset.
"""

from __future__ import annotations

import collections
import logging
import os
import time

import numpy as np
import pytest

import loader
from loader import Client
from loader.errors import ConfigError, WorkerError
from loader.service.client.client import query_status
from tests.integration.conftest import collect_ids, make_config, running_daemon, write_id_files

pytestmark = pytest.mark.integration


def _assert_alive_and_exact(daemon, ids, **client_kwargs):
    """The daemon still answers and a fresh client reads one exact epoch."""
    assert query_status(daemon.endpoint)["endpoint"] == daemon.endpoint
    with Client(daemon.endpoint, timeout_s=10, **client_kwargs) as client:
        assert collections.Counter(collect_ids(client.epoch())) == collections.Counter(ids)


# -- item 1: rows of another width ---------------------------------------------------------------


def _ragged_width_files(tmp_path):
    good = tmp_path / "good"
    good.mkdir()
    np.save(good / "a.npy", np.zeros((100, 4), dtype=np.float32))
    np.save(good / "b.npy", np.ones((100, 5), dtype=np.float32))  # another width: does not fit a batch
    return good


@pytest.mark.parametrize("shuffle_buffer", [0, 64])
def test_rows_of_another_width_fail_the_epoch_naming_the_file(tmp_path, shuffle_buffer):
    bad = _ragged_width_files(tmp_path)
    ids = write_id_files(tmp_path, 2, 300)
    config = make_config(bad, pipeline={"shuffle_buffer": shuffle_buffer, "batch_size": 16})
    with running_daemon(config) as daemon:
        with Client(daemon.endpoint, timeout_s=10, read_ahead=False) as client:
            with pytest.raises(WorkerError) as info:
                for _ in client.epoch():
                    pass
        err = info.value
        assert err.file is not None and os.path.basename(err.file) in ("a.npy", "b.npy")
        assert err.record is not None and "batch_format" in err.message
        assert "(100, 4)" in err.message or "(4,)" in err.message
        assert query_status(daemon.endpoint)["endpoint"] == daemon.endpoint  # still serving
    good_config = make_config(tmp_path, pipeline={"shuffle_buffer": shuffle_buffer})
    with running_daemon(good_config) as daemon:
        _assert_alive_and_exact(daemon, ids)


def test_rows_of_another_width_are_skipped_and_counted_under_skip(tmp_path):
    bad = _ragged_width_files(tmp_path)
    config = make_config(bad, pipeline={"shuffle_buffer": 64, "batch_size": 16, "on_error": "skip"})
    with running_daemon(config) as daemon:
        with Client(daemon.endpoint, timeout_s=10, read_ahead=False) as client:
            rows = sum(len(batch["data"]) for batch in client.epoch())
        assert rows == 100  # one file's rows fit, the other file's do not
        assert query_status(daemon.endpoint)["skipped_records"] == 100


def test_ragged_samples_one_per_message_need_list_format(tmp_path):
    ids = write_id_files(tmp_path, 2, 50)
    # A mapper that makes sample i a vector of i % 3 + 1 values: ragged.
    pipeline = {"mappers": ["tests.helpers:ragged_by_value"], "shuffle_buffer": 8, "batch_size": 4}
    config = make_config(tmp_path, pipeline=pipeline, workers={"samples_per_message": 1})
    with running_daemon(config) as daemon:
        with Client(daemon.endpoint, timeout_s=10, read_ahead=False) as client:
            with pytest.raises(WorkerError, match="batch_format"):
                for _ in client.epoch():
                    pass
        assert query_status(daemon.endpoint)["endpoint"] == daemon.endpoint
    listed = make_config(tmp_path, pipeline={**pipeline, "batch_format": "list"}, workers={"samples_per_message": 1})
    with running_daemon(listed) as daemon, Client(daemon.endpoint, timeout_s=10, read_ahead=False) as client:
        got = [int(np.asarray(sample[0])[0]) for batch in client.epoch() for sample in batch]
        assert collections.Counter(got) == collections.Counter(ids)


# -- item 2: a negative epoch ---------------------------------------------------------------------


def test_negative_epoch_is_refused_by_the_client_and_the_daemon_survives(tmp_path):
    ids = write_id_files(tmp_path, 2, 100)
    with running_daemon(make_config(tmp_path)) as daemon:
        with Client(daemon.endpoint, timeout_s=10) as client:
            with pytest.raises(ValueError, match="epoch"):
                client.epoch(-1)
            assert collections.Counter(collect_ids(client.epoch())) == collections.Counter(ids)
        _assert_alive_and_exact(daemon, ids)


# -- item 3: prefetch -----------------------------------------------------------------------------


def test_the_largest_prefetch_the_config_accepts_reads_exact_epochs(tmp_path):
    from loader.config.sections import MAX_PREFETCH

    ids = write_id_files(tmp_path, 4, 2000)
    config = make_config(tmp_path, pipeline={"batch_size": 4}, client={"prefetch": MAX_PREFETCH})
    with running_daemon(config) as daemon:
        with Client(daemon.endpoint, timeout_s=10, prefetch=config.client.prefetch) as client:
            for _ in range(2):
                assert collections.Counter(collect_ids(client.epoch())) == collections.Counter(ids)


def test_a_prefetch_beyond_the_limit_is_refused_with_the_limit(tmp_path):
    from loader.config.sections import MAX_PREFETCH

    write_id_files(tmp_path, 1, 10)
    with pytest.raises(ConfigError, match=f"client.prefetch must be <= {MAX_PREFETCH}"):
        make_config(tmp_path, client={"prefetch": MAX_PREFETCH + 1})
    with running_daemon(make_config(tmp_path)) as daemon:
        with pytest.raises(ValueError, match="prefetch"):
            Client(daemon.endpoint, timeout_s=10, prefetch=MAX_PREFETCH + 1)


# -- item 4: a symlink loop -----------------------------------------------------------------------


def test_recursive_glob_through_a_symlink_loop_reads_each_file_once(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    ids = write_id_files(data, 3, 40)
    os.symlink(data, data / "loop")  # data/loop -> data: a loop for a recursive glob
    os.symlink(data / "f000.npy", data / "alias.npy")  # a second name for one real file
    config = make_config(data, source={"files": [str(data / "**" / "*.npy")]})
    assert len(config.source.expand_files()) == 3
    with running_daemon(config) as daemon:
        _assert_alive_and_exact(daemon, ids)


def test_a_file_name_that_is_not_utf8_is_a_config_error_not_a_stopped_daemon(tmp_path):
    import loader

    write_id_files(tmp_path, 2, 40)
    np.save(os.path.join(str(tmp_path), os.fsdecode(b"bad\xfe.npy")), np.arange(8, dtype=np.int64))
    config = make_config(tmp_path, client={"timeout_s": 5.0})
    # It failed to encode in the daemon's first LEASE: the loop stopped and the client waited out its timeout.
    with pytest.raises(ConfigError, match=r"is not UTF-8 text .*rename"):
        with loader.Loader(config) as data:
            collect_ids(data.epoch())


# -- item 5: skip keeps every good record ---------------------------------------------------------


def _recordio_with_a_bad_chunk(path, ids, per_chunk, bad_chunk):
    """A RecordIO file of ``(id,)`` samples, ``per_chunk`` per chunk, chunk ``bad_chunk`` damaged (CRC)."""
    from loader.recordio import HEADER, Writer

    with Writer(path, max_num_records=per_chunk) as writer:
        for value in ids:
            writer.write((np.int64(value),))
    data = bytearray(path.read_bytes())
    offset = 0
    for _ in range(bad_chunk):  # walk the chunk headers to the damaged one
        size = HEADER.unpack_from(data, offset)[-1]
        offset += HEADER.size + size
    data[offset + HEADER.size + 5] ^= 0xFF  # one payload byte: the chunk's checksum no longer matches
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("mappers", [[], ["tests.helpers:identity_mapper"]])
def test_skip_keeps_every_good_record_of_a_file_that_fails_mid_file(tmp_path, mappers):
    ids = list(range(1000))
    _recordio_with_a_bad_chunk(tmp_path / "a.recordio", ids, per_chunk=50, bad_chunk=7)
    lost = set(range(350, 400))  # chunk 7's records
    config = make_config(
        tmp_path,
        source={"files": [str(tmp_path / "*.recordio")]},
        pipeline={"on_error": "skip", "batch_size": 16, "mappers": mappers},
    )
    with running_daemon(config) as daemon, Client(daemon.endpoint, timeout_s=10, read_ahead=False) as client:
        for epoch in range(2):
            got = [int(v) for batch in client.epoch() for v in np.asarray(next(iter(batch.values()))).reshape(-1)]
            assert collections.Counter(got) == collections.Counter(i for i in ids if i not in lost)
            assert query_status(daemon.endpoint)["skipped_records"] == len(lost) * (epoch + 1)


@pytest.mark.parametrize("mappers", [[], ["tests.helpers:identity_mapper"]])
@pytest.mark.parametrize("bad", ["ragged", "pickle", "garbage"])
def test_skip_keeps_every_good_record_after_one_that_does_not_decode(tmp_path, mappers, bad):
    import pickle

    from loader.recordio import Writer

    ids = list(range(200))
    with Writer(tmp_path / "a.recordio", max_num_records=64) as writer:
        for value in ids:
            if value == 77:
                if bad == "ragged":
                    writer.write([[1, [2, 3]], "a"])  # no array
                else:
                    writer.write_raw(pickle.dumps((value,)) if bad == "pickle" else b"\xc1")
            else:
                writer.write((np.int64(value),))
    config = make_config(
        tmp_path,
        source={"files": [str(tmp_path / "*.recordio")]},
        pipeline={"on_error": "skip", "batch_size": 16, "mappers": mappers},
    )
    # The reader had stepped past the record, but its error was taken for the end of the file: the 122 records
    # after it never came, and the count said one was skipped.
    with running_daemon(config) as daemon, Client(daemon.endpoint, timeout_s=10, read_ahead=False) as client:
        got = [int(v) for batch in client.epoch() for v in np.asarray(next(iter(batch.values()))).reshape(-1)]
        assert collections.Counter(got) == collections.Counter(i for i in ids if i != 77)
        assert query_status(daemon.endpoint)["skipped_records"] == 1


def test_a_file_that_kills_its_worker_is_skipped_under_skip(tmp_path):
    ids = write_id_files(tmp_path, 3, 200)
    poison = tmp_path / "poison.npy"
    np.save(poison, np.array([123456789], dtype=np.int64))
    config = make_config(tmp_path, pipeline={"on_error": "skip", "mappers": ["tests.helpers:exit_on_123456789"]})
    with running_daemon(config) as daemon, Client(daemon.endpoint, timeout_s=20, read_ahead=False) as client:
        for _ in range(2):
            assert collections.Counter(collect_ids(client.epoch())) == collections.Counter(ids)
        status = query_status(daemon.endpoint)
        assert status["skipped_records"] == 2  # the poison record, once per epoch
    raising = make_config(tmp_path, pipeline={"mappers": ["tests.helpers:exit_on_123456789"]})
    with running_daemon(raising) as daemon, Client(daemon.endpoint, timeout_s=20, read_ahead=False) as client:
        with pytest.raises(WorkerError, match="poison.npy"):
            collect_ids(client.epoch())


# -- item 8: workers that die at start-up ---------------------------------------------------------


def test_workers_that_die_at_start_back_off_and_fail_the_epoch_with_the_cause(tmp_path):
    from loader.service.daemon.workforce import MAX_START_FAILURES

    write_id_files(tmp_path, 2, 50)
    with running_daemon(make_config(tmp_path), worker_entry="tests.helpers:die_at_start") as daemon:
        with Client(daemon.endpoint, timeout_s=10) as client:
            with pytest.raises(WorkerError, match="died before reading a file.*exited with code 7"):
                collect_ids(client.epoch())
            restarts = query_status(daemon.endpoint)["worker_restarts"]
            assert MAX_START_FAILURES <= restarts <= 2 * MAX_START_FAILURES  # backing off, not hundreds
            # The client can ask again, and is told again rather than left waiting.
            with pytest.raises(WorkerError, match="exited with code 7"):
                collect_ids(client.epoch())


@pytest.mark.slow  # the daemon's stall timeout is at least stage.MIN_STALL_TIMEOUT_S (30 s)
def test_an_epoch_with_no_worker_at_all_fails_on_both_sides(tmp_path, monkeypatch):
    from loader.service.client.client import EpochStalledError
    from loader.service.daemon import stage

    # The floor keeps a worker's replacement from being taken for a stall (30 s); nothing is replaced here.
    monkeypatch.setattr(stage, "MIN_STALL_TIMEOUT_S", 1.0)
    write_id_files(tmp_path, 2, 50)
    quick = make_config(tmp_path, workers={"progress_timeout_s": 0.5})
    with running_daemon(quick, start_workers=False) as daemon:  # nobody to read the files
        with Client(daemon.endpoint, timeout_s=10) as client:
            # The daemon's stall is the same exception as the client's own: one ``except`` for both.
            with pytest.raises(EpochStalledError, match="daemon at .*: epoch 0 made no progress for \\d+s.*2 file"):
                collect_ids(client.epoch())
    slow = make_config(tmp_path, workers={"progress_timeout_s": 600.0})
    with running_daemon(slow, start_workers=False) as daemon:
        with Client(daemon.endpoint, timeout_s=10, progress_timeout_s=1.0) as client:
            with pytest.raises(EpochStalledError, match="sent nothing for this epoch"):
                collect_ids(client.epoch())


# -- item 6: memory bounded by configuration, not by file size ------------------------------------


@pytest.mark.slow
def test_a_big_file_and_a_client_that_stops_reading_keep_the_stage_within_its_bound(tmp_path):
    rows, width = 16384, 1024  # 64 MiB of 4 KiB rows (inline: below the shared-memory threshold)
    data = np.lib.format.open_memmap(tmp_path / "big.npy", mode="w+", dtype=np.float32, shape=(rows, width))
    data[:, 0] = np.arange(rows)
    data.flush()
    del data
    batch_size, prefetch, spm = 32, 2, 64
    config = make_config(
        tmp_path,
        pipeline={"batch_size": batch_size},
        workers={"samples_per_message": spm, "shm_arena_mib": 0},
        client={"prefetch": prefetch},
    )
    with running_daemon(config) as daemon:
        with Client(daemon.endpoint, timeout_s=10, prefetch=prefetch) as client:
            batches = client.epoch()
            for _ in range(3):
                next(batches)  # then the training loop stops reading
            session = next(iter(daemon.stage.sessions.values()))
            bound = 2 * daemon.stage.buffer_limit_rows(session.current) + spm  # one chunk may land on the bound
            seen = []
            for _ in range(40):  # while the workers would read on, the stage stays within its bound
                seen.append(query_status(daemon.endpoint)["buffered_samples"])
                time.sleep(0.05)
            assert max(seen) <= bound < rows // 4
            # Reading on delivers the whole file exactly once.
            got = [int(v) for batch in batches for v in batch["data"][:, 0]]
        assert len(got) + 3 * batch_size == rows


def test_a_client_takes_host_port_as_loader_status_does(tmp_path):
    ids = write_id_files(tmp_path, 2, 20)
    with running_daemon(make_config(tmp_path)) as daemon:
        assert daemon.endpoint.startswith("tcp://")
        with Client(daemon.endpoint[len("tcp://") :], timeout_s=10) as client:
            assert collections.Counter(collect_ids(client.epoch())) == collections.Counter(ids)
    with pytest.raises(ConfigError, match="is not a daemon address: give tcp://HOST:PORT, HOST:PORT"):
        Client("no address at all", timeout_s=1)


# -- a data file rewritten while the daemon runs --------------------------------------------------


def _rewrite(path, how):
    """Rewrite ``path`` (an .npy of ids): with more rows, as a FIFO (opening it would wait for a writer), or as
    the same bytes under a later mtime."""
    if how == "size":
        np.save(path, np.arange(10_000, 10_050, dtype=np.int64))
    elif how == "fifo":
        os.remove(path)
        os.mkfifo(path)
    else:
        found = os.stat(path)
        os.utime(path, ns=(found.st_atime_ns, found.st_mtime_ns + 1_000_000_000))


@pytest.mark.parametrize("how", ["size", "fifo"])
def test_a_file_rewritten_between_epochs_fails_the_next_epoch_naming_it(tmp_path, how):
    # The daemon's epoch length, pieces and checkpoints describe the files it found at start-up: a file
    # regenerated under it was served silently, len() saying one thing and the batches another.
    ids = write_id_files(tmp_path, 3, 100)
    config = make_config(tmp_path, pipeline={"shuffle_buffer": 0, "batch_size": 16})
    with running_daemon(config) as daemon:
        with Client(daemon.endpoint, timeout_s=10, read_ahead=False) as client:
            assert sorted(collect_ids(client.epoch(0))) == sorted(ids)
            _rewrite(tmp_path / "f001.npy", how)
            with pytest.raises(WorkerError) as info:
                collect_ids(client.epoch(1))
        err = info.value
        assert err.type_name == "FileChangedError" and os.path.basename(err.file) == "f001.npy"
        assert "changed since the daemon started" in err.message and "restart the daemon" in err.message
        assert "bytes then, " in err.message
        assert query_status(daemon.endpoint)["endpoint"] == daemon.endpoint  # still serving


def test_a_file_of_the_same_bytes_and_a_new_mtime_is_served(tmp_path):
    # A touch, an rsync refresh or a copy on another node without -p: the same file to a reader, not a change.
    ids = write_id_files(tmp_path, 3, 100)
    config = make_config(tmp_path, pipeline={"shuffle_buffer": 0, "batch_size": 16})
    with running_daemon(config) as daemon:
        with Client(daemon.endpoint, timeout_s=10, read_ahead=False) as client:
            assert sorted(collect_ids(client.epoch(0))) == sorted(ids)
            _rewrite(tmp_path / "f001.npy", "mtime")
            assert sorted(collect_ids(client.epoch(1))) == sorted(ids)


def test_a_file_rewritten_between_epochs_is_skipped_under_skip(tmp_path):
    ids = write_id_files(tmp_path, 3, 100)
    config = make_config(tmp_path, pipeline={"shuffle_buffer": 0, "batch_size": 16, "on_error": "skip"})
    with running_daemon(config) as daemon:
        with Client(daemon.endpoint, timeout_s=10, read_ahead=False) as client:
            assert sorted(collect_ids(client.epoch(0))) == sorted(ids)
            _rewrite(tmp_path / "f002.npy", "size")
            assert sorted(collect_ids(client.epoch(1))) == sorted(ids[:200])
        assert query_status(daemon.endpoint)["skipped_records"] == 1  # the file, which was not opened


def test_a_file_of_a_lease_group_rewritten_is_named_not_the_groups_first(tmp_path):
    ids = write_id_files(tmp_path, 6, 20)
    config = make_config(tmp_path, source={"files_per_lease": 3}, pipeline={"shuffle_buffer": 0, "batch_size": 8})
    with running_daemon(config) as daemon:
        with Client(daemon.endpoint, timeout_s=10, read_ahead=False) as client:
            assert sorted(collect_ids(client.epoch(0))) == sorted(ids)
            _rewrite(tmp_path / "f004.npy", "size")
            with pytest.raises(WorkerError) as info:
                collect_ids(client.epoch(1))
        assert os.path.basename(info.value.file) == "f004.npy" and info.value.type_name == "FileChangedError"


def test_a_dataset_of_no_samples_is_served_with_a_warning_that_every_epoch_is_empty(tmp_path, caplog):
    # `loader check` refused it, but `loader serve` and Loader served empty epochs without a word.
    np.save(tmp_path / "empty.npy", np.zeros((0, 4), dtype=np.float32))
    with caplog.at_level(logging.WARNING, logger="loader"):
        with loader.Loader(make_config(tmp_path, workers={"count": 1})) as local:
            assert list(local.epoch()) == []
    assert "dataset 'default' holds no samples: its 1 file(s) have no rows" in caplog.text


def test_far_more_workers_than_cores_are_served_with_a_warning(tmp_path, caplog, monkeypatch):
    # 64 workers on 2 cores started without a word (torch's DataLoader warns of its num_workers).
    from loader.service.daemon import loop

    monkeypatch.setattr(loop, "cpu_count", lambda: 1)
    ids = write_id_files(tmp_path, 2, 20)
    with caplog.at_level(logging.WARNING, logger="loader"):
        with loader.Loader(make_config(tmp_path, workers={"count": 3})) as local:
            assert sorted(collect_ids(local.epoch())) == sorted(ids)
    assert "workers.count = 3 is over 2 times the 1 core(s) this process may use" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="loader"):
        with loader.Loader(make_config(tmp_path, workers={"count": 2})) as local:
            assert sorted(collect_ids(local.epoch())) == sorted(ids)
    assert "core(s) this process may use" not in caplog.text
