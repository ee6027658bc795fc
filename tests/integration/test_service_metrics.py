"""The operators' endpoint on a live daemon: every documented metric during an epoch, the probes, wait time."""

from __future__ import annotations

import collections
import threading
import urllib.error
import urllib.request

import numpy as np
import pytest

from loader import Client
from loader.service.client.client import query_status
from loader.service.daemon.snapshot import METRICS
from tests.helpers import wait_until
from tests.integration.conftest import make_config, running_daemon, write_id_files

pytestmark = pytest.mark.integration
parser = pytest.importorskip("prometheus_client.parser")  # the metrics extra (in the test extra: present in CI)

HTTP_TIMEOUT_S = 5.0


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def scrape(address: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """{metric family name (as documented, without _total): [(labels, value)]}."""
    status, text = get(f"http://{address}/metrics")
    assert status == 200
    out: dict[str, list[tuple[dict[str, str], float]]] = collections.defaultdict(list)
    for family in parser.text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            out[family.name].append((sample.labels, sample.value))
    return out


def value(metrics: dict, name: str, **labels: str) -> float:
    found = [v for got, v in metrics.get(name, []) if all(got.get(k) == w for k, w in labels.items())]
    assert len(found) == 1, (name, labels, metrics.get(name))
    return found[0]


def epoch_samples(metrics: dict) -> float:
    """Samples of the client's epoch sent so far; 0 until a snapshot has seen its epoch."""
    labels = {"dataset": "default", "session": "1", "rank": "0"}
    found = [v for got, v in metrics.get("loader_epoch_samples_sent", []) if got == labels]
    return found[0] if found else 0.0


# Alone: settled() below needs the client's wait for the end of its epoch (after its last credit, so never
# reported to the daemon) to stay under 1 ms, which a test on the other xdist worker can make it exceed.
@pytest.mark.alone
def test_every_documented_metric_is_scraped_during_an_epoch_with_plausible_values(tmp_path):
    ids = write_id_files(tmp_path, 4, 120)
    config = make_config(
        tmp_path,
        # One slow worker feeds a client that reads as fast as it can: the client waits.
        pipeline={"mappers": ["tests.helpers:slow_sample_2ms"], "batch_size": 16},
        workers={"count": 1, "samples_per_message": 8},
        service={"metrics": "127.0.0.1:0"},
    )
    with running_daemon(config) as daemon:
        address = daemon.metrics.address
        assert get(f"http://{address}/healthz")[0] == 200
        assert wait_until(lambda: get(f"http://{address}/readyz")[0] == 200, timeout_s=20)
        with Client(daemon.endpoint, timeout_s=10) as client:
            got, during = [], None
            for i, batch in enumerate(client.epoch()):
                got.extend(batch["data"].tolist())
                if i == 5:
                    # A snapshot is up to half a second old: wait for one that saw these batches.
                    assert wait_until(lambda: epoch_samples(scrape(address)) >= 6 * 16, timeout_s=5)
                    during = scrape(address)
            assert sorted(got) == sorted(ids)
            stats = client.stats()
            assert during is not None
            # Every metric in the table is exported during the epoch (families with no sample yet included).
            assert {name for name, *_ in METRICS} <= set(during)
            assert 0 < value(during, "loader_epoch_files", dataset="default", session="1", rank="0") == 4
            assert 0 <= value(during, "loader_epoch_files_done", dataset="default", session="1", rank="0") <= 4
            assert value(during, "loader_epoch", dataset="default", session="1", rank="0") == 0
            assert value(during, "loader_workers", state="alive") == 1
            assert value(during, "loader_leases") >= 1
            assert 0.0 <= value(during, "loader_worker_utilisation") <= 1.0
            assert 0 <= value(during, "loader_shm_used_bytes") <= value(during, "loader_shm_bytes")
            # int64 ids, 8 bytes a row as the byte bound counts them
            assert value(during, "loader_stage_buffered_bytes") == 8 * value(during, "loader_stage_buffered_samples")

            def settled() -> bool:
                m = scrape(address)
                return value(m, "loader_samples_sent", dataset="default") == len(ids) and value(
                    m, "loader_client_wait_seconds", session="1", rank="0"
                ) == pytest.approx(client.stats()["wait_s"], abs=1e-3)

            assert wait_until(settled, timeout_s=5)
            after = scrape(address)
            status = query_status(daemon.endpoint)

    assert stats["batches"] == stats["batches_received"] == -(-len(ids) // 16)
    assert stats["samples_received"] == len(ids)
    assert stats["wait_s"] > 0  # the client read faster than one slow worker fed it
    assert status["clients"][0]["wait_s"] > 0
    assert status["metrics"] == address
    assert value(after, "loader_client_wait_seconds", session="1", rank="0") > 0
    assert value(after, "loader_batches_sent", dataset="default") == stats["batches"]
    assert value(after, "loader_samples_received", dataset="default") == len(ids)
    assert value(after, "loader_bytes_sent", dataset="default") > len(ids) * 8  # int64 ids plus headers
    assert value(after, "loader_bytes_received", dataset="default") > len(ids) * 8
    assert value(after, "loader_leases") >= 4
    assert value(after, "loader_re_leases") == 0
    assert value(after, "loader_worker_busy_seconds") > 0
    assert value(after, "loader_ready") == 1
    assert value(after, "loader_uptime_seconds") > 0
    assert value(after, "loader_duplicates_dropped") == 0
    assert value(after, "loader_messages_rejected") == 0
    assert value(after, "loader_records_skipped") == 0
    assert value(after, "loader_clients") == 1
    # The daemon has sent the whole epoch; the client is still there: the epoch gauges show its end.
    mine = {"dataset": "default", "session": "1", "rank": "0"}
    assert value(after, "loader_epoch", **mine) == 0
    assert value(after, "loader_epoch_files", **mine) == value(after, "loader_epoch_files_done", **mine) == 4
    assert value(after, "loader_epoch_samples_sent", **mine) == len(ids)


def test_metrics_endpoint_closes_with_the_daemon(tmp_path):
    write_id_files(tmp_path, 1, 10)
    config = make_config(tmp_path, service={"metrics": "127.0.0.1:0"}, workers={"count": 1})
    with running_daemon(config, start_workers=False) as daemon:
        address = daemon.metrics.address
        # No worker: alive, not ready.
        assert wait_until(lambda: get(f"http://{address}/readyz")[0] == 503, timeout_s=5)
        assert get(f"http://{address}/healthz")[0] == 200
        assert get(f"http://{address}/nothing")[0] == 404
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://{address}/healthz", timeout=HTTP_TIMEOUT_S)


def test_traffic_is_counted_per_dataset(tmp_path):
    """Samples and batches served and bytes moved carry the dataset they belong to, not one sum."""
    train_ids = write_id_files(tmp_path, 2, 40)
    (tmp_path / "eval").mkdir()
    eval_ids = write_id_files(tmp_path / "eval", 1, 30)
    config = make_config(
        tmp_path,
        pipeline={"batch_size": 8},
        workers={"count": 1},
        service={"metrics": "127.0.0.1:0"},
        datasets={"eval": {"source": {"files": [str(tmp_path / "eval" / "*.npy")]}, "pipeline": {"batch_size": 5}}},
    )
    with running_daemon(config) as daemon:
        address = daemon.metrics.address
        assert wait_until(lambda: "loader_samples_sent" in scrape(address), timeout_s=5)  # the first snapshot
        before = scrape(address)
        # Every dataset has its series before any client reads it.
        assert value(before, "loader_samples_sent", dataset="eval") == 0
        assert value(before, "loader_samples_sent", dataset="default") == 0
        with (
            Client(daemon.endpoint, timeout_s=10) as train,
            Client(daemon.endpoint, dataset="eval", timeout_s=10) as ev,
        ):
            assert sorted(v for b in train.epoch() for v in b["data"].tolist()) == sorted(train_ids)
            assert sorted(v for b in ev.epoch() for v in b["data"].tolist()) == sorted(eval_ids)

        def settled() -> bool:
            m = scrape(address)
            return value(m, "loader_samples_sent", dataset="default") == len(train_ids) and value(
                m, "loader_samples_sent", dataset="eval"
            ) == len(eval_ids)

        assert wait_until(settled, timeout_s=5)
        after = scrape(address)
    for dataset, ids, batch_size in (("default", train_ids, 8), ("eval", eval_ids, 5)):
        assert value(after, "loader_batches_sent", dataset=dataset) == -(-len(ids) // batch_size)
        assert value(after, "loader_samples_received", dataset=dataset) == len(ids)
        assert value(after, "loader_bytes_sent", dataset=dataset) > len(ids) * 8  # int64 ids plus headers
        assert value(after, "loader_bytes_received", dataset=dataset) > len(ids) * 8
        assert value(after, "loader_samples_per_second", dataset=dataset) >= 0


def test_records_that_do_not_fit_their_batch_count_as_rejected(tmp_path):
    """``loader_records_rejected`` counts the records the daemon's checks refuse (it stayed 0)."""
    np.save(tmp_path / "f000.npy", np.arange(40, dtype=np.int64).reshape(20, 2))
    np.save(tmp_path / "f001.npy", np.arange(30, dtype=np.int64).reshape(10, 3))  # rows of another shape
    config = make_config(
        tmp_path,
        pipeline={"batch_size": 4, "on_error": "skip"},
        workers={"count": 1},
        service={"metrics": "127.0.0.1:0"},
    )
    with running_daemon(config) as daemon:
        address = daemon.metrics.address
        with Client(daemon.endpoint, timeout_s=10) as client:
            assert sum(len(batch["data"]) for batch in client.epoch()) == 20

        def counted() -> bool:
            return value(scrape(address), "loader_records_skipped") == 10

        assert wait_until(counted, timeout_s=5)
        assert value(scrape(address), "loader_records_rejected") == 10
        assert query_status(daemon.endpoint)["rejected_records"] == 10


def test_a_wait_going_on_is_reported_while_it_lasts(tmp_path):
    # A training loop blocked on its first batch (4 samples of 0.5 s each) shows its wait in the daemon's
    # status before the batch comes: a stalled trainer is visible while it is stalled.
    write_id_files(tmp_path, 1, 8)
    config = make_config(
        tmp_path, pipeline={"mappers": ["tests.helpers:slow_sample_500ms"], "batch_size": 4}, workers={"count": 1}
    )
    with running_daemon(config) as daemon, Client(daemon.endpoint, timeout_s=10) as client:
        batches = client.epoch()
        got: list = []
        reader = threading.Thread(target=lambda: got.append(next(batches)), daemon=True)
        reader.start()

        def waited() -> float:
            clients = query_status(daemon.endpoint)["clients"]
            return clients[0]["wait_s"] if clients else 0.0

        # got is looked at after the status came: empty then, the status was taken before the batch arrived.
        assert wait_until(lambda: waited() >= 0.5 and not got, timeout_s=10)
        reader.join(timeout=20)
        assert got and client.stats()["wait_s"] >= 0.5


def test_shared_memory_use_shows_rows_no_client_has_read_yet(tmp_path):
    # Rows of 128 KiB made by a mapper go through the arenas; a client that stops after one batch leaves
    # its read-ahead there.
    for i in range(4):
        np.save(tmp_path / f"big-{i}.npy", np.full((32, 32 * 1024), i, dtype=np.float32))
    config = make_config(
        tmp_path,
        pipeline={"mappers": ["tests.helpers:identity_mapper"], "batch_size": 4},
        service={"metrics": "127.0.0.1:0"},
    )
    with running_daemon(config) as daemon, Client(daemon.endpoint, timeout_s=10) as client:
        address = daemon.metrics.address
        batches = client.epoch()
        assert next(batches)["data"].shape == (4, 32 * 1024)
        assert wait_until(lambda: value(scrape(address), "loader_shm_used_bytes") >= 128 * 1024, timeout_s=10)
        assert value(scrape(address), "loader_shm_used_bytes") <= value(scrape(address), "loader_shm_bytes")
