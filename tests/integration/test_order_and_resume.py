"""One order per seed, equal batches on every rank, and mid-epoch resume (also elastic), end to end.

Every check compares whole batch sequences (ids in order, batch by batch), never just sets.
"""

from __future__ import annotations

import collections
import contextlib
import random
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import loader
import loader.torch
from loader.errors import ConfigError, WorkerError
from loader.service.client.client import Client, query_status
from tests.integration.conftest import kill_leased_worker, make_config, running_daemon, silence, write_id_files

pytestmark = pytest.mark.integration

SIZES = [37, 120, 5, 64, 200, 1, 90, 143]  # uneven files: chunks, files and steps never line up


# Every property runs over six kinds of data: small rows (inline frames); 64 KiB rows (the id
# repeated), which travel as references into the files themselves or through the shared-memory arenas;
# small rows in small files leased three at a time (``source.files_per_lease``); and files cut into
# leases of PIECE records (``source.records_per_lease``), of small rows and of 64 KiB file rows.
PIECE = 24
ROW_KINDS: dict[str, dict[str, dict[str, Any]]] = {
    "small": {},
    "file_rows": {"workers": {"file_rows": True}},
    "arena": {"workers": {"file_rows": False}},
    "lease_groups": {"source": {"files_per_lease": 3}},
    "pieces": {"source": {"records_per_lease": PIECE}},
    "piece_file_rows": {"source": {"records_per_lease": PIECE}, "workers": {"file_rows": True}},
}
BIG_ROW_KINDS = ("file_rows", "arena", "piece_file_rows")
SLOW_KINDS = ("lease_groups", "pieces", "piece_file_rows")  # few records a lease: workers kill tests slow down
BIG_ROW_VALUES = 8192  # int64: 64 KiB, the smallest row sent by reference
_KIND_OF: dict[str, str] = {}  # data directory -> its kind


@pytest.fixture(scope="module", params=list(ROW_KINDS))
def data(request: Any, tmp_path_factory: Any) -> tuple[Any, list[int]]:
    directory = tmp_path_factory.mktemp(f"order-data-{request.param}")
    ids = write_id_files(directory, len(SIZES), SIZES)
    if request.param in BIG_ROW_KINDS:
        for i in range(len(SIZES)):
            base = np.load(directory / f"f{i:03d}.npy")
            np.save(directory / f"f{i:03d}.npy", np.repeat(base[:, None], BIG_ROW_VALUES, axis=1))
    _KIND_OF[str(directory)] = request.param
    return directory, ids


def small_only(data: tuple[Any, list[int]]) -> None:
    """Skip a test whose subject is not how rows travel (it runs on small rows only)."""
    if _KIND_OF.get(str(data[0])) in BIG_ROW_KINDS:
        pytest.skip("not about how rows travel: run on small rows only")


def sections_of(directory: Any) -> dict[str, dict[str, Any]]:
    return ROW_KINDS[_KIND_OF.get(str(directory), "small")]


def config(directory: Any, *, workers: int = 2, transport: str = "zmq", shuffle: int = 50, **pipeline: Any) -> Any:
    sections = sections_of(directory)
    return make_config(
        directory,
        source={"files": [str(directory / "*.npy")], **sections.get("source", {})},
        pipeline={"batch_size": 8, "shuffle_buffer": shuffle, "seed": 11, **pipeline},
        workers={
            "count": workers,
            "transport": transport,
            "samples_per_message": 16,
            **sections.get("workers", {}),
        },
    )


def ids_of(batch: dict[str, Any]) -> list[int]:
    """The ids of a batch's samples (the first value of each row: big rows repeat their id)."""
    data = batch["data"]
    return [int(v) for v in data.reshape(len(data), -1)[:, 0]]


def read_loader(cfg: Any, epoch: int = 0) -> list[list[int]]:
    with loader.Loader(cfg) as data:
        return [ids_of(b) for b in data.epoch(epoch)]


