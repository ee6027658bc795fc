"""Acceptance test of the provider, DataFeeder and device placement (`loader.provider`, `loader.DataFeeder`, `loader.device`), as the spec was written."""

from __future__ import annotations

import importlib.util
import inspect
import logging

import numpy as np
import pytest

import loader
import loader.io as lio
from loader import provider as P
from loader.provider import CacheType, SequenceType, provider

EMPTY = inspect.Parameter.empty


def _params(fn) -> list[tuple[str, object]]:
    return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()]


# --- providers used below (module level: providers pickle by reference) ----------------------

CALLS: list[str] = []
HOOKS: list[dict] = []
LIVE = {"produced": 0, "consumed": 0, "peak": 0}


def _hook(settings, file_list, is_train, **kwargs):
    HOOKS.append({"file_list": list(file_list), "is_train": is_train, **kwargs})
    settings.scale = kwargs.get("scale", 1)


@provider(
    input_types={
        "dense": P.dense_vector(3),
        "label": P.integer_value(10),
        "bin": P.sparse_binary_vector(8),
        "val": P.sparse_float_vector(8),
        "seq": P.integer_value_sequence(100),
        "sub": P.integer_value_sub_sequence(100),
        "dseq": P.dense_vector_sequence(2),
    },
    init_hook=_hook,
)
def everything(settings, filename):
    CALLS.append(filename)
    base = int(filename.rsplit("-", 1)[1])
    for i in range(3):
        k = base * 10 + i
        yield {
            "dense": [k * settings.scale, 0.5, -1.0],
            "label": k % 10,
            "bin": [1, 3 + i],
            "val": [(0, 0.5), (7, float(k))],
            "seq": list(range(i + 1)),
            "sub": [[1, 2], [3]] if i % 2 else [[4]],
            "dseq": [[float(k), 1.0]] * (i + 1),
        }


@provider(input_types=[P.integer_value(1_000_000)])
def numbered(settings, filename):
    CALLS.append(filename)
    for i in range(int(settings.count)):
        LIVE["produced"] += 1
        LIVE["peak"] = max(LIVE["peak"], LIVE["produced"] - LIVE["consumed"])
        yield int(filename.rsplit("-", 1)[1]) * 10_000 + i


@provider(input_types=[P.integer_value(10**6)], cache=CacheType.CACHE_PASS_IN_MEM, should_shuffle=False)
def cached(settings, filename):
    CALLS.append(filename)
    yield from range(5)


@provider(input_types=[P.integer_value_sequence(100)], calc_batch_size=lambda s: len(s[0]), can_over_batch_size=False)
def weighted_strict(settings, filename):
    for n in (4, 4, 4, 9, 1, 12, 3):
        yield list(range(n))


@provider(input_types=[P.integer_value_sequence(100)], calc_batch_size=lambda s: len(s[0]), can_over_batch_size=True)
def weighted_loose(settings, filename):
    for n in (4, 4, 4, 9, 1, 12, 3):
        yield list(range(n))


BAD_SAMPLES = {
    "dim": ([1.0, 2.0], 1, [0], [[0]]),
    "range": ([1.0, 2.0, 3.0], 10, [0], [[0]]),
    "sparse": ([1.0, 2.0, 3.0], 1, [0, 8], [[0]]),
    "float": ([1.0, float("nan"), 3.0], 1, [0], [[0]]),
    "nesting": ([1.0, 2.0, 3.0], 1, [0], [0]),
}
GOOD = ([1.0, 2.0, 3.0], 1, [0], [[0]])


def _checked_samples(settings, filename):
    for i in range(6):
        yield BAD_SAMPLES[settings.bad] if i == 4 else GOOD


_CHECK_TYPES = [P.dense_vector(3), P.integer_value(10), P.sparse_binary_vector(8), P.integer_value_sub_sequence(5)]
checked = provider(input_types=_CHECK_TYPES, check=True, should_shuffle=False)(_checked_samples)
checked_lenient = provider(input_types=_CHECK_TYPES, check=True, check_fail_continue=True, should_shuffle=False)(
    _checked_samples
)


