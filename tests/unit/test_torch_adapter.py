"""``loader.torch.DataLoader`` over a fake reader: epochs, ``len()``, ``set_epoch``, checkpoint state, close.

The fake stands for ``Client``/``Loader`` with their checkpoint API (``state_dict()``, and
``load_state_dict()`` after which ``epoch()`` continues the interrupted epoch).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from loader.errors import ConfigError, LoaderError, MissingDependencyError

SUBPROCESS_TIMEOUT_S = 60
BATCHES = 4


@pytest.fixture(autouse=True)
def _torch_or_skip(request: pytest.FixtureRequest) -> None:
    if "runs_without_torch" not in request.fixturenames:
        pytest.importorskip("torch", reason="loader.torch needs torch: pip install -e '.[test]' installs it")


@pytest.fixture
def runs_without_torch() -> None:
    """Named by a test that needs no torch, so it runs where torch is absent too."""


@pytest.fixture
def torch() -> Any:
    import torch

    return torch


class FakeEpoch:
    def __init__(self, reader: FakeReader, epoch: int, start: int, length: int | None) -> None:
        self.reader, self.epoch, self.start, self.length = reader, epoch, start, length
        self.closed = False
        self._batches = self._make()

    def _make(self) -> Iterator[Any]:
        import torch

        for index in range(self.start, BATCHES):
            self.reader.at = {"epoch": self.epoch, "taken": index + 1}
            yield {"epoch": torch.tensor([self.epoch]), "index": torch.tensor([index])}

    def __iter__(self) -> FakeEpoch:
        return self

    def __next__(self) -> Any:
        return next(self._batches)

    def __len__(self) -> int:
        if self.length is None:
            raise TypeError("not known ahead")
        return self.length

    def close(self) -> None:
        self.closed = True
        self._batches.close()


class FakeReader:
    """``epoch(n)``, ``state_dict()``, ``load_state_dict()`` as ``Client`` has them."""

    def __init__(self, length: int | None = BATCHES) -> None:
        self.length = length
        self.calls: list[int | None] = []
        self.epochs: list[FakeEpoch] = []
        self.at: dict[str, int] = {"epoch": 0, "taken": 0}
        self.loaded: dict[str, int] | None = None
        self.next = 0

    def epoch(self, epoch: int | None = None) -> FakeEpoch:
        self.calls.append(epoch)
        if epoch is None and self.loaded is not None:
            number, start = self.loaded["epoch"], self.loaded["taken"]
        else:
            number, start = (self.next if epoch is None else epoch), 0
        self.loaded, self.next = None, number + 1
        self.epochs.append(FakeEpoch(self, number, start, self.length))
        return self.epochs[-1]

    def state_dict(self) -> dict[str, int]:
        return dict(self.at)

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.loaded = dict(state)

    def close(self) -> None:
        raise AssertionError("a reader the caller made is not closed by the adapter")


def _seen(batches: Any) -> list[tuple[int, int]]:
    return [(int(b["epoch"][0]), int(b["index"][0])) for b in batches]


def _adapter(reader: FakeReader | None = None) -> Any:
    from loader.torch import DataLoader

    return DataLoader(reader if reader is not None else FakeReader())


def test_each_iteration_runs_the_next_epoch_of_torch_tensors(torch):
    data = _adapter()
    first, second = list(data), list(data)
    assert all(isinstance(batch["index"], torch.Tensor) for batch in first)
    assert _seen(first) == [(0, i) for i in range(BATCHES)]
    assert _seen(second) == [(1, i) for i in range(BATCHES)]


def test_set_epoch_picks_the_epoch_of_the_next_iteration(torch):
    import numpy as np

    data = _adapter()
    data.set_epoch(5)
    assert {epoch for epoch, _ in _seen(data)} == {5}
    assert {epoch for epoch, _ in _seen(data)} == {6}
    for bad in (-1, 1.0, True, "2", torch.tensor(2.0)):
        with pytest.raises(ValueError, match="an epoch is a whole number >= 0"):
            data.set_epoch(bad)
    for number in (np.int64(8), torch.tensor(9)):  # as DistributedSampler.set_epoch takes them
        data.set_epoch(number)
        assert {epoch for epoch, _ in _seen(data)} == {int(number)}


def test_len_is_the_epoch_length_and_asks_for_no_extra_epoch():
    reader = FakeReader()
    data = _adapter(reader)
    assert len(data) == BATCHES
    assert len(data) == BATCHES
    assert _seen(data) == [(0, i) for i in range(BATCHES)]
    assert reader.calls == [0]  # the epoch len() opened is the one iterated


def test_len_of_an_epoch_of_unknown_length_is_a_type_error():
    data = _adapter(FakeReader(length=None))
    with pytest.raises(TypeError):
        len(data)
    assert len(list(data)) == BATCHES


def test_set_epoch_after_len_replaces_the_epoch_opened_ahead():
    reader = FakeReader()
    data = _adapter(reader)
    len(data)
    data.set_epoch(3)
    assert {epoch for epoch, _ in _seen(data)} == {3}
    assert reader.calls == [0, 3] and reader.epochs[0].closed


def test_len_then_set_epoch_of_that_epoch_keeps_the_count_going():
    reader = FakeReader()
    data = _adapter(reader)
    for epoch in range(2):
        len(data)
        data.set_epoch(epoch)
        assert {number for number, _ in _seen(data)} == {epoch}
    assert reader.calls == [0, 1]


def test_a_new_iteration_drops_the_unfinished_epoch_as_torch_does():
    reader = FakeReader()
    data = _adapter(reader)
    next(iter(data))
    assert _seen(data) == [(1, i) for i in range(BATCHES)]
    assert reader.epochs[0].closed


def test_an_iteration_that_took_no_batch_runs_no_epoch():
    # Lightning calls iter() to check a dataloader is iterable and drops it: that used up epoch 0.
    reader = FakeReader()
    data = _adapter(reader)
    iter(data)
    assert len(data) == BATCHES
    assert _seen(data) == [(0, i) for i in range(BATCHES)]
    iter(data)
    assert _seen(data) == [(1, i) for i in range(BATCHES)]
    assert reader.calls == [0, 1]


class FailingReader(FakeReader):
    """Its epoch 0 fails after ``good`` batches (at its first, by default), as a worker's error does."""

    def __init__(self, good: int = 0) -> None:
        super().__init__()
        self.good = good

    def epoch(self, epoch: int | None = None) -> Any:
        made = super().epoch(epoch)
        if made.epoch == 0:
            batches = made._batches

            def fail() -> Iterator[Any]:
                for _ in range(self.good):
                    yield next(batches)
                raise LoaderError("a worker failed")

            made._batches = fail()
        return made


