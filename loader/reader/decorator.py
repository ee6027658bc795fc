"""``loader.reader.decorator``: paddle's module name for :mod:`loader.reader.decorators`.

Code written for ``paddle.reader.decorator`` imports from here unchanged; every
name is the same object as in ``loader.reader.decorators``.
"""

from __future__ import annotations

from loader.reader import decorators as _decorators
from loader.reader.decorators import *  # noqa: F403 - an alias module re-exports everything

__all__ = list(_decorators.__all__)