@pytest.fixture(autouse=True)
def _reset():
    CALLS.clear()
    HOOKS.clear()
    LIVE.update(produced=0, consumed=0, peak=0)


def _files(n: int) -> list[str]:
    return [f"file-{i}" for i in range(n)]


# --- names and signatures ------------------------------------------------------------------


def test_provider_names_and_signatures_are_exactly_as_stated():
    assert _params(provider) == [
        ("input_types", None),
        ("should_shuffle", None),
        ("pool_size", -1),
        ("min_pool_size", -1),
        ("can_over_batch_size", True),
        ("calc_batch_size", None),
        ("cache", CacheType.NO_CACHE),
        ("check", False),
        ("check_fail_continue", False),
        ("init_hook", None),
        ("kwargs", EMPTY),
    ]
    for base in ("dense_vector", "sparse_binary_vector", "sparse_float_vector", "sparse_vector", "integer_value"):
        plain, seq, sub = getattr(P, base)(7), getattr(P, base + "_sequence")(7), getattr(P, base + "_sub_sequence")(7)
        assert (plain.seq_type, seq.seq_type, sub.seq_type) == (
            SequenceType.NO_SEQUENCE,
            SequenceType.SEQUENCE,
            SequenceType.SUB_SEQUENCE,
        )
        assert plain.dim == seq.dim == sub.dim == 7
    assert P.sparse_vector(3) == P.sparse_float_vector(3)
    assert {m.name for m in SequenceType} == {"NO_SEQUENCE", "SEQUENCE", "SUB_SEQUENCE"}
    assert {m.name for m in CacheType} == {"NO_CACHE", "CACHE_PASS_IN_MEM"}
    assert _params(numbered.reader) == [("file_list", EMPTY), ("is_train", True), ("kwargs", EMPTY)]
    assert _params(numbered.batch_reader) == [
        ("file_list", EMPTY),
        ("batch_size", EMPTY),
        ("is_train", True),
        ("drop_last", False),
        ("kwargs", EMPTY),
    ]
    assert _params(loader.Field) == [
        ("name", EMPTY),
        ("shape", EMPTY),
        ("dtype", "float32"),
        ("lod_level", 0),
        ("flatten", False),
    ]
    assert _params(loader.DataFeeder) == [
        ("feed_list", EMPTY),
        ("place", "cpu"),
        ("program", None),
        ("return_arrays", False),
    ]
    feeder = loader.DataFeeder([loader.Field("x", [-1, 1])])
    assert _params(feeder.feed) == [("minibatch", EMPTY)]
    assert _params(feeder.feed_parallel) == [("minibatches", EMPTY), ("num_places", None)]
    assert _params(feeder.decorate_reader) == [
        ("reader", EMPTY),
        ("multi_devices", EMPTY),
        ("num_places", None),
        ("drop_last", True),
    ]
    from loader.feeder import DataFeeder, Field, LoDTensor

    assert (DataFeeder, Field, LoDTensor) == (loader.DataFeeder, loader.Field, loader.LoDTensor)


# --- the provider ------------------------------------------------------------------------


