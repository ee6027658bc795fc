"""Faults and bad input: dead workers, failing mappers, corrupt files, a daemon that stops."""

from __future__ import annotations

import collections
import logging
import re
import socket
import threading
import time

import pytest

from loader import Client
from loader.config import LoaderConfig
from loader.errors import (
    ConfigError,
    EpochStalledError,
    LoaderError,
    ServiceUnavailableError,
    TransportError,
    WorkerError,
)
from loader.service.client.client import query_status
from loader.service.daemon.loop import Daemon
from tests.helpers import child_pids, wait_until
from tests.integration.conftest import (
    collect_ids,
    connected_workers,
    kill_leased_worker,
    make_config,
    running_daemon,
    silence,
    write_id_files,
)

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("per_lease", [0, 150], ids=["files", "pieces"])  # source.records_per_lease
def test_killed_worker_is_replaced_and_epoch_is_exactly_once(tmp_path, per_lease):
    ids = write_id_files(tmp_path, 4, 400)
    config = make_config(
        tmp_path,
        source={"files": [str(tmp_path / "*.npy")], "records_per_lease": per_lease},
        pipeline={"mappers": ["tests.helpers:slow_sample_2ms"], "batch_size": 40},
        workers={"samples_per_message": 16},
    )
    with running_daemon(config) as daemon:
        assert wait_until(lambda: connected_workers(daemon.endpoint) == 2, timeout_s=20)
        with Client(daemon.endpoint, timeout_s=10) as client:
            got, killed = [], None
            for i, batch in enumerate(client.epoch()):
                got.extend(batch["data"].tolist())
                if i == 3:
                    killed = kill_leased_worker(query_status(daemon.endpoint))
            assert killed is not None
            assert collections.Counter(got) == collections.Counter(ids)
            status = query_status(daemon.endpoint)
            assert status["worker_restarts"] >= 1
            assert killed not in [w["pid"] for w in status["workers"]]
            assert wait_until(lambda: connected_workers(daemon.endpoint) == 2, timeout_s=20)
            # The next epoch is complete too, with the replacement in service.
            assert collections.Counter(collect_ids(client.epoch())) == collections.Counter(ids)


@pytest.mark.parametrize("records_per_lease", [0, 1000], ids=["whole", "pieces"])
def test_a_file_that_hangs_every_worker_fails_saying_so(tmp_path, caplog, records_per_lease):
    from loader.service.daemon.workforce import HUNG_FILE_ATTEMPTS

    caplog.set_level(logging.WARNING, logger="loader.daemon")
    write_id_files(tmp_path, 1, 3100)  # id 3000 is record 3000
    config = make_config(
        tmp_path,
        source={"records_per_lease": records_per_lease},  # in pieces, record 3000 is the first of the fourth
        pipeline={"mappers": ["tests.helpers:hang_on_3000"]},
        workers={"count": 1, "progress_timeout_s": 1.0, "samples_per_message": 16},
    )
    # No read-ahead: the next epoch's file would hang another worker meanwhile.
    with running_daemon(config) as daemon, Client(daemon.endpoint, timeout_s=10, read_ahead=False) as client:
        start = time.monotonic()
        with pytest.raises(WorkerError) as info:
            collect_ids(client.epoch())
        assert time.monotonic() - start < 30, "well before the stall timeout"
        err = info.value
        assert err.type_name == "WorkerDiedError" and err.file.endswith("f000.npy")
        # The daemon stopped the hung workers itself: their SIGTERM is not the cause.
        assert "signal" not in err.message, err.message
        assert err.message.startswith(
            f"file f000.npy hung {HUNG_FILE_ATTEMPTS} workers in a row (no progress for 1 s each"
        )
        assert "a mapper or reader blocks; raise workers.progress_timeout_s" in err.message
        # The chunks before the hung sample arrived (16 samples each, or every 50 ms).
        at = int(re.search(r"nothing arrived from record (\d+) on", err.message).group(1))
        assert 3000 - 16 < at <= 3000, err.message
        # And the record it hung on, as the worker's heartbeats said (numbered in the file, a piece's too).
        assert "; the last was on record 3000)" in err.message and err.record == 3000, err.message
    assert caplog.text.count("made no progress on its lease") == HUNG_FILE_ATTEMPTS


