"""Start-up: from ``loader serve`` to a fresh client's first batch, and from ``loader.Loader(...)`` to its first batch.

``run(quick) -> list[dict]`` (the driver's group ``startup``). Run alone:
``python scripts/bench_startup.py [--quick]``. Target: under 1 s each.

Both are measured from fresh processes on a machine whose page cache already holds Python, the
libraries and the data (the files were just written); ``loader serve`` is measured once more after
dropping every file the processes read (code and data) from the page cache with
``posix_fadvise(DONTNEED)``, which needs no privileges but leaves pages that other running
processes map (a shared ``libpython`` or numpy of another Python): the nearest this benchmark
gets to a cold machine.

* ``loader serve``: at t0 this process starts ``python -m loader.cli serve CONFIG`` and, at once, a
  client process (``python scripts/bench_startup.py --client ...``, which imports only the standard
  library before ``loader``); the client's ``Client(address)`` waits for the daemon to answer, asks
  for an epoch and takes its first batch. The figure is t0 -> that batch (``time.monotonic``, one
  clock for every process on Linux).
* ``loader.Loader``: a fresh process imports ``loader``, builds the config, then times
  ``loader.Loader(config)`` -> ``next(loader.epoch())``.

Where the time goes is measured, not guessed: each case is run again *traced*, with timestamps
written by every process at its milestones (interpreter up, imports done, bound, each worker
spawned, worker up, worker welcomed, first lease, first chunk sent, first chunk at the stage,
client connected, first batch). Tracing wraps a few methods (``bench_startup.patch``) and starts
workers through ``bench_startup:traced_worker``, a thin wrapper of ``workers.main:run_worker``; the
untraced figure is the one compared with the target, and both totals are printed so the cost of the
tracing shows. Each figure is the median of several tries; each event's time is its median too.

The data: 4 ``.npy`` files of 4,096 rows of 64 float32 with labels; 2 workers, batch 256.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

TRACE_ENV = "LOADER_BENCH_TRACE"  # a file every traced process appends its events to
TRACED_WORKER = "bench_startup:traced_worker"
TARGET_S = 1.0
WORKERS = 2
BATCH = 256
FILES, ROWS = 4, 4096
TRY_TIMEOUT_S = 60.0
HERE = Path(__file__).resolve().parent


# -- tracing ----------------------------------------------------------------------------------


def mark(event: str) -> None:
    """Append ``event`` with this process's id and ``time.monotonic()`` to the trace file, if tracing."""
    path = os.environ.get(TRACE_ENV)
    if path:
        line = json.dumps({"event": event, "pid": os.getpid(), "t": time.monotonic()}) + "\n"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line.encode())  # one short O_APPEND write: lines from processes never interleave
        finally:
            os.close(fd)


def _wrap(owner: Any, name: str, before: str | None = None, after: str | None = None, *, every: bool = False) -> None:
    """Mark ``before`` / ``after`` around ``owner.name`` (its first call only, unless ``every``)."""
    original = getattr(owner, name)
    done = [False]

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        first = every or not done[0]
        done[0] = True
        if first and before:
            mark(before)
        got = original(*args, **kwargs)
        if first and after:
            mark(after)
        return got

    setattr(owner, name, wrapper)


def patch_daemon(worker_entry: str | None) -> None:
    """Marks at the daemon's milestones; workers started through ``worker_entry`` when given."""
    from loader.service.daemon import desk, launcher, loop, stage, workforce

    _wrap(loop, "_open_sources", "binding", "bound")
    _wrap(loop.Daemon, "__init__", "daemon init", "daemon ready")
    _wrap(workforce.WorkerPool, "launch", "spawning a worker", "spawned a worker", every=True)
    _wrap(workforce.WorkerPool, "hello", "worker joined", every=True)
    _wrap(desk.ClientDesk, "hello", "client attached")
    _wrap(stage.Stage, "on_chunk", "first chunk at the stage")
    if worker_entry is not None:
        start = launcher.start_worker
        launcher.start_worker = lambda connect, worker_id, entry=worker_entry: start(connect, worker_id, worker_entry)