def test_an_epoch_that_failed_at_its_first_batch_is_not_taken_over_by_the_next_iteration():
    # An iteration that took no batch lends its epoch to the next iter(); one that failed must not, or the next
    # iteration ends at once on its spent iterator, with no batch and no error.
    data = _adapter(FailingReader())
    with pytest.raises(LoaderError, match="a worker failed"):
        list(data)
    assert _seen(data) == [(1, i) for i in range(BATCHES)]


def test_an_iteration_takes_its_epoch_at_its_first_batch():
    # Lightning makes the epoch's iterator, then calls sampler.set_epoch(epoch), then takes the batches.
    reader = FakeReader()
    data = _adapter(reader)
    batches = iter(data)
    data.sampler.set_epoch(3)
    assert _seen(batches) == [(3, i) for i in range(BATCHES)]
    batches = iter(data)
    data.sampler.set_epoch(4)  # the epoch this iteration opened: nothing is opened again
    assert _seen(batches) == [(4, i) for i in range(BATCHES)]
    assert reader.calls == [0, 3, 4]
    assert data.batch_sampler is None  # as torch's DataLoader with a sampler; Lightning reads both

    taken = iter(data)
    next(taken)
    state = data.state_dict()
    resumed = _adapter()
    batches = iter(resumed)
    resumed.load_state_dict(state)  # as Lightning loads a mid-epoch checkpoint's state: after its check iter()
    resumed.sampler.set_epoch(5)  # the resumed epoch's number: it goes on where the state was taken
    assert _seen(batches) == [(5, i) for i in range(1, BATCHES)]


def test_set_epoch_of_the_epoch_being_iterated_keeps_the_next_epoch_next():
    # Lightning, when len() is unknown, fetches an epoch's first batch before sampler.set_epoch(epoch): that
    # set_epoch rewound the next epoch to this one, so a state taken at the epoch's end said "epoch 0" again.
    data = _adapter(FakeReader(length=None))
    for epoch in range(3):
        batches = iter(data)
        first = next(batches)
        data.sampler.set_epoch(epoch)
        assert _seen([first, *batches]) == [(epoch, i) for i in range(BATCHES)]
        assert (data.state_dict()["epoch"], data.state_dict()["resume"]) == (epoch + 1, False)


def test_set_epoch_of_another_epoch_during_an_iteration_that_goes_on_runs_that_epoch_with_a_warning(caplog):
    # Lightning resumed from an epoch-end checkpoint over a source of unknown len(): it fetched epoch 0's first
    # batch, then called set_epoch(1), and trained on epoch 0 again as epoch 1, without a word.
    data = _adapter(FakeReader(length=None))
    batches = iter(data)
    first = next(batches)
    data.sampler.set_epoch(1)
    state = data.state_dict()
    assert (state["epoch"], state["resume"]) == (1, False)  # what runs next, as a break would leave it
    assert _seen([first, *batches]) == [(0, 0)] + [(1, i) for i in range(BATCHES)]
    assert "set_epoch(1) was called after this iteration had given 1 batch(es) of epoch 0" in caplog.text
    assert _seen(data) == [(2, i) for i in range(BATCHES)]

    resumed = _adapter(FakeReader(length=None))
    resumed.load_state_dict(state)
    assert _seen(resumed) == [(1, i) for i in range(BATCHES)]


def test_set_epoch_of_another_epoch_during_a_loaded_states_epoch_that_goes_on_is_refused():
    # Refused before the first resumed batch ("would drop the batches left"), it only warned after one, dropping
    # the rest of the loaded epoch and skipping epochs.
    resumed = _resumed_after_a_batch()
    batches = iter(resumed)
    next(batches)
    resumed.set_epoch(3)
    with pytest.raises(ValueError, match=r"loaded state's epoch 0 was iterated.*drop the rest of epoch 0 and skip"):
        next(batches)


