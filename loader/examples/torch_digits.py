"""A small model trained on scikit-learn's handwritten digits through ``loader.torch``, with checkpoints.

::

    python -m loader.examples.torch_digits prepare DIR        # DIR/digits-*.npz and DIR/digits.toml
    python -m loader.examples.torch_digits train DIR/digits.toml --checkpoint ck.pt --every 10 --out w.pt
    python -m loader.examples.torch_digits train DIR/digits.toml --checkpoint ck.pt --every 10 --out w.pt --resume

Every ``--every`` steps the model, the optimizer and the loader's ``state_dict()`` go to ``--checkpoint``
(written to a temporary file and renamed, so a kill never leaves half a checkpoint). ``--resume`` goes
on from it: the interrupted epoch continues with the batch after the last one trained on. The batches
are fixed by the config's ``pipeline.seed`` (one worker: see ``configs/example.toml``), the model's
start by ``torch.manual_seed``, and torch runs deterministic kernels on one CPU thread, so a resumed run
ends with exactly the weights of one never stopped (``scripts/digits_resume.py`` checks it).

Needs torch and scikit-learn: ``pip install '/path/to/loader[examples]'`` from the checkout.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import os
import sys
from typing import Any

import numpy as np

from loader.device import import_torch
from loader.errors import ConfigError, LoaderError, MissingDependencyError

CONFIG_NAME = "digits.toml"
BATCH_SIZE = 64
SEED = 1234  # the loader's pipeline.seed: which samples make each batch of each epoch
TORCH_SEED = 0  # the model's initial weights
CONFIG = """\
# scikit-learn's handwritten digits, written by `python -m loader.examples.torch_digits prepare`.
[source]
files = ["digits-*.npz"]

[pipeline]
batch_size = {batch_size}
shuffle_buffer = 2048   # the whole set: a full shuffle each epoch
seed = {seed}           # fixed: every run sees the same batches, so a resumed run can match one never stopped
epochs = {epochs}

[workers]
count = 1               # with several, which worker delivers first also shapes the order
"""


def prepare(directory: str, *, shards: int = 4, epochs: int = 2) -> str:
    """Write the 1797 digits as ``digits-N.npz`` shards (``image`` float32[n, 64] in [0, 1], ``label``
    int64[n]) and a config beside them; return the config's path."""
    try:
        datasets = importlib.import_module("sklearn.datasets")
    except ImportError:
        raise MissingDependencyError(
            "the digits example needs scikit-learn, which is not installed: pip install scikit-learn"
        ) from None
    digits = datasets.load_digits()
    images = (digits.data / 16.0).astype(np.float32)  # pixels are 0..16
    labels = digits.target.astype(np.int64)
    os.makedirs(directory, exist_ok=True)
    for index, rows in enumerate(np.array_split(np.arange(len(labels)), shards)):
        np.savez(os.path.join(directory, f"digits-{index}.npz"), image=images[rows], label=labels[rows])
    path = os.path.join(directory, CONFIG_NAME)
    with open(path, "w") as fh:
        fh.write(CONFIG.format(batch_size=BATCH_SIZE, seed=SEED, epochs=epochs))
    return path


def _deterministic_torch() -> Any:
    torch = import_torch("the digits example")
    torch.manual_seed(TORCH_SEED)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)  # one thread: sums are added in one order, run after run
    return torch


def _model(torch: Any) -> tuple[Any, Any]:
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)  # momentum: optimizer state to keep
    return model, optimizer


def _save(torch: Any, path: str, checkpoint: dict[str, Any]) -> None:
    """Write to a temporary file and rename it: a process killed while saving leaves the previous checkpoint."""
    temporary = f"{path}.tmp"
    torch.save(checkpoint, temporary)
    os.replace(temporary, path)


