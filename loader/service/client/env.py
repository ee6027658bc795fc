"""A client placed by its scheduler: the variables torchrun and Slurm set, and the client's own counters.

``Client()`` and ``Client.from_env()`` fill what the caller leaves out from the
environment:

==================  ============================================================
``LOADER_ADDRESS``  the daemon's address (``tcp://HOST:PORT``); required when no
                    ``address`` is given
``RANK``            this trainer's rank (torchrun); else ``SLURM_PROCID``; else 0
``WORLD_SIZE``      the number of trainers (torchrun); else ``SLURM_NTASKS``; else 1;
                    set without a rank (Lightning's DDP launcher sets no
                    ``RANK``), the rank of torch.distributed's process group of
                    that size
(none of them)      the rank and size of torch.distributed's default process group,
                    when this process has one (``mp.spawn`` and
                    ``init_process_group(rank=, world_size=)`` set no variables):
                    ranks that each read the whole epoch would not say so
``LOCAL_RANK``      the GPU of this trainer on its host: a device that names no
                    GPU (``"cuda"``, ``"gpu"``, ``"torch:cuda"``,
                    ``torch.device("cuda")``) becomes ``cuda:LOCAL_RANK``
                    (torchrun); else ``SLURM_LOCALID``; else (or when
                    ``CUDA_VISIBLE_DEVICES`` shows fewer GPUs than that, one
                    per rank) it is the current CUDA device
                    (``torch.cuda.set_device``), as ``loader.device`` reads it
==================  ============================================================

Variables that disagree with a process group this process has (rank or size) are refused, naming both: they
were left from another launcher. An argument given explicitly always wins. A variable that is set but not a
non-negative integer is an error naming it, never silently ignored: a trainer
reading the wrong share of the data is worse than one that does not start. So is
half a placement (a world size without a rank, a rank above 0 without a world
size); a share read from the environment is logged once.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from typing import Any

from loader.device import cuda_without_index
from loader.errors import ConfigError

log = logging.getLogger("loader.client")

ADDRESS_VARIABLE = "LOADER_ADDRESS"
# (torchrun's name, Slurm's name): torchrun's wins when both are set (torchrun under srun).
RANK_VARIABLES = ("RANK", "SLURM_PROCID")
WORLD_SIZE_VARIABLES = ("WORLD_SIZE", "SLURM_NTASKS")
LOCAL_RANK_VARIABLES = ("LOCAL_RANK", "SLURM_LOCALID")


def from_environment(
    address: str | None,
    rank: int | None,
    world_size: int | None,
    device: Any,
    environ: Mapping[str, str] | None = None,
) -> tuple[str, int, int, Any]:
    """(address, rank, world_size, device) with what was left out (None, a CUDA device without an index)
    read from ``environ``."""
    env = os.environ if environ is None else environ
    if isinstance(address, str) and not address.strip():
        # Client(os.environ.get("X", "")) with X unset reached 127.0.0.1:5555, maybe another user's daemon.
        raise ConfigError(
            f"an empty daemon address: pass Client(address=...) a tcp://HOST:PORT, HOST:PORT, ipc://PATH or config "
            f"file, or leave it out to use {ADDRESS_VARIABLE}"
        )
    if address is None:
        address = env.get(ADDRESS_VARIABLE, "").strip()
        if not address:
            raise ConfigError(
                f"no daemon address: pass Client(address=...) or set {ADDRESS_VARIABLE}=tcp://HOST:PORT "
                "(loader serve --address-file writes it for a daemon bound to port *)"
            )
    rank_from = world_from = None
    rank_defaulted = world_defaulted = False
    group = process_group()
    if rank is None:
        rank, rank_from = integer_variable(env, RANK_VARIABLES, 0)
        rank_defaulted = rank_from is None
    if world_size is None:
        world_size, world_from = integer_variable(env, WORLD_SIZE_VARIABLES, 1)
        world_defaulted = world_from is None
    if world_from is not None and rank_defaulted and world_size > 1:
        # Lightning's DDP launcher sets WORLD_SIZE (and LOCAL_RANK, NODE_RANK) but not RANK: its process group,
        # up by the time train_dataloader() runs, says the rank.
        if group is None or group[1] != world_size:
            raise ConfigError(
                f"environment variable {world_from}={world_size} is set but no rank ({' or '.join(RANK_VARIABLES)}) "
                "and no torch.distributed process group of that size: set it too, pass rank=, or make the client "
                "once the process group is up (Lightning: in train_dataloader()); a world size alone would read "
                "rank 0's share"
            )
        rank, rank_from, rank_defaulted = group[0], "torch.distributed's process group", False
    if rank_from is not None and world_defaulted and rank > 0:
        raise ConfigError(
            f"environment variable {rank_from}={rank} is set but no world size "
            f"({' or '.join(WORLD_SIZE_VARIABLES)}): set it too, or pass world_size="
        )
    if rank_from is not None and world_from is not None and rank >= world_size:
        raise ConfigError(
            f"environment variables {rank_from}={rank} and {world_from}={world_size}: the rank must be below the world size"
        )
    if group is not None and rank_defaulted and world_defaulted:
        rank, world_size = group
        rank_from = world_from = "torch.distributed's process group"
    elif group is not None and (
        (rank_from is not None and rank != group[0]) or (world_from is not None and world_size != group[1])
    ):
        # Variables of two launchers mixed: Lightning's DDP ranks in an `srun --pty bash` shell take WORLD_SIZE from
        # Lightning and SLURM_PROCID from the shell, so every rank read rank 0's share.
        said = " and ".join(
            f"{name}={value}" for name, value in ((rank_from, rank), (world_from, world_size)) if name is not None
        )
        raise ConfigError(
            f"environment variable(s) {said} disagree with torch.distributed's process group (rank {group[0]} of "
            f"{group[1]}): left from another launcher? Unset them, or pass rank= and world_size= for this "
            "process's share"
        )
    if world_from is not None and world_size > 1:
        # Said once per client: Slurm's variables in an salloc shell made a plain script read a quarter of the
        # data without a word.
        log.info(
            "rank %d of %d from %s: this client reads its 1/%d share of each epoch",
            rank,
            world_size,
            " and ".join(dict.fromkeys(name for name in (rank_from, world_from) if name)),
            world_size,
        )
    # Every spelling of "a GPU, not saying which": torch.device("cuda") after torch.cuda.set_device(local_rank)
    # is the usual DDP idiom, and put every rank's batches on GPU 0 while only the string "cuda" was rewritten.
    bare = cuda_without_index(device)
    if bare is not None:
        local_rank, _ = integer_variable(env, LOCAL_RANK_VARIABLES, None)
        if local_rank is not None and _visible(env, local_rank):
            device = f"{bare}:{local_rank}"
    return address, rank, world_size, device


def process_group() -> tuple[int, int] | None:
    """(rank, world_size) of torch.distributed's default process group, when this process has one of more than
    one rank; else None. torch is not imported for it: a script that made a process group has imported it."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return None
        rank, world_size = int(dist.get_rank()), int(dist.get_world_size())
    except Exception:  # a torch too old or too odd to say: the variables and arguments decide, as without it
        return None
    return (rank, world_size) if world_size > 1 and 0 <= rank < world_size else None


