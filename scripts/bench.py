"""Benchmark driver: runs each group's ``run(quick)`` and prints one table.

Each group is a module ``scripts/bench_<group>.py`` exposing
``run(quick: bool) -> list[dict]`` with keys name, ours, peer, unit, ratio,
target, passed (None for a row that has no target), detail. Ratios are measured in one run against the named peer;
the machine is shared and noisy, so read them as figures, not as test results.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import sys
import time
from pathlib import Path

GROUPS = ("io", "service", "recordio", "resume", "images", "growth", "startup")
HERE = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short runs, to check the benchmarks work")
    parser.add_argument("--only", choices=GROUPS, action="append", help="run only this group (repeatable)")
    parser.add_argument("--out", default="bench-results/latest.json", help="where to write the JSON results")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(HERE))
    results: list[dict] = []
    for group in args.only or GROUPS:
        module = importlib.import_module(f"bench_{group}")
        started = time.perf_counter()
        rows = module.run(quick=args.quick)
        for row in rows:
            row["group"] = group
        results.extend(rows)
        print(f"[{group}] {len(rows)} benchmarks in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    _print_table(results)
    _write(results, Path(args.out), quick=args.quick)
    return 0


def _print_table(rows: list[dict]) -> None:
    header = f"{'benchmark':<52} {'ours':>12} {'peer':>12} {'unit':<12} {'ratio':>7}  {'target':<22} ok"
    print(header)
    print("-" * len(header))
    for row in rows:
        print(
            f"{row['name']:<52} {row['ours']:>12.4g} {row['peer']:>12.4g} {row['unit']:<12} "
            f"{row['ratio']:>7.2f}  {row['target']:<22} {_verdict(row['passed'])}"
        )
        if row.get("detail"):
            print(f"    {row['detail']}")


def _verdict(passed: bool | None) -> str:
    return "-" if passed is None else ("yes" if passed else "NO")


def _write(rows: list[dict], path: Path, *, quick: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "quick": quick,
    }
    path.write_text(json.dumps({"meta": meta, "results": rows}, indent=2))
    print(f"results written to {path}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