def test_batch_reader_forms_per_slot_type():
    batches = list(everything.batch_reader(_files(2), 6, is_train=False, scale=2)())
    assert len(batches) == 1
    b = batches[0]
    assert b["dense"].shape == (6, 3) and b["dense"].dtype == np.float32
    assert b["dense"][:, 0].tolist() == [0, 2, 4, 20, 22, 24]  # user kwargs reach the settings via init_hook
    assert b["label"].shape == (6,) and b["label"].dtype == np.int64
    assert b["label"].tolist() == [0, 1, 2, 0, 1, 2]
    csr = b["bin"]
    assert (csr.dim, csr.offsets.tolist(), csr.indices.tolist()) == (8, [0, 2, 4, 6, 8, 10, 12], [1, 3, 1, 4, 1, 5] * 2)
    assert csr.values.tolist() == [1.0] * 12
    val = b["val"]
    assert val.indices.tolist()[:2] == [0, 7] and val.values.tolist()[:2] == [0.5, 0.0] and val.dim == 8
    seq = b["seq"]
    assert isinstance(seq, loader.LoDTensor)
    assert seq.recursive_sequence_lengths() == [[1, 2, 3, 1, 2, 3]] and seq.data.tolist() == [0, 0, 1, 0, 1, 2] * 2
    sub = b["sub"]
    assert sub.recursive_sequence_lengths()[0] == [1, 2, 1, 1, 2, 1]
    assert sub.recursive_sequence_lengths()[1] == [1, 2, 1, 1, 1, 2, 1, 1]
    assert sub.data.tolist() == [4, 1, 2, 3, 4, 4, 1, 2, 3, 4]
    dseq = b["dseq"]
    assert dseq.data.shape == (12, 2) and dseq.data.dtype == np.float32
    assert dseq.recursive_sequence_lengths() == [[1, 2, 3, 1, 2, 3]]
    # the same form DataFeeder makes
    feeder = loader.DataFeeder([loader.Field("seq", [-1], "int64", lod_level=1)])
    fed = feeder.feed([([0],), ([0, 1],), ([0, 1, 2],)])["seq"]
    assert type(fed) is type(seq) and fed.recursive_sequence_lengths() == [[1, 2, 3]]


def test_reader_settings_init_hook_and_train_list(tmp_path):
    listing = tmp_path / "train.list"
    listing.write_text("file-1\n\nfile-0\n")
    r = everything.reader(str(listing), is_train=False, scale=3)
    assert HOOKS == [{"file_list": ["file-1", "file-0"], "is_train": False, "scale": 3}]
    first = list(r())
    second = list(r())
    assert len(HOOKS) == 1  # once per provider instance, not per pass
    assert first == second and len(first) == 6 and isinstance(first[0], tuple)
    assert first[0][0] == [30, 0.5, -1.0]  # file-1 first: list order without shuffling
    settings = r.settings
    assert settings.input_types is everything.options["input_types"]
    assert settings.is_train is False and settings.file_list == ["file-1", "file-0"] and settings.scale == 3
    assert isinstance(settings.logger, logging.Logger)


def test_should_shuffle_defaults_to_is_train():
    ordered = [x[0] for x in numbered.reader(_files(3), is_train=False, count=50)()]
    assert ordered == [f * 10_000 + i for f in range(3) for i in range(50)]
    shuffled = [x[0] for x in numbered.reader(_files(3), is_train=True, count=50)()]
    assert sorted(shuffled) == ordered and shuffled != ordered


def test_pool_size_bounds_samples_in_memory_and_min_pool_size_is_the_granularity():
    @provider(input_types=[P.integer_value(10**6)], pool_size=20, min_pool_size=20)
    def pooled(settings, filename):
        for i in range(300):
            LIVE["produced"] += 1
            LIVE["peak"] = max(LIVE["peak"], LIVE["produced"] - LIVE["consumed"])
            yield i

    out = []
    for sample in pooled.reader(["only"], is_train=True)():
        LIVE["consumed"] += 1
        out.append(sample[0])
    assert sorted(out) == list(range(300)) and out != list(range(300))
    assert LIVE["peak"] <= 21
    # granularity: the i-th sample out was among the first i + 20 read
    assert all(x < i + 20 for i, x in enumerate(out))