def test_mapper_error_names_file_record_and_cause(tmp_path, caplog):
    caplog.set_level(logging.ERROR, logger="loader.stage")
    write_id_files(tmp_path, 3, 1300)  # id 1234 is record 1234 of file f000
    config = make_config(tmp_path, pipeline={"mappers": ["tests.helpers:fail_on_1234"]})
    with running_daemon(config) as daemon, Client(daemon.endpoint) as client:
        with pytest.raises(WorkerError) as info:
            collect_ids(client.epoch())
        err = info.value
        assert err.type_name == "Boom" and "bad value 1234" in err.message
        assert err.file.endswith("f000.npy") and err.record == 1234
        assert "Traceback" in err.remote_traceback
        # The client stays usable: a later epoch raises the same way rather than hanging.
        with pytest.raises(WorkerError):
            collect_ids(client.epoch())
    # The operator reading the daemon's log sees the failure too, on one line.
    failed = [r.getMessage() for r in caplog.records if "failed:" in r.getMessage()]
    assert failed and failed[0].startswith("epoch 0 of client 1 failed: Boom: bad value 1234"), failed
    assert "f000.npy, record 1234" in failed[0] and all("\n" not in line for line in failed)


def test_skip_mode_skips_counts_and_reports(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="loader.stage")
    ids = write_id_files(tmp_path, 3, 1300)
    (tmp_path / "f999.npy").write_bytes(b"this is not a numpy file")
    config = make_config(tmp_path, pipeline={"mappers": ["tests.helpers:fail_on_1234"], "on_error": "skip"})
    # No read-ahead: the next epoch's skips would be counted too while we look.
    with running_daemon(config) as daemon, Client(daemon.endpoint, read_ahead=False) as client:
        got = collect_ids(client.epoch())
        assert collections.Counter(got) == collections.Counter(i for i in ids if i != 1234)
        assert query_status(daemon.endpoint)["skipped_records"] == 2  # one record, one unreadable file
    assert "skipped 1 bad record(s)" in caplog.text  # and the daemon's log says so


def test_corrupt_file_raises_naming_the_file(tmp_path):
    write_id_files(tmp_path, 2, 100)
    (tmp_path / "f500.npy").write_bytes(b"\x93NUMPY garbage")
    config = make_config(tmp_path)
    with running_daemon(config) as daemon, Client(daemon.endpoint) as client:
        with pytest.raises(WorkerError) as info:
            collect_ids(client.epoch())
        assert info.value.file.endswith("f500.npy")


def test_daemon_stop_ends_workers_and_fails_waiting_client(tmp_path):
    write_id_files(tmp_path, 2, 3000)
    children_before = child_pids()
    config = make_config(tmp_path, pipeline={"mappers": ["tests.helpers:slow_sample_2ms"]})
    with running_daemon(config) as daemon:
        client = Client(daemon.endpoint, timeout_s=10)
        it = client.epoch()
        next(it)
    start = time.monotonic()
    with pytest.raises(ServiceUnavailableError):
        for _ in it:
            pass
    assert time.monotonic() - start < 3
    client.close()
    assert wait_until(lambda: not (child_pids() - children_before), timeout_s=5)


def test_vanished_daemon_is_noticed_within_timeout(tmp_path):
    import threading

    write_id_files(tmp_path, 1, 10)
    daemon = Daemon(make_config(tmp_path), start_workers=False)
    stop = threading.Event()
    thread = threading.Thread(target=daemon.serve, args=(stop,), daemon=True)
    thread.start()
    try:
        client = Client(daemon.endpoint, timeout_s=1.0)
        it = client.epoch()  # no workers: the client waits
        stop.set()  # the daemon goes silent without saying goodbye
        thread.join(5)
        start = time.monotonic()
        with pytest.raises(ServiceUnavailableError, match="silent"):
            next(it)
        assert time.monotonic() - start < 3
        client.close()
    finally:
        stop.set()
        daemon.close()


def test_port_in_use_is_one_clear_error(tmp_path):
    write_id_files(tmp_path, 1, 10)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        config = make_config(tmp_path, service={"bind": f"tcp://127.0.0.1:{port}"})
        with pytest.raises(TransportError, match=f"127.0.0.1:{port}.*address already in use"):
            Daemon(config, start_workers=False)


