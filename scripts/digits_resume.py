#!/usr/bin/env python3
"""A training killed mid-epoch and resumed ends with exactly the weights of one never stopped.

    python scripts/digits_resume.py [--kill-at STEP] [--keep DIR]

With ``loader.examples.torch_digits`` (scikit-learn's 1797 digits, batch 64: 29 steps an epoch,
2 epochs): trains once uninterrupted; trains again in a process that is SIGKILLed right after it
saved the checkpoint of step STEP (default 20, in the middle of epoch 0); resumes from that
checkpoint in a new process; and checks that every tensor of the final weights is ``torch.equal``
to the uninterrupted run's. Exit status 0 when they are, 1 when not. Takes seconds.
Needs torch and scikit-learn (``pip install -e '.[examples]'``).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
from typing import Any

EXAMPLE = [sys.executable, "-m", "loader.examples.torch_digits"]
RUN_TIMEOUT_S = 120
EVERY = 10  # steps between checkpoints


def _train(config: str, *extra: str) -> str:
    done = subprocess.run(
        [*EXAMPLE, "train", config, "--every", str(EVERY), *extra],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    if done.returncode != 0:
        raise SystemExit(f"training failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    return done.stdout


def _train_until_killed(config: str, checkpoint: str, kill_at: int) -> None:
    """Train until the checkpoint of step ``kill_at`` is saved, then SIGKILL the process and its workers at once
    (its own process group, as a scheduler ends a preempted job): no clean-up of any kind runs."""
    command = [*EXAMPLE, "train", config, "--every", str(EVERY), "--checkpoint", checkpoint]
    log = f"{checkpoint}.stderr"
    with open(log, "w") as stderr:
        process = subprocess.Popen(
            [*command, "--wait-after-checkpoint", str(kill_at)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            start_new_session=True,
        )
        try:
            assert process.stdout is not None
            for line in process.stdout:  # ends early if the process dies first
                if line.startswith(f"checkpoint at step {kill_at}"):
                    os.killpg(process.pid, signal.SIGKILL)
                    break
            process.wait(RUN_TIMEOUT_S)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    if process.returncode != -signal.SIGKILL:
        with open(log) as fh:
            raise SystemExit(
                f"the training to kill ended ({process.returncode}) before step {kill_at}'s checkpoint:\n{fh.read()}"
            )


def _same_weights(first: str, second: str) -> list[str]:
    """Names of the tensors that differ (empty: identical)."""
    import torch

    a: dict[str, Any] = torch.load(first)
    b: dict[str, Any] = torch.load(second)
    if a.keys() != b.keys():
        return sorted(a.keys() ^ b.keys())
    return [name for name in a if not torch.equal(a[name], b[name])]


def check(directory: str, kill_at: int) -> bool:
    from loader.examples.torch_digits import prepare

    config = prepare(os.path.join(directory, "data"))
    whole, resumed = os.path.join(directory, "whole.pt"), os.path.join(directory, "resumed.pt")
    checkpoint = os.path.join(directory, "checkpoint.pt")
    print(_train(config, "--checkpoint", os.path.join(directory, "unused.pt"), "--out", whole), end="")
    _train_until_killed(config, checkpoint, kill_at)
    print(f"killed (SIGKILL) right after the checkpoint of step {kill_at}")
    print(_train(config, "--checkpoint", checkpoint, "--resume", "--out", resumed), end="")
    differ = _same_weights(whole, resumed)
    print("identical weights" if not differ else f"weights differ: {', '.join(differ)}")
    return not differ


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kill-at", type=int, default=20, help="the step whose checkpoint is resumed (default 20)")
    parser.add_argument("--keep", default="", help="work in this directory and keep it (default: a temporary one)")
    args = parser.parse_args(argv)
    if args.kill_at % EVERY:
        parser.error(f"--kill-at must be a multiple of {EVERY}, the steps between checkpoints")
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
        return 0 if check(args.keep, args.kill_at) else 1
    with tempfile.TemporaryDirectory(prefix="digits-resume-") as directory:
        return 0 if check(directory, args.kill_at) else 1


if __name__ == "__main__":
    sys.exit(main())