def test_calc_batch_size_and_can_over_batch_size():
    strict = [
        b["slot0"].recursive_sequence_lengths()[0] for b in weighted_strict.batch_reader(["f"], 10, is_train=False)()
    ]
    assert all(sum(lengths) <= 10 or len(lengths) == 1 for lengths in strict)
    assert strict == [[4, 4], [4], [9, 1], [12], [3]]
    loose = [
        b["slot0"].recursive_sequence_lengths()[0] for b in weighted_loose.batch_reader(["f"], 10, is_train=False)()
    ]
    assert loose == [[4, 4, 4], [9, 1], [12], [3]]


def test_cache_pass_in_mem_reads_files_on_the_first_pass_only():
    r = cached.reader(_files(3))
    first = list(r())
    assert len(CALLS) == 3
    assert list(r()) == first and list(r()) == first
    assert len(CALLS) == 3


@pytest.mark.parametrize(
    "bad, words",
    [
        ("dim", ["slot0", "3"]),
        ("range", ["slot1", "10", "range"]),
        ("sparse", ["slot2", "8", "range"]),
        ("float", ["slot0", "finite"]),
        ("nesting", ["slot3", "sequence"]),
    ],
)
def test_check_names_file_sample_slot_and_problem(bad, words):
    with pytest.raises(ValueError) as info:
        list(checked.reader(["data-7.txt"], bad=bad)())
    text = str(info.value)
    assert "data-7.txt" in text and "sample 4" in text
    for word in words:
        assert word in text


def test_check_fail_continue_drops_counts_and_logs_at_end_of_pass(caplog):
    with caplog.at_level(logging.WARNING, logger="loader.provider"):
        r = checked_lenient.reader(["data-1.txt", "data-2.txt"], bad="range")
        assert len(list(r())) == 10
    warnings = [rec.getMessage() for rec in caplog.records if rec.levelno >= logging.WARNING]
    assert any("2" in message and "dropped" in message for message in warnings), warnings
    assert r.last_pass_dropped == 2


def test_memory_bounded_with_many_files_and_no_generator_per_file():
    r = numbered.reader(_files(2_000), is_train=True, count=3)
    seen = 0
    for _ in r():
        LIVE["consumed"] += 1
        seen += 1
    assert seen == 6_000
    # at most the pool (1000 by default) plus the files in flight, never the whole data set
    assert LIVE["peak"] <= P.DEFAULT_MIN_POOL_SIZE + P.DEFAULT_MAX_OPEN_FILES


# --- DataFeeder ----------------------------------------------------------------------------


def test_feeder_examples_from_the_original_tests():
    image = loader.Field("image", [-1, 1, 28, 28])
    label = loader.Field("label", [-1, 1], "int64")
    out = loader.DataFeeder([image, label]).feed([([0] * 784, [9]), ([1] * 784, [1])])
    assert isinstance(out, dict) and out["image"].shape == (2, 1, 28, 28) and out["label"].shape == (2, 1)
    assert out["image"].dtype == np.float32 and out["label"].dtype == np.int64
    assert np.asarray(out["label"]).ravel().tolist() == [9, 1]

    one = loader.DataFeeder([loader.Field("words", [-1, 1], "int64", lod_level=1)])
    t = one.feed([([1, 2, 3],), ([4, 5],), ([6, 7, 8, 9],)])["words"]
    assert isinstance(t, loader.LoDTensor) and t.data.shape == (9, 1)
    assert t.recursive_sequence_lengths() == [[3, 2, 4]] and t.lod() == [[0, 3, 5, 9]]
    assert t.data.ravel().tolist() == list(range(1, 10))

    two = loader.DataFeeder([loader.Field("words", [-1, 1], "int64", lod_level=2)])
    t = two.feed([([[1, 2, 3], [4, 5]],), ([[6, 7, 8, 9]],)])["words"]
    assert t.data.shape == (9, 1) and t.recursive_sequence_lengths() == [[2, 1], [3, 2, 4]]