def train(args: argparse.Namespace) -> None:
    from loader.torch import DataLoader

    torch = _deterministic_torch()
    model, optimizer = _model(torch)
    start, step = 0, 0
    with DataLoader(args.config, device="cpu") as data:
        if args.resume:
            checkpoint = torch.load(args.checkpoint)
            model.load_state_dict(checkpoint["model"])
            optimizer.load_state_dict(checkpoint["optimizer"])
            data.load_state_dict(checkpoint["data"])  # the epoch goes on after the checkpoint's last batch
            start, step = checkpoint["epoch"], checkpoint["step"]
            print(f"resumed from {args.checkpoint}: epoch {start}, step {step}", flush=True)
        for epoch in range(start, args.epochs):
            data.set_epoch(epoch)
            step = _train_epoch(torch, args, model, optimizer, data, epoch, step)
    if args.out:
        torch.save(model.state_dict(), args.out)
    print(f"trained {step} steps; weights {_digest(model)}")


def _train_epoch(
    torch: Any, args: argparse.Namespace, model: Any, optimizer: Any, data: Any, epoch: int, step: int
) -> int:
    """One epoch (or the rest of one), saving a checkpoint every ``args.every`` steps; returns the step count."""
    losses, right, seen = [], 0, 0
    for batch in data:
        logits = model(batch["image"])
        loss = torch.nn.functional.cross_entropy(logits, batch["label"])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        losses.append(loss.item())
        right += int((logits.argmax(1) == batch["label"]).sum())
        seen += len(batch["label"])
        if args.checkpoint and args.every and step % args.every == 0:
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "data": data.state_dict()}
            _save(torch, args.checkpoint, {**state, "epoch": epoch, "step": step})
            if step == args.wait_after_checkpoint:
                print(f"checkpoint at step {step}", flush=True)
                sys.stdin.read()  # a test kills this process here (SIGKILL); end of input goes on
    print(f"epoch {epoch}: {seen} samples, loss {np.mean(losses or [0.0]):.4f}, accuracy {right / max(seen, 1):.3f}")
    return step


def _digest(model: Any) -> str:
    """A short hash of the weights, so two runs can be compared by eye."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m loader.examples.torch_digits",
        description="Train a small model on scikit-learn's digits through loader.torch, with checkpoints.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser("prepare", help="write the digits as .npz shards and a config beside them")
    make.add_argument("directory", help="where to write the shards and digits.toml (created if missing)")
    make.add_argument("--shards", type=int, default=4, help="files to split the 1797 digits into (default 4)")
    make.add_argument("--epochs", type=int, default=2, help="the config's pipeline.epochs (default 2)")
    run = commands.add_parser("train", help="train, saving checkpoints; --resume goes on from one")
    run.add_argument("config", help="the config `prepare` wrote (or a daemon's address)")
    run.add_argument("--epochs", type=int, default=2, help="epochs to train in all (default 2)")
    run.add_argument("--checkpoint", default="", help="the checkpoint file (model, optimizer, loader state)")
    run.add_argument("--every", type=int, default=10, help="save a checkpoint every this many steps (default 10)")
    run.add_argument("--resume", action="store_true", help="go on from --checkpoint")
    run.add_argument("--out", default="", help="write the final weights here (torch.save of the state_dict)")
    run.add_argument(
        "--wait-after-checkpoint",
        type=int,
        default=0,
        metavar="STEP",
        help="after the checkpoint of step STEP, say so and wait for end of input (to be killed by a test)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "prepare":
            print(prepare(args.directory, shards=args.shards, epochs=args.epochs))
        else:
            if args.resume and not args.checkpoint:
                raise ConfigError("--resume needs --checkpoint")
            if args.resume and not os.path.exists(args.checkpoint):
                # Checked before the loader starts its workers, not when torch.load fails after.
                raise ConfigError(f"--resume: the checkpoint {args.checkpoint!r} does not exist")
            train(args)
    except (LoaderError, OSError) as exc:  # a mistyped path, a missing package: one line, as `loader` prints
        print(f"torch_digits: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
