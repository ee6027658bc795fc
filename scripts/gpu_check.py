"""End-to-end check of device placement through a real daemon: ``Client(address, device="cuda")``.

    python scripts/gpu_check.py [--device cuda] [--json results.json]

What it does (run it on a machine with a CUDA device; ``--device torch:cpu``
runs the correctness part anywhere torch is installed, for a dry run):

1. Writes two datasets with ``loader.examples.datagen`` (the code behind ``loader
   gen-data``): "small" = ``.npz`` with ``x`` float32[64] + ``label`` int64
   (rows travel inline through the daemon), "large" = ``.npy`` float32[16384]
   (64 KiB rows: they travel worker -> client through the shared-memory arenas).
2. Starts ``loader serve`` (a child process, as in production) on each, with a
   shuffle buffer, and reads two epochs with ``Client(address, device=DEVICE)``
   and one with ``device="cpu"``. Every leaf of every batch must be a torch
   tensor on the device with the source's dtype; each epoch's rows, read back
   with ``.cpu()``, must be exactly the source rows (every row once: compared as
   a multiset of row hashes with the files and with the CPU epoch).
3. The same with ``device="cupy:cuda"`` (if cupy is installed) and with
   ``loader.Loader(config)`` (daemon in this process, ``client.device``).
4. Overlap (CUDA only): a simulated train step (a sum over the batch, then
   ``torch.cuda._sleep`` for S ms on the GPU, then ``.item()``, which waits for
   the GPU like a loss read-out) is timed per batch for
   ``ours``     = ``Client(device="cuda")`` (pinned staging + copy on a side stream,
                  done by the client's receiver thread while the step runs),
   ``manual``   = ``Client(device="cpu")`` + ``torch.from_numpy(x).to("cuda")`` in the loop,
   ``manual_pinned`` = ``Client(device="cpu")`` + ``.pin_memory().to("cuda", non_blocking=True)``,
   beside ``load`` (each client with no step) and ``compute`` (the step on a
   resident tensor). Overlap shows as ``ours`` close to ``max(compute, load)``
   where ``manual`` pays ``compute + copy``.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import platform
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

# scripts/demo.py (this directory is on sys.path): starting, awaiting and stopping `loader serve`.
from demo import free_port, start_daemon, stop_daemon, wait_ready

from loader.examples import datagen

SERVE_START_TIMEOUT_S = 60.0
CLIENT_TIMEOUT_S = 60.0

CONFIG = """\
[source]
files = [{files}]

[pipeline]
batch_size = {batch_size}
shuffle_buffer = {shuffle}
seed = 7
epochs = 0

[workers]
count = {workers}
samples_per_message = {per_message}

[service]
bind = "{bind}"

[client]
device = "{device}"
"""


def write_config(
    work: str,
    name: str,
    files: list[str],
    *,
    batch_size: int,
    workers: int,
    shuffle: int,
    per_message: int,
    bind: str,
    device: str = "cpu",
) -> str:
    path = os.path.join(work, f"{name}.toml")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(
            CONFIG.format(
                files=", ".join(json.dumps(f) for f in files),
                batch_size=batch_size,
                workers=workers,
                shuffle=shuffle,
                per_message=per_message,
                bind=bind,
                device=device,
            )
        )
    return path


class Served:
    """``loader serve`` on a config in a child process."""

    def __init__(self, config: str, address: str, workers: int) -> None:
        self.address = address
        self.proc = start_daemon(config)
        try:
            wait_ready(address, self.proc, workers, SERVE_START_TIMEOUT_S)
        except BaseException:
            stop_daemon(self.proc)
            raise

    def __enter__(self) -> Served:
        return self

    def __exit__(self, *exc: Any) -> None:
        code = stop_daemon(self.proc)
        if code != 0:
            raise RuntimeError(f"loader serve exited with code {code}")


# -- rows as hashes ------------------------------------------------------------------


def row_keys(columns: list[np.ndarray]) -> list[bytes]:
    """One hash per row over every column's bytes of that row."""
    n = len(columns[0])
    flat = [np.ascontiguousarray(c).reshape(n, -1) for c in columns]
    keys = []
    for i in range(n):
        h = hashlib.blake2b(digest_size=16)
        for c in flat:
            h.update(c[i].tobytes())
        keys.append(h.digest())
    return keys


def source_keys(fmt: str, files: int, samples: int, dim: int) -> collections.Counter:
    keys: collections.Counter = collections.Counter()
    for index in range(files):
        features, labels = datagen.file_arrays(index, samples, dim, 0)
        keys.update(row_keys([features, labels]))  # npz members, or an .npy and its .label.npy companion
    return keys


