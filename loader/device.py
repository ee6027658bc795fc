"""Placement of batches on a device: the one module that knows about torch and cupy.

Contract used by ``DoubleBufferReader``, ``DataFeeder`` and the service client::

    placer = Placer("cpu")          # or "cuda:0"
    staged = placer.stage(batch)    # background thread: start the host->device copy
    batch = placer.finish(staged)   # consumer thread: wait for that copy, get the result

``batch`` is any nest of lists, tuples and dicts whose leaves are numpy arrays
(other leaves pass through). On ``"cpu"`` both steps return the input unchanged.

(Skeleton: CPU placement only. Device placement is added by the provider/feeder
issue.)
"""

from __future__ import annotations

from typing import Any


class Placer:
    """Moves nests of numpy arrays to one place."""

    def __init__(self, place: str = "cpu") -> None:
        place = str(place).lower()
        if place != "cpu":
            raise ValueError(f"unsupported place {place!r}: only 'cpu' is available in this build")
        self.place = place

    @property
    def is_cpu(self) -> bool:
        return self.place == "cpu"

    def stage(self, obj: Any) -> Any:
        return obj

    def finish(self, staged: Any) -> Any:
        return staged


__all__ = ["Placer"]
