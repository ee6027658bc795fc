"""A provider served by the daemon (``source.provider``): what it is told, and which options it loses.

In process, a ``ProviderSession`` pools, shuffles, weighs and caches the samples of its whole file
list. Under the daemon a worker only reads the files it leases, in file order, and the daemon's
pipeline shuffles (``pipeline.shuffle_buffer``, ``pipeline.seed``) and batches
(``pipeline.batch_size`` samples). So the options that steer pooling, batching and caching have no
effect there: :func:`daemon_ignored_options` names each one a provider sets, with what the daemon
does instead, and :func:`warn_daemon_options` logs them once per process and dataset (``loader
serve``, ``loader check`` and ``Loader`` call it as they check the config's imports).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from loader.provider.core import normalize_should_shuffle
from loader.provider.session import DEFAULT_MAX_OPEN_FILES
from loader.provider.types import CacheType

logger = logging.getLogger("loader.provider")

_warned: set[tuple[str, str]] = set()  # (provider, dataset) already warned of in this process
_warned_lock = threading.Lock()


def daemon_ignored_options(process: Any, pipeline: Any) -> list[str]:
    """One phrase per option of ``process`` (a ``@provider``) that the daemon does not honour, set to other
    than its default, saying what the daemon does instead under ``pipeline`` (a ``PipelineConfig``)."""
    options = getattr(process, "options", None)
    if not isinstance(options, dict):
        return []
    shuffle = f"pipeline.shuffle_buffer = {pipeline.shuffle_buffer}"
    lines = []
    wanted = normalize_should_shuffle(options.get("should_shuffle"))
    # Only where the pipeline does otherwise: should_shuffle=False with no shuffle buffer is what happens anyway.
    if wanted is not None and bool(wanted) != (pipeline.shuffle_buffer > 0):
        lines.append(
            f"should_shuffle={wanted!r}: samples are shuffled by {shuffle} and pipeline.seed"
            + (" (0: the files and their samples in order)" if pipeline.shuffle_buffer == 0 else "")
        )
    for key in ("pool_size", "min_pool_size"):
        if options.get(key, -1) != -1:
            lines.append(f"{key}={options[key]}: the daemon's shuffle pool is {shuffle} samples")
    if options.get("max_open_files", DEFAULT_MAX_OPEN_FILES) != DEFAULT_MAX_OPEN_FILES:
        lines.append(f"max_open_files={options['max_open_files']}: each worker reads the one file it leased")
    batch = f"every batch is pipeline.batch_size = {pipeline.batch_size} samples"
    if options.get("calc_batch_size") is not None:
        lines.append(f"calc_batch_size: every sample counts 1, {batch}")
    if options.get("can_over_batch_size", True) is not True:
        lines.append(f"can_over_batch_size={options['can_over_batch_size']!r}: {batch}")
    if options.get("cache", CacheType.NO_CACHE) != CacheType.NO_CACHE:
        lines.append(f"cache={CacheType(options['cache']).name}: every epoch reads the files again")
    return lines


def warn_daemon_options(process: Any, dataset: str, pipeline: Any) -> None:
    """Log, once per process for ``dataset``, one warning naming each option ``daemon_ignored_options``
    finds (nothing when there is nothing to say)."""
    lines = daemon_ignored_options(process, pipeline)
    name = f"{getattr(process, '__module__', '?')}:{getattr(process, '__qualname__', process)}"
    with _warned_lock:
        if not lines or (name, dataset) in _warned:
            return
        _warned.add((name, dataset))
    logger.warning(
        "dataset %s: source.provider %s sets options the daemon does not use (they act only in process, "
        "through process.reader / batch_reader): %s",
        dataset,
        name,
        "; ".join(lines),
    )


__all__ = ["daemon_ignored_options", "warn_daemon_options"]