def to_numpy(leaf: Any) -> np.ndarray:
    if isinstance(leaf, np.ndarray):
        return leaf
    if type(leaf).__module__.startswith("cupy"):
        return leaf.get()
    return leaf.cpu().numpy()  # torch: a copy on the consumer's stream, after its wait on the event


def check_epoch(
    batches: Iterable[dict[str, Any]], slots: list[str], dtypes: dict[str, str], device: str
) -> tuple[collections.Counter, int, list[str]]:
    """(row-hash multiset, batches, problems) of one epoch; every leaf is checked for its place and dtype."""
    problems: list[str] = []
    keys: collections.Counter = collections.Counter()
    count = 0
    for batch in batches:
        count += 1
        if sorted(batch) != sorted(slots):
            problems.append(f"batch {count}: slots {sorted(batch)} != {sorted(slots)}")
            continue
        for name in slots:
            problem = leaf_problem(batch[name], device, dtypes[name])
            if problem:
                problems.append(f"batch {count} slot {name}: {problem}")
        keys.update(row_keys([to_numpy(batch[name]) for name in slots]))
    return keys, count, problems


def leaf_problem(leaf: Any, device: str, dtype: str) -> str | None:
    if device == "cpu":
        if not isinstance(leaf, np.ndarray):
            return f"{type(leaf).__name__}, not a numpy array"
        return None if str(leaf.dtype) == dtype else f"dtype {leaf.dtype} != {dtype}"
    if device.startswith("cupy"):
        import cupy

        if not isinstance(leaf, cupy.ndarray):
            return f"{type(leaf).__name__}, not a cupy array"
        return None if str(leaf.dtype) == dtype else f"dtype {leaf.dtype} != {dtype}"
    import torch

    if not isinstance(leaf, torch.Tensor):
        return f"{type(leaf).__name__}, not a torch tensor"
    want = "cpu" if device == "torch:cpu" else "cuda"
    if leaf.device.type != want:
        return f"on {leaf.device}, not {want}"
    return None if str(leaf.dtype) == f"torch.{dtype}" else f"dtype {leaf.dtype} != torch.{dtype}"


def exactly_once(got: collections.Counter, expected: collections.Counter) -> str | None:
    if got == expected:
        return None
    missing = sum((expected - got).values())
    extra = sum((got - expected).values())
    dup = sum(1 for k, v in got.items() if v > 1)
    return f"missing {missing} rows, {extra} unexpected/extra, {dup} rows seen more than once"


# -- correctness ---------------------------------------------------------------------


def correctness(
    work: str,
    name: str,
    fmt: str,
    files: int,
    samples: int,
    dim: int,
    batch_size: int,
    device: str,
    extra_devices: list[str],
) -> dict[str, Any]:
    from loader.service.client import Client

    paths = datagen.generate(os.path.join(work, name), format=fmt, files=files, samples=samples, dim=dim)
    slots = ["x", "label"] if fmt == "npz" else ["data", "label"]  # datagen's .npy has a .label.npy companion
    dtypes = {"x": "float32", "label": "int64", "data": "float32"}
    expected = source_keys(fmt, files, samples, dim)
    address = f"tcp://127.0.0.1:{free_port()}"
    config = write_config(
        work,
        name,
        paths,
        batch_size=batch_size,
        workers=2,
        shuffle=batch_size * 4,
        per_message=64 if fmt == "npz" else 16,
        bind=address,
    )
    out: dict[str, Any] = {
        "dataset": f"{name}: {files} {fmt} files x {samples} rows, dim {dim}, batch {batch_size}",
        "rows": sum(expected.values()),
        "problems": [],
    }
    with Served(config, address, 2):
        with Client(address, device="cpu", timeout_s=CLIENT_TIMEOUT_S) as client:
            cpu_keys, cpu_batches, problems = check_epoch(client.epoch(), slots, dtypes, "cpu")
        out["problems"] += [f"cpu epoch: {p}" for p in problems]
        if bad := exactly_once(cpu_keys, expected):
            out["problems"].append(f"cpu epoch vs files: {bad}")
        for dev in [device, *extra_devices]:
            with Client(address, device=dev, timeout_s=CLIENT_TIMEOUT_S) as client:
                for epoch in range(2):
                    keys, count, problems = check_epoch(client.epoch(), slots, dtypes, dev)
                    out["problems"] += [f"{dev} epoch {epoch}: {p}" for p in problems[:5]]
                    if bad := exactly_once(keys, expected):
                        out["problems"].append(f"{dev} epoch {epoch} vs files: {bad}")
                    if keys != cpu_keys:
                        out["problems"].append(f"{dev} epoch {epoch}: rows differ from the cpu epoch")
                    out[f"{dev}_epoch{epoch}_batches"] = count
                    if dev != device:
                        break  # one epoch for the extra places
        out["cpu_batches"] = cpu_batches
    return out