def test_a_same_epoch_set_epoch_then_a_failure_goes_on_with_the_next_epoch():
    # set_epoch(0) during epoch 0, then a worker's error at its next batch: the failed epoch ran again next.
    data = _adapter(FailingReader(good=1))
    batches = iter(data)
    next(batches)
    data.set_epoch(0)
    with pytest.raises(LoaderError):
        next(batches)
    assert (data.state_dict()["epoch"], data.state_dict()["resume"]) == (1, False)
    assert {epoch for epoch, _ in _seen(data)} == {1}


def test_after_a_break_set_epoch_picks_the_next_iterations_epoch_the_same_one_included():
    data = _adapter()
    for _ in zip(range(2), data):
        pass
    data.set_epoch(0)  # epoch 0 again, from its start
    assert _seen(data) == [(0, i) for i in range(BATCHES)]
    for _ in zip(range(2), data):
        pass
    data.set_epoch(5)
    assert _seen(data) == [(5, i) for i in range(BATCHES)]


def test_a_state_after_a_failed_epoch_says_what_the_next_iteration_runs():
    data = _adapter(FailingReader())
    with pytest.raises(LoaderError):
        list(data)
    state = data.state_dict()
    assert (state["epoch"], state["resume"]) == (1, False)


def test_an_iteration_ended_by_a_later_one_says_so_instead_of_stopping_silently():
    # zip(data, data) ran no step and an outer loop ended after an inner pass, without a word.
    from loader.errors import ClosedError

    data = _adapter()
    with pytest.raises(ClosedError, match=r"this iteration was ended by a later iter\(\) before its first batch"):
        sum(1 for _ in zip(data, data))
    outer = iter(data)
    next(outer)
    assert len(list(data)) == BATCHES  # an inner pass, to its end
    with pytest.raises(ClosedError, match="runs one iteration at a time"):
        next(outer)
    last = iter(data)
    next(last)
    data.close()
    with pytest.raises(ClosedError, match=r"ended by close\(\)"):
        next(last)


def test_state_mid_epoch_resumes_with_the_next_batch_in_a_new_adapter():
    data = _adapter()
    list(data)
    batches = iter(data)
    taken = _seen([next(batches), next(batches)])
    state = data.state_dict()
    assert json.loads(json.dumps(state)) == state  # small and JSON-serialisable
    assert state["epoch"] == 1 and state["resume"] is True

    resumed = _adapter()
    resumed.load_state_dict(state)
    assert resumed.state_dict() == state  # nothing taken since: still the same place
    resumed.set_epoch(1)  # a loop that calls set_epoch(epoch) from the checkpoint's epoch
    rest = _seen(resumed)
    assert taken + rest == [(1, i) for i in range(BATCHES)]
    assert _seen(resumed) == [(2, i) for i in range(BATCHES)]


def test_resume_through_len_and_state_taken_before_the_first_resumed_batch():
    data = _adapter()
    batches = iter(data)
    next(batches)
    state = data.state_dict()
    resumed = _adapter()
    resumed.load_state_dict(state)
    assert len(resumed) == BATCHES
    assert resumed.state_dict()["resume"] is True
    assert _seen(resumed) == [(0, i) for i in range(1, BATCHES)]


def _resumed_after_a_batch() -> Any:
    """A new adapter loaded with the state of one that took one batch of epoch 0."""
    data = _adapter()
    next(iter(data))
    resumed = _adapter()
    resumed.load_state_dict(data.state_dict())
    return resumed


def test_set_epoch_refuses_to_skip_epochs_after_a_loaded_state():
    resumed = _resumed_after_a_batch()
    with pytest.raises(ValueError, match=r"middle of epoch 0: .* set_epoch\(2\) would drop .* and skip epoch 1"):
        resumed.set_epoch(2)
    assert _seen(resumed) == [(0, i) for i in range(1, BATCHES)]  # still where it stood


def test_set_epoch_of_the_next_epoch_after_a_mid_epoch_state_drops_the_rest_with_a_warning(caplog):
    # A loop that ends its epochs early (Lightning's limit_train_batches), resumed from a state at its last step,
    # asks for the next epoch: it was refused, and the resumed fit crashed.
    resumed = _resumed_after_a_batch()
    resumed.set_epoch(1)
    assert "set_epoch(1) after loading a state in the middle of epoch 0 drops the 4 batch(es) left" in caplog.text
    assert _seen(resumed) == [(1, i) for i in range(BATCHES)]
    data = _adapter(FakeReader(length=None))
    next(iter(data))
    uncounted = _adapter(FakeReader(length=None))
    uncounted.load_state_dict(data.state_dict())
    uncounted.set_epoch(1)
    assert "drops the rest of it" in caplog.text
    assert _seen(uncounted) == [(1, i) for i in range(BATCHES)]


def test_state_between_epochs_goes_on_with_the_next_epoch():
    reader = FakeReader()
    data = _adapter(reader)
    list(data)
    state = data.state_dict()
    assert (state["epoch"], state["resume"]) == (1, False)
    other = FakeReader()
    resumed = _adapter(other)
    resumed.load_state_dict(state)
    assert other.loaded == state["reader"]  # for the reader to check; the next epoch is asked for by number
    assert {epoch for epoch, _ in _seen(resumed)} == {1}
    assert other.calls == [1]


