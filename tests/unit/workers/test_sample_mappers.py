"""Per-sample mappers and their generators: every way a mapper may ask for ``rng``, and the ways it may not."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pytest

from loader.config import LoaderConfig
from loader.errors import ConfigError
from workers.mapping import SampleMappers

HERE = "tests.unit.workers.test_sample_mappers"


def draw(sample: Any, rng: Any) -> Any:
    return sample + int(rng.integers(1000))


def draw_keyword_only(sample: Any, *, rng: Any = None) -> Any:
    return sample + int(rng.integers(1000))


def draw_positional_only(sample: Any, rng: Any, /) -> Any:
    return sample + int(rng.integers(1000))


def scaled(sample: Any, rng: Any, factor: int) -> Any:
    return sample + factor * int(rng.integers(1000))


class Drawer:
    def __call__(self, sample: Any, rng: Any) -> Any:
        return sample + int(rng.integers(1000))


def rng_first(rng: Any, sample: Any) -> Any:
    return sample


def rng_variadic(sample: Any, *rng: Any) -> Any:
    return sample


def _expected(record: int, draws: int = 1, factors: tuple[int, ...] = (1,)) -> int:
    rng = np.random.default_rng((3, 1, 7, record))
    return sum(f * int(rng.integers(1000)) for f in factors[:draws])


@pytest.mark.parametrize(
    "mapper",
    [draw, draw_keyword_only, draw_positional_only, functools.partial(scaled, factor=1), Drawer()],
    ids=["plain", "keyword-only", "positional-only", "partial", "callable"],
)
def test_every_form_of_rng_gets_the_samples_generator(mapper: Any) -> None:
    mappers = SampleMappers([mapper], seed=3, epoch=1, file_key=7)
    assert [mappers(0, record) for record in range(5)] == [_expected(r) for r in range(5)]


def test_mappers_of_one_sample_share_its_generator_in_order_and_plain_ones_get_none() -> None:
    mappers = SampleMappers([draw, abs, draw_keyword_only], seed=3, epoch=1, file_key=7)
    assert mappers(0, 4) == _expected(4, draws=2, factors=(1, 1))


@pytest.mark.parametrize(("mapper", "reason"), [(rng_first, "first parameter is rng"), (rng_variadic, "variadic")])
def test_an_rng_that_cannot_follow_the_sample_is_refused_by_the_config_and_the_worker(mapper: Any, reason: str) -> None:
    with pytest.raises(TypeError, match=reason):
        SampleMappers([mapper], seed=0, epoch=0, file_key=0)
    config = LoaderConfig.from_dict(
        {"source": {"files": ["x.npy"]}, "pipeline": {"mappers": [f"{HERE}:{mapper.__name__}"]}}
    )
    with pytest.raises(ConfigError, match=rf"pipeline.mappers \('{HERE}:{mapper.__name__}'\): its .*{reason}"):
        config.check_imports()  # the config itself builds: the import check is what refuses it


def takes_nothing() -> Any:
    return 0


def takes_two(sample: Any, other: Any) -> Any:
    return sample


def takes_rng_and_more(sample: Any, rng: Any, factor: int) -> Any:
    return sample


def takes_anything(*args: Any, **kwargs: Any) -> Any:
    return args[0]


def with_default(sample: Any, factor: int = 2) -> Any:
    return sample * factor


def _imports(key: str, name: str) -> None:
    LoaderConfig.from_dict({"source": {"files": ["x.npy"]}, "pipeline": {key: [f"{HERE}:{name}"]}}).check_imports()


@pytest.mark.parametrize(
    ("key", "name", "call"),
    [
        ("mappers", "takes_nothing", r"f\(sample\): too many positional arguments"),
        ("mappers", "takes_two", r"f\(sample\): missing a required argument: 'other'"),
        ("mappers", "takes_rng_and_more", r"f\(sample, rng=rng\): missing a required argument: 'factor'"),
        ("batch_mappers", "takes_nothing", r"f\(block\): too many positional arguments"),
        ("batch_mappers", "takes_two", r"f\(block\): missing a required argument: 'other'"),
    ],
)
def test_a_mapper_that_cannot_be_called_so_is_refused_by_the_config_not_at_every_sample(
    key: str, name: str, call: str
) -> None:
    with pytest.raises(ConfigError, match=rf"^pipeline.{key} \('{HERE}:{name}'\) cannot be called as {call} \("):
        _imports(key, name)


@pytest.mark.parametrize(
    "name", ["draw", "draw_keyword_only", "draw_positional_only", "takes_anything", "with_default"]
)
def test_mappers_that_can_be_called_so_pass_the_config(name: str) -> None:
    _imports("mappers", name)
    if name in ("takes_anything", "with_default"):
        _imports("batch_mappers", name)
