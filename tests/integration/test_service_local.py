"""``loader.Loader``: the same service inside the training process."""

from __future__ import annotations

import collections

import numpy as np
import pytest

import loader
from loader.config import LoaderConfig
from tests.integration.conftest import collect_ids, make_config, write_id_files

pytestmark = pytest.mark.integration


def test_loader_iterates_configured_epochs_and_cleans_up(tmp_path, no_leaks):
    ids = write_id_files(tmp_path, 3, 200)
    config = make_config(
        tmp_path,
        pipeline={"epochs": 2, "shuffle_buffer": 50, "batch_size": 64},
        workers={"count": 1},
        service={"bind": "tcp://127.0.0.1:5555"},
    )
    with loader.Loader(config) as local:
        got = collect_ids(local)
        assert local.endpoint.startswith("ipc://")
        stats = local.stats()  # its client's, as Client.stats() gives them
        assert stats["samples_received"] == len(ids) * 2 and stats["batches"] == stats["batches_received"]
        assert stats["wait_s"] >= 0
    assert collections.Counter(got) == collections.Counter(ids * 2)


def test_a_loader_iterated_again_after_its_epochs_says_why_it_gives_nothing(tmp_path):
    ids = write_id_files(tmp_path, 2, 50)
    config = make_config(tmp_path, pipeline={"epochs": 1, "batch_size": 16}, workers={"count": 1})
    with loader.Loader(config) as local:
        assert sorted(collect_ids(local)) == sorted(ids)
        with pytest.warns(UserWarning, match=r"has run the 1 epoch\(s\) its config names"):
            assert list(local) == []  # what ``for epoch in range(n): for batch in data:`` meets next


def test_an_epoch_kept_and_iterated_again_says_it_was_one_pass(tmp_path):
    # batches = data.epoch(), then a loop over it per epoch: the second loop trained on nothing, without a word.
    ids = write_id_files(tmp_path, 2, 50)
    with loader.Loader(make_config(tmp_path, pipeline={"batch_size": 16}, workers={"count": 1})) as local:
        batches = local.epoch()
        assert sorted(collect_ids(batches)) == sorted(ids)
        with pytest.warns(UserWarning, match="epoch 0's batches were all iterated already, so iterating them"):
            assert list(batches) == []
        assert sorted(collect_ids(local.epoch())) == sorted(ids)  # the next epoch, as asked


def test_a_loader_takes_a_config_files_path(tmp_path):
    ids = write_id_files(tmp_path, 2, 50)
    (tmp_path / "train.toml").write_text('[source]\nfiles = ["*.npy"]\n[pipeline]\nbatch_size = 16\n')
    with loader.Loader(str(tmp_path / "train.toml")) as local:
        assert sorted(collect_ids(local)) == sorted(ids)
    with pytest.raises(TypeError, match="Loader takes a config file's path or loader.load_config"):
        loader.Loader({"source": {}})  # type: ignore[arg-type]


def test_a_closed_loader_says_it_is_closed_at_once(tmp_path):
    # After close() an epoch said "the client is closed" (no client of the caller's), and status() waited 5 s to
    # say no daemon answered at a private ipc address, as if `loader serve` were not running.
    import time

    from loader.errors import ClosedError

    write_id_files(tmp_path, 1, 20)
    local = loader.Loader(make_config(tmp_path, workers={"count": 1}, pipeline={"batch_size": 10}))
    assert repr(local) == "<Loader '<dict>', 1 workers>"  # the config's origin: a file's path, or how it was made
    local.close()
    assert repr(local) == "<Loader '<dict>', closed>"
    started = time.monotonic()
    for use in (local.epoch, local.status, local.client, lambda: next(iter(local))):
        with pytest.raises(ClosedError, match="this Loader is closed"):
            use()
    assert time.monotonic() - started < 1.0
    assert local.stats()["batches"] == 0  # what it did stays readable


def test_loader_with_user_reader_list_format_and_strings(tmp_path, no_leaks):
    for i in range(3):
        (tmp_path / f"part{i}.txt").write_text(f"{i * 100} {i * 100 + 40}")
    config = LoaderConfig.from_dict(
        {
            "source": {
                "files": [str(tmp_path / "*.txt")],
                "reader": "tests.helpers:range_file_reader",
                "fields": ["id", "name"],
            },
            "pipeline": {"batch_size": 16, "batch_format": "list", "mappers": ["tests.helpers:identity_mapper"]},
            "workers": {"count": 2, "heartbeat_interval_s": 0.2, "heartbeat_timeout_s": 2.0},
        }
    )
    with loader.Loader(config) as local:
        samples = [s for batch in local.epoch() for s in batch]
        assert sorted(int(i) for i, _ in samples) == [i * 100 + j for i in range(3) for j in range(40)]
        assert all(name == f"s{int(i)}" for i, name in samples)