class CheckingReader(FakeReader):
    """Refuses a state of another config, as ``Client.load_state_dict`` does."""

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state.get("config") != "mine":
            raise ConfigError(f"the state was taken under another config: {state}")
        super().load_state_dict(state)


def test_a_state_between_epochs_of_another_config_is_refused_by_the_reader():
    # The reader part of a between-epochs state went unchecked: the README promises a ConfigError.
    data = _adapter(CheckingReader())
    with pytest.raises(ConfigError, match="another config"):
        data.load_state_dict({"epoch": 3, "resume": False, "reader": {"config": "theirs"}})
    data.load_state_dict({"epoch": 3, "resume": False, "reader": {"config": "mine"}})
    assert {epoch for epoch, _ in _seen(data)} == {3}


def test_state_before_iterating_and_after_len():
    data = _adapter()
    assert data.state_dict() == {"epoch": 0, "resume": False, "reader": {"epoch": 0, "taken": 0}}
    len(data)
    assert (data.state_dict()["epoch"], data.state_dict()["resume"]) == (0, False)


@pytest.mark.parametrize(
    "state", [{}, {"epoch": 0, "resume": "yes", "reader": {}}, {"epoch": -1, "resume": False, "reader": {}}, []]
)
def test_a_state_of_something_else_is_refused(state):
    with pytest.raises(ValueError, match="state|epoch"):
        _adapter().load_state_dict(state)


def test_close_stops_the_epoch_and_leaves_a_given_reader_open():
    reader = FakeReader()
    with _adapter(reader) as data:
        next(iter(data))
    assert reader.epochs[0].closed
    data.close()  # idempotent


def test_options_for_a_reader_that_exists_are_refused():
    from loader.torch import DataLoader

    with pytest.raises(TypeError, match="prefetch"):
        DataLoader(FakeReader(), prefetch=2)
    with pytest.raises(TypeError):
        DataLoader(FakeReader(), device="cuda")


def test_a_source_that_is_no_address_nor_config_is_a_config_error():
    from loader.torch import DataLoader

    with pytest.raises(ConfigError, match="not a daemon address"):
        DataLoader("no-such-thing")
    with pytest.raises(ConfigError, match="does not exist"):
        DataLoader("missing.toml")


def test_a_config_refuses_ranks_and_unknown_options(tmp_path):
    from loader.torch import DataLoader

    config = tmp_path / "c.toml"
    config.write_text('[source]\nfiles = ["*.npz"]\n')
    with pytest.raises(ValueError, match="loader serve"):
        DataLoader(config, rank=1, world_size=2)
    with pytest.raises(TypeError, match="read_ahead"):
        DataLoader(config, read_ahead=False)
    with pytest.raises(ConfigError, match=r"got 'gpu0' \(DataLoader\(device='gpu0'\)\)"):
        DataLoader(config, device="gpu0")  # the argument's fault, not the file's
    with pytest.raises(TypeError, match=r"batch_size: \[pipeline\] batch_size in the config; num_workers: \[workers\]"):
        DataLoader(config, batch_size=32, num_workers=4)  # what a torch user types first


def test_torch_arguments_to_a_daemons_dataloader_say_where_they_live():
    from loader.torch import DataLoader

    with pytest.raises(TypeError, match=r"not \['batch_size', 'shuffle'\] \(batch_size: \[pipeline\] batch_size"):
        DataLoader("127.0.0.1:1", batch_size=32, shuffle=True)  # refused before connecting


