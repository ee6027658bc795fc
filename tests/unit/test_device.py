"""loader.device.Placer: CPU identity, place parsing, and the device path (fake torch on CPU, real on GPU)."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import inspect
import sys
import threading
import types

import numpy as np
import pytest

from loader import LoDTensor
from loader import device as device_mod
from loader.device import Placer, map_leaves
from loader.errors import ConfigError


def test_cpu_is_the_identity():
    placer = Placer("cpu")
    batch = {"x": np.ones(3), "y": [np.zeros(2), "text"]}
    assert placer.finish(placer.stage(batch)) is batch
    assert placer.is_cpu and not placer.is_cuda and placer.place == "cpu"


@pytest.mark.parametrize("place", ["tpu", "cuda:x", "cpu:1", "", "cupy:cpu", 3])
def test_unparseable_place_is_a_value_error(place):
    with pytest.raises(ConfigError, match="place"):  # the project's error for a bad setting, and a ValueError
        Placer(place)


@pytest.mark.parametrize("place", ["cuda", "cuda:0", "gpu:1", "torch:cuda:0", "cupy:cuda"])
def test_device_place_without_torch_or_cupy_fails_at_construction(monkeypatch, place):
    monkeypatch.setattr(device_mod, "_try_import", lambda name: None)
    with pytest.raises(ConfigError, match="needs .*installed") as info:
        Placer(place)
    assert "\n" not in str(info.value)


def test_map_leaves_walks_nests_and_dataclasses():
    @dataclasses.dataclass(frozen=True)
    class Pair:
        a: np.ndarray
        b: int

    nest = {"t": LoDTensor(np.ones(2), [[1, 1]]), "p": (Pair(np.zeros(1), 5), [np.arange(2)]), "s": "keep"}
    out = map_leaves(nest, lambda a: a + 10)
    assert out["t"].data.tolist() == [11, 11] and out["t"].lengths == [[1, 1]]
    assert out["p"][0].a.tolist() == [10] and out["p"][0].b == 5 and out["p"][1][0].tolist() == [10, 11]
    assert out["s"] == "keep" and isinstance(out["p"], tuple)


# -- a fake torch that records what the placer asks of it ------------------------------------


class _FakeTensor:
    def __init__(self, array, log, where="cpu", pinned=False):
        self.array, self.log, self.where, self.pinned = array, log, where, pinned
        self.is_cuda = where.startswith("cuda")
        self.dtype = array.dtype

    def pin_memory(self):
        # Tensor.pin_memory() copies on torch's intra-op thread pool, which stalls on a host
        # whose cores are busy with the loader's workers: the placer copies with numpy instead.
        raise AssertionError("stage must not call Tensor.pin_memory(): copy into torch.empty(pin_memory=True)")

    def numpy(self):
        return self.array

    def to(self, device, non_blocking=False):
        assert self.pinned and non_blocking, "copies must come from pinned memory, asynchronously"
        self.log.append(("copy", self.log_stream[0]))
        return _FakeTensor(self.array, self.log, f"cuda:{device.index}")

    def record_stream(self, stream):
        self.log.append(("record_stream", stream.name))


def _checked(real: object, fake):
    """``fake``, refusing any call that ``real`` (the installed torch's function) would not accept."""
    if real is None:
        return fake
    signature = inspect.signature(real)

    def call(*args, **kwargs):
        signature.bind(*args, **kwargs)
        return fake(*args, **kwargs)

    return call


def _fake_torch(log, real=None, current_device=1):
    """A torch whose CUDA calls are logged; with ``real``, each call is checked against its signature.

    Two devices; ``current_device`` is what ``torch.cuda.current_device()`` says (as after ``set_device``)."""
    torch = types.ModuleType("torch")
    current = ["default"]
    _FakeTensor.log_stream = current
    cuda = getattr(real, "cuda", None)

    class Device:
        def __init__(self, kind, index=None):
            self.type, self.index = kind, index

        def __str__(self):  # as torch.device's
            return self.type if self.index is None else f"{self.type}:{self.index}"

    class Stream:
        def __init__(self, device=None, name="side"):
            self.name = name

        def wait_event(self, event):
            log.append(("wait", self.name, event.stream))

    class Event:
        def record(self, stream):
            self.stream = stream.name
            log.append(("event", stream.name))

    @contextlib.contextmanager
    def use_stream(stream):
        previous, current[0] = current[0], stream.name
        try:
            yield
        finally:
            current[0] = previous

    if cuda is not None:
        Stream.wait_event = _checked(cuda.Stream.wait_event, Stream.wait_event)
        Event.record = _checked(cuda.Event.record, Event.record)

    def from_numpy(array):
        if not array.dtype.isnative:
            raise ValueError("given numpy array has byte order different from the native byte order")
        if array.dtype.char in "gG":  # as torch: no long double
            raise TypeError(f"can't convert np.ndarray of type numpy.{array.dtype.type.__name__}")
        return _FakeTensor(array, log)

    def empty(shape, dtype=None, pin_memory=False):
        if pin_memory:
            log.append("pin")
        return _FakeTensor(np.empty(shape, dtype=dtype), log, pinned=pin_memory)

    Device.__module__ = "torch"
    torch.device, torch.Tensor = Device, _FakeTensor
    torch.from_numpy, torch.empty = from_numpy, empty
    torch.cuda = types.SimpleNamespace(
        is_available=lambda: True,
        device_count=lambda: 2,
        current_device=_checked(cuda and cuda.current_device, lambda: current_device),
        Stream=_checked(cuda and cuda.Stream, Stream),
        Event=_checked(cuda and cuda.Event, Event),
        stream=_checked(cuda and cuda.stream, use_stream),
        device=_checked(cuda and cuda.device, lambda d: contextlib.nullcontext()),
        current_stream=_checked(cuda and cuda.current_stream, lambda d: Stream(name="consumer")),
    )
    return torch


def _installed_torch():
    return importlib.import_module("torch") if importlib.util.find_spec("torch") else None


def test_cuda_path_pins_copies_on_a_side_stream_and_the_consumer_waits(monkeypatch):
    # With torch installed, every torch.cuda call the placer makes is also checked
    # against the installed torch's signatures (the fake cannot drift from the real API).
    log: list = []
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(log, _installed_torch()))
    placer = Placer("cuda:1")
    assert placer.library == "torch" and placer.place == "cuda:1"
    batch = {"x": np.arange(4, dtype=np.float32)[::2], "t": LoDTensor(np.ones(2), [[2]]), "s": np.array(["a"])}
    staged = []
    producer = threading.Thread(target=lambda: staged.append(placer.stage(batch)))
    producer.start()
    producer.join(timeout=5)
    assert log.count("pin") == 2 and ("copy", "side") in log and log[-1] == ("event", "side")
    assert not any(entry[0] == "wait" for entry in log if isinstance(entry, tuple))  # stage never waits
    out = placer.finish(staged[0])
    assert ("wait", "consumer", "side") in log
    assert log.count(("record_stream", "consumer")) == 2
    assert out["x"].where == "cuda:1" and out["x"].array.tolist() == [0, 2]
    assert out["t"].data.where == "cuda:1" and out["t"].lengths == [[2]]
    assert isinstance(out["s"], np.ndarray)  # strings stay on the host
    with pytest.raises(ValueError, match="sees 2 CUDA device"):
        Placer("cuda:2")
    assert Placer(sys.modules["torch"].device("cuda", 1)).place == "cuda:1"