@contextlib.contextmanager
def clients(endpoint: str, world_size: int, **options: Any) -> Iterator[list[Client]]:
    made = [Client(endpoint, rank=r, world_size=world_size, timeout_s=20, **options) for r in range(world_size)]
    try:
        yield made
    finally:
        for client in made:
            client.close()


def read_ranks(ranks: list[Client], epoch: int | None = None, stop_after: int | None = None) -> list[list[list[int]]]:
    """Batches per rank, read in lockstep as data-parallel training does (step k of every rank, then k+1)."""
    iterators = [iter(c.epoch(epoch)) for c in ranks]
    out: list[list[list[int]]] = [[] for _ in ranks]
    while stop_after is None or len(out[0]) < stop_after:
        got = [next(it, None) for it in iterators]
        if all(g is None for g in got):
            break
        assert all(g is not None for g in got), "every rank gets the same number of batches"
        for r, batch in enumerate(got):
            out[r].append(ids_of(batch))
    return out


def test_one_order_whatever_the_workers_and_transport(data: Any) -> None:
    directory, ids = data
    reference = read_loader(config(directory, workers=1))
    assert sorted(i for b in reference for i in b) == sorted(ids)
    assert reference != [sorted(b) for b in reference], "shuffled"
    for workers, transport in [(3, "zmq"), (2, "pipe"), (4, "queue")]:
        assert read_loader(config(directory, workers=workers, transport=transport)) == reference, (workers, transport)
    with running_daemon(config(directory, workers=2)) as daemon, clients(daemon.endpoint, 1) as [client]:
        assert [ids_of(b) for b in client.epoch(0)] == reference, "the daemon and the in-process Loader agree"
    assert read_loader(config(directory), epoch=1) != reference, "another epoch, another order"


def test_shared_memory_and_no_shuffle_keep_the_order(data: Any, tmp_path: Any) -> None:
    small_only(data)
    directory, ids = data
    plain = read_loader(config(directory, shuffle=0))
    assert [i for b in plain for i in b] == ids, "without a shuffle: files in name order, records in order"
    assert read_loader(config(directory, shuffle=0, workers=3)) == plain
    big = tmp_path / "big"
    big.mkdir()
    rows = write_id_files(big, 3, [9, 14, 6])
    for i in range(3):  # 64 KiB rows travel through the shared-memory arenas
        base = np.load(big / f"f{i:03d}.npy")
        np.save(big / f"f{i:03d}.npy", np.repeat(base[:, None], 8192, axis=1))
    with_shm = read_loader(config(big, shuffle=4, workers=2))
    no_shm = make_config(
        big,
        pipeline={"batch_size": 8, "shuffle_buffer": 4, "seed": 11},
        workers={"count": 3, "shm_arena_mib": 0, "samples_per_message": 16},
    )
    assert sorted(i for b in with_shm for i in b) == sorted(rows)
    assert read_loader(no_shm) == with_shm


@pytest.mark.parametrize("world_size", [2, 3])
def test_every_rank_gets_equal_batches_cut_from_one_global_sequence(data: Any, world_size: int) -> None:
    directory, ids = data
    single = [i for b in read_loader(config(directory)) for i in b]
    with running_daemon(config(directory, workers=2)) as daemon, clients(daemon.endpoint, world_size) as ranks:
        per_rank = read_ranks(ranks, 0)
    steps = len(per_rank[0])
    assert all(len(r) == steps for r in per_rank)
    global_order = [i for k in range(steps) for r in range(world_size) for i in per_rank[r][k]]
    padding = len(global_order) - len(ids)
    assert 0 <= padding <= world_size - 1
    assert global_order[: len(ids)] == single, "ranks are cuts of the same sequence the whole epoch is"
    assert collections.Counter(global_order[: len(ids)]) == collections.Counter(ids)
    assert all(len(per_rank[r][k]) == 8 for r in range(world_size) for k in range(steps - 1))


