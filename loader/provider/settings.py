"""``Settings``: what ``process(settings, filename)`` and ``init_hook`` see.

A class of its own (the session and the decorator both use it, and neither imports the
other for it), with the attributes PyDataProvider2's ``settings`` object had, declared and
typed. The user's keyword arguments (``provider.open(files, dictionary=...)``) become
attributes too, as in the original, and ``init_hook`` may add its own (``settings.value =
...``). ``settings.slots`` is the original's older name of ``input_types``: an ``init_hook``
may set either (Paddle's semantic role labelling demo sets ``slots``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from loader.provider.types import CacheType, InputType

# Attributes of Settings that a user kwarg may not overwrite.
RESERVED = frozenset(
    "input_types slots logger is_train file_list kwargs should_shuffle pool_size min_pool_size can_over_batch_size "
    "calc_batch_size cache check check_fail_continue slot_names slot_types dict_mode max_open_files".split()
)


class ProviderLike(Protocol):
    """What a session needs of a provider: its ``process`` function and a name for messages."""

    __name__: str

    def process(self, settings: Any, filename: str) -> Iterable[Any]: ...


class Settings:
    """Options of one provider instance, plus the user's keyword arguments as attributes."""

    input_types: Any  # a dict or list of InputType (or one), None until @provider or init_hook sets it
    logger: logging.Logger
    is_train: bool
    file_list: list[str]
    kwargs: dict[str, Any]
    should_shuffle: bool
    pool_size: int
    min_pool_size: int
    can_over_batch_size: bool
    calc_batch_size: Callable[[Any], int] | None
    cache: CacheType
    check: bool
    check_fail_continue: bool
    max_open_files: int
    # Filled in once the slots are resolved (after init_hook):
    slot_names: list[str]
    slot_types: list[InputType]
    dict_mode: bool

    def __init__(
        self,
        *,
        input_types: Any,
        logger: logging.Logger,
        is_train: bool,
        file_list: list[str],
        should_shuffle: bool,
        pool_size: int,
        min_pool_size: int,
        can_over_batch_size: bool,
        calc_batch_size: Callable[[Any], int] | None,
        cache: CacheType,
        check: bool,
        check_fail_continue: bool,
        max_open_files: int,
        user_kwargs: dict[str, Any] | None = None,
    ) -> None:
        clash = RESERVED.intersection(user_kwargs or {})
        if clash:
            raise ValueError(f"provider kwargs {sorted(clash)} clash with settings attributes of the same name")
        self.input_types = input_types
        self.logger = logger
        self.is_train = is_train
        self.file_list = file_list
        self.kwargs = dict(user_kwargs or {})
        self.should_shuffle = should_shuffle
        self.pool_size = pool_size
        self.min_pool_size = min_pool_size
        self.can_over_batch_size = can_over_batch_size
        self.calc_batch_size = calc_batch_size
        self.cache = cache
        self.check = check
        self.check_fail_continue = check_fail_continue
        self.max_open_files = max_open_files
        self.slot_names = []
        self.slot_types = []
        self.dict_mode = False
        for key, value in self.kwargs.items():
            setattr(self, key, value)  # the original made every user kwarg a settings attribute

    @property
    def slots(self) -> Any:
        """The original's older name of ``input_types`` (the same value)."""
        return self.input_types

    @slots.setter
    def slots(self, value: Any) -> None:
        self.input_types = value

    def __repr__(self) -> str:
        keys = ", ".join(sorted(k for k in self.__dict__ if not k.startswith("_")))
        return f"Settings({keys})"


__all__ = ["Settings", "ProviderLike", "RESERVED"]
