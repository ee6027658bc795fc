"""Client placement from the variables torchrun and Slurm set (``Client.from_env`` and left-out arguments)."""

from __future__ import annotations

import numpy as np
import pytest

from loader import Client
from loader.errors import ConfigError
from loader.service.client.env import from_environment

TORCHRUN = {"LOADER_ADDRESS": "tcp://10.0.0.1:5555", "RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1"}


def test_torchrun_variables_fill_what_is_left_out():
    assert from_environment(None, None, None, "cuda", TORCHRUN) == ("tcp://10.0.0.1:5555", 3, 8, "cuda:1")
    assert from_environment(None, None, None, "torch:cuda", TORCHRUN)[3] == "torch:cuda:1"


@pytest.mark.parametrize("address", ["", "  "])
def test_an_empty_address_is_refused_not_taken_for_the_default_port(address):
    # Client(os.environ.get("X", "")) with X unset reached tcp://127.0.0.1:5555, maybe another user's daemon.
    with pytest.raises(ConfigError, match="an empty daemon address"):
        from_environment(address, None, None, "cpu", TORCHRUN)
    with pytest.raises(ConfigError, match="an empty daemon address"):
        Client(address)


@pytest.mark.parametrize(
    ("device", "placed"),
    [("gpu", "cuda:1"), ("torch:gpu", "torch:cuda:1"), ("cupy:cuda", "cupy:cuda:1"), (" CUDA ", "cuda:1")],
)
def test_every_spelling_of_a_gpu_without_an_index_takes_local_rank(device, placed):
    assert from_environment(None, None, None, device, TORCHRUN)[3] == placed


def test_a_torch_device_without_an_index_takes_local_rank():
    # The DDP idiom: torch.cuda.set_device(local_rank), then torch.device("cuda"). It went to cuda:0 on
    # every rank while only the string "cuda" was rewritten.
    torch = pytest.importorskip("torch")
    assert from_environment(None, None, None, torch.device("cuda"), TORCHRUN)[3] == "torch:cuda:1"
    given = torch.device("cuda", 0)
    assert from_environment(None, None, None, given, TORCHRUN)[3] is given  # an index given wins
    cpu = torch.device("cpu")
    assert from_environment(None, None, None, cpu, TORCHRUN)[3] is cpu


def test_explicit_arguments_win():
    assert from_environment("tcp://h:1", 0, 2, "cuda:0", TORCHRUN) == ("tcp://h:1", 0, 2, "cuda:0")
    assert from_environment(None, None, None, "cpu", TORCHRUN)[3] == "cpu"  # LOCAL_RANK places only a GPU
    assert from_environment(None, None, None, "gpu:0", TORCHRUN)[3] == "gpu:0"
    assert from_environment(None, None, None, "tpu", TORCHRUN)[3] == "tpu"  # left for Placer to refuse


def test_slurm_variables_when_torchrun_sets_none():
    slurm = {"LOADER_ADDRESS": "tcp://h:1", "SLURM_PROCID": "5", "SLURM_NTASKS": "6", "SLURM_LOCALID": "2"}
    assert from_environment(None, None, None, "cuda", slurm) == ("tcp://h:1", 5, 6, "cuda:2")
    # torchrun under srun: torchrun's per-process variables win over the task's.
    assert from_environment(None, None, None, "cuda", {**slurm, **TORCHRUN})[1:] == (3, 8, "cuda:1")


def test_a_rank_that_sees_only_its_own_gpu_keeps_the_current_one():
    # srun --gpus-per-task=1: each rank sees one GPU (number 0), while SLURM_LOCALID goes up to the host's ranks.
    slurm = {"LOADER_ADDRESS": "tcp://h:1", "SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "3"}
    for device in ("cuda", "gpu", "torch:cuda"):
        assert from_environment(None, None, None, device, {**slurm, "CUDA_VISIBLE_DEVICES": "3"})[3] == device
    assert from_environment(None, None, None, "cuda", {**slurm, "CUDA_VISIBLE_DEVICES": "0,1,2,3"})[3] == "cuda:3"


def test_defaults_without_a_scheduler():
    assert from_environment(None, None, None, "cuda", {"LOADER_ADDRESS": "ipc:///tmp/x"}) == (
        "ipc:///tmp/x",
        0,
        1,
        "cuda",
    )


def test_missing_address_says_what_to_set():
    with pytest.raises(ConfigError, match="LOADER_ADDRESS"):
        from_environment(None, 0, 1, "cpu", {})


@pytest.mark.parametrize(("name", "text"), [("RANK", "one"), ("WORLD_SIZE", "-2"), ("LOCAL_RANK", "1.5")])
def test_malformed_variables_are_named(name, text):
    env = {**TORCHRUN, name: text}
    with pytest.raises(ConfigError, match=rf"environment variable {name} must be a non-negative integer"):
        from_environment(None, None, None, "cuda", env)


def test_client_from_env_reads_the_environment(monkeypatch):
    monkeypatch.setenv("LOADER_ADDRESS", "tcp://127.0.0.1:1")
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "2")  # rank 2 of 2: refused before anything connects
    with pytest.raises(ConfigError, match=r"environment variables RANK=2 and WORLD_SIZE=2: the rank must be below"):
        Client.from_env()
    with pytest.raises(ValueError, match=r"got 5"):
        Client.from_env(rank=5)
    monkeypatch.delenv("LOADER_ADDRESS")
    with pytest.raises(ConfigError, match="LOADER_ADDRESS"):
        Client.from_env(rank=0)


