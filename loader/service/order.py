"""What the order of an epoch is a function of, and how a position in it is named.

An epoch of a dataset is one global sequence of samples, the same for every
run, worker count and transport:

1. its files in ``file_order(n, seed, epoch, shuffle)``, each file's records in
   record order (records skipped under ``on_error = "skip"`` left out); with
   ``source.files_per_lease`` above 1, "file" here means a lease group of small
   files (``lease_groups``), read as one file; with ``source.records_per_lease``
   above 0, a piece of a large file (``lease_pieces``), numbered from its first
   record as if it were a file;
2. shuffled by ``batching.WindowShuffle``: the sequence is cut into *windows*
   of ``window_rows(shuffle_buffer)`` rows, each shuffled on its own by a
   buffer of ``shuffle_buffer`` rows seeded by (seed, epoch, window, round);
3. cut by ``batching.StepCutter`` into global steps of ``world_size x
   batch_size`` samples, rank r taking the r-th slice of each.

A position is a count of samples of that global sequence. A checkpoint names
one with an *anchor* ``[window, order index, record]``: the window the position
lies in, and where that window's input begins (the file at that place of the
file order, from that record). Resuming reads from the anchor, so files wholly
before the position's window are never read, and re-reads at most one window.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import numpy as np

# Rounds of ``shuffle_buffer`` rows in one shuffle window: a sample moves at most this many buffers.
WINDOW_ROUNDS = 8
# Without a shuffle, the rows of one window (the most a resume reads again before its position).
UNSHUFFLED_WINDOW_ROWS = 8192
# Version of the order and of the checkpoint state; a state from another is refused.
STATE_VERSION = 1

Anchor = tuple[int, int, int]  # (window, order index, record)


def file_order(count: int, seed: int, epoch: int, shuffle: bool) -> list[int]:
    """The order of ``count`` files in ``epoch``: a permutation seeded by (seed, epoch) when shuffling."""
    if not shuffle:
        return list(range(count))
    return [int(i) for i in np.random.default_rng((seed, epoch)).permutation(count)]


# The most bytes of small files one lease group holds: about what a file may weigh before it is cut.
GROUP_BYTES = 8 << 20
# Seeds the fixed grouping of a shuffled dataset's small files (with the dataset's seed), apart from epochs.
_GROUPING_STREAM = 0x67726F75


def lease_groups(sizes: list[int | None], per_lease: int, small: int, seed: int, shuffle: bool) -> list[list[int]]:
    """Files (by position, with their sizes; None: unknown) grouped into leases of up to ``per_lease``.

    Only files under ``small`` bytes share a lease, up to ``GROUP_BYTES`` together; any other goes alone.
    Unshuffled, a group is a run of neighbouring files, so the groups in order read the files in list
    order. Shuffled, small files are grouped from one permutation seeded by the dataset's seed (the same
    every epoch; the epoch's ``file_order`` then shuffles the groups): a sorted list of class folders
    would otherwise make groups of one class each.
    """
    count = len(sizes)
    if per_lease <= 1:
        return [[i] for i in range(count)]
    weights = [size if size is not None and size < small else None for size in sizes]  # None: goes alone
    order: list[int] = list(range(count))
    if shuffle:
        permuted = np.random.default_rng((seed, _GROUPING_STREAM)).permutation(count)
        order = [i for i in order if weights[i] is None] + [int(i) for i in permuted if weights[int(i)] is not None]
    groups: list[list[int]] = []
    current: list[int] = []
    held = 0
    for i in order:
        weight = weights[i]
        if current and (weight is None or len(current) >= per_lease or held + weight > GROUP_BYTES):
            groups.append(current)
            current, held = [], 0
        if weight is None:
            groups.append([i])
            continue
        current.append(i)
        held += weight
    if current:
        groups.append(current)
    return groups


Piece = tuple[int, int]  # (first record in its file, records): consecutive records of one file leased as one


def lease_pieces(counts: list[int | None], per_lease: int) -> list[tuple[int, Piece | None]]:
    """Files (by position, with their record counts; None: unknown) cut into leases of ``per_lease`` records.

    One ``(file, piece)`` per lease, in list order: a file's pieces are consecutive, the last one shorter.
    A file of unknown count, or of at most ``per_lease`` records, is one lease with no piece (read whole).
    """
    leases: list[tuple[int, Piece | None]] = []
    for i, count in enumerate(counts):
        if count is None or count <= per_lease:
            leases.append((i, None))
            continue
        leases.extend((i, (first, min(per_lease, count - first))) for first in range(0, count, per_lease))
    return leases


def window_rows(shuffle_buffer: int) -> int:
    """Rows of one shuffle window."""
    return WINDOW_ROUNDS * shuffle_buffer if shuffle_buffer > 0 else UNSHUFFLED_WINDOW_ROWS


def start_anchor() -> Anchor:
    """The anchor of an epoch's first window."""
    return (0, 0, 0)


