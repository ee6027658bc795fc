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
    state = Place(2, 16, (0, 1, 3)).state("default", 1, FINGERPRINT)
    state.update(changes)
    return state


def test_a_genuine_state_names_its_place():
    assert place_of(_state(), "default", FINGERPRINT) == Place(2, 16, (0, 1, 3))


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
    assert place_of(_state(fingerprint=saved), "default", FINGERPRINT) == Place(2, 16, (0, 1, 3))