def _visible(env: Mapping[str, str], gpu: int) -> bool:
    """Whether ``CUDA_VISIBLE_DEVICES`` (when set) lets this process see GPU number ``gpu``.

    A scheduler that gives each rank its own GPU (``srun --gpus-per-task=1``) shows each one device, number 0,
    while the local rank goes up to the ranks on the host: then a GPU without an index is the current one."""
    visible = env.get("CUDA_VISIBLE_DEVICES")
    return visible is None or gpu < len([d for d in visible.split(",") if d.strip()])


def integer_variable(env: Mapping[str, str], names: tuple[str, ...], default: int | None) -> tuple[Any, str | None]:
    """(value, the variable it came from) of the first of ``names`` that is set, or (default, None)."""
    for name in names:
        text = env.get(name)
        if text is None or not text.strip():
            continue
        try:
            value = int(text.strip())
        except ValueError:
            raise ConfigError(f"environment variable {name} must be a non-negative integer, got {text!r}") from None
        if value < 0:
            raise ConfigError(f"environment variable {name} must be a non-negative integer, got {text!r}")
        return value, name
    return default, None


def client_stats(client: Any) -> dict[str, Any]:
    """``Client.stats()``: plain numbers, safe to log or send to a dashboard."""
    batches_received, samples_received = client._received
    return {
        "address": client.address,
        "rank": client.rank,
        "world_size": client.world_size,
        "batches": client._consumed,  # taken by the training loop
        "batches_received": batches_received,
        "samples_received": samples_received,
        "wait_s": round(client._wait_total(), 6),
    }


__all__ = ["from_environment", "client_stats", "integer_variable", "ADDRESS_VARIABLE", "WORLD_SIZE_VARIABLES"]
