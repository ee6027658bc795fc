"""Several named datasets in one config, served at once by one daemon and its workers."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

import loader
from loader.errors import ConfigError
from tests.integration.conftest import running_daemon

pytestmark = pytest.mark.integration


def _two_datasets(tmp_path) -> loader.LoaderConfig:
    (tmp_path / "train").mkdir()
    (tmp_path / "eval").mkdir()
    for i in range(3):
        np.save(tmp_path / "train" / f"t{i}.npy", np.arange(i * 100, i * 100 + 40, dtype=np.int64))
        np.save(tmp_path / "train" / f"t{i}.label.npy", np.zeros(40, dtype=np.int64))
    for i in range(2):
        np.save(tmp_path / "eval" / f"e{i}.npy", np.arange(10_000 + i * 100, 10_000 + i * 100 + 15, dtype=np.int64))
    (tmp_path / "both.toml").write_text(
        textwrap.dedent(
            """\
            [source]
            files = ["train/*.npy"]
            [pipeline]
            batch_size = 16
            shuffle_buffer = 50
            seed = 3
            epochs = 2

            [datasets.eval.source]
            files = ["eval/*.npy"]
            [datasets.eval.pipeline]
            batch_size = 5
            mappers = ["negate:negate"]

            [workers]
            count = 2
            [service]
            bind = "tcp://127.0.0.1:*"
            """
        )
    )
    (tmp_path / "negate.py").write_text("def negate(sample):\n    return (-sample[0],)\n")
    return loader.load_config(tmp_path / "both.toml")


def test_two_datasets_with_different_batch_sizes_are_served_at_once(tmp_path):
    config = _two_datasets(tmp_path)
    with running_daemon(config) as daemon:
        with (
            loader.Client(daemon.endpoint, timeout_s=20.0) as train,
            loader.Client(daemon.endpoint, dataset="eval", timeout_s=20.0) as evaluate,
        ):
            train_epoch, eval_epoch = iter(train.epoch()), iter(evaluate.epoch())
            train_batches, eval_batches, eval_ended = [], [], False
            for batch in train_epoch:  # interleaved: both streams are open at once
                train_batches.append(batch)
                eval_batch = None if eval_ended else next(eval_epoch, None)
                if eval_batch is not None:
                    eval_batches.append(eval_batch)
                eval_ended = eval_batch is None
            if not eval_ended:
                eval_batches.extend(eval_epoch)
            status = loader.service.client.client.query_status(daemon.endpoint)
    train_ids = sorted(int(v) for b in train_batches for v in b["data"])
    eval_ids = sorted(int(v) for b in eval_batches for v in b["data"])
    assert train_ids == [i * 100 + j for i in range(3) for j in range(40)]
    assert eval_ids == sorted(-(10_000 + i * 100 + j) for i in range(2) for j in range(15))  # eval's own mapper
    assert sorted({len(b["data"]) for b in train_batches}) == [8, 16]  # 120 = 7 * 16 + 8
    assert {len(b["data"]) for b in eval_batches} == {5}
    assert {"label"} <= set(train_batches[0]) and set(eval_batches[0]) == {"data"}
    shown = {d["name"]: (d["files"], d["batch_size"], d["epochs"]) for d in status["datasets"]}
    assert shown == {"default": (3, 16, 2), "eval": (2, 5, 1)}


def test_a_client_for_an_unknown_dataset_is_refused_with_the_names(tmp_path):
    config = _two_datasets(tmp_path)
    with running_daemon(config) as daemon:
        with pytest.raises(ConfigError, match="no dataset named 'test'.*'default', 'eval'"):
            loader.Client(daemon.endpoint, dataset="test", timeout_s=10.0)


def test_len_of_an_epoch_follows_the_dataset(tmp_path):
    config = _two_datasets(tmp_path)
    with running_daemon(config) as daemon:
        with loader.Client(daemon.endpoint, dataset="eval", timeout_s=20.0) as evaluate:
            epoch = evaluate.epoch()
            assert len(epoch) == len(list(epoch)) == 6  # 30 samples in batches of 5


@pytest.mark.parametrize("placed", [False, True], ids=["alone", "a rank of two"])
def test_a_local_loader_reads_its_second_dataset_through_another_client(tmp_path, monkeypatch, placed):
    # A rank's Loader serves that process alone: its other clients read all of their dataset, whatever RANK and
    # WORLD_SIZE (or torch.distributed's process group) say; they read half of it.
    if placed:
        monkeypatch.setenv("RANK", "1")
        monkeypatch.setenv("WORLD_SIZE", "2")
    config = _two_datasets(tmp_path)
    with loader.Loader(config) as local:
        evaluate = local.client("eval")
        assert sorted(-int(v) for b in evaluate.epoch() for v in b["data"]) == [
            10_000 + i * 100 + j for i in range(2) for j in range(15)
        ]
        assert len(list(local.epoch())) == 8
    with pytest.raises(loader.errors.ClosedError):
        evaluate.epoch()
