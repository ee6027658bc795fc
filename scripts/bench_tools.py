"""Helpers shared by the images, growth and start-up benchmarks (not a benchmark group itself).

* ``Serve``: ``loader serve`` on a config written from a dict, in a child process, waited for and
  stopped (SIGTERM, then SIGKILL) on leaving ``with``;
* ``in_child``: call ``module:function(**kwargs)`` of a script in this directory in a fresh Python
  process and return what it printed as JSON (our clients live in their own processes, and the
  benchmark process never holds a ZeroMQ context that torch's forked workers would inherit);
* ``CpuMeter``, ``process_tree``, ``memory_kib``: CPU seconds and memory of a process tree, read
  from ``/proc`` (Linux only).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# bench_service and demo live in this directory (on sys.path when a script here runs).
from bench_service import child_env
from demo import free_port, start_daemon, stop_daemon, wait_ready

HERE = Path(__file__).resolve().parent
SERVE_START_TIMEOUT_S = 60.0
CHILD_TIMEOUT_S = 300.0
CLOCK_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01


# -- the driver's rows ----------------------------------------------------------------------


def row(
    name: str,
    ours: float,
    peer: float,
    unit: str,
    target: str,
    passed: bool | None,
    detail: str,
    ratio: float | None = None,
) -> dict[str, Any]:
    """One row for ``scripts/bench``; ``passed`` None for a figure with no target; ``ratio`` defaults to ours / peer."""
    if ratio is None:
        ratio = ours / peer if peer else 0.0
    return {
        "name": name,
        "ours": round(float(ours), 4),
        "peer": round(float(peer), 4),
        "unit": unit,
        "ratio": round(float(ratio), 3),
        "target": target,
        "passed": None if passed is None else bool(passed),
        "detail": detail,
    }


# -- a config file and `loader serve` ----------------------------------------------------


def toml_text(tables: dict[str, dict[str, Any]]) -> str:
    """A TOML document of ``{table: {key: value}}`` with str, int, float, bool and list values."""
    lines = []
    for table, values in tables.items():
        lines.append(f"[{table}]")
        lines += [f"{key} = {json.dumps(value)}" for key, value in values.items()]
        lines.append("")
    return "\n".join(lines)


def write_config(work: str, tables: dict[str, dict[str, Any]], name: str = "") -> tuple[str, str]:
    """Write ``tables`` plus a fresh loopback ``service.bind`` to a config file: (path, address)."""
    address = f"tcp://127.0.0.1:{free_port()}"
    tables = {**tables, "service": {**tables.get("service", {}), "bind": address}}
    path = os.path.join(work, f"{name or 'bench'}-{os.getpid()}-{time.monotonic_ns()}.toml")
    Path(path).write_text(toml_text(tables), encoding="utf-8")
    return path, address


class Serve:
    """``loader serve`` on ``tables`` in a child process, ready (its workers connected) once constructed."""

    def __init__(self, work: str, tables: dict[str, dict[str, Any]], *, wait_workers: int | None = None) -> None:
        self.config, self.address = write_config(work, tables, "serve")
        self.workers = int(tables.get("workers", {}).get("count", 2)) if wait_workers is None else wait_workers
        self.proc = start_daemon(self.config)
        try:
            wait_ready(self.address, self.proc, self.workers, SERVE_START_TIMEOUT_S)
        except BaseException:
            self.close()
            raise

    @property
    def pid(self) -> int:
        return self.proc.pid

    def close(self) -> int | None:
        return stop_daemon(self.proc)

    def __enter__(self) -> Serve:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# -- a measurement in a fresh process ------------------------------------------------------


def child_command(module: str, func: str, **kwargs: Any) -> list[str]:
    spec = json.dumps({"module": module, "func": func, "kwargs": kwargs})
    return [sys.executable, str(HERE / "bench_tools.py"), "--child", spec]


def in_child(module: str, func: str, *, timeout_s: float = CHILD_TIMEOUT_S, **kwargs: Any) -> Any:
    """``module.func(**kwargs)`` in a fresh Python process (BLAS pools of one thread); its JSON result."""
    proc = subprocess.run(
        child_command(module, func, **kwargs), capture_output=True, text=True, timeout=timeout_s, env=child_env()
    )
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"]
        raise RuntimeError(f"{module}.{func} failed: {lines[-1]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _child_main(spec: str) -> int:
    call = json.loads(spec)
    func = getattr(importlib.import_module(call["module"]), call["func"])
    print(json.dumps(func(**call["kwargs"])))
    return 0


# -- /proc: process trees, CPU time, memory ------------------------------------------------


def _stat_fields(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
        text = fh.read()
    return text[text.rindex(")") + 2 :].split()  # fields from the third (state) on: the name may hold spaces


def process_tree(root: int) -> list[int]:
    """``root`` and its live descendants."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parent = int(_stat_fields(int(entry))[1])
            except (OSError, ValueError, IndexError):
                continue  # ended meanwhile
            children.setdefault(parent, []).append(int(entry))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo += children.get(pid, [])
    return tree


def cpu_seconds(pid: int) -> float:
    """User + system CPU of ``pid`` and of its children it has waited for (0 if it ended)."""
    try:
        fields = _stat_fields(pid)
    except OSError:
        return 0.0
    return sum(int(fields[i]) for i in (11, 12, 13, 14)) * CLOCK_TICK_S  # utime, stime, cutime, cstime


def minor_faults(pid: int) -> int:
    """Minor page faults of ``pid`` so far (0 if it ended): a worker whose allocator gives memory back faults
    every image's arrays in again (``bench_images.single_core_rate``)."""
    try:
        return int(_stat_fields(pid)[7])  # minflt, the stat file's tenth field
    except OSError:
        return 0


class CpuMeter:
    """CPU seconds a process tree spends between ``start()`` and ``stop()`` (all its processes).

    A process that starts meanwhile counts from zero. One that ends meanwhile is counted through its
    parent's cutime once waited for (its whole life, so slightly over) or not at all if it is not;
    none ends in these benchmarks, whose workers stay up across the measured epochs.
    """

    def __init__(self, root: int | None = None) -> None:
        self.root = os.getpid() if root is None else root
        self.before: dict[int, float] = {}

    def _now(self) -> dict[int, float]:
        return {pid: cpu_seconds(pid) for pid in process_tree(self.root)}

    def start(self) -> None:
        self.before = self._now()

    def stop(self) -> tuple[float, int]:
        """(CPU seconds used since ``start``, processes in the tree now)."""
        after = self._now()
        return sum(max(0.0, t - self.before.get(pid, 0.0)) for pid, t in after.items()), len(after)


def memory_kib(pid: int) -> dict[str, int]:
    """VmRSS, RssAnon, RssFile, RssShmem and VmHWM of ``pid`` in KiB, from ``/proc/PID/status``."""
    keys = ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmHWM")
    found = dict.fromkeys(keys, 0)
    with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as fh:
        for line in fh:
            key, _, rest = line.partition(":")
            if key in found:
                found[key] = int(rest.split()[0])
    return found


def group_main(doc: str, run: Callable[[bool], list[dict[str, Any]]], quick_help: str, argv: list[str] | None) -> int:
    """A group script run alone: ``--quick`` and ``--json``; prints one row per line."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args(argv)
    for got in run(args.quick):
        print(json.dumps(got) if args.json else got)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 2 and args[0] == "--child":
        return _child_main(args[1])
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main())
