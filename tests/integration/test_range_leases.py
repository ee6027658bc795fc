"""Range leases end to end (``source.records_per_lease``): large files cut into leases of records.

The order, resume and fault properties of ``test_order_and_resume`` run with pieces as two of their
kinds of data, and ``test_service_property``/``test_service_faults`` check exactly-once with them; here
one file of more records than a lease: every worker reads it, the batches are the same for any worker
count and across a resume, unshuffled pieces read what the whole file reads, errors name the file and
the record's number in it, a checkpoint of other pieces is refused, and files whose headers give no
record count are leased whole.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest

import loader
from loader.errors import ConfigError, WorkerError
from loader.service import protocol as P
from loader.service.client.client import Client, query_status
from tests.helpers import wait_until
from tests.integration.conftest import (
    collect_ids_meanwhile,
    connected_workers,
    make_config,
    running_daemon,
    write_id_files,
)
from tests.integration.test_hostile_peers import FakeWorker
from tests.integration.test_lease_groups import id_lines_source, ids_of, read_loader

pytestmark = pytest.mark.integration

RECORDS = 1300  # one file: id i is record i (write_id_files starts at 0)
PIECE = 100


def config(directory: Any, *, per_lease: int = PIECE, workers: int = 2, shuffle: int = 32, **pipeline: Any) -> Any:
    return make_config(
        directory,
        source={"files": [str(directory / "*.npy")], "records_per_lease": per_lease},
        pipeline={"batch_size": 8, "shuffle_buffer": shuffle, "seed": 5, **pipeline},
        workers={"count": workers, "samples_per_message": 16},
    )


@pytest.fixture(scope="module")
def one_file(tmp_path_factory: Any) -> tuple[Any, list[int]]:
    directory = tmp_path_factory.mktemp("pieces-data")
    return directory, write_id_files(directory, 1, RECORDS)


def test_one_file_is_read_in_pieces_and_the_batches_do_not_depend_on_the_workers(one_file: Any) -> None:
    directory, ids = one_file
    mapper = {"mappers": ["tests.integration.test_lease_groups:draw"]}  # the id and one draw of its generator
    rows = {}
    for workers in (1, 2, 3):
        with loader.Loader(config(directory, workers=workers, **mapper)) as source:
            rows[workers] = [np.asarray(b["data"]).tolist() for b in source.epoch(1)]
            files = source.status()["files"]
        assert (files["total"], files["leases"]) == (1, RECORDS // PIECE), files
    assert rows[1] == rows[2] == rows[3], "the same batches and draws, batch by batch, whatever the worker count"
    got = [row[0] for batch in rows[1] for row in batch]
    assert sorted(got) == ids and got != ids, "every record once, shuffled"
    for value, drawn in (row for batch in rows[1] for row in batch):
        piece, record = divmod(value, PIECE)  # a mapper's generator: (seed, epoch, piece, record in the piece)
        assert drawn == int(np.random.default_rng((5, 1, piece, record)).integers(2**62))


def test_unshuffled_pieces_read_what_the_whole_file_reads(one_file: Any) -> None:
    directory, ids = one_file
    whole = read_loader(config(directory, per_lease=0, shuffle=0))
    assert [i for b in whole for i in b] == ids
    for per_lease, workers in [(PIECE, 3), (333, 2), (RECORDS, 2), (RECORDS * 2, 1)]:
        assert read_loader(config(directory, per_lease=per_lease, workers=workers, shuffle=0)) == whole, per_lease


def test_a_resume_from_the_middle_of_an_epoch_continues_it(one_file: Any) -> None:
    directory, _ = one_file
    full = read_loader(config(directory, workers=3))
    with loader.Loader(config(directory, workers=1)) as first:
        batches = iter(first.epoch(0))
        head = [ids_of(next(batches)) for _ in range(70)]
        state = first.state_dict()
    assert state["anchor"][1] > 0, "the anchor names a piece past the first"
    with running_daemon(config(directory, workers=2)) as daemon, Client(daemon.endpoint, timeout_s=20) as client:
        client.load_state_dict(state)
        tail = [ids_of(b) for b in client.epoch()]
    assert head + tail == full


def test_a_mapper_failing_inside_a_piece_names_the_file_and_the_record_in_it(one_file: Any) -> None:
    directory, _ = one_file
    cfg = config(directory, mappers=["tests.helpers:fail_on_1234"])  # record 34 of the piece from record 1200
    with running_daemon(cfg) as daemon, Client(daemon.endpoint, timeout_s=20) as client:
        with pytest.raises(WorkerError) as info:
            for _ in client.epoch(0):
                pass
    assert info.value.type_name == "Boom" and "bad value 1234" in info.value.message
    assert (info.value.file, info.value.record) == (str(directory / "f000.npy"), 1234)


def test_a_worker_death_in_a_piece_names_the_records_of_its_lease(tmp_path: Any) -> None:
    values = np.arange(400, dtype=np.int64)
    values[250] = 123456789  # kills its worker, every time
    np.save(tmp_path / "f000.npy", values)
    cfg = config(tmp_path, shuffle=0, mappers=["tests.helpers:exit_on_123456789"])
    with running_daemon(cfg) as daemon, Client(daemon.endpoint, timeout_s=30) as client:
        with pytest.raises(WorkerError) as info:
            for _ in client.epoch(0):
                pass
    assert info.value.type_name == "WorkerDiedError" and info.value.file == str(tmp_path / "f000.npy")
    assert "the lease was records 200 to 299 of f000.npy (source.records_per_lease)" in info.value.message


def test_a_resume_with_other_pieces_is_refused(tmp_path: Any) -> None:
    # An anchor names a piece by its place in the lease list and a record in it: with other pieces the
    # resumed epoch would repeat some samples and miss others without a word.
    write_id_files(tmp_path, 2, [300, 500])
    with loader.Loader(config(tmp_path, workers=1)) as first:
        batches = iter(first.epoch(0))
        for _ in range(40):
            next(batches)
        state = first.state_dict()
    with loader.Loader(config(tmp_path, per_lease=2 * PIECE)) as other:
        with pytest.raises(ConfigError, match=r"records_per_lease \(100 in the state, 200 now\)"):
            other.load_state_dict(state)
    np.save(tmp_path / "f000.npy", np.arange(350, dtype=np.int64))  # 50 records more: one piece more
    with loader.Loader(config(tmp_path)) as grown:
        with pytest.raises(ConfigError, match="lease_pieces .* a file's record count changed"):
            grown.load_state_dict(state)


def test_files_whose_headers_give_no_record_count_are_leased_whole(tmp_path: Any, caplog: Any) -> None:
    (tmp_path / "f001.txt").write_text("".join(f"{i}\n" for i in range(5000, 5250)))
    cfg = make_config(
        tmp_path,
        source=id_lines_source(tmp_path, records_per_lease=PIECE),
        pipeline={"batch_size": 8, "seed": 5},
    )
    caplog.set_level(logging.INFO, logger="loader.daemon")
    with running_daemon(cfg) as daemon, Client(daemon.endpoint, timeout_s=20) as client:
        got = [i for b in client.epoch(0) for i in ids_of(b)]
        files = query_status(daemon.endpoint)["files"]
    assert got == list(range(5000, 5250)) and (files["total"], files["leases"]) == (1, 1)
    noted = [r.getMessage() for r in caplog.records if "give no record count" in r.getMessage()]
    assert noted == [
        "dataset 'default': 1 of 1 files (f001.txt first) give no record count in their headers: leased whole "
        "(source.records_per_lease cuts .npy and .npz files)"
    ]


def test_chunks_of_records_past_a_piece_are_refused(tmp_path: Any) -> None:
    # The daemon knows a piece's record count: a worker that sends records past it (file rows of the next
    # piece pass the file's own checks) would give those records twice, or start a re-lease past the piece.
    ids = write_id_files(tmp_path, 1, 300)
    # The fake forges as soon as it holds its lease (a lease that sends nothing for progress_timeout_s is taken
    # back, and its chunks then count as a lost worker's stale data, not as refused: a loaded CI waited past it
    # for a first batch before forging), then says goodbye, so its lease goes to the real worker at once.
    cfg = make_config(
        tmp_path,
        source={"files": [str(tmp_path / "*.npy")], "records_per_lease": PIECE},
        pipeline={"batch_size": 8, "shuffle_buffer": 0, "seed": 5},
        workers={"count": 1, "samples_per_message": 16, "heartbeat_timeout_s": 6.0, "progress_timeout_s": 3.0},
    )
    with running_daemon(cfg) as daemon:
        assert wait_until(lambda: connected_workers(daemon.endpoint) >= 1, timeout_s=30)
        fake = FakeWorker(daemon.endpoint)
        try:
            before = query_status(daemon.endpoint)["rejected_messages"]
            with Client(daemon.endpoint, timeout_s=30) as client:
                fake.ask_lease()
                # Asked at the first batch, which the reading thread waits for: the fake, which asked first, gets
                # the first lease (a stage left full would stop reading every worker's data).
                read = collect_ids_meanwhile(client.epoch(0))
                lease = fake.lease()
                assert lease.piece is not None
                first, count = lease.piece
                tag = {"stream": lease.stream, "file": lease.file, "lease": lease.lease, "worker": fake.welcome.worker}
                spec = {"data": {0: ["<i8", []]}}  # the id files hold int64 scalars
                fake.heartbeat()
                for record in range(count + 3):  # the piece's records, then 3 of the next piece's as file rows
                    chunk = P.Chunk(**tag, token=lease.token, record=record, count=1, refs=spec)
                    fake.data.send(P.encode(chunk, {"data": np.array([[-2, first + record, 0]], dtype=np.int64)}))
                refused = lambda: query_status(daemon.endpoint)["rejected_messages"] >= before + 3  # noqa: E731
                assert wait_until(lambda: fake.heartbeat() or refused())
                fake.peer.send(P.encode(P.Bye()))  # its lease goes to the real worker, from the piece's end
                got = read()
        finally:
            fake.close()
    assert got == ids