def test_a_job_restarted_while_its_old_ranks_are_still_known_reads_one_stream(data: Any) -> None:
    """A trainer restarted faster than the heartbeat timeout: its new ranks replace the old sessions. Old rank
    0 had started the epoch, old rank 1 not; new rank 1 was given old rank 0's stream (never asked there by
    rank 1), new rank 0 a new one, and each waited on the other's stream until the stall error."""
    small_only(data)
    directory, _ = data
    with running_daemon(config(directory)) as daemon:
        with clients(daemon.endpoint, 2, job="reference") as ranks:
            expected = [read_ranks(ranks, epoch) for epoch in (0, 1)]
        with clients(daemon.endpoint, 2, job="train") as old:
            next(iter(old[0].epoch(0)))  # old rank 1 never asked
            for client in old:
                silence(client)  # the old trainer was killed
            with clients(daemon.endpoint, 2, job="train") as new:  # the restart
                assert read_ranks(new, 0) == expected[0]
        # At an epoch's end: the old ranks read epoch 0, old rank 0 began epoch 1, and the new ranks resume at 1.
        with clients(daemon.endpoint, 2, job="train") as old:
            assert read_ranks(old, 0) == expected[0]
            next(iter(old[0].epoch(1)))
            for client in old:
                silence(client)
            with clients(daemon.endpoint, 2, job="train") as new:
                assert read_ranks(new, 1) == expected[1]


def test_an_epoch_taken_for_its_len_alone_asks_the_daemon_nothing(data: Any) -> None:
    """len(client.epoch(0)) before iterating client.epoch(0), on one rank or on each: epoch() asked the daemon at
    once, and the ranks' requests, paired in order, paired the len() one with the other rank's read one: a stall."""
    small_only(data)
    directory, _ = data
    with running_daemon(config(directory)) as daemon:
        with clients(daemon.endpoint, 2, job="reference") as ranks:
            expected = read_ranks(ranks, 0)
        for asking in ([0], [0, 1]):
            with clients(daemon.endpoint, 2, job=f"len-on-{len(asking)}") as ranks:
                assert [len(ranks[r].epoch()) for r in asking] == [len(expected[0])] * len(asking)
                assert read_ranks(ranks) == expected, "the next epoch() is the same epoch 0"


def test_an_epoch_taken_for_its_len_alone_moves_the_client_nowhere(data: Any) -> None:
    """epoch() moved on at the call: len(client.epoch()) then client.epoch() read epoch 1, and after
    load_state_dict the len() call used up the resume place, so the epoch iterated started over elsewhere."""
    small_only(data)
    directory, _ = data
    with running_daemon(config(directory)) as daemon:
        with clients(daemon.endpoint, 1) as [c]:
            whole = [ids_of(b) for b in c.epoch(0)]
        with clients(daemon.endpoint, 1) as [c]:
            assert len(c.epoch()) == len(whole)
            assert [ids_of(b) for b in c.epoch()] == whole
            it = c.epoch(0)
            head = [ids_of(next(it)) for _ in range(5)]
            state = c.state_dict()
        with clients(daemon.endpoint, 1) as [c]:
            c.load_state_dict(state)
            assert len(c.epoch()) == len(whole) - 5
            assert head + [ids_of(b) for b in c.epoch()] == whole


def test_drop_last_drops_the_incomplete_step_on_every_rank(data: Any) -> None:
    directory, ids = data
    with (
        running_daemon(config(directory, drop_last=True)) as daemon,
        clients(daemon.endpoint, 3) as ranks,
    ):
        per_rank = read_ranks(ranks, 0)
    assert len(per_rank[0]) == len(ids) // 24
    assert all(len(b) == 8 for r in per_rank for b in r)


def tick_1ms(sample: Any) -> Any:
    """Slow enough an epoch of lease groups (three leases), or of pieces of PIECE records, that a worker
    holds one when it is killed."""
    time.sleep(0.001)
    return sample