def test_missing_files_and_empty_list_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="matched no files"):
        Daemon(make_config(tmp_path), start_workers=False)
    listing = tmp_path / "train.list"
    listing.write_text("# nothing here\n")
    config = LoaderConfig.from_dict({"source": {"list_file": str(listing)}})
    with pytest.raises(ConfigError, match="lists no files"):
        Daemon(config, start_workers=False)


def test_hand_started_worker_needs_only_the_address(tmp_path):
    import threading

    from workers.main import run_worker

    ids = write_id_files(tmp_path, 3, 100)
    with running_daemon(make_config(tmp_path), start_workers=False) as daemon:
        stop = threading.Event()
        result = {}
        thread = threading.Thread(
            target=lambda: result.setdefault("rc", run_worker(daemon.endpoint, stop_event=stop)), daemon=True
        )
        thread.start()
        with Client(daemon.endpoint) as client:
            assert collections.Counter(collect_ids(client.epoch())) == collections.Counter(ids)
        stop.set()
        thread.join(5)
    assert result == {"rc": 0}


def test_a_client_replaced_by_another_of_its_job_and_rank_is_told_why(tmp_path):
    write_id_files(tmp_path, 2, 100)
    config = make_config(tmp_path, workers={"count": 1})
    with running_daemon(config) as daemon:
        first = Client(daemon.endpoint, rank=0, world_size=2, job="j", timeout_s=10)
        try:
            silence(first)  # its trainer was killed, but that process still reads what the daemon says
            with Client(daemon.endpoint, rank=0, world_size=2, job="j", timeout_s=10):  # a restarted trainer
                # Before: "no longer knows this client", the reason only in the daemon's log.
                with pytest.raises(ServiceUnavailableError, match="replaced by client .* of the same job and rank"):
                    list(first.epoch())
        finally:
            first.close()


def test_a_hello_for_a_rank_a_live_client_of_another_process_holds_is_refused_and_that_client_reads_on(
    tmp_path, monkeypatch
):
    # One hello of a job's name (easy to guess: "default") and rank ended the live client of that rank, and the
    # job with it (its other ranks wait for that rank's batches). A live client pings: its rank is its own.
    from loader.service.client import client as client_module

    ids = write_id_files(tmp_path, 2, 100)
    config = make_config(tmp_path, workers={"count": 1})
    with running_daemon(config) as daemon:
        with Client(daemon.endpoint, rank=0, world_size=1, timeout_s=10) as alone:
            with Client(daemon.endpoint, rank=1, world_size=2, timeout_s=10) as live:
                started = time.monotonic()
                with monkeypatch.context() as elsewhere:
                    elsewhere.setattr(client_module, "_process_owner", lambda: "another process")
                    with pytest.raises(LoaderError, match=r"rank 1 of job 'default' .* of another process, heard"):
                        Client(daemon.endpoint, rank=1, world_size=2, timeout_s=2)
                assert time.monotonic() - started >= 1.5  # it asked again, for as long as its timeout_s
                assert live._fatal is None and len(daemon.stage.sessions) == 2
            assert sorted(collect_ids(alone.epoch())) == sorted(ids)


def test_a_client_made_anew_in_the_same_process_takes_its_rank_at_once(tmp_path):
    # Lightning's reload_dataloaders_every_n_epochs under DDP makes the new dataloader before it drops the old,
    # and a notebook cell run again makes a second client beside the first: both were refused for timeout_s.
    write_id_files(tmp_path, 2, 100)
    with running_daemon(make_config(tmp_path, workers={"count": 1})) as daemon:
        with Client(daemon.endpoint, rank=0, world_size=2, job="j", timeout_s=10) as first:
            started = time.monotonic()
            with Client(daemon.endpoint, rank=0, world_size=2, job="j", timeout_s=10):
                assert time.monotonic() - started < 1.0
                with pytest.raises(ServiceUnavailableError, match="replaced by client .* of the same job and rank"):
                    list(first.epoch())


