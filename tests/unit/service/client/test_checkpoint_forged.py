"""Checkpoint states that are forged or corrupted: each is a ``ConfigError`` of one line, never a traceback
from deep inside (``checkpoint.place_of``, what ``load_state_dict`` asks)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from loader.errors import ConfigError
from loader.service.client.checkpoint import Place, place_of

FINGERPRINT = {"files": "0123456789abcdef", "seed": 1, "batch_size": 8, "drop_last": False}


def _state(**changes: Any) -> dict[str, Any]:
    state = Place(2, 16, (1, 1, 3)).state("default", 1, FINGERPRINT)
    state.update(changes)
    return state


def test_a_genuine_state_names_its_place():
    assert place_of(_state(), "default", FINGERPRINT) == Place(2, 16, (1, 1, 3))


@pytest.mark.parametrize(
    "changes",
    [
        {"fingerprint": {1: 2, **FINGERPRINT}},  # a key that is not a setting's name: sorted() met int and str
        {"fingerprint": {**FINGERPRINT, "seed": np.array([1, 2])}},  # numpy's "truth value is ambiguous"
        {"fingerprint": {**FINGERPRINT, "files": ["a", "b"]}},
        {"dataset": np.array(["default", "other"])},
        {"kind": np.array([1, 2])},
        {"epoch": np.arange(1000)},
        {"anchor": np.zeros((3, 300), np.int64)},
    ],
    ids=["int-key", "array-value", "list-value", "array-dataset", "array-kind", "array-epoch", "array-anchor"],
)
def test_a_forged_or_corrupted_state_is_one_config_error_line(changes):
    with pytest.raises(ConfigError) as info:
        place_of(_state(**changes), "default", FINGERPRINT)
    message = str(info.value)
    assert "\n" not in message and len(message) < 400, message


def test_numpy_scalars_in_a_fingerprint_still_match_the_values_they_equal():
    saved = {**FINGERPRINT, "seed": np.int64(1), "drop_last": np.bool_(False)}
    assert place_of(_state(fingerprint=saved), "default", FINGERPRINT) == Place(2, 16, (1, 1, 3))


@pytest.mark.parametrize(
    "changes",
    [{"anchor": [0, 3, 0]}, {"anchor": [1, 6, 0]}, {"position": 17}, {"epoch": 3}, {"check": 5}],
    ids=["later-file", "later-window", "position", "epoch", "not-text"],
)
def test_a_state_changed_after_state_dict_fails_its_check(changes):
    # An anchor naming a later file was served as the whole rest of the epoch: half of it, no error, len() unchanged.
    with pytest.raises(ConfigError, match="do not match its check value|first window") as info:
        place_of(_state(**changes), "default", FINGERPRINT)
    assert "\n" not in str(info.value)


def test_a_state_without_a_check_value_from_an_older_loader_is_read():
    state = _state()
    del state["check"]
    assert place_of(state, "default", FINGERPRINT) == Place(2, 16, (1, 1, 3))


def test_the_first_windows_anchor_is_where_the_epoch_begins():
    state = {**_state(), "position": 5, "anchor": [0, 2, 0]}
    del state["check"]  # an older state: still refused, by its shape
    with pytest.raises(ConfigError, match=r"first window begins, \[0, 0, 0\]"):
        place_of(state, "default", FINGERPRINT)