def local_loader(work: str, device: str) -> dict[str, Any]:
    """``loader.Loader(config)`` (daemon thread in this process) with ``client.device``: one epoch."""
    import loader

    files, samples, dim = 3, 500, 64
    paths = datagen.generate(os.path.join(work, "local"), format="npz", files=files, samples=samples, dim=dim)
    config = loader.load_config(
        write_config(
            work,
            "local",
            paths,
            batch_size=64,
            workers=2,
            shuffle=256,
            per_message=64,
            bind="tcp://127.0.0.1:5555",
            device=device,
        )
    )
    expected = source_keys("npz", files, samples, dim)
    with loader.Loader(config) as local:
        keys, count, problems = check_epoch(local.epoch(), ["x", "label"], {"x": "float32", "label": "int64"}, device)
    if bad := exactly_once(keys, expected):
        problems.append(f"vs files: {bad}")
    return {"batches": count, "rows": sum(keys.values()), "problems": problems}


# -- overlap -------------------------------------------------------------------------


def calibrate_sleep() -> float:
    """GPU cycles of ``torch.cuda._sleep`` per millisecond."""
    import torch

    torch.cuda._sleep(1_000_000)  # warm up
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles = 50_000_000
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return cycles / start.elapsed_time(end)


class ReceiverProfile:
    """With ``--profile``: time the client's receiver spends in ``refs.gather`` and ``Placer.stage``, and
    the process's minor page faults, per batch of each ``per_batch`` figure."""

    def __init__(self) -> None:
        from loader import device
        from loader.service import refs

        self.totals = {"gather": 0.0, "stage": 0.0, "staged": 0}
        self.figures: list[dict[str, Any]] = []
        stage, gather = device.Placer.stage, refs.gather

        def timed_stage(placer: Any, obj: Any) -> Any:
            start = time.perf_counter()
            try:
                return stage(placer, obj)
            finally:
                self.totals["stage"] += time.perf_counter() - start
                self.totals["staged"] += 1

        def timed_gather(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return gather(*args, **kwargs)
            finally:
                self.totals["gather"] += time.perf_counter() - start

        device.Placer.stage, refs.gather = timed_stage, timed_gather

    def start(self) -> None:
        import resource

        self.totals.update(gather=0.0, stage=0.0, staged=0)
        self.faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt

    def stop(self, label: str, batches: int) -> None:
        import resource

        n = max(self.totals["staged"], 1)
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - self.faults
        self.figures.append(
            {
                "figure": label,
                "gather_ms": round(self.totals["gather"] / n * 1e3, 3),
                "stage_ms": round(self.totals["stage"] / n * 1e3, 3),
                "minor_faults_per_batch": round(faults / max(batches, 1)),
            }
        )


PROFILE: ReceiverProfile | None = None


def per_batch(address: str, device: str, count: int, step: Callable[[Any], Any], label: str = "") -> tuple[float, int]:
    """Mean seconds per batch over ``count`` epochs of a fresh ``Client(address, device=device)``
    (after one warm-up epoch), and the batches timed."""
    import torch

    from loader.service.client import Client

    with Client(address, device=device, timeout_s=CLIENT_TIMEOUT_S) as client:
        for batch in client.epoch():
            step(batch)
        torch.cuda.synchronize()
        if PROFILE is not None:
            PROFILE.start()
        n = 0
        start = time.perf_counter()
        for _ in range(count):
            for batch in client.epoch():
                step(batch)
                n += 1
        torch.cuda.synchronize()
        seconds = (time.perf_counter() - start) / n
        if PROFILE is not None:
            PROFILE.stop(label or device, n)
        return seconds, n


def overlap(
    work: str, files: int, samples: int, dim: int, batch_size: int, workers: int, sleeps_ms: list[float], epochs: int
) -> dict[str, Any]:
    import torch

    paths = datagen.generate(os.path.join(work, "overlap"), format="npy", files=files, samples=samples, dim=dim)
    address = f"tcp://127.0.0.1:{free_port()}"
    config = write_config(
        work, "overlap", paths, batch_size=batch_size, workers=workers, shuffle=0, per_message=16, bind=address
    )
    cuda = torch.device("cuda", 0)
    cycles_per_ms = calibrate_sleep()
    batch_mib = batch_size * dim * 4 / 2**20
    resident = torch.randn(batch_size, dim, device=cuda)

    def compute(x: Any, ms: float) -> float:
        s = x.sum()
        if ms:
            torch.cuda._sleep(int(ms * cycles_per_ms))
        return float(s)  # waits for the GPU, like reading a loss

    def manual(b: Any) -> Any:
        return torch.from_numpy(b["data"]).to(cuda)

    def manual_pinned(b: Any) -> Any:
        return torch.from_numpy(b["data"]).pin_memory().to(cuda, non_blocking=True)

    rows: list[dict[str, Any]] = []
    with Served(config, address, workers), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        load_ours, n = per_batch(address, "cuda", epochs, lambda b: b["data"], "load ours_cuda")
        load_manual, _ = per_batch(address, "cpu", epochs, manual, "load cpu_then_to_cuda")
        load_cpu, _ = per_batch(address, "cpu", epochs, lambda b: b["data"], "load cpu_numpy")
        compute(resident, 1)  # the first launches load the kernels (lazy module loading): not timed
        for ms in sleeps_ms:
            t0 = time.perf_counter()
            reps = 20
            for _ in range(reps):
                compute(resident, ms)
            compute_s = (time.perf_counter() - t0) / reps
            ours_s, _ = per_batch(address, "cuda", epochs, lambda b, ms=ms: compute(b["data"], ms), f"ours sleep {ms}")
            manual_s, _ = per_batch(
                address, "cpu", epochs, lambda b, ms=ms: compute(manual(b), ms), f"manual sleep {ms}"
            )
            pinned_s, _ = per_batch(
                address, "cpu", epochs, lambda b, ms=ms: compute(manual_pinned(b), ms), f"manual_pinned sleep {ms}"
            )
            rows.append(
                {
                    "sleep_ms": ms,
                    "compute_ms": round(compute_s * 1e3, 3),
                    "ours_ms": round(ours_s * 1e3, 3),
                    "manual_ms": round(manual_s * 1e3, 3),
                    "manual_pinned_ms": round(pinned_s * 1e3, 3),
                }
            )
    return {
        "dataset": f"{files} npy files x {samples} rows, dim {dim} float32 ({dim * 4 // 1024} KiB rows), "
        f"batch {batch_size} = {batch_mib:.0f} MiB, {workers} workers, {n} batches timed per figure",
        "load_only_ms_per_batch": {
            "ours_cuda": round(load_ours * 1e3, 3),
            "cpu_then_to_cuda": round(load_manual * 1e3, 3),
            "cpu_numpy": round(load_cpu * 1e3, 3),
        },
        "sleep_cycles_per_ms": round(cycles_per_ms),
        "rows": rows,
        "max_memory_allocated_mib": round(torch.cuda.max_memory_allocated() / 2**20, 1),
        **({"receiver_profile": PROFILE.figures} if PROFILE is not None else {}),
    }


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {"python": platform.python_version(), "cpus": os.cpu_count(), "numpy": np.__version__}
    try:
        import torch

        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="loader device placement, end to end")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--skip-overlap", action="store_true")
    parser.add_argument("--only", default="", help="comma-separated steps: small, large, local_loader, overlap")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="time the client receiver's gather and stage, and count page faults (overlap step)",
    )
    args = parser.parse_args(argv)
    if args.profile:
        global PROFILE
        PROFILE = ReceiverProfile()
    results: dict[str, Any] = {"machine": machine()}
    extra = []
    if args.device != "torch:cpu":
        try:
            import cupy  # noqa: F401

            extra.append("cupy:cuda")
        except ImportError:
            pass
    with tempfile.TemporaryDirectory(prefix="loader-gpu-check-") as work:
        steps: list[tuple[str, Callable[[], Any]]] = [
            ("small", lambda: correctness(work, "small", "npz", 4, 1000, 64, 64, args.device, extra)),
            ("large", lambda: correctness(work, "large", "npy", 6, 200, 16384, 32, args.device, extra)),
            # client.device in a config takes the forms of config.sections.DEVICE_FORMS (no torch.device)
            ("local_loader", lambda: local_loader(work, args.device if args.device.startswith("cuda") else "cpu")),
        ]
        if not args.skip_overlap and args.device.startswith("cuda"):
            steps.append(("overlap", lambda: overlap(work, 16, 512, 16384, 256, 4, [0, 2, 5, 10, 20], 2)))
        if args.only:
            steps = [(name, step) for name, step in steps if name in args.only.split(",")]
        for name, step in steps:
            start = time.perf_counter()
            try:
                results[name] = step()
            except Exception as exc:
                import traceback

                results[name] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
            results[name]["seconds"] = round(time.perf_counter() - start, 2)
            print(f"== {name}\n{json.dumps(results[name], indent=2, default=str)}", flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(results, fh, indent=2, default=str)
    failed = [k for k, v in results.items() if isinstance(v, dict) and (v.get("problems") or v.get("error"))]
    print("FAILED: " + ", ".join(failed) if failed else "ALL CHECKS PASSED")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