def test_feeder_checks_every_shape_and_the_field_count():
    feeder = loader.DataFeeder([loader.Field("image", [-1, 1, 28, 28]), loader.Field("label", [-1, 1], "int64")])
    with pytest.raises(ValueError) as info:
        feeder.feed([([0] * 783, [1])])
    assert "image" in str(info.value) and "(1, 28, 28)" in str(info.value) and "783" in str(info.value)
    same_rank = loader.DataFeeder([loader.Field("x", [-1, 3])])
    with pytest.raises(ValueError) as info:
        same_rank.feed([([1, 2],), ([3, 4],)])  # the original silently made a (2, 2) tensor
    assert "'x'" in str(info.value) and "(3,)" in str(info.value) and "(2,)" in str(info.value)
    with pytest.raises(ValueError) as info:
        feeder.feed([([0] * 784,)])
    assert "1" in str(info.value) and "2" in str(info.value)


def test_feed_parallel_and_decorate_reader():
    feeder = loader.DataFeeder([loader.Field("x", [-1, 2])])
    batches = [[([1, 2],)], [([3, 4],), ([5, 6],)]]
    out = feeder.feed_parallel(batches, num_places=2)
    assert [o["x"].shape for o in out] == [(1, 2), (2, 2)]
    with pytest.raises(ValueError):
        feeder.feed_parallel(batches, num_places=3)  # at once, not at the first next()

    def batch_reader():
        for i in range(5):
            yield [([i, i],)]

    single = list(feeder.decorate_reader(batch_reader, multi_devices=False)())
    assert [b["x"].numpy().tolist() for b in single] == [[[i, i]] for i in range(5)]
    grouped = list(feeder.decorate_reader(batch_reader, multi_devices=True, num_places=2)())
    assert len(grouped) == 2 and all(len(g) == 2 for g in grouped)
    with pytest.raises(ValueError):
        list(feeder.decorate_reader(batch_reader, multi_devices=True, num_places=2, drop_last=False)())


# --- device placement --------------------------------------------------------------------


def test_cpu_place_is_numpy_and_a_missing_device_fails_clearly():
    from loader.device import Placer

    arrays = {"x": np.ones(3)}
    assert Placer("cpu").place_now(arrays)["x"] is arrays["x"]
    torch = importlib.util.find_spec("torch")
    has_cuda = bool(torch) and __import__("torch").cuda.is_available()
    if not has_cuda:
        with pytest.raises(ValueError):
            Placer("cuda:0")


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch not installed")
def test_feeder_and_double_buffer_place_through_the_one_placer():
    import torch

    feeder = loader.DataFeeder([loader.Field("x", [-1, 2])], place="torch:cpu")
    assert isinstance(feeder.feed([([1, 2],)])["x"].data, torch.Tensor)
    arrays = loader.DataFeeder([loader.Field("x", [-1, 2])], place="torch:cpu", return_arrays=True)
    assert isinstance(arrays.feed([([1, 2],)])["x"], torch.Tensor)
    source = lio.from_reader(lambda: iter([np.ones(2, np.float32)] * 3), [[-1, 2]], ["float32"])
    with lio.DoubleBufferReader(source, place="torch:cpu") as r:
        items = list(r)
    assert len(items) == 3 and all(isinstance(item[0], torch.Tensor) for item in items)


def _cuda_available() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_available(), reason="no CUDA device")
def test_cuda_place_gives_device_tensors():
    import torch

    feeder = loader.DataFeeder(
        [loader.Field("x", [-1, 2]), loader.Field("s", [-1, 1], "int64", 1)], place="cuda:0", return_arrays=True
    )
    out = feeder.feed([([1, 2], [1, 2]), ([3, 4], [3])])
    assert out["x"].is_cuda and out["s"].data.is_cuda
    torch.cuda.synchronize()
    assert out["x"].cpu().tolist() == [[1, 2], [3, 4]]
    source = lio.from_reader(lambda: iter([np.ones(2, np.float32)] * 3), [[-1, 2]], ["float32"])
    with lio.DoubleBufferReader(source, place="cuda:0") as r:
        assert all(item[0].is_cuda for item in r)