def test_killing_workers_mid_epoch_changes_nothing(data: Any) -> None:
    directory, _ = data
    slow = (
        {"mappers": ["tests.integration.test_order_and_resume:tick_1ms"]}
        if _KIND_OF[str(directory)] in SLOW_KINDS
        else {}
    )
    reference = read_loader(config(directory, workers=1, **slow))
    with running_daemon(config(directory, workers=3, **slow)) as daemon, clients(daemon.endpoint, 1) as [client]:
        got, killed = [], 0
        for batch in client.epoch(0):
            got.append(ids_of(batch))
            status = query_status(daemon.endpoint)
            if killed < 2 and any(w["leases"] and w["alive"] for w in status["workers"]):
                with contextlib.suppress(AssertionError):  # each one listed was killed already
                    kill_leased_worker(status)
                    killed += 1
    assert killed >= 1
    assert got == reference


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_resume_at_random_points_continues_the_uninterrupted_run(data: Any, seed: int) -> None:
    directory, _ = data
    full = read_loader(config(directory))
    cut = random.Random(seed).randrange(1, len(full))
    with loader.Loader(config(directory, workers=1)) as first:
        head = []
        for batch in first.epoch(0):
            head.append(ids_of(batch))
            if len(head) == cut:
                break
        state = first.state_dict()
    assert state["epoch"] == 0 and state["position"] == cut * 8
    # Another worker count and transport, and a daemon instead of the in-process Loader.
    with running_daemon(config(directory, workers=3, transport="zmq")) as daemon, clients(daemon.endpoint, 1) as [c]:
        c.load_state_dict(state)
        rest = c.epoch()
        assert len(rest) == len(full) - cut
        tail = [ids_of(b) for b in rest]
        assert c.state_dict()["epoch"] == 1 and c.state_dict()["position"] == 0
    assert head + tail == full


def test_a_state_taken_before_the_batches_a_loop_holds_gives_them_again(data: Any) -> None:
    # A loop that takes batches ahead of the step it trains (Lightning holds one where len() is unknown) saves
    # state_dict(held=n): a resume gives those n again, then the rest, as the uninterrupted epoch.
    small_only(data)
    directory, _ = data
    with running_daemon(config(directory)) as daemon, clients(daemon.endpoint, 1) as [c]:
        full = [ids_of(b) for b in c.epoch(0)]
        ended = c.state_dict(held=2)  # after the epoch's end too: before its last two batches
        states = {}
        for i, _ in enumerate(c.epoch(0)):
            if i in (0, 1, 6):
                states[i + 1] = {held: c.state_dict(held=held) for held in range(min(i + 1, 3))}
            if i == 1:
                with pytest.raises(ValueError, match="held=3, but the loop took 2 batch"):
                    c.state_dict(held=3)
            if i == 6:
                with pytest.raises(ValueError, match="held=5"):
                    c.state_dict(held=5)
                break
        c.load_state_dict(states[7][0])
        with pytest.raises(ValueError, match="since a state was loaded"):
            c.state_dict(held=1)
        for taken, by_held in [*states.items(), (len(full), {2: ended})]:
            for held, state in by_held.items():
                c.load_state_dict(state)
                assert [ids_of(b) for b in c.epoch()] == full[taken - held :], (taken, held)


def test_resume_from_a_daemon_into_a_loader_and_the_next_epochs_follow(data: Any) -> None:
    directory, _ = data
    with loader.Loader(config(directory)) as whole:
        epochs = [[ids_of(b) for b in whole.epoch()] for _ in range(2)]
    with running_daemon(config(directory, workers=2)) as daemon, clients(daemon.endpoint, 1) as [c]:
        it = c.epoch()
        head = [ids_of(next(it)) for _ in range(5)]
        state = c.state_dict()
    with loader.Loader(config(directory, workers=1, transport="pipe")) as resumed:
        resumed.load_state_dict(state)
        tail = [ids_of(b) for b in resumed.epoch()]
        following = [ids_of(b) for b in resumed.epoch()]
    assert head + tail == epochs[0]
    assert following == epochs[1]