def traced_worker(connect: Any, *, worker_id: str | None = None, stop_event: Any = None) -> int:
    """``workers.main:run_worker`` with marks: entered, imported, welcomed, first lease, first chunk sent."""
    mark("worker entered")
    from workers import main

    mark("worker imported")
    _wrap(main.Worker, "_handshake", None, "worker welcomed")
    _wrap(main.Worker, "_serve_lease", "worker's first lease")
    _wrap(main.Worker, "_send_data", "worker's first chunk sent")
    return main.run_worker(connect, worker_id=worker_id, stop_event=stop_event)


def read_trace(path: str) -> dict[str, float]:
    """Each event's first time (workers: the first worker to reach it)."""
    events: dict[str, float] = {}
    if os.path.exists(path):
        for line in Path(path).read_text().splitlines():
            got = json.loads(line)
            events.setdefault(got["event"], got["t"])
            events[got["event"]] = min(events[got["event"]], got["t"])
    return events


# -- the processes ---------------------------------------------------------------------------


def first_batch_at(epoch: Callable[[], Any], event: str) -> float:
    """``time.monotonic()`` when the first batch of ``epoch()`` arrived (marked as ``event``)."""
    batches = epoch()
    next(batches)
    first = time.monotonic()
    mark(event)
    batches.close()
    return first


def client_main(address: str) -> int:
    """A fresh client: connect (waiting for the daemon), first batch; prints the times as JSON."""
    mark("client up")
    started = time.monotonic()
    from loader.service.client.client import Client

    mark("client imported")
    with Client(address, timeout_s=TRY_TIMEOUT_S) as client:
        mark("client connected")
        first = first_batch_at(client.epoch, "client's first batch")
    print(json.dumps({"up": started, "first_batch": first}))
    return 0


def serve_main(config: str) -> int:
    """``python -m loader.cli serve CONFIG``, traced: the same module run as ``__main__``, after the patches."""
    import runpy

    mark("daemon up")
    patch_daemon(TRACED_WORKER)  # imports the package and the daemon's modules (loader.cli comes with run_module)
    mark("daemon imported")
    sys.argv = ["loader", "serve", config, "--log-level", "warning"]
    try:
        runpy.run_module("loader.cli", run_name="__main__", alter_sys=True)
    except SystemExit as exit:
        return int(exit.code or 0)
    return 0


def loader_main(config: str, traced: bool) -> int:
    """A fresh training process: import, config, ``Loader(config)`` -> first batch; prints the times as JSON."""
    up = time.monotonic()
    mark("process up")
    import loader
    from loader.config import load_config

    Loader = loader.Loader  # the lazy import of the service's code: part of what `import loader` costs a user
    if traced:
        patch_daemon(None)
    mark("imported")
    imported = time.monotonic()
    loaded = load_config(config)
    called = time.monotonic()
    mark("Loader(...) called")
    with Loader(loaded, **({"worker_entry": TRACED_WORKER} if traced else {})) as data:
        mark("Loader(...) returned")
        first = first_batch_at(data.epoch, "first batch")
    print(json.dumps({"up": up, "imported": imported, "called": called, "first_batch": first}))
    return 0


# -- one try of each case -----------------------------------------------------------------------


def _env(trace: str | None) -> dict[str, str]:
    from bench_service import child_env

    env = child_env()
    env.pop(TRACE_ENV, None)
    if trace:
        env[TRACE_ENV] = trace
    return env