def test_a_rank_that_never_comes_is_named_when_the_epoch_stalls(tmp_path, monkeypatch, caplog):
    # Rank 1 of 2 never connects: rank 0 reads its half of what the stage may hold, then waits. The stall's
    # error names the missing rank, not "no record arrived" (records did arrive: they wait for rank 1); and
    # before it, the daemon's log and `loader status` say it (the error came after 360 s by default, silent).
    config = _quick_stall_config(tmp_path, monkeypatch, caplog)
    with running_daemon(config) as daemon, Client(daemon.endpoint, rank=0, world_size=2, timeout_s=10) as client:
        raised: list[BaseException] = []
        thread = threading.Thread(target=lambda: raised.extend(_read_all(client.epoch())), daemon=True)
        thread.start()

        def waiting_for() -> list[list[int] | None]:
            return [c["waiting_for_ranks"] for c in query_status(daemon.endpoint, timeout_s=5)["clients"]]

        assert wait_until(lambda: waiting_for() == [[1]], timeout_s=3.0), waiting_for()
        thread.join(30)
        assert not thread.is_alive()
    ((error,),) = [raised]
    assert isinstance(error, EpochStalledError)  # the daemon's stall, as the client's own would be
    assert re.search(r"rank\(s\) 1 of world_size 2, which never asked for this epoch", str(error)), str(error)
    (note,) = [r.getMessage() for r in caplog.records if "waits for rank" in r.getMessage()]
    assert note.startswith("epoch 0 of job 'default/default/2' waits for rank(s) 1 of world_size 2, which never")
    assert note.endswith("it fails after 3 s without progress"), note


def _read_all(batches) -> list[BaseException]:
    """Read to the end; what it raised, if anything."""
    try:
        for _ in batches:
            pass
    except BaseException as exc:  # the caller checks it
        return [exc]
    return []


def test_ranks_on_different_epochs_after_a_resume_are_named_when_they_stall(tmp_path, monkeypatch, caplog):
    # Only rank 0 loads the checkpoint's state (epoch 1, mid-way); rank 1 starts over at epoch 0. Each stream
    # waits for the rank reading the other: the note and the error say so, and what to do, where they said
    # "which never asked for this epoch" (rank 1 did ask: for another one).
    config = _quick_stall_config(tmp_path, monkeypatch, caplog)
    with running_daemon(config) as daemon:
        with Client(daemon.endpoint, rank=0, world_size=1, timeout_s=10) as alone:
            steps = iter(alone.epoch(1))
            for _ in range(3):
                next(steps)
            state = alone.state_dict()
        ranks = [Client(daemon.endpoint, rank=r, world_size=2, timeout_s=10) for r in range(2)]
        try:
            ranks[0].load_state_dict(state)  # rank 1 does not
            raised: list[list[BaseException]] = [[], []]
            threads = [
                threading.Thread(target=lambda r=r: raised[r].extend(_read_all(ranks[r].epoch())), daemon=True)
                for r in range(2)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(30)
            assert not any(thread.is_alive() for thread in threads)
        finally:
            for client in ranks:
                client.close()
    ((stalled_1,), (stalled_0,)) = raised
    assert isinstance(stalled_1, EpochStalledError) and isinstance(stalled_0, EpochStalledError)
    position = state["position"]
    expected_1 = f"rank(s) 1 of world_size 2, which read another epoch (rank 1: epoch 0, begun at sample 0; this is epoch 1, begun at sample {position})"
    assert expected_1 in str(stalled_1), str(stalled_1)
    expected_0 = f"rank(s) 0 of world_size 2, which read another epoch (rank 0: epoch 1, begun at sample {position}; this is epoch 0"
    assert expected_0 in str(stalled_0), str(stalled_0)
    assert "every rank loads the same state" in str(stalled_0)
    notes = [r.getMessage() for r in caplog.records if "which read another epoch" in r.getMessage()]
    assert len(notes) == 2, notes


def _quick_stall_config(tmp_path, monkeypatch, caplog) -> LoaderConfig:
    """Id files and a config whose epochs stall within seconds (3 s), the note of the ranks waited for at once."""
    import loader.service.daemon.stage as stage_module

    monkeypatch.setattr(stage_module, "MIN_STALL_TIMEOUT_S", 3.0)
    monkeypatch.setattr(stage_module, "RANKS_NOTE_S", 0.2)
    caplog.set_level(logging.WARNING, logger="loader.stage")
    write_id_files(tmp_path, 4, 20_000)
    return make_config(
        tmp_path, pipeline={"batch_size": 100, "shuffle_buffer": 0}, workers={"count": 1, "progress_timeout_s": 0.5}
    )