def test_a_state_loaded_while_an_epoch_is_iterated_ends_that_iteration(data: Any) -> None:
    # A loop that rolls back (a NaN loss) loads an earlier state mid-epoch. The open iterator went on reading
    # the old place while state_dict() said the loaded one, so a checkpoint then replayed batches, and a Loader
    # iterating its epochs ran the loaded epoch twice and the last one never.
    small_only(data)
    directory, _ = data
    with loader.Loader(config(directory, epochs=2)) as whole:
        reference = [ids_of(b) for b in whole]
    with loader.Loader(config(directory, epochs=2)) as data_:
        taken = []
        iterator = iter(data_)
        for _ in range(10):
            taken.append(ids_of(next(iterator)))
        early = data_.state_dict()
        for _ in range(20):
            taken.append(ids_of(next(iterator)))
        data_.load_state_dict(early)
        assert data_.state_dict() == early
        with pytest.raises(loader.errors.ClosedError, match=r"ended by load_state_dict\(\)"):
            next(iterator)
        assert data_.state_dict() == early  # where the loop is now: the loaded place, and it stays true
        rest = [ids_of(b) for b in data_]  # the next iteration continues from it, through the last epoch
    assert taken == reference[:30]
    assert rest == reference[10:]


def test_resume_reads_only_from_the_anchor_window(data: Any, tmp_path: Any) -> None:
    sizes = [400] * 25  # 10,000 samples; shuffle window 8 x 50 = 400 samples
    ids = write_id_files(tmp_path, len(sizes), sizes)
    cfg = config(tmp_path, workers=2)
    with loader.Loader(cfg) as first:
        it = first.epoch()
        for _ in range(1000):  # 8,000 samples in
            next(it)
        state = first.state_dict()
    with running_daemon(cfg) as daemon, clients(daemon.endpoint, 1, read_ahead=False) as [c]:
        c.load_state_dict(state)
        tail = [i for b in c.epoch() for i in b["data"].reshape(-1).tolist()]
        read = query_status(daemon.endpoint)["samples_in"]
    assert len(tail) == len(ids) - 8000
    assert read <= len(ids) - 8000 + 400 + 400, "at most the position's window and one file more are read again"


@pytest.mark.parametrize(("before", "after"), [(2, 3), (2, 1), (3, 2)])
def test_elastic_resume_delivers_every_sample_once(data: Any, before: int, after: int) -> None:
    directory, ids = data
    with running_daemon(config(directory, workers=2)) as daemon:
        with clients(daemon.endpoint, before) as ranks:
            head = read_ranks(ranks, 0, stop_after=4)
            states = [r.state_dict() for r in ranks]
        assert len({s["position"] for s in states}) == 1, "ranks in lockstep stand at the same place"
        with clients(daemon.endpoint, after, job="resumed") as ranks:
            # len() of loader.torch's DataLoader, which Lightning compares with the steps it counted before the
            # checkpoint (4): the whole epoch at the new world size made it end a grown job's epoch early.
            adapter = loader.torch.DataLoader(ranks[0])
            adapter.load_state_dict({"epoch": 0, "resume": True, "reader": states[0]})  # its state_dict's form
            resumed_len = len(adapter)
            for r in ranks:
                r.load_state_dict(states[0])
            tail = read_ranks(ranks)
        assert resumed_len == 4 + len(tail[0])
    seen = [i for rank in head for b in rank for i in b] + [i for rank in tail for b in rank for i in b]
    counts = collections.Counter(seen)
    assert set(counts) == set(ids), "every sample is delivered"
    assert sum(counts.values()) - len(ids) <= after - 1, "and once, up to the last step's padding"