def serve_try(work: str, data: list[str], traced: bool) -> dict[str, Any]:
    """One try of ``loader serve`` + a fresh client: times from t0, and the trace's events."""
    from bench_tools import write_config
    from demo import stop_daemon

    config, address = write_config(work, _tables(data), "startup")
    trace = os.path.join(work, f"trace-{time.monotonic_ns()}.jsonl") if traced else None
    serve = [sys.executable, str(HERE / "bench_startup.py"), "--serve", config] if traced else None
    env = _env(trace)
    t0 = time.monotonic()
    daemon = subprocess.Popen(
        serve or [sys.executable, "-m", "loader.cli", "serve", config, "--log-level", "warning"], env=env
    )
    try:
        client = subprocess.run(
            [sys.executable, str(HERE / "bench_startup.py"), "--client", address],
            capture_output=True,
            text=True,
            timeout=TRY_TIMEOUT_S,
            env=env,
        )
    finally:
        stop_daemon(daemon)
    if client.returncode != 0:
        raise RuntimeError(f"the client failed: {(client.stderr.strip().splitlines() or ['?'])[-1]}")
    times = json.loads(client.stdout.strip().splitlines()[-1])
    events = {k: v - t0 for k, v in read_trace(trace).items()} if trace else {}
    return {"total": times["first_batch"] - t0, "events": events}


def loader_try(work: str, config: str, traced: bool) -> dict[str, Any]:
    trace = os.path.join(work, f"trace-{time.monotonic_ns()}.jsonl") if traced else None
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(HERE / "bench_startup.py"), "--loader", config] + (["--traced"] if traced else []),
        capture_output=True,
        text=True,
        timeout=TRY_TIMEOUT_S,
        env=_env(trace),
    )
    if proc.returncode != 0:
        raise RuntimeError(f"the Loader process failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
    times = json.loads(proc.stdout.strip().splitlines()[-1])
    events = {k: v - t0 for k, v in read_trace(trace).items()} if trace else {}
    return {
        "total": times["first_batch"] - times["called"],
        "process": times["first_batch"] - t0,
        "interpreter": times["up"] - t0,
        "imports": times["imported"] - times["up"],
        "events": events,
    }


# What the processes of a start-up read: every module's source and bytecode, every mapped library.
_CODE_FILES = """
import json, sys
import loader.cli, loader.service.daemon.loop, loader.service.client.client, workers.main
found = set()
for module in list(sys.modules.values()):
    found |= {getattr(module, "__file__", None), getattr(module, "__cached__", None)}
with open("/proc/self/maps") as fh:
    found |= {line.split()[-1] for line in fh if line.split()[-1].startswith("/")}
found.add(sys.executable)
print(json.dumps(sorted(f for f in found if f)))
"""


def code_files() -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-c", _CODE_FILES], capture_output=True, text=True, check=True, timeout=TRY_TIMEOUT_S
    )
    return [path for path in json.loads(proc.stdout) if os.path.isfile(path)]


def evict(paths: list[str]) -> int:
    """Drop the files' clean pages from the page cache (``posix_fadvise(DONTNEED)``; pages that a
    running process maps stay); the bytes asked to drop."""
    total = 0
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            total += os.fstat(fd).st_size
        finally:
            os.close(fd)
    return total


def interpreter_start_s(tries: int) -> float:
    """Median wall time of ``python -c pass`` (this interpreter, site packages and all)."""
    times = []
    for _ in range(tries):
        start = time.monotonic()
        subprocess.run([sys.executable, "-c", "pass"], check=True, timeout=TRY_TIMEOUT_S)
        times.append(time.monotonic() - start)
    return statistics.median(times)


# -- the rows -------------------------------------------------------------------------------------


def _tables(data: list[str]) -> dict[str, dict[str, Any]]:
    return {
        "source": {"files": data},
        "pipeline": {"batch_size": BATCH, "shuffle_buffer": 0, "epochs": 1},
        "workers": {"count": WORKERS},
    }


def _median_events(tries: list[dict[str, Any]]) -> dict[str, float]:
    names = {name for t in tries for name in t["events"]}
    medians = {name: statistics.median(t["events"][name] for t in tries if name in t["events"]) for name in names}
    return dict(sorted(medians.items(), key=lambda item: item[1]))


def _timeline(events: dict[str, float], since: float = 0.0) -> str:
    return ", ".join(f"{name} {1000 * (t - since):.0f}" for name, t in events.items())


def _ms(tries: list[dict[str, Any]]) -> str:
    return ", ".join(f"{1000 * t['total']:.0f}" for t in tries)