def fingerprint(
    config: Any,
    files: list[str],
    seed: int,
    groups: list[list[int]] | None = None,
    sizes: list[int | None] | None = None,
    pieces: list[tuple[int, Piece | None]] | None = None,
) -> dict[str, Any]:
    """What a checkpoint of this dataset must match, one entry per setting (small, JSON-able).

    ``config`` is the dataset's view of the daemon's config (its ``source`` and ``pipeline``); ``groups``
    the files (by position) of each lease when leases may hold several (``lease_groups``); ``sizes`` the
    files' bytes (None: not a regular file), read once at start-up; ``pieces`` each lease's file and piece
    when leases may be pieces of files (``lease_pieces``).
    """
    pipeline = config.pipeline
    source = _plain(config.source)
    source.pop("files", None)  # the patterns: the files they matched are what counts (below)
    if source.get("files_per_lease") == 1:
        del source["files_per_lease"]  # the default: checkpoints from before the setting existed still match
    # Named on its own (when set), so a state of other pieces says which setting differs.
    per_lease = source.pop("records_per_lease", 0)
    # Only when set, so checkpoints from before batch mappers existed still match a config without them.
    batch = {"batch_mappers": _digest(list(pipeline.batch_mappers))} if pipeline.batch_mappers else {}
    # Groups follow the files' sizes, read at start-up: a file grown past SMALL_FILE_BYTES, or one whose new size
    # moves a GROUP_BYTES boundary, regroups its neighbours, and an anchor's order index then names another group.
    leases = {"lease_groups": _digest(groups)} if groups is not None and any(len(g) > 1 for g in groups) else {}
    if per_lease:
        leases["records_per_lease"] = per_lease
    # Pieces follow the files' record counts, read at start-up: a file that grew or shrank is cut otherwise, and
    # an anchor's order index and record would then name other records.
    if pieces is not None and any(piece is not None for _, piece in pieces):
        leases["lease_pieces"] = _digest([[i, *piece] if piece else [i] for i, piece in pieces])
    # The names are relative (a moved dataset is the same one), so without the sizes another dataset written
    # under the same names (another directory, files rewritten) would be taken for it, and a resume would land
    # on other samples.
    sized = {"file_sizes": _digest(sizes)} if sizes is not None else {}
    return {
        "files": _digest(_relative(files)),
        "file_count": len(files),
        "seed": int(seed),
        "batch_size": int(pipeline.batch_size),
        "shuffle_buffer": int(pipeline.shuffle_buffer),
        "drop_last": bool(pipeline.drop_last),
        "window": window_rows(pipeline.shuffle_buffer),
        "mappers": _digest(list(pipeline.mappers)),
        "source": _digest(source),
        **batch,
        **leases,
        **sized,
    }


def epoch_batches(samples: int | None, position: int, world_size: int, batch_size: int, drop_last: bool) -> int | None:
    """Batches each rank receives of an epoch of ``samples`` read from ``position`` (None: unknown)."""
    if samples is None:
        return None
    full, tail = divmod(max(0, samples - position), world_size * batch_size)
    return full + (1 if tail and not drop_last else 0)


def _relative(files: list[str]) -> list[str]:
    """The files relative to their common directory: a dataset moved elsewhere is the same dataset."""
    if not files:
        return []
    base = os.path.commonpath([os.path.dirname(os.path.abspath(f)) for f in files])
    return [os.path.relpath(os.path.abspath(f), base) for f in files]


def differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """The settings on which two fingerprints differ, in words."""
    out = []
    for key in sorted(set(saved) | set(current)):
        if key in _LATER_KEYS and key not in saved:
            continue  # a state saved before the key was recorded: it cannot say, so it is not refused for it
        if saved.get(key) != current.get(key):
            then, now = _shown(saved, key), _shown(current, key)
            out.append(f"{key} ({then} in the state, {now} now{_WHY.get(key, '')})")
    return out


def _shown(fingerprint: dict[str, Any], key: str) -> str:
    # A key a fingerprint leaves out is a setting at its default (lease groups, pieces): "None" read as a value.
    return repr(fingerprint[key]) if key in fingerprint else "unset"


# What a difference means where its values (digests) do not say.
_WHY = {
    "lease_groups": ": the small files are grouped otherwise, so source.files_per_lease changed, or a file changed "
    "or was replaced (the files' sizes group them)",
    "file_sizes": ": the files' sizes differ, so these are other files (or they changed) under the same names",
    "lease_pieces": ": the files are cut into other pieces, so source.records_per_lease or a file's record count "
    "changed",
}
# Keys fingerprints gained after states were first saved: a state without one still matches on the others.
_LATER_KEYS = frozenset({"file_sizes"})


def _plain(section: Any) -> Any:
    """A config section as plain JSON-able data (its ``to_dict`` where it has one)."""
    to_dict = getattr(section, "to_dict", None)
    if callable(to_dict):
        return to_dict()
    fields = getattr(section, "__dataclass_fields__", None)
    if fields is not None:
        return {name: _plain(getattr(section, name)) for name in fields if name != "origin"}
    if isinstance(section, (list, tuple)):
        return [_plain(v) for v in section]
    if isinstance(section, dict):
        return {str(k): _plain(v) for k, v in section.items()}
    return section if isinstance(section, (str, int, float, bool, type(None))) else repr(section)


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


__all__ = [
    "Anchor",
    "Piece",
    "STATE_VERSION",
    "WINDOW_ROUNDS",
    "differences",
    "epoch_batches",
    "file_order",
    "fingerprint",
    "start_anchor",
    "window_rows",
]