def test_bad_states_are_refused_with_one_clear_error(data: Any, tmp_path: Any) -> None:
    small_only(data)
    directory, _ = data
    with loader.Loader(config(directory)) as first:
        next(iter(first.epoch()))
        state = first.state_dict()
    with loader.Loader(config(directory, batch_size=16)) as other:
        with pytest.raises(ConfigError, match=r"batch_size \(8 in the state, 16 now\)"):
            other.load_state_dict(state)
    with loader.Loader(config(directory, seed=12)) as other:
        with pytest.raises(ConfigError, match="seed"):
            other.load_state_dict(state)
        truncated = {k: v for k, v in state.items() if k != "anchor"}
        with pytest.raises(ConfigError, match="missing anchor"):
            other.load_state_dict(truncated)
        with pytest.raises(ConfigError, match="newer"):
            other.load_state_dict({**state, "version": 99})
        with pytest.raises(ConfigError, match="a dict"):
            other.load_state_dict("epoch 3")  # type: ignore[arg-type]
    with loader.Loader(config(directory)) as same:
        # Numbers the daemon would count on from past what its messages carry: the client died of its own batch.
        for huge in ({"position": 2**62 - 1}, {"epoch": 2**64}, {"anchor": [2**60, 0, 0]}):
            with pytest.raises(ConfigError, match=r"in \[0, 2\*\*60\)"):
                same.load_state_dict({**state, **huge})
    with loader.Loader(config(directory)) as same:
        # Outside its anchor's window, in a state without a check value (as older loaders wrote), which the client
        # cannot tell from a true one: the daemon refuses the epoch.
        forged = {k: v for k, v in {**state, "position": 10**6}.items() if k != "check"}
        same.load_state_dict(forged)
        with pytest.raises(WorkerError, match="does not lie in its anchor"):
            list(same.epoch())


def test_a_state_of_other_files_under_the_same_names_is_refused(data: Any, tmp_path: Any) -> None:
    """Other files (another directory, the same names, other sizes) are another config; the same files moved
    elsewhere are not."""
    small_only(data)
    directory, _ = data
    with loader.Loader(config(directory)) as first:
        next(iter(first.epoch()))
        state = first.state_dict()
    others, moved = tmp_path / "others", tmp_path / "moved"
    for made in (others, moved):
        made.mkdir()
        _KIND_OF[str(made)] = _KIND_OF[str(directory)]  # the same config but for where its files are
    write_id_files(others, len(SIZES), [size + 1 for size in SIZES])  # f000.npy ... as in ``data``
    with loader.Loader(config(others)) as other:
        with pytest.raises(ConfigError, match="file_sizes .*other files"):
            other.load_state_dict(state)
    for path in directory.glob("*.npy"):
        (moved / path.name).write_bytes(path.read_bytes())
    with loader.Loader(config(moved)) as same:
        same.load_state_dict(state)
        assert [ids_of(b) for b in same.epoch()] == read_loader(config(directory))[1:]


def test_state_is_small_and_json(data: Any) -> None:
    small_only(data)
    import json

    directory, _ = data
    with loader.Loader(config(directory)) as data_loader:
        assert data_loader.state_dict()["position"] == 0
        next(iter(data_loader.epoch()))
        text = json.dumps(data_loader.state_dict())
    assert len(text) < 4096


RNG_MAPPERS = """
import numpy as np


def tag(sample, rng):
    (value,) = sample
    return (np.array([int(value), int(rng.integers(2**62))], dtype=np.int64),)


def tag_again(sample, *, rng):  # keyword-only: gets the same sample's generator, after ``tag`` drew from it
    (row,) = sample
    return (np.array([row[0], row[1], int(rng.integers(2**62))], dtype=np.int64),)


def plain(sample):
    return sample
"""