class _ProcessGroup:
    """torch.distributed with an initialised default group, as mp.spawn's ranks have it (no RANK/WORLD_SIZE)."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return True

    def get_rank(self) -> int:
        return self.rank

    def get_world_size(self) -> int:
        return self.world_size


def test_ranks_started_by_mp_spawn_take_their_share_from_the_process_group(tmp_path, monkeypatch):
    # init_process_group(rank=r, world_size=2) sets no variable: each rank read the whole dataset, silently.
    from loader.service.client.env import from_environment
    from loader.torch import DataLoader

    for name in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setitem(sys.modules, "torch.distributed", _ProcessGroup(1, 2))
    assert from_environment("tcp://h:1", None, None, "cpu")[1:3] == (1, 2)
    assert from_environment("tcp://h:1", 0, 1, "cpu")[1:3] == (0, 1)  # given: it wins
    assert from_environment("tcp://h:1", None, 1, "cpu")[1:3] == (0, 1)  # world_size=1: all of it
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    with pytest.raises(ConfigError, match=r"RANK=3 and WORLD_SIZE=4 disagree"):  # two launchers' words: neither
        from_environment("tcp://h:1", None, None, "cpu")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert from_environment("tcp://h:1", None, None, "cpu")[1:3] == (1, 2)  # torchrun's, which its group agrees with
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.delenv("RANK")
    config = tmp_path / "c.toml"
    config.write_text('[source]\nfiles = ["*.npz"]\n')
    with pytest.raises(ValueError, match=r"torch.distributed's world_size=2: this process is one of 2 ranks"):
        DataLoader(config)
    monkeypatch.setitem(sys.modules, "torch.distributed", _ProcessGroup(0, 1))
    assert from_environment("tcp://h:1", None, None, "cpu")[1:3] == (0, 1)


def test_a_world_size_without_a_rank_takes_the_rank_of_a_process_group_of_that_size(monkeypatch):
    # Lightning's DDP launcher sets WORLD_SIZE, LOCAL_RANK and NODE_RANK, not RANK: the client refused to start.
    from loader.service.client.env import from_environment

    for name in ("RANK", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setitem(sys.modules, "torch.distributed", _ProcessGroup(1, 2))
    assert from_environment("tcp://h:1", None, None, "cpu")[1:3] == (1, 2)
    monkeypatch.setitem(sys.modules, "torch.distributed", _ProcessGroup(1, 4))  # another job's size: not ours
    with pytest.raises(ConfigError, match=r"WORLD_SIZE=2 is set but no rank .* no torch.distributed process group"):
        from_environment("tcp://h:1", None, None, "cpu")
    # Under `srun --pty bash`, Lightning's ranks also inherit the shell's SLURM_PROCID=0: both read rank 0's share.
    monkeypatch.setitem(sys.modules, "torch.distributed", _ProcessGroup(1, 2))
    monkeypatch.setenv("SLURM_PROCID", "0")
    with pytest.raises(ConfigError, match=r"SLURM_PROCID=0 and WORLD_SIZE=2 disagree with .* \(rank 1 of 2\)"):
        from_environment("tcp://h:1", None, None, "cpu")
    assert from_environment("tcp://h:1", 1, 2, "cpu")[1:3] == (1, 2)  # given: it wins
    monkeypatch.setenv("WORLD_SIZE", "1")  # each rank reading it all, said by a variable: the group says otherwise
    monkeypatch.delenv("SLURM_PROCID")
    with pytest.raises(ConfigError, match=r"WORLD_SIZE=1 disagree"):
        from_environment("tcp://h:1", None, None, "cpu")
    assert from_environment("tcp://h:1", None, 1, "cpu")[1:3] == (0, 1)  # world_size=1 given: all of it


def test_a_config_under_torchrun_is_refused_unless_each_rank_is_to_read_it_all(tmp_path, monkeypatch):
    from loader.torch import DataLoader

    config = tmp_path / "c.toml"
    config.write_text('[source]\nfiles = ["*.npz"]\n')
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(ValueError, match=r"WORLD_SIZE=2: this process is one of 2 ranks.*loader serve"):
        DataLoader(config)  # every rank would have read the whole dataset
    with pytest.raises(ConfigError, match="matched no files"):  # world_size=1: it goes on (and finds no data)
        DataLoader(config, world_size=1)
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.delenv("RANK")
    monkeypatch.setenv("SLURM_NTASKS", "4")  # one plain `python train.py` in an sbatch script sees it too
    with pytest.raises(ConfigError, match="matched no files"):
        DataLoader(config)


def _npy_config(tmp_path: Any, data: Any, seed: int = 7) -> Any:
    """A config of one ``.npy`` file of ``data`` and its labels (0, 1, ...), one worker, seeded."""
    import numpy as np

    from loader.config import LoaderConfig

    np.save(tmp_path / "f0.npy", data)
    np.save(tmp_path / "f0.label.npy", np.arange(len(data), dtype=np.int64))
    return LoaderConfig.from_dict(
        {
            "source": {"files": [str(tmp_path / "*.npy")]},
            "pipeline": {"batch_size": 8, "seed": seed, "shuffle_buffer": 16},
            "workers": {"count": 1},
        }
    )


def test_a_field_torch_has_no_dtype_for_stays_numpy_and_the_rest_are_tensors(tmp_path, torch):
    # torch.from_numpy refuses long double: it raised in the client's receiver thread, and the client was
    # dead for good (every later epoch raised it again).
    import numpy as np

    from loader.torch import DataLoader

    with DataLoader(_npy_config(tmp_path, np.arange(64, dtype=np.longdouble)), device="torch") as data:
        for _ in range(2):
            batches = list(data)
            assert len(batches) == 8
            assert all(isinstance(b["data"], np.ndarray) and b["data"].dtype == np.longdouble for b in batches)
            assert all(isinstance(b["label"], torch.Tensor) for b in batches)
            assert sorted(int(x) for b in batches for x in b["data"]) == list(range(64))


def test_a_loader_of_numpy_batches_given_as_it_is_gives_tensors(tmp_path, torch):
    # loader.Loader(config) batches are numpy arrays (its client's device "cpu"): a torch DataLoader over it
    # gave them as they were.
    import numpy as np

    import loader
    from loader.torch import DataLoader

    with loader.Loader(_npy_config(tmp_path, np.arange(64, dtype=np.float32))) as local:
        batches = list(DataLoader(local))
    assert len(batches) == 8 and all(isinstance(b[k], torch.Tensor) for b in batches for k in ("data", "label"))
    assert sorted(int(x) for b in batches for x in b["data"]) == list(range(64))


def test_a_state_between_epochs_replaces_a_position_loaded_before(tmp_path):
    # Over a real in-process Loader: whole epochs compared with an uninterrupted run's.
    import numpy as np

    from loader.torch import DataLoader

    config = _npy_config(tmp_path, np.arange(1000, 1200, dtype=np.int64))

    def rows(batches: Any) -> list[list[int]]:
        return [b["data"].tolist() for b in batches]

    with DataLoader(config) as data:
        epochs = [rows(data) for _ in range(2)]  # epochs 0 and 1, uninterrupted
        after_epoch_1 = data.state_dict()
        epoch_2 = iter(data)
        for _ in range(5):
            next(epoch_2)
        mid_epoch_2 = data.state_dict()
        data.set_epoch(2)
        epochs += [rows(data), rows(data)]  # epochs 2 and 3
    assert (after_epoch_1["epoch"], after_epoch_1["resume"], mid_epoch_2["resume"]) == (2, False, True)
    assert len(epochs[2]) == 25 and epochs[2] != epochs[1]

    with DataLoader(config) as data:
        data.load_state_dict(mid_epoch_2)
        data.load_state_dict(after_epoch_1)  # an older checkpoint after all: epoch 2 from its start
        state = data.state_dict()
        assert (state["epoch"], state["resume"], state["reader"]["position"]) == (2, False, 0)
        data.set_epoch(2)
        assert [rows(data), rows(data)] == epochs[2:]
        # A between-epochs state whose reader part stands inside its epoch (as this method saved it when it
        # left a stale position in force): the epoch still starts from its first batch.
        data.load_state_dict({**mid_epoch_2, "resume": False})
        assert rows(data) == epochs[2]
        data.load_state_dict(mid_epoch_2)  # a mid-epoch state still goes on after its last batch
        assert rows(data) == epochs[2][5:]
        # The reader part of a between-epochs state is checked: a state of another config is refused.
        with DataLoader(_npy_config(tmp_path, np.arange(1000, 1200, dtype=np.int64), seed=8)) as elsewhere:
            foreign = elsewhere.state_dict()
        assert (foreign["epoch"], foreign["resume"]) == (0, False)
        with pytest.raises(ConfigError, match="another config"):
            data.load_state_dict(foreign)


def test_the_names_torch_users_know():
    from loader import torch as adapter

    assert adapter.StatefulDataLoader is adapter.DataLoader


_WITHOUT_TORCH = """
import sys
sys.modules["torch"] = None  # as if not installed: importing it raises ImportError
import loader.torch  # the module imports without torch
from loader.errors import MissingDependencyError
try:
    loader.torch.DataLoader("tcp://127.0.0.1:1")
