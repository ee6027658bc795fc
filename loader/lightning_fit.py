"""What a PyTorch Lightning fit loop up the call stack holds for the dataloader it trains on.

Where a dataloader's ``len()`` is unknown, Lightning's fit loop takes each batch one step ahead of the step
that trains it (its ``_PrefetchDataFetcher``, to know which batch is the last), and it takes an epoch's first
batch before it calls ``sampler.set_epoch(epoch)``. Lightning tells the dataloader neither, so a
``loader.torch.DataLoader`` under it would save a state one batch past the step trained (a resumed fit missed
that batch) and, resumed from an epoch-end checkpoint, hand out a batch of the wrong epoch first. Lightning
has no hook for either, so this module reads them from the fit loop that calls the dataloader, found by
walking up the calling frames: ``state_dict()`` is called from the loop's ``on_save_checkpoint``, an epoch's
first batch from the loop's fetcher.

Everything read is Lightning's private state (checked against pytorch-lightning 2.4-2.6,
tests/integration/test_lightning.py): where it is not as expected, this finds no loop and the dataloader
behaves as without Lightning. Only frames of Lightning's own files are looked into.
"""

from __future__ import annotations

import sys
from types import FrameType
from typing import Any

# Frames walked up from the caller: Lightning's calls reach a dataloader through its combined loader and fetcher,
# five to eight frames below the loop.
SEARCH_DEPTH = 16
_MODULES = ("pytorch_lightning.", "lightning.pytorch.")
_FILE_MARK = "lightning"  # in the path of each of Lightning's files, pytorch_lightning's too


def fit_loop_of(data: object, skip: int = 1) -> Any | None:
    """The Lightning fit loop that is calling, up the stack, and trains on ``data``; None when there is none.

    ``skip``: frames above this function's caller to start from (1: the caller's caller)."""
    try:
        frame: FrameType | None = sys._getframe(skip + 1)
    except ValueError:  # a shallower stack (driven from a thread with no Python caller): no loop calls
        return None
    for _ in range(SEARCH_DEPTH):
        if frame is None:
            return None
        if _FILE_MARK in frame.f_code.co_filename:
            loop = _fit_loop(frame.f_locals.get("self"))
            if loop is not None:
                return loop if _trains_on(loop, data) else None
        frame = frame.f_back
    return None


def batches_held(loop: Any) -> int:
    """Batches the loop's fetcher took ahead of the step it trains (0 where it takes none ahead)."""
    held = getattr(getattr(loop, "_data_fetcher", None), "batches", None)
    return len(held) if isinstance(held, list) else 0


def epoch_to_run(loop: Any) -> int | None:
    """The epoch the loop runs now: the number it gives ``sampler.set_epoch`` (None where it cannot be read)."""
    progress = getattr(getattr(getattr(loop, "epoch_progress", None), "current", None), "processed", None)
    return progress if isinstance(progress, int) and not isinstance(progress, bool) and progress >= 0 else None


def reloads_for(loop: Any, epoch: int) -> bool:
    """Whether the fit makes its dataloaders anew for ``epoch`` (``reload_dataloaders_every_n_epochs``): a new
    dataloader, so a new iterator, whatever became of the one before."""
    every = getattr(getattr(loop, "trainer", None), "reload_dataloaders_every_n_epochs", 0)
    last = getattr(loop, "_last_train_dl_reload_epoch", None)
    if not isinstance(every, int) or every <= 0:
        return False
    return not isinstance(last, int) or epoch - last >= every


def _fit_loop(owner: Any) -> Any | None:
    """``owner`` if it is Lightning's fit loop, the fit loop of the trainer it belongs to if it is another of
    Lightning's objects (the training epoch loop calls ``iter()`` from the second epoch on), else None."""
    if owner is None or not type(owner).__module__.startswith(_MODULES):
        return None
    if _is_fit_loop(owner):
        return owner
    loop = getattr(getattr(owner, "trainer", None), "fit_loop", None)
    return loop if _is_fit_loop(loop) else None


def _is_fit_loop(value: Any) -> bool:
    kind = type(value)
    return kind.__name__ == "_FitLoop" and kind.__module__.startswith(_MODULES)


def _trains_on(loop: Any, data: object) -> bool:
    """``data`` is one of the loop's training dataloaders (not a validation one, whose loop is another)."""
    flattened = getattr(getattr(loop, "_combined_loader", None), "flattened", None)
    return isinstance(flattened, list) and any(item is data for item in flattened)


__all__ = ["batches_held", "epoch_to_run", "fit_loop_of", "reloads_for"]
