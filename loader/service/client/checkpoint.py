"""A client's place in training as a checkpoint state: a small JSON-able dict, and its checks.

The state names the epoch, the global sample position the training loop has
reached in it, and the anchor of that position (``service/order.py``), plus the
fingerprint of the dataset's config it was taken under. It does not depend on
the rank, the world size, the worker count or the transport, so any client of
a daemon serving the same dataset can resume from it, with any world size.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from loader.errors import ConfigError
from loader.service.order import STATE_VERSION, differences
from loader.service.protocol import MAX_PLACE

STATE_KIND = "loader.Client"
_KEYS = ("kind", "version", "dataset", "epoch", "position", "anchor", "fingerprint")
# Where ``loader.torch.DataLoader.state_dict()`` keeps its reader's state (``loader.torch.STATE_KEYS``), named here
# without importing that module: a DataLoader's state given to a Client or Loader is a mix-up the error names.
TORCH_READER_KEY = "reader"


@dataclass(frozen=True)
class Place:
    """Where the training loop stands: the next batch it takes is the one after ``position`` of ``epoch``."""

    epoch: int
    position: int = 0
    anchor: tuple[int, int, int] = (0, 0, 0)

    def state(self, dataset: str, world_size: int, fingerprint: dict[str, Any] | None) -> dict[str, Any]:
        return {
            "kind": STATE_KIND,
            "version": STATE_VERSION,
            "dataset": dataset,
            "epoch": self.epoch,
            "position": self.position,
            "anchor": list(self.anchor),
            "world_size": world_size,  # for the reader of the checkpoint; any world size may resume
            "fingerprint": dict(fingerprint or {}),
            "check": _check_value(dataset, self.epoch, self.position, self.anchor),
        }


def at_epoch_start(state: dict[str, Any], epoch: int) -> dict[str, Any]:
    """A copy of ``state`` moved to the start of ``epoch`` (``Place(epoch)``), with its check value made anew when
    it had one (``loader.torch`` resumes a state taken between epochs so)."""
    moved = {**state, "epoch": epoch, "position": 0, "anchor": [0, 0, 0]}
    if "check" in moved and isinstance(moved.get("dataset"), str):
        moved["check"] = _check_value(moved["dataset"], epoch, 0, (0, 0, 0))
    return moved


def _check_value(dataset: str, epoch: int, position: int, anchor: tuple[int, int, int]) -> str:
    """A digest of where a state stands. Not a secret: it catches a state changed by hand or corrupted on the way,
    whose anchor (where its window's input begins, a file and a record) the daemon can only bound, not verify: one
    naming a later file served part of the epoch as if it were all of it."""
    text = json.dumps([STATE_KIND, dataset, epoch, position, list(anchor)])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _not_a_state(state: dict[Any, Any], missing: list[str]) -> str:
    """Why ``state`` is no loader state: a ``loader.torch.DataLoader`` state (the likeliest mix-up, since both
    have ``state_dict``) says which of its values is one; anything else, which keys it lacks."""
    inner = state.get(TORCH_READER_KEY)
    if isinstance(inner, dict) and _text_is(inner.get("kind"), STATE_KIND):
        return (
            "not a loader state: it looks like a loader.torch.DataLoader state, which holds the loader's under "
            f"{TORCH_READER_KEY!r}: pass state[{TORCH_READER_KEY!r}] here, or the whole state to that DataLoader's "
            "load_state_dict"
        )
    return f"not a loader state (truncated or of something else): missing {', '.join(missing) or 'kind'}"


def place_of(state: Any, dataset: str, fingerprint: dict[str, Any] | None) -> Place:
    """The place a state names, once it is known to be a state of this dataset under this config.

    Every value is checked for its type before it is compared or shown: a state is whatever a checkpoint file
    held, and an array in it made ``!=`` raise numpy's own error, and its repr many lines."""
    if not isinstance(state, dict):
        raise ConfigError(f"a loader state is a dict from state_dict(), got {type(state).__name__}")
    missing = [key for key in _KEYS if key not in state]
    if missing or not _text_is(state.get("kind"), STATE_KIND):
        raise ConfigError(_not_a_state(state, missing))
    version = state["version"]
    if not _count(version) or version > STATE_VERSION:
        raise ConfigError(
            f"the state is of version {_brief(version)}, this loader reads version {STATE_VERSION}: a newer one"
        )
    if not _text_is(state["dataset"], dataset):
        raise ConfigError(f"the state is of dataset {_brief(state['dataset'])}, this client reads {dataset!r}")
    anchor = state["anchor"]
    if not (_count(state["epoch"]) and _count(state["position"])):
        raise ConfigError(
            "the state's epoch and position must be integers in [0, 2**60): "
            f"{_brief(state['epoch'])}, {_brief(state['position'])}"
        )
    if not (isinstance(anchor, (list, tuple)) and len(anchor) == 3 and all(_count(v) for v in anchor)):
        raise ConfigError(f"the state's anchor must be three integers in [0, 2**60), got {_brief(anchor)}")
    if anchor[0] == 0 and any(anchor):
        raise ConfigError(f"the state's anchor {_brief(anchor)} is not where an epoch's first window begins, [0, 0, 0]")
    saved = state["fingerprint"]
    if not _settings(saved):
        raise ConfigError(f"the state's fingerprint is not a dict of settings to plain values: {_brief(saved)}")
    changed = differences(saved, dict(fingerprint or {}))
    if changed:
        raise ConfigError(f"the state was taken under another config of dataset {dataset!r}: {'; '.join(changed)}")
    place = Place(int(state["epoch"]), int(state["position"]), (int(anchor[0]), int(anchor[1]), int(anchor[2])))
    check = state.get("check")  # absent from the states of loaders before it: those are taken as they are
    if check is not None and not _text_is(check, _check_value(dataset, place.epoch, place.position, place.anchor)):
        raise ConfigError(
            "the state's epoch, position and anchor do not match its check value: it was changed or corrupted "
            "after state_dict() made it"
        )
    return place


# What a fingerprint's settings hold (``order.fingerprint``): digests, counts, flags (numpy's scalars compare as
# these do, should a checkpoint library have turned one into one).
_PLAIN = (str, int, float, bool, type(None), np.generic)
BRIEF_CHARS = 80  # of a bad value shown in an error


def _settings(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, _PLAIN) for k, v in value.items())


def _text_is(value: Any, text: str) -> bool:
    return isinstance(value, str) and value == text


def _brief(value: Any) -> str:
    """``repr(value)`` on one line of at most ``BRIEF_CHARS`` characters (an array's repr has many)."""
    shown = " ".join(repr(value).split())
    return shown if len(shown) <= BRIEF_CHARS else shown[:BRIEF_CHARS] + "..."


def _count(value: Any) -> bool:
    return type(value) is int and 0 <= value < MAX_PLACE


__all__ = ["Place", "STATE_KIND", "place_of"]
