"""A module that interrupts its own process while a child of the process named by ``INTERRUPT_IMPORT_OF``
imports it: what a terminal's Ctrl-C does to a spawned worker still importing
(``tests/unit/runtime/test_processes.py``). Imported anywhere else, it does nothing."""

from __future__ import annotations

import os
import signal

INTERRUPT_IMPORT_OF = "LOADER_TEST_INTERRUPT_IMPORT_OF"

if os.environ.get(INTERRUPT_IMPORT_OF) == str(os.getppid()):
    os.kill(os.getpid(), signal.SIGINT)


def finish() -> None:
    """The child's target: reached only if the interrupt during the import did not end the child."""