def test_loader_reader_is_paddle_style(tmp_path):
    ids = write_id_files(tmp_path, 2, 50)
    config = make_config(tmp_path, workers={"count": 1}, pipeline={"batch_size": 10, "drop_last": True})
    with loader.Loader(config) as local:
        batches = list(local.reader()())
    assert all(isinstance(b, list) and len(b) == 10 and all(isinstance(s, tuple) for s in b) for b in batches)
    assert len(batches) == 10 and {int(s[0]) for b in batches for s in b} == set(ids)


def test_loader_text_format_with_a_parser_named_in_the_config(tmp_path, no_leaks):
    # The parser travels to the workers as a "module:function" string and is imported there.
    lines = [f"{i % 10}\t{' '.join(str(i * 0.5) for _ in range(3))}" for i in range(60)]
    for part in range(3):
        (tmp_path / f"part{part}.txt").write_text("\n".join(lines[part * 20 : part * 20 + 20]) + "\n")
    config = LoaderConfig.from_dict(
        {
            "source": {
                "files": [str(tmp_path / "*.txt")],
                "format": "text",
                "format_options": {"parser": "loader.examples:parse_labeled_line"},
            },
            "pipeline": {"batch_size": 8},
            "workers": {"count": 2},
        }
    )
    with loader.Loader(config) as local:
        batches = list(local.epoch())
    labels = np.concatenate([np.asarray(b["label"]).reshape(-1) for b in batches])
    assert sorted(labels.tolist()) == sorted(i % 10 for i in range(60))


def test_loader_reads_a_user_format_from_the_config_formats_table(tmp_path, no_leaks):
    for part in range(2):
        np.save(tmp_path / f"p{part}.npy", np.arange(part * 30, part * 30 + 30, dtype=np.int64))
        (tmp_path / f"p{part}.npy").rename(tmp_path / f"p{part}.rows")
    config = LoaderConfig.from_dict(
        {
            "source": {
                "files": [str(tmp_path / "*.rows")],
                "formats": {"rowsfmt": {"factory": "loader.io.formats_numpy:NpyFileReader", "suffixes": [".rows"]}},
            },
            "pipeline": {"batch_size": 7},
            "workers": {"count": 1},
        }
    )
    try:
        with loader.Loader(config) as local:
            got = np.concatenate([b["data"] for b in local.epoch()])
        assert sorted(got.tolist()) == list(range(60))
    finally:
        from loader.io.registry import unregister_file_reader

        unregister_file_reader("rowsfmt")


INTERRUPTED_TWICE = """
import os, signal, sys, threading
import loader
from loader.examples import datagen

print(os.getpid(), flush=True)
datagen.generate(sys.argv[1], files=4, samples=500, dim=16384)  # 64 KiB rows: they go through the arenas
config = loader.load_config(sys.argv[2])
with loader.Loader(config) as data:
    for batch in data:
        # Ctrl-C twice, the second while the first one's shutdown stops the workers. A daemon timer: a shutdown
        # done within 50 ms must not wait for it at exit (its Ctrl-C then lands in threading._shutdown).
        second = threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGINT))
        second.daemon = True
        second.start()
        os.kill(os.getpid(), signal.SIGINT)
"""


def test_a_second_ctrl_c_while_a_loader_closes_leaves_nothing_behind(tmp_path):
    import os
    import subprocess
    import sys

    from loader.service.shm.arena import shm_directory

    config = tmp_path / "c.toml"
    config.write_text(f'[source]\nfiles = ["{tmp_path}/data/*.npy"]\n[pipeline]\nepochs = 0\n[workers]\ncount = 2\n')
    script = tmp_path / "run.py"
    script.write_text(INTERRUPTED_TWICE)
    run = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "data"), str(config)], capture_output=True, text=True, timeout=120
    )
    pid = run.stdout.split()[0]
    assert run.returncode != 0 and run.stderr.count("KeyboardInterrupt") == 1, run.stderr
    assert "During handling" not in run.stderr and "_shut_down" not in run.stderr, run.stderr
    # Before: the workers' join was interrupted and the arenas stayed in /dev/shm until another daemon swept them.
    left = [name for name in os.listdir(shm_directory()) if name.startswith("loader-") and f"-{pid}-" in name]
    assert left == []


def test_a_fault_of_the_daemon_loop_reaches_the_training_loop_at_once_and_stops_the_workers(tmp_path, no_leaks):
    # A bug in the daemon's own loop (not a peer's message or a file): the thread ended with a traceback on
    # stderr, and the training loop waited out client.timeout_s for a daemon that was gone, workers left up.
    write_id_files(tmp_path, 2, 100)
    config = make_config(tmp_path, pipeline={"batch_size": 10}, client={"timeout_s": 120.0})
    with loader.Loader(config) as local:
        batches = iter(local.epoch())
        next(batches)

        def dispatch() -> None:
            raise RuntimeError("a fault in the loop")

        local._daemon.pool.dispatch = dispatch
        with pytest.raises(
            loader.ServiceUnavailableError, match=r"the daemon failed: RuntimeError: a fault in the loop"
        ):
            for _ in batches:  # the fault comes at the daemon's next turn: this epoch or the next ends in it
                pass
            for _ in local.epoch():
                pass
        assert local._daemon._closed