def test_mappers_with_rng_draw_from_seed_epoch_file_and_record(data: Any, tmp_path: Any) -> None:
    small_only(data)
    if _KIND_OF.get(str(data[0])) == "lease_groups":
        pytest.skip("with lease groups the generator's file and record are the group's (tested in test_lease_groups)")
    directory, _ = data
    (tmp_path / "rng_mappers.py").write_text(RNG_MAPPERS)
    per_lease = sections_of(directory).get("source", {}).get("records_per_lease", 0)

    def cfg(workers: int) -> Any:
        return loader.config.LoaderConfig.from_dict(
            {
                "source": {"files": [str(directory / "*.npy")], "records_per_lease": per_lease},
                "pipeline": {
                    "batch_size": 8,
                    "shuffle_buffer": 50,
                    "seed": 11,
                    "mappers": ["rng_mappers:tag", "rng_mappers:plain", "rng_mappers:tag_again"],
                },
                "workers": {"count": workers, "samples_per_message": 16, "heartbeat_timeout_s": 2.0},
                "service": {"bind": "tcp://127.0.0.1:*"},
                "import_path": [str(tmp_path)],
            }
        )

    # id -> (lease key, record in the lease), from how write_id_files lays ids out: a file of more than
    # records_per_lease records is leases of that many, each numbered from 0.
    where: dict[int, tuple[int, int]] = {}
    start, key = 0, 0
    for size in SIZES:
        per = per_lease if 0 < per_lease < size else size
        for first in range(0, size, per):
            for record in range(first, min(size, first + per)):
                where[start + record] = (key, record - first)
            key += 1
        start += size + 1000

    def rows(batches: Any) -> list[list[list[int]]]:
        return [np.asarray(b["data"]).tolist() for b in batches]

    with loader.Loader(cfg(1)) as data_1:
        one = [rows(data_1.epoch(e)) for e in (0, 1)]
    with running_daemon(cfg(3)) as daemon, clients(daemon.endpoint, 1) as [client]:
        three = [rows(client.epoch(e)) for e in (0, 1)]
    assert one == three, "the same draws, batch by batch, whatever the worker count"
    for epoch, batches in enumerate(one):
        for row in (r for batch in batches for r in batch):
            expected = np.random.default_rng((11, epoch, *where[row[0]]))
            assert row[1:] == [int(expected.integers(2**62)), int(expected.integers(2**62))]
    assert one[0] != one[1], "each epoch draws afresh"


def test_a_daemon_killed_mid_epoch_is_resumed_on_a_new_one_with_other_workers(data: Any, tmp_path: Any) -> None:
    import os
    import signal
    import subprocess
    import sys

    from loader.service.address_file import read_address_file
    from tests.helpers import wait_until

    directory, _ = data
    full = read_loader(config(directory))
    toml = tmp_path / "train.toml"
    grouped = sections_of(directory).get("source", {}).get("files_per_lease", 1)
    pieces = sections_of(directory).get("source", {}).get("records_per_lease", 0)
    toml.write_text(
        f'[source]\nfiles = ["{directory}/*.npy"]\nfiles_per_lease = {grouped}\nrecords_per_lease = {pieces}\n'
        "[pipeline]\nbatch_size = 8\nshuffle_buffer = 50\nseed = 11\n"
        "[workers]\nsamples_per_message = 16\nheartbeat_timeout_s = 2.0\n"
    )

    def serve(workers: int, name: str) -> tuple[subprocess.Popen, str]:
        path = tmp_path / name
        command = [sys.executable, "-m", "loader.cli", "serve", str(toml), "--bind", "tcp://127.0.0.1:*"]
        process = subprocess.Popen([*command, "--workers", str(workers), "--address-file", str(path)])
        assert wait_until(path.exists, timeout_s=30, interval_s=0.05), "the daemon wrote no address"
        return process, read_address_file(str(path))

    first, address = serve(3, "first")
    try:
        with Client(address, timeout_s=20) as client:
            it = iter(client.epoch())
            head = [ids_of(next(it)) for _ in range(7)]
            state = client.state_dict()
            os.kill(first.pid, signal.SIGKILL)  # no goodbye: the client only has its state
            assert first.wait(timeout=10) == -signal.SIGKILL
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(timeout=10)
    second, address = serve(1, "second")
    try:
        with Client(address, timeout_s=20) as client:
            client.load_state_dict(state)
            tail = [ids_of(b) for b in client.epoch()]
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(timeout=20)
    assert head + tail == full