@pytest.mark.parametrize("spelling", ["cuda", "gpu", "torch:cuda", "torch:gpu", "device"])
def test_a_cuda_place_without_an_index_is_the_current_device_as_in_torch(monkeypatch, spelling):
    # torch reads torch.device("cuda") as the current device (torch.cuda.set_device); every spelling of a
    # GPU without an index went to device 0 here, so a DDP rank's batches landed on another rank's GPU.
    log: list = []
    torch = _fake_torch(log, _installed_torch(), current_device=1)
    monkeypatch.setitem(sys.modules, "torch", torch)
    place = torch.device("cuda") if spelling == "device" else spelling
    placer = Placer(place)
    assert (placer.library, placer.index, placer.place) == ("torch", 1, "cuda:1")
    out = placer.place_now({"x": np.arange(3)})
    assert out["x"].where == "cuda:1"
    assert Placer(torch.device("cuda", 0)).place == Placer("cuda:0").place == "cuda:0"  # an index given wins
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(log, current_device=0))
    assert Placer(place).place == "cuda:0"


def test_a_gpu_without_an_index_is_placed_alike_by_a_client_and_by_loader_torch(monkeypatch):
    # Client(device=...) and loader.torch.DataLoader(config, device=...) (whose in-process Loader gets
    # str(device) through its config) pick the same device for every spelling: LOCAL_RANK where set,
    # else the current device.
    from loader.service.client.env import from_environment
    from loader.torch import _torch_place

    log: list = []
    torch = _fake_torch(log, current_device=1)
    monkeypatch.setitem(sys.modules, "torch", torch)
    for environ, expected in [({"LOCAL_RANK": "0"}, "cuda:0"), ({}, "cuda:1")]:
        for device in ["cuda", "gpu", "torch:cuda", torch.device("cuda")]:
            places = set()
            for given in (_torch_place(device), _torch_place(str(device))):  # what _open and _local pass on
                resolved = from_environment("tcp://h:1", 0, 1, given, environ)[3]
                places.add(Placer(resolved).place)
            assert places == {expected}, (device, environ)