def _run_tries(tries: int, one: Callable[[bool], dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    plain, traced = [], []
    for _ in range(tries):  # alternating, so both see the same load
        plain.append(one(False))
        traced.append(one(True))
    return plain, traced


def run(quick: bool = False) -> list[dict[str, Any]]:
    from bench_tools import row, toml_text

    from loader.examples import datagen

    tries = 3 if quick else 7
    rows = []
    with tempfile.TemporaryDirectory(prefix="loader-bench-startup-") as work:
        data = datagen.generate(os.path.join(work, "data"), format="npy", files=FILES, samples=ROWS)
        python = interpreter_start_s(tries)

        plain, traced = _run_tries(tries, lambda t: serve_try(work, data, t))
        total = statistics.median(p["total"] for p in plain)
        traced_total = statistics.median(p["total"] for p in traced)
        rows.append(
            row(
                "startup_serve_to_first_batch",
                total,
                TARGET_S,
                "s",
                f"< {TARGET_S:g} s",
                total < TARGET_S,
                f"median of {tries}: `loader serve` and a fresh client started together -> the client's first batch "
                f"({_ms(plain)} ms); peer = the target; "
                f"`python -c pass` takes {1000 * python:.0f} ms here; traced ({1000 * traced_total:.0f} ms), "
                f"ms from the start: {_timeline(_median_events(traced))}",
                ratio=total / TARGET_S,
            )
        )

        files = code_files() + data
        cold = []
        for _ in range(max(1, tries // 2)):
            dropped = evict(files)
            cold.append(serve_try(work, data, False))
        total = statistics.median(p["total"] for p in cold)
        rows.append(
            row(
                "startup_serve_cold_page_cache",
                total,
                TARGET_S,
                "s",
                f"< {TARGET_S:g} s",
                total < TARGET_S,
                f"median of {len(cold)}: as above, after dropping from the page cache the {len(files)} files the "
                f"processes read ({dropped / 1e6:.0f} MB: Python's, the libraries', loader's and the data; "
                f"pages other running processes map stay) ({_ms(cold)} ms); peer = the target",
                ratio=total / TARGET_S,
            )
        )

        config = os.path.join(work, "loader.toml")
        Path(config).write_text(toml_text(_tables(data)), encoding="utf-8")
        plain, traced = _run_tries(tries, lambda t: loader_try(work, config, t))
        total = statistics.median(p["total"] for p in plain)
        events = _median_events(traced)
        called = events.get("Loader(...) called", 0.0)
        rows.append(
            row(
                "startup_Loader_to_first_batch",
                total,
                TARGET_S,
                "s",
                f"< {TARGET_S:g} s",
                total < TARGET_S,
                f"median of {tries}: loader.Loader(config) -> next(epoch()) in a fresh process "
                f"({_ms(plain)} ms); before it: interpreter "
                f"{1000 * statistics.median(p['interpreter'] for p in plain):.0f} ms, `import loader` + `loader.Loader` "
                f"{1000 * statistics.median(p['imports'] for p in plain):.0f} ms; whole process to first batch "
                f"{1000 * statistics.median(p['process'] for p in plain):.0f} ms; traced "
                f"({1000 * statistics.median(p['total'] for p in traced):.0f} ms), ms from Loader(...): "
                f"{_timeline({k: v for k, v in events.items() if v >= called}, called)}",
                ratio=total / TARGET_S,
            )
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 tries instead of 7")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--client", metavar="ADDRESS", help=argparse.SUPPRESS)  # internal: one fresh client
    parser.add_argument("--serve", metavar="CONFIG", help=argparse.SUPPRESS)  # internal: a traced `loader serve`
    parser.add_argument("--loader", metavar="CONFIG", help=argparse.SUPPRESS)  # internal: one fresh Loader
    parser.add_argument("--traced", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.client:
        return client_main(args.client)
    if args.serve:
        return serve_main(args.serve)
    if args.loader:
        return loader_main(args.loader, args.traced)
    for got in run(quick=args.quick):
        print(json.dumps(got) if args.json else got)
    return 0


if __name__ == "__main__":
    sys.exit(main())