SKIPPING_MAPPER = """
def bad(sample, rng):
    (value,) = sample
    if int(value) % 19 == 0:  # about 5% of the records
        raise ValueError(f"bad {int(value)}")
    return sample
"""


@pytest.mark.parametrize("per_lease", [0, 64], ids=["files", "pieces"])
def test_records_skipped_by_leases_that_were_cut_are_counted_once(tmp_path: Any, per_lease: int) -> None:
    sizes = [500, 37, 400, 1, 250, 300, 90, 400]
    ids = write_id_files(tmp_path, len(sizes), sizes)
    (tmp_path / "skipping.py").write_text(SKIPPING_MAPPER)

    def run(workers: int) -> tuple[list[list[int]], int]:
        cfg = loader.config.LoaderConfig.from_dict(
            {
                "source": {"files": [str(tmp_path / "*.npy")], "records_per_lease": per_lease},
                "pipeline": {"batch_size": 8, "seed": 3, "mappers": ["skipping:bad"], "on_error": "skip"},
                "workers": {"count": workers, "samples_per_message": 4},
                "service": {"bind": "tcp://127.0.0.1:*", "reorder_window_mib": 0},  # a small window: many cuts
                "import_path": [str(tmp_path)],
            }
        )
        with loader.Loader(cfg) as local:
            batches = [ids_of(b) for b in local.epoch(0)]
            return batches, local.status()["skipped_records"]

    bad = sum(1 for i in ids if i % 19 == 0)
    one, skipped_one = run(1)
    three, skipped_three = run(3)
    assert sorted(i for b in one for i in b) == sorted(i for i in ids if i % 19)
    assert three == one
    assert skipped_one == skipped_three == bad


def test_ranks_resumed_from_states_of_different_steps_are_warned_of(data: Any, caplog: Any) -> None:
    """Each such rank reads a stream of its own, so their batch counts for the rest of the epoch differ (DDP's
    collectives would hang at its end): not refused (a job restarted before its old ranks were seen leaving
    looks alike for a moment), but the daemon's log says so, naming the ranks and both places."""
    small_only(data)
    directory, _ = data
    with running_daemon(config(directory, workers=1)) as daemon:
        with clients(daemon.endpoint, 2) as ranks:
            steps = [iter(r.epoch(0)) for r in ranks]
            for _ in range(3):
                [next(step) for step in steps]
            early = ranks[0].state_dict()
            for _ in range(2):
                [next(step) for step in steps]
            late = ranks[1].state_dict()
        assert early["epoch"] == late["epoch"] == 0 and early["position"] != late["position"]
        with caplog.at_level("WARNING", logger="loader.daemon"):
            with clients(daemon.endpoint, 2, job="resumed") as ranks:
                ranks[0].load_state_dict(early)
                ranks[1].load_state_dict(late)
                # Each rank's stream waits for the other rank, which reads elsewhere: a step each, no more.
                firsts = [ids_of(next(iter(r.epoch()))) for r in ranks]
    assert all(firsts), firsts
    (line,) = [r.getMessage() for r in caplog.records if "states of different steps" in r.getMessage()]
    assert f"rank 1 starts epoch 0 at sample {late['position']}" in line
    assert f"rank(s) 0 of the job read it from sample {early['position']}" in line


def test_ranks_resumed_from_one_state_read_one_stream_without_a_warning(data: Any, caplog: Any) -> None:
    small_only(data)
    directory, _ = data
    with running_daemon(config(directory, workers=1)) as daemon:
        with clients(daemon.endpoint, 2) as ranks:
            read_ranks(ranks, 0, stop_after=3)
            state = ranks[1].state_dict()
        with caplog.at_level("WARNING", logger="loader.daemon"):
            with clients(daemon.endpoint, 2, job="resumed") as ranks:
                for r in ranks:
                    r.load_state_dict(state)
                tail = read_ranks(ranks)
    assert len(tail[0]) == len(tail[1]) > 0
    assert not [r for r in caplog.records if "states of different steps" in r.getMessage()]