def test_cuda_stage_copies_any_layout_once_into_pinned_memory(monkeypatch):
    # Read-only (np.frombuffer on received frames), strided and byte-swapped arrays (a
    # big-endian .npy) go straight into a pinned buffer with numpy: no torch.from_numpy of
    # the array (which refuses the last two) and no intermediate copy.
    log: list = []
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(log))
    monkeypatch.setattr(device_mod, "_host_array", lambda a: pytest.fail("no intermediate host copy"))
    read_only = np.frombuffer(np.arange(6, dtype=np.float32).tobytes(), dtype=np.float32).reshape(2, 3)
    big_endian = np.arange(4, dtype=">i8")
    batch = {
        "r": read_only,
        "s": np.arange(12, dtype=np.int32).reshape(3, 4)[:, ::2],
        "b": big_endian,
        "z": np.array(2.5),
        "e": np.zeros((0, 3), np.uint8),
        "m": np.array([True, False]),
    }
    out = Placer("cuda:0").place_now(batch)
    assert log.count("pin") == len(batch)
    for name, array in batch.items():
        assert out[name].where == "cuda:0" and out[name].array.dtype.isnative
        assert out[name].array.shape == array.shape and out[name].array.tolist() == array.tolist(), name


def test_cuda_path_leaves_dtypes_torch_has_not_as_numpy(monkeypatch):
    # torch.from_numpy refuses long double: it raised in the client's receiver thread, killing the client.
    log: list = []
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(log))
    placer = Placer("cuda:0")
    batch = {"x": np.arange(3, dtype=np.float32), "g": np.arange(3, dtype=np.longdouble), "G": np.ones(2, "G")}
    for _ in range(2):  # the second time from what the placer learnt of torch
        out = placer.place_now(batch)
        assert out["x"].where == "cuda:0"
        assert out["g"] is batch["g"] and out["G"] is batch["G"]
    assert log.count("pin") == 2


def test_cupy_has_every_numeric_dtype_but_long_double():
    def never(dtype):
        raise AssertionError("torch is not asked about a cupy place")

    for char in "?bBhHiIlLqQefdFD":
        assert device_mod._device_storable(np.empty(1, char), "cupy", never), char
    for char in "gGUSOMm":
        assert not device_mod._device_storable(np.empty(1, char), "cupy", never), char


def test_torch_cpu_place_takes_byte_swapped_arrays(monkeypatch):
    log: list = []
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(log))
    out = Placer("torch:cpu").place_now({"b": np.arange(3, dtype=">f4")})
    assert out["b"].array.dtype == np.float32 and out["b"].array.tolist() == [0, 1, 2]


# -- real libraries ------------------------------------------------------------------------

_HAS_TORCH = importlib.util.find_spec("torch") is not None


def _cuda_available() -> bool:
    if not _HAS_TORCH:
        return False
    import torch

    return bool(torch.cuda.is_available())


@pytest.mark.skipif(not _HAS_TORCH, reason="torch is not installed")
def test_torch_cpu_place_gives_tensors():
    import torch

    out = Placer("torch:cpu").place_now({"x": np.arange(3), "r": np.arange(4)[::2]})
    assert isinstance(out["x"], torch.Tensor) and out["x"].tolist() == [0, 1, 2]
    assert out["r"].tolist() == [0, 2]
    assert Placer(torch.device("cpu")).place == "torch:cpu"
    # numpy scalars (a "list" batch's sample fields) are 0-d tensors; a string scalar stays as it was
    label, flag, word = Placer("torch").place_now((np.int64(3), np.bool_(True), np.str_("w")))
    assert isinstance(label, torch.Tensor) and label.shape == () and label.dtype == torch.int64 and int(label) == 3
    assert isinstance(flag, torch.Tensor) and flag.dtype == torch.bool and bool(flag)
    assert type(word) is np.str_ and word == "w"
    assert type(map_leaves(np.float16(0.5), lambda a: a)) is np.float16  # unchanged by fn: the scalar itself