except MissingDependencyError as exc:
    print(type(exc).__name__, isinstance(exc, ImportError), exc)
"""


def test_without_torch_the_module_imports_and_using_it_says_how_to_install(runs_without_torch):
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_TORCH], capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S, check=True
    )
    assert done.stdout.startswith("MissingDependencyError True ")
    assert "pip install torch" in done.stdout
    assert issubclass(MissingDependencyError, LoaderError)


def test_a_torch_that_is_installed_but_does_not_import_says_why(monkeypatch):
    # A missing CUDA library (or a script named like a module torch imports) was reported as "not installed".
    import importlib

    from loader import device

    real = importlib.import_module

    def broken(name, *args):
        if name == "torch":
            raise ImportError("libcudart.so.12: cannot open shared object file: No such file or directory")
        return real(name, *args)

    monkeypatch.setattr(device.importlib, "import_module", broken)
    with pytest.raises(MissingDependencyError) as caught:
        device.import_torch("loader.torch.DataLoader")
    assert str(caught.value) == (
        "torch is installed but does not import: ImportError: libcudart.so.12: cannot open shared object file: "
        "No such file or directory"
    )


@pytest.mark.parametrize("kind", ["dataset", "list"])
def test_a_torch_dataset_as_the_source_says_what_the_source_is(torch, kind):
    # What a torch user passes first: it failed inside load_config with "expected str, bytes or os.PathLike
    # object, not TensorDataset", naming neither this class nor what it reads.
    from loader.torch import DataLoader

    source = torch.utils.data.TensorDataset(torch.arange(8)) if kind == "dataset" else [1, 2, 3]
    with pytest.raises(TypeError, match=r"reads a loader daemon's address, a config .* not a (TensorDataset|list)"):
        DataLoader(source)
    with pytest.raises(TypeError, match="config's \\[source\\] names the files"):
        DataLoader(source, batch_size=4)  # the source is what is wrong, before the torch argument


def test_device_none_gives_cpu_tensors_over_a_daemon_and_over_a_config(tmp_path, torch):
    # torch's "device=None" (the default device): over an address it gave numpy arrays (a Client reads None as
    # fluid's "no place"), over a config a ConfigError "got 'None'".
    import numpy as np

    from loader.service.local import Loader
    from loader.torch import DataLoader

    config = _npy_config(tmp_path, np.arange(16, dtype=np.float32))
    with DataLoader(config, device=None) as data:
        batch = next(iter(data))
        assert isinstance(batch["data"], torch.Tensor) and batch["data"].device.type == "cpu"
    with Loader(config) as daemon:
        with DataLoader(daemon.endpoint, device=None) as data:  # its daemon's address
            batch = next(iter(data))
            assert isinstance(batch["label"], torch.Tensor) and batch["label"].device.type == "cpu"


def test_batch_size_is_the_configs_as_torch_users_read_it(tmp_path, torch):
    import numpy as np

    from loader.service.local import Loader
    from loader.torch import DataLoader

    config = _npy_config(tmp_path, np.arange(16, dtype=np.float32))
    with DataLoader(config) as data:
        assert data.batch_size == 8 == len(next(iter(data))["label"])
    with Loader(config) as local:
        assert local.info.batch_size == 8 and local.info.samples == 16
        with DataLoader(local.endpoint) as data:  # over the daemon's address: a Client's welcome
            assert data.batch_size == 8
    assert _adapter().batch_size is None  # a reader of your own that does not say


def test_len_after_a_resume_is_the_whole_epochs_as_torchdatas(tmp_path, torch):
    # It was the batches left: a loop that counts the batches taken before the state against len() (as Lightning's
    # batch progress does) would end the resumed epoch early.
    import numpy as np

    from loader.torch import DataLoader

    config = _npy_config(tmp_path, np.arange(64, dtype=np.float32))
    state = _state_after(config, 3)
    with DataLoader(config) as data:
        data.load_state_dict(state)
        assert len(data) == 8
        assert sum(1 for _ in data) == 5  # the rest of the epoch
        assert len(data) == 8  # the next one


def test_a_torch_device_of_the_cpu_gives_tensors_over_a_config(tmp_path, torch):
    import numpy as np

    from loader.torch import DataLoader

    config = _npy_config(tmp_path, np.arange(16, dtype=np.float32))
    with DataLoader(config, device=torch.device("cpu")) as data:  # was numpy: "cpu" as the config's text
        batch = next(iter(data))
        assert isinstance(batch["label"], torch.Tensor) and isinstance(batch["data"], torch.Tensor)


def test_a_state_whose_epoch_differs_from_its_readers_is_refused(tmp_path, torch):
    import numpy as np

    from loader.torch import DataLoader

    config = _npy_config(tmp_path, np.arange(64, dtype=np.float32))
    with DataLoader(config) as data:
        data.set_epoch(1)
        batches = iter(data)
        next(batches)
        state = data.state_dict()
    assert (state["epoch"], state["resume"], state["reader"]["epoch"]) == (1, True, 1)
    with DataLoader(config) as data:
        with pytest.raises(ValueError, match=r"in the middle of epoch 2 whose reader stands in epoch 1: .*edited"):
            data.load_state_dict({**state, "epoch": 2})  # would have skipped epoch 2 after the resumed one
        data.load_state_dict(state)
        assert len(list(data)) == 64 // 8 - 1


def test_a_state_taken_after_iter_and_before_its_first_batch_starts_that_epoch(tmp_path, torch):
    # The reader still stood in the epoch left by `break`: the state said "in the middle of epoch 1" over a reader
    # in epoch 0, which the epoch check refused as edited (and before it, epoch 0's rest was served as epoch 1).
    import numpy as np

    from loader.torch import DataLoader

    config = _npy_config(tmp_path, np.arange(64, dtype=np.float32))
    with DataLoader(config) as data:
        for index, _ in enumerate(data):
            if index == 1:
                break
        batches = iter(data)  # epoch 1 handed out, nothing taken
        state = data.state_dict()
        expected = [batch["label"].tolist() for batch in batches]  # epoch 1 as it runs
    assert (state["epoch"], state["resume"]) == (1, False)
    with DataLoader(config) as data:
        data.load_state_dict(state)
        assert [batch["label"].tolist() for batch in data] == expected


def test_a_list_batch_gives_the_scalar_fields_of_its_samples_as_tensors_too(tmp_path, torch):
    # With batch_format = "list" a sample's scalar fields (the label) are numpy scalars: they stayed numpy
    # (np.int64) beside the tensors of its array fields, so torch.stack of the labels failed.
    import numpy as np

    from loader.torch import DataLoader

    config = _npy_config(tmp_path, np.arange(24, dtype=np.float32).reshape(12, 2))
    config = config.override({"pipeline.batch_format": "list"})
    np.save(tmp_path / "f0.word.npy", np.array([f"w{i}" for i in range(12)]))  # a third field, of strings
    with DataLoader(config) as data:
        samples = [sample for batch in data for sample in batch]
    assert len(samples) == 12
    for features, label, word in samples:
        assert isinstance(features, torch.Tensor) and features.shape == (2,) and features.dtype == torch.float32
        assert isinstance(label, torch.Tensor) and label.shape == () and label.dtype == torch.int64
        assert isinstance(word, np.str_)  # torch has no strings: as it was
        assert int(features[0]) == 2 * int(label) and str(word) == f"w{int(label)}"
    assert sorted(torch.stack([label for _, label, _ in samples]).tolist()) == list(range(12))


def test_torch_arguments_given_positionally_say_what_they_were_taken_for_and_where_they_live(tmp_path, torch):
    # DataLoader(source, 32), as torch's DataLoader(dataset, batch_size) is written: Python's own "takes 2
    # positional arguments but 3 were given" said neither what 32 was nor where a batch size is set here.
    from loader.torch import DataLoader

    config = tmp_path / "c.toml"
    config.write_text('[source]\nfiles = ["*.npz"]\n')
    for source in ("127.0.0.1:1", config, FakeReader()):  # refused before connecting or starting a Loader
        with pytest.raises(
            TypeError, match=r"only the source positionally, not torch's batch_size=32 \(batch_size: \[pipeline\]"
        ):
            DataLoader(source, 32)
    with pytest.raises(TypeError, match=r"batch_size=32, shuffle=True \(.*; shuffle: \[pipeline\] shuffle_buffer"):
        DataLoader(config, 32, True)
    with pytest.raises(TypeError, match="config's \\[source\\] names the files"):
        DataLoader(torch.utils.data.TensorDataset(torch.arange(8)), 32)  # the source is what is wrong first


def test_torch_arguments_with_a_reader_of_your_own_say_where_they_live_not_to_give_them_to_it():
    from loader.torch import DataLoader

    with pytest.raises(TypeError, match=r"takes no \['batch_size'\] \(batch_size: \[pipeline\] batch_size in the"):
        DataLoader(FakeReader(), batch_size=32)  # said "give ['batch_size'] to it instead": no Client takes it


def test_this_dataloader_given_to_torchs_dataloader_says_to_iterate_it_instead(torch):
    # torch takes it for a map-style Dataset: len() (ours), then indexing, which failed inside torch with
    # "'DataLoader' object is not subscriptable".
    with _adapter() as data:
        wrapped = torch.utils.data.DataLoader(data, batch_size=None)
        with pytest.raises(TypeError, match=r"not a Dataset but the DataLoader itself .* iterate it"):
            next(iter(wrapped))
        assert _seen(data) == [(0, index) for index in range(BATCHES)]  # as a DataLoader of its own, it works


def test_a_loader_or_client_given_to_torchs_dataloader_says_to_use_loader_torch(tmp_path, torch):
    # torch's sampler asks len() of what it takes for a Dataset: "object of type 'Loader' has no len()", from
    # inside torch, said nothing of what to use.
    import numpy as np

    from loader.service.local import Loader

    with Loader(_npy_config(tmp_path, np.arange(16, dtype=np.float32))) as data:
        for reader in (data, data.client()):
            name = type(reader).__name__
            wrapped = torch.utils.data.DataLoader(reader)
            with pytest.raises(TypeError, match=rf"a {name} has no len\(\): .* use loader.torch.DataLoader\(x\)"):
                next(iter(wrapped))
            assert reader  # still true, though it has a __len__ now
        with pytest.raises(TypeError, match=r"one epoch at a time: for batch in client.epoch\(\)"):
            iter(data.client())  # was "'Client' object is not iterable"
        batches = list(data)  # list() asks len() for a size hint, and goes on without one
    assert len(batches) == 2 and sorted(np.concatenate([b["label"] for b in batches]).tolist()) == list(range(16))


def test_set_epoch_of_the_next_epoch_after_a_state_taken_at_an_epochs_last_batch(tmp_path):
    # A loop that saves its state at every step and counts an epoch done after its last batch resumes with
    # set_epoch(next epoch): it was refused ("in the middle of epoch 0"), though nothing was left to drop.
    import numpy as np

    from loader.torch import DataLoader

    config = _npy_config(tmp_path, np.arange(1000, 1200, dtype=np.int64))

    def rows(batches: Any) -> list[list[int]]:
        return [b["data"].tolist() for b in batches]

    with DataLoader(config) as data:
        epoch_0 = iter(data)
        for _ in range(len(data)):
            next(epoch_0)
        at_last_batch = data.state_dict()
        next(epoch_0, None)
        epoch_1 = rows(data)
    assert at_last_batch["resume"] is True and len(epoch_1) == 25
    with DataLoader(config) as data:
        data.load_state_dict(at_last_batch)
        with pytest.raises(
            ValueError,
            match=r"taken at epoch 0's last batch: set_epoch\(1\) starts the next epoch; "
            r"set_epoch\(2\) would skip epoch 1",
        ):
            data.set_epoch(2)
        data.set_epoch(1)
        state = data.state_dict()  # the reader moved to the start of epoch 1, as a between-epochs state says
        assert (state["epoch"], state["resume"]) == (1, False)
        assert (state["reader"]["epoch"], state["reader"]["position"]) == (1, 0)
        assert rows(data) == epoch_1
    with DataLoader(config) as data:
        data.load_state_dict(at_last_batch)
        len(data)  # opened ahead first, as a loop that sizes its progress bar does
        data.set_epoch(1)
        assert rows(data) == epoch_1
    mid_epoch = _state_after(config, 5)
    with DataLoader(config) as data:
        data.load_state_dict(mid_epoch)
        with pytest.raises(
            ValueError, match=r"set_epoch\(4\) would drop the 20 batch\(es\) left of it and skip epochs 1-3"
        ):
            data.set_epoch(4)
        assert len(rows(data)) == 20  # still where it stood: set_epoch(0) or iterating goes on with the rest


def _state_after(config: Any, batches: int) -> dict[str, Any]:
    """A ``loader.torch.DataLoader``'s state after taking ``batches`` batches of its first epoch."""
    from loader.torch import DataLoader

    with DataLoader(config) as data:
        epoch = iter(data)
        for _ in range(batches):
            next(epoch)
        return data.state_dict()