def test_stats_count_batches_and_the_wait_reported_with_credits():
    from loader.service import protocol as P
    from loader.service.transport import FakeChannel
    from tests.unit.service.client.test_client import FakeDaemon

    near, far = FakeChannel.pair()
    credits: list[P.Credit] = []

    class Recording(FakeDaemon):
        def run(self):  # the fake serves as usual and keeps every credit it was sent
            original = self.channel.recv

            def recv(timeout_s):
                frames = original(timeout_s)
                if frames is not None and isinstance(P.decode(frames)[0], P.Credit):
                    credits.append(P.decode(frames)[0])
                return frames

            self.channel.recv = recv
            super().run()

    daemon = Recording(far, batches=5)
    with Client("fake://daemon", channel=near, prefetch=2, timeout_s=1.0) as client:
        assert client.stats()["batches"] == 0
        assert len(list(client.epoch())) == 5
        stats = client.stats()
    daemon.stop.set()
    assert (stats["batches"], stats["batches_received"], stats["samples_received"]) == (5, 5, 10)
    assert stats["wait_s"] > 0  # the first batch at least was waited for
    reported = [c.wait_s for c in credits]
    assert reported and all(w is not None for w in reported)
    assert reported == sorted(reported) and reported[-1] <= stats["wait_s"]  # a running total


@pytest.mark.parametrize(
    ("environ", "match"),
    [
        # A world size left in the shell: rank 0's share, without a word, before.
        ({"WORLD_SIZE": "2"}, r"WORLD_SIZE=2 is set but no rank \(RANK or SLURM_PROCID\)"),
        ({"SLURM_NTASKS": "4"}, r"SLURM_NTASKS=4 is set but no rank"),
        ({"RANK": "1"}, r"RANK=1 is set but no world size \(WORLD_SIZE or SLURM_NTASKS\)"),
    ],
)
def test_half_a_placement_in_the_environment_is_refused_naming_the_variable(environ, match):
    from loader.service.client.env import from_environment

    with pytest.raises(ConfigError, match=match):
        from_environment("tcp://h:1", None, None, "cpu", environ)


def test_a_share_read_from_the_environment_is_said_once_and_explicit_arguments_win(caplog):
    from loader.service.client.env import from_environment

    environ = {"SLURM_PROCID": "1", "SLURM_NTASKS": "4"}
    with caplog.at_level("INFO", logger="loader.client"):
        assert from_environment("tcp://h:1", None, None, "cpu", environ)[1:3] == (1, 4)
    assert "rank 1 of 4 from SLURM_PROCID and SLURM_NTASKS: this client reads its 1/4 share" in caplog.text
    assert from_environment("tcp://h:1", 0, 1, "cpu", environ)[1:3] == (0, 1)
    assert from_environment("tcp://h:1", 0, None, "cpu", {"WORLD_SIZE": "2"})[1:3] == (0, 2)  # rank given
    assert from_environment("tcp://h:1", None, None, "cpu", {"RANK": "0"})[1:3] == (0, 1)  # harmless alone


def test_a_world_size_no_job_has_is_refused_before_connecting():
    from loader.service import protocol as P

    with pytest.raises(ValueError, match=rf"world_size must be in \[1, {P.MAX_WORLD_SIZE}\], got 4000000"):
        Client("tcp://127.0.0.1:1", rank=0, world_size=4_000_000)


@pytest.mark.parametrize(
    "kwargs, says",
    [
        ({"rank": "0", "world_size": 2}, "rank must be an int, got str '0'"),
        ({"rank": 0, "world_size": 2.0}, "world_size must be an int, got float 2.0"),
        ({"rank": True, "world_size": 2}, "rank must be an int, got bool True"),
        ({"dataset": 3}, "dataset must be a str (a dataset's name), got int 3"),
        ({"job": None}, "job must be a str, got NoneType None"),
    ],
)
def test_arguments_of_the_wrong_type_are_named_before_connecting(kwargs, says):
    # rank="0" raised "'<=' not supported between instances of 'int' and 'str'"; a dataset of 3 went to the daemon.
    with pytest.raises(TypeError) as info:
        Client("tcp://127.0.0.1:1", **kwargs)
    assert str(info.value) == says


def test_numpy_integers_pass_as_ranks():
    with pytest.raises(ValueError, match="world_size must be in"):  # past the type check, to the range check
        Client("tcp://127.0.0.1:1", rank=np.int64(0), world_size=np.int32(-1))