@pytest.mark.skipif(not _HAS_TORCH, reason="torch is not installed")
def test_a_dtype_torch_cannot_hold_stays_numpy_and_the_rest_become_tensors():
    # The installed torch decides: long double never; uint16/32/64 only in torch versions that have them.
    import torch

    batch = {char: np.arange(3).astype(char) for char in "?bBhHiIlLqQefdFDgG"}
    batch[">f8"] = np.arange(3, dtype=">f8")
    batch["when"] = np.array(["2024-01-01"], dtype="datetime64[D]")
    out = Placer("torch").place_now(batch)
    for name, array in batch.items():
        try:
            torch.from_numpy(np.empty(0, array.dtype.newbyteorder("=")))
            held = array.dtype.kind in "biufc"
        except TypeError:
            held = False
        if held:
            assert isinstance(out[name], torch.Tensor) and out[name].tolist() == array.tolist(), name
        else:
            assert out[name] is array, name
    assert out["g"] is batch["g"] and out["G"] is batch["G"] and out["when"] is batch["when"]


@pytest.mark.skipif(not _HAS_TORCH, reason="torch is not installed")
def test_the_tensor_methods_the_cuda_path_uses_exist_in_torch():
    # The C-implemented methods have no inspectable signatures: call what runs on a CPU.
    import torch

    tensor = torch.from_numpy(np.arange(3, dtype=np.float32))
    assert tensor.to(torch.device("cpu"), non_blocking=True).tolist() == [0, 1, 2]
    empty = torch.empty((2, 3), dtype=torch.from_numpy(np.empty(0, np.int64)).dtype, pin_memory=False)
    np.copyto(empty.numpy(), np.ones((2, 3), ">i8"), casting="equiv")
    assert empty.dtype == torch.int64 and empty.sum().item() == 6
    assert callable(tensor.pin_memory) and callable(tensor.record_stream) and tensor.is_cuda is False
    assert torch.device("cuda", 1).index == 1 and torch.device("cuda", 1).type == "cuda"


@pytest.mark.skipif(not _HAS_TORCH, reason="torch is not installed")
def test_rows_gathered_into_a_host_buffer_are_staged_as_views_of_it(monkeypatch):
    # A client on a torch CUDA place gathers rows into Placer.host_buffer's page-locked tensor; stage sends
    # them from a view of that tensor (no second host copy), of torch's own memory so that its pinned-memory
    # cache sees the copy. No CUDA here: the placer says it pins, and torch.empty gives ordinary memory.
    import torch

    placer = Placer("torch:cpu")
    assert placer.host_buffer(8) is None  # a place that does not pin: the client gathers into its own memory
    real_empty = torch.empty
    monkeypatch.setattr(Placer, "gathers_pinned", property(lambda self: True))
    monkeypatch.setattr(torch.cuda, "device", lambda index: contextlib.nullcontext())
    monkeypatch.setattr(torch, "empty", lambda *a, pin_memory=False, **k: real_empty(*a, **k))
    buffer = placer.host_buffer(4096)
    rows = buffer[: 6 * 40].reshape(6, 40).view(np.float32).reshape(6, 2, 5)  # as refs.gather lays rows out
    rows[...] = np.arange(60, dtype=np.float32).reshape(6, 2, 5)
    part = rows[2:4]  # one part of a packed batch, past the buffer's start
    view = device_mod._pinned_view(torch, part, placer._handed_out)
    assert view.dtype == torch.float32 and tuple(view.shape) == (2, 2, 5) and view.tolist() == part.tolist()
    assert view.data_ptr() == part.ctypes.data  # the same bytes, not a copy
    assert view.untyped_storage().data_ptr() == buffer.ctypes.data  # of the buffer's own tensor
    swapped = buffer[:80].view(">f4")
    for other in (np.ones(3, np.float32), rows[:, 0], rows[:0], swapped):  # no tensor's, strided, empty, swapped
        assert device_mod._pinned_view(torch, other, placer._handed_out) is None
    # Memory of a tensor the placer did not hand out (the caller's own pinned batch) is copied, as stage always
    # did: the caller may overwrite it once it is staged.
    own = real_empty(4096, dtype=torch.uint8).numpy().view(np.float32)
    assert device_mod._pinned_view(torch, own, placer._handed_out) is None
    del buffer, rows, part, swapped, view, other
    assert placer._host_buffers == {}  # forgotten once dropped


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_available(), reason="no CUDA device")
def test_cuda_rows_in_a_host_buffer_reach_the_device_without_a_second_copy(monkeypatch):
    # Batches gathered into host_buffer memory are staged from it directly, and each one's values reach the
    # device whole although the next batches' buffers are taken and written while every copy still waits
    # behind a long kernel on the side stream (torch's pinned cache must not hand out memory queued for copy).
    import torch

    placer = Placer("cuda")
    assert placer.gathers_pinned
    monkeypatch.setattr(device_mod, "_pinned_copy", lambda *a: pytest.fail("a second host copy"))
    side = placer._side_stream(lambda: torch.cuda.Stream(device=torch.device("cuda", placer.index)))
    with torch.cuda.stream(side):
        torch.cuda._sleep(1_000_000_000)  # about 0.5 s at 2 GHz: the copies below queue behind it
    outs, expected = [], []
    for i in range(40):
        raw = placer.host_buffer(64 * 1024 * 4)
        rows = raw.view(np.float32).reshape(64, 1024)
        rows[...] = i
        staged = placer.stage({"x": rows[1 : 33 + i % 31]})  # past the buffer's start, as a packed part is
        del raw, rows  # the client keeps no reference of its own once a batch is staged
        outs.append(placer.finish(staged)["x"])
        expected.append((32 + i % 31, i))
    assert not side.query()  # the copies were still queued when the last buffers were written
    torch.cuda.synchronize()
    for out, (n, value) in zip(outs, expected):
        assert out.is_cuda and tuple(out.shape) == (n, 1024) and bool((out == value).all())


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_available(), reason="no CUDA device")
def test_cuda_place_with_torch_copies_asynchronously():
    import torch

    placer = Placer("cuda")
    batch = {
        "x": np.random.rand(256, 128).astype(np.float32),
        "t": LoDTensor(np.arange(5), [[2, 3]]),
        "b": np.frombuffer(np.arange(6, dtype=">f8").tobytes(), dtype=">f8")[::2],
    }
    staged = []
    producer = threading.Thread(target=lambda: staged.append(placer.stage(batch)))
    producer.start()
    producer.join(timeout=30)
    out = placer.finish(staged[0])
    assert out["x"].is_cuda and out["t"].data.is_cuda
    torch.cuda.current_stream().synchronize()
    np.testing.assert_array_equal(out["x"].cpu().numpy(), batch["x"])
    assert out["t"].data.cpu().tolist() == list(range(5))
    assert out["b"].is_cuda and out["b"].dtype == torch.float64 and out["b"].cpu().tolist() == [0, 2, 4]


@pytest.mark.skipif(not _HAS_TORCH or _cuda_available(), reason="needs torch without a CUDA device")
def test_cuda_place_with_torch_but_no_device_fails_at_construction():
    with pytest.raises(ValueError, match=r"torch sees 0 CUDA device\(s\), no device 0"):
        Placer("torch:cuda")


def test_torch_alone_means_torch_tensors_on_the_cpu() -> None:
    from loader.device import _parse_place

    assert _parse_place("torch") == _parse_place("torch:cpu") == ("torch", "cpu", 0)
    assert _parse_place("cpu") == ("numpy", "cpu", 0)


def test_fluid_places_and_none_are_taken_wherever_a_place_is():
    # Paddle code passes CPUPlace(), CUDAPinnedPlace() or double_buffer's default None to readers too, not only
    # to DataFeeder: each is the host (a CUDAPlace is "cuda:i", checked with the CUDA places above).
    from loader.io import DoubleBufferReader
    from loader.io.bridge import from_reader
    from tests.paddle_shim import CPUPlace, CUDAPlace

    class CUDAPinnedPlace:
        pass

    for place in (CPUPlace(), CUDAPinnedPlace(), None):
        assert Placer(place).place == "cpu"
        reader = DoubleBufferReader(from_reader(lambda: iter([[np.arange(3)]]), None, None), place=place)
        assert [int(v) for v in reader.read_next()[0]] == [0, 1, 2]
        reader.close()
    assert device_mod.place_name(CUDAPlace(3)) == "cuda:3"
